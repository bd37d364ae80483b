"""Hydra launchers of conf/hydra/launcher/: every config composes with an experiment and targets its
plugin's launcher, the SLURM GPU config asks for exactly one GPU per job, and a joblib sweep at smoke
scale runs on CPU, each job its own process and session, so the reproduction refuses its cross-session AR pair."""

import json
import subprocess
import sys

import pytest
from hydra.utils import get_class, instantiate
from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
from omegaconf import OmegaConf

from specbench.config import CONF_DIR, compose_config
from specbench.reproduce.results import load_results
from tests.conftest import ROOT

EXPERIMENT = "+experiment=smoke/r2_table1_code"
LAUNCHERS = sorted(path.stem for path in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))
PLUGIN_TARGETS = {"joblib": JobLibLauncherConf._target_, "submitit_slurm": SlurmQueueConf._target_}


def launcher_config(name: str, *overrides: str):
    cfg = compose_config(EXPERIMENT, f"hydra/launcher={name}", *overrides, hydra_node=True)
    assert cfg.hydra.runtime.choices["hydra/launcher"] == name
    return cfg


def test_the_launchers_are_there():
    assert {"local_cpu", "slurm_gpu"} <= set(LAUNCHERS)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_every_launcher_config_composes_with_an_experiment(name, monkeypatch):
    monkeypatch.delenv("SPECBENCH_SLURM_PARTITION", raising=False)
    cfg = launcher_config(name)
    launcher = cfg.hydra.launcher
    assert launcher._target_ in PLUGIN_TARGETS.values()
    get_class(launcher._target_)  # the plugin's launcher class imports
    instantiate(launcher)  # and accepts every key of the config
    assert cfg.experiment == "r2_table1_code" and cfg.method.name == "ar"  # the app config is untouched
    text = (CONF_DIR / "hydra" / "launcher" / f"{name}.yaml").read_text()
    assert text.startswith("#") and f"hydra/launcher={name}" in text  # says how to use it


def test_local_cpu_is_a_joblib_launcher_with_two_process_workers():
    launcher = launcher_config("local_cpu").hydra.launcher
    assert launcher._target_ == PLUGIN_TARGETS["joblib"]
    assert launcher.n_jobs == 2 and launcher.backend == "loky"
    assert launcher_config("local_cpu", "hydra.launcher.n_jobs=4").hydra.launcher.n_jobs == 4


def test_slurm_gpu_runs_one_task_on_exactly_one_gpu_per_job(monkeypatch):
    monkeypatch.delenv("SPECBENCH_SLURM_PARTITION", raising=False)
    cfg = launcher_config("slurm_gpu")
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"] == PLUGIN_TARGETS["submitit_slurm"]
    assert launcher["nodes"] == 1 and launcher["tasks_per_node"] == 1 and launcher["gpus_per_node"] == 1
    assert launcher["gpus_per_task"] is None and launcher["gres"] is None  # no second way to ask for more
    assert launcher["cpus_per_task"] >= 1 and launcher["mem_gb"] >= 1 and launcher["timeout_min"] >= 1
    assert launcher["array_parallelism"] >= 1
    assert launcher["partition"] is None  # the cluster's default
    assert launcher["submitit_folder"].startswith(str(cfg.hydra.sweep.dir))  # logs beside the sweep
    monkeypatch.setenv("SPECBENCH_SLURM_PARTITION", "gpu")
    assert OmegaConf.to_container(launcher_config("slurm_gpu").hydra.launcher, resolve=True)["partition"] == "gpu"


@pytest.mark.skipif("slurm_cpu" not in LAUNCHERS, reason="no slurm_cpu launcher config")
def test_slurm_cpu_asks_for_no_gpu():
    launcher = launcher_config("slurm_cpu").hydra.launcher
    assert launcher._target_ == PLUGIN_TARGETS["submitit_slurm"]
    assert launcher.gpus_per_node is None and launcher.gpus_per_task is None and launcher.gres is None


@pytest.mark.slow
def test_a_joblib_sweep_at_smoke_scale_runs_on_cpu_and_its_cross_session_pair_is_refused(tmp_path):
    results_root, sweep_dir = tmp_path / "runs", tmp_path / "sweep"
    command = [
        sys.executable,
        "-m",
        "specbench",
        "--multirun",
        EXPERIMENT,
        "hydra/launcher=local_cpu",
        "model=tiny_llama",
        "limit=1",
        "max_new_tokens=4",
        "warmup=0",
        "progress=false",
        f"results_root={results_root}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    multirun = OmegaConf.load(sweep_dir / "multirun.yaml")
    assert multirun.hydra.launcher._target_ == PLUGIN_TARGETS["joblib"]  # the sweep used joblib
    summaries = {path.parent.name: json.loads(path.read_text()) for path in results_root.rglob("summary.json")}
    assert sorted(summaries) == ["method=anpd", "method=ar"]
    for summary in summaries.values():
        assert summary["status"] == "complete" and summary["n_samples"] == 1
        assert summary["experiment"] == "r2_table1_code" and summary["model"] == "tiny_llama"
    results = load_results(results_root)
    assert sorted(results.runs["method"]) == ["anpd", "ar"]
    anpd = results.runs[results.runs["method"] == "anpd"].iloc[0]
    # each joblib job is a process, so a session, of its own: the reproduction's rule refuses the cross-session pair
    assert anpd["n_common"] == 0 and "AR partner timed in another session" in anpd["pairing"]
    assert anpd["sessions"] != anpd["ar.sessions"]
