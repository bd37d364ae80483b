"""Every config composes; unknown names list the valid ones."""

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from specbench.config import compose_config as compose_run
from specbench.config import group_options as options
from tests.conftest import ROOT


def test_defaults_contract():
    cfg = compose_run()
    assert (cfg.model.name, cfg.method.name, cfg.dataset.name) == ("smollm2_135m", "ar", "humaneval")
    for knob in (
        "limit",
        "max_new_tokens",
        "temperature",
        "top_p",
        "seed",
        "device",
        "dtype",
        "warmup",
        "output_dir",
        "data_dir",
    ):
        assert knob in cfg
    assert cfg.device == "auto" and cfg.dtype == "auto" and cfg.temperature == 0.0


def check(cfg, model: str, method: str, dataset: str) -> None:
    """The composed config resolves (every interpolation) and names what was asked for."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert (resolved["model"]["name"], resolved["method"]["name"]) == (model, method)
    assert resolved["dataset"]["name"] in (dataset, f"{dataset}_{resolved['dataset'].get('input_tokens')}")
    assert cfg.model.source in ("hub", "embedded", "tiny")
    assert cfg.method.engine in ("loop", "hf_generate")
    assert model in cfg.output_dir and method in cfg.output_dir


@pytest.mark.parametrize("model", options("model"))
@pytest.mark.parametrize("method", options("method"))
def test_every_model_method_pair_composes(model, method):
    """Methods read their model's draft, heads and sizes: every pair resolves (datasets are independent of it)."""
    check(compose_run(f"model={model}", f"method={method}"), model, method, "humaneval")


@pytest.mark.parametrize("model", options("model"))
@pytest.mark.parametrize("dataset", options("dataset"))
def test_every_model_dataset_pair_composes(model, dataset):
    """Datasets pick their prompt format by model: every pair resolves."""
    check(compose_run(f"model={model}", f"dataset={dataset}"), model, "ar", dataset)


def test_profile_config_composes():
    cfg = compose_run("model=tiny_llama", config_name="profile")
    assert cfg.model.name == "tiny_llama"


@pytest.mark.parametrize("group,bad", [("method", "nope"), ("model", "gpt9"), ("dataset", "imaginary")])
def test_unknown_name_lists_valid_options(group, bad):
    proc = subprocess.run(
        [sys.executable, "-m", "specbench", f"{group}={bad}"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    for valid in options(group):
        assert valid in proc.stderr
