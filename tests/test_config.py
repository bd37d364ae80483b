"""Every config composes; unknown names list the valid ones."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.conftest import ROOT

CONF = ROOT / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_run(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=list(overrides))


def test_defaults_contract():
    cfg = compose_run()
    assert (cfg.model.name, cfg.method.name, cfg.dataset.name) == ("smollm2_135m", "ar", "humaneval")
    for knob in ("limit", "max_new_tokens", "temperature", "top_p", "seed", "device", "dtype", "warmup",
                 "output_dir", "data_dir"):
        assert knob in cfg
    assert cfg.device == "auto" and cfg.dtype == "auto" and cfg.temperature == 0.0


@pytest.mark.parametrize("model", options("model"))
@pytest.mark.parametrize("method", options("method"))
@pytest.mark.parametrize("dataset", options("dataset"))
def test_every_combination_composes(model, method, dataset):
    cfg = compose_run(f"model={model}", f"method={method}", f"dataset={dataset}")
    assert cfg.model.name == model and cfg.method.name == method and cfg.dataset.name == dataset
    assert cfg.model.source in ("hub", "embedded", "tiny")
    assert cfg.method.engine in ("loop", "hf_generate")
    assert model in cfg.output_dir and method in cfg.output_dir


def test_profile_config_composes():
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("profile", overrides=["model=tiny_llama"])
    assert cfg.model.name == "tiny_llama"


@pytest.mark.parametrize("group,bad", [("method", "nope"), ("model", "gpt9"), ("dataset", "imaginary")])
def test_unknown_name_lists_valid_options(group, bad):
    proc = subprocess.run([sys.executable, "-m", "specbench", f"{group}={bad}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    for valid in options(group):
        assert valid in proc.stderr
