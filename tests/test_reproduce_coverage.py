"""The paper plan covers every published number (a job fills it, or the row says why none can), the
stored smoke runs keep their folders and config digests, and the plan's cost estimate adds up."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from specbench.errors import ConfigError
from specbench.reproduce.__main__ import main
from specbench.reproduce.cost import LatencyModel, cost_table, estimate, model_size, paper_number
from specbench.reproduce.coverage import coverage, folder_conflicts, job_config, job_of, plan_jobs
from specbench.reproduce.plan import load_plan, sweep_jobs
from specbench.reproduce.tables import paper_values
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def paper_jobs():
    return plan_jobs(load_plan("paper"))


@pytest.fixture(scope="module")
def smoke_jobs():
    return plan_jobs(load_plan("smoke"))


@pytest.fixture(scope="module")
def covered(paper_jobs):
    return coverage(paper_values(), paper_jobs)


def test_every_paper_row_is_filled_by_a_job_or_says_why_not(covered):
    missing = covered[covered["status"] == "missing"]
    stale = covered[covered["status"] == "stale reason"]
    assert missing.empty, (
        "rows with neither a job nor a reason:\n"
        + missing[["paper", "table", "paper_model", "paper_method", "metric"]].to_string()
    )
    assert stale.empty, (
        "rows filled by a job that still carry an unfillable reason:\n"
        + stale[["paper", "table", "paper_model", "paper_method", "experiments"]].to_string()
    )
    reasons = covered.loc[covered["status"] == "unfillable", "unfillable"]
    assert (reasons.str.len() > 25).all()  # a sentence, not a tag


@pytest.mark.parametrize(
    "paper,table,paper_method,experiment",
    [
        ("self_draft", "Table 2", "LADE", "r1_table2_chat_13b"),  # 13B LADE at (W, N, G) = (10, 5, 10)
        ("medusa", "Table 1", "Medusa-2", "r4_medusa2"),
        ("medusa", "Fig 4b", "Medusa-2", "r4_medusa2"),
        ("lookahead", "PIA README", "lookahead", "r5_pia_readme"),
    ],
)
def test_rows_that_had_no_job_now_have_the_papers_setting(covered, paper, table, paper_method, experiment):
    rows = covered[
        (covered["paper"] == paper)
        & (covered["table"] == table)
        & (covered["paper_method"] == paper_method)
        & (covered["status"] == "filled")
    ]
    assert len(rows) and rows["experiments"].str.contains(experiment).any()


def test_lade_13b_rows_run_the_13b_setting(paper_jobs):
    lade = [job for job in paper_jobs if job.method.startswith("lade") and job.experiment.startswith("r1_table2")]
    assert {(job.model.endswith("13b"), job.method) for job in lade} == {(False, "lade"), (True, "lade_13b")}
    cfg = job_config(["+experiment=paper/r1_table2_chat_13b", "model=llama_13b", "method=lade_13b", "dataset=mt_bench"])
    assert (cfg.method.drafter.window_size, cfg.method.drafter.guess_set_size, cfg.method.drafter.ngram_size) == (
        10,
        10,
        5,
    )


def test_pia_readme_jobs_warm_up_from_their_own_dataset(paper_jobs):
    jobs = [job for job in paper_jobs if job.experiment == "r5_pia_readme" and job.method != "ar"]
    assert {job.setting for job in jobs} == {
        f"method.drafter.branch_length=8;method.drafter.warmup.dataset={name}" for name in ("dolly", "gsm8k")
    }
    assert {job.limit for job in jobs} == {1000}


def test_medusa_paper_jobs_use_published_trees_and_vicuna_prompts(paper_jobs):
    medusa = [job for job in paper_jobs if job.method.startswith("medusa") or job.experiment.startswith("r4_")]
    assert medusa and all(job.model.startswith(("vicuna_", "medusa2_")) for job in medusa)
    lossy = {job.model for job in medusa if job.changes_target}
    assert lossy == {job.model for job in medusa if job.model.startswith("medusa2_")}
    cfg = job_config(["+experiment=paper/r4_speedup", "model=vicuna_7b", "method=medusa", "dataset=mt_bench"])
    assert cfg.dataset.prompt_format == "vicuna" and cfg.method.drafter.heads.tree == "mc_sim_7b_63"


def test_list_prints_coverage_and_cost(capsys):
    main(["list", "--scale", "paper", "--coverage", "--only", "r4_medusa2"])
    text = capsys.readouterr().out
    assert "job: r4_medusa2" in text and "unfillable:" in text and "paper rows:" in text
    main(["list", "--scale", "paper", "--only", "r4_speedup"])
    text = capsys.readouterr().out
    assert "| r4_speedup | 4 |" in text and "GPU-hours (A100)" in text and "assumed: the AR throughput" in text


def test_cost_of_an_ar_job_is_tokens_times_the_papers_time_per_token():
    jobs = [job_of("r4_speedup", overrides) for overrides in sweep_jobs("paper", "r4_speedup")]
    latency = LatencyModel("a100")
    per_job = estimate(jobs, latency)
    ar = per_job[[job.method == "ar" and job.model == "vicuna_7b" for job in jobs]].iloc[0]
    assert ar["samples"] == 160 and ar["generated_tokens"] == (80 + 1) * 2 * 1024  # + one warm-up question
    per_token = 1 / paper_number(
        paper_values(),
        {"paper": "self_draft", "table": "Table 2", "model": "llama_7b", "dataset": "gsm100", "metric": "throughput"},
    )
    assert ar["gpu_hours"] == pytest.approx(ar["generated_tokens"] * per_token / 3600)
    medusa = per_job[[job.method == "medusa" for job in jobs]]
    assert (medusa["forwards"] < medusa["generated_tokens"]).all()
    table = cost_table(per_job, ["r4_speedup"])
    assert table.iloc[-1]["experiment"] == "total" and table.iloc[-1]["jobs"] == 4
    assert model_size("llama2_13b_chat") == 13 and model_size("smollm2_135m") is None


def test_cost_counts_only_the_categories_a_job_keeps():
    """Medusa's tree-size ablation asks MT-Bench's writing and roleplay questions: 20 of 80, two turns each."""
    jobs = [job_of("r4_tree_sparse", overrides) for overrides in sweep_jobs("paper", "r4_tree_sparse")]
    per_job = estimate(jobs, LatencyModel("a100"))
    assert {job.categories for job in jobs} == {("writing", "roleplay")}
    assert (per_job["samples"] == 20 * 2).all()


def test_a_measured_profile_of_the_named_gpu_replaces_the_assumption(tmp_path):
    rows = [
        {
            "model": "vicuna_7b",
            "device_name": "cuda: NVIDIA A100-SXM4-80GB",
            "dtype": "float16",
            "context_length": 256,
            "num_tokens": n,
            "mask": "tree",
            "median_ms": ms,
            "min_ms": ms,
            "repeats": 5,
        }
        for n, ms in ((1, 20.0), (64, 26.0))
    ]
    (tmp_path / "vicuna_7b").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "vicuna_7b" / "latency_cuda_float16.csv", index=False)
    latency = LatencyModel("a100", tmp_path)
    measured = latency.of("vicuna_7b")
    assert measured.seconds_per_token == pytest.approx(0.02) and measured.overhead == pytest.approx(1.3)
    assert measured.source.startswith("measured:")
    assert latency.of("vicuna_13b").source.startswith("assumed:")
    with pytest.raises(ConfigError, match="no cost assumptions for GPU"):
        LatencyModel("tpu-v9")


def test_no_two_jobs_of_a_plan_share_a_run_folder_with_different_configs(paper_jobs, smoke_jobs):
    assert folder_conflicts(paper_jobs) == {}
    assert folder_conflicts(smoke_jobs) == {}
    one = paper_jobs[0]
    clash = [one, replace(one, experiment="other", digest="0" * 16)]
    assert folder_conflicts(clash) == {one.folder: sorted({one.experiment, "other"})}


def test_stored_smoke_runs_keep_their_folders_and_config_digests(smoke_jobs):
    """Every stored smoke run is the run of a job of the smoke plan, with the same config digest, so ``make
    reproduce-tables`` resumes the stored smoke results instead of stopping on a conflict. A stored run that no job
    makes any more (the plan's settings changed its folder) fails too: the test must check every stored run, or a plan
    change that renamed every folder would leave it checking nothing. Such runs are rerun into fresh folders and the old
    ones deleted (docs/reproduction.md)."""
    root = ROOT / "results" / "experiments" / "smoke"
    stored = {path.parent.relative_to(root).as_posix() for path in root.rglob("summary.json")}
    assert stored, "no stored smoke results: results/experiments/smoke is part of the repository"
    changed, checked = [], set()
    for job in smoke_jobs:
        summary = root / job.folder / "summary.json"
        if summary.is_file():
            checked.add(Path(job.folder).as_posix())
            if json.loads(summary.read_text())["config_digest"] != job.digest:
                changed.append(job.folder)
    assert not changed, (
        f"{len(changed)} stored smoke run(s) no longer match their job's configuration (the "
        f"next make reproduce-tables stops on them): restore the config, or rerun those runs "
        f"into a fresh results folder and replace them:\n" + "\n".join(changed)
    )
    orphans = sorted(stored - checked)
    assert not orphans, (
        f"{len(orphans)} of {len(stored)} stored smoke runs are no job's run any more (the plan changed their "
        f"folders): rerun the smoke plan into fresh folders and delete these:\n" + "\n".join(orphans)
    )
