"""Shared fixtures: tiny random Llama models built in code, the embedded model, the repo's conf/."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from specbench.models.loading import build_tiny_llama

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("SPECBENCH_DATA_DIR", ROOT.parent / "shared" / "datasets"))
TINY_ARCH = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=512,
)


# Property tests (tests/test_fuzz.py). quick (`make test`): a few derandomized examples each, the same on every run;
# fuzz (`make fuzz`, HYPOTHESIS_PROFILE=fuzz): no example limit (FUZZ_SECONDS bounds the time), random examples, and
# the failing ones kept in .hypothesis/ and tried first next time. Commands are slow (Hydra composes configs), so no
# deadline and no health check on slow data generation.
SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "quick", max_examples=3, deadline=None, derandomize=True, database=None, suppress_health_check=SLOW_IS_FINE
)
settings.register_profile(
    "fuzz",
    max_examples=10**9,
    deadline=None,
    database=DirectoryBasedExampleDatabase(ROOT / ".hypothesis" / "examples"),
    suppress_health_check=SLOW_IS_FINE,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


def share_cores_among_workers() -> None:
    """Under pytest-xdist (``make test``), each worker and the subprocesses it starts get their share of the cores as
    torch threads, so that two workers on two cores do not each run two threads."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, cores // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


share_cores_among_workers()


def tiny_model(vocab_size: int = 97, seed: int = 0, **arch) -> torch.nn.Module:
    """A float32 tiny random Llama on CPU (seeded, so every test sees the same weights)."""
    return build_tiny_llama(vocab_size=vocab_size, seed=seed, **{**TINY_ARCH, **arch}).float()


@pytest.fixture(scope="session")
def tiny():
    return tiny_model()


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct in float32 on CPU (converted once, then cached)."""
    from omegaconf import OmegaConf

    from specbench.models.loading import load_model

    cfg = OmegaConf.create({"name": "smollm2_135m", "source": "embedded"})
    return load_model(cfg, torch.device("cpu"), torch.float32)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "humaneval.jsonl").is_file():
        pytest.skip(f"shared datasets not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="module")
def no_model_loads(tmp_path_factory):
    """For a module's in-process commands (tests/commands.py): every model load stops there; a fresh cache."""
    from tests.commands import models_stopped

    with models_stopped(tmp_path_factory.mktemp("cache"), SHARED_DATA):
        yield


@pytest.fixture
def training_cache(tmp_path, monkeypatch) -> Path:
    """A fresh SPECBENCH_CACHE that still sees the converted embedded checkpoint (tokenizer of tiny models)."""
    from specbench.models.embedded import embedded_checkpoint

    checkpoint = embedded_checkpoint()
    root = tmp_path / "cache"
    root.mkdir()
    (root / checkpoint.name).symlink_to(checkpoint)
    monkeypatch.setenv("SPECBENCH_CACHE", str(root))
    return root


def pytest_addoption(parser):
    """``--method NAME`` (repeatable) and ``--config-dir DIR``: run the conformance suite on your own method too;
    ``--thorough``: with the sampling check's thorough number of draws."""
    parser.addoption(
        "--method",
        action="append",
        default=[],
        metavar="NAME",
        help="a method config for tests/test_conformance.py (default: every config in conf/method)",
    )
    parser.addoption(
        "--config-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of your own configs (method/, dataset/, ...), as for python -m specbench -cd DIR",
    )
    parser.addoption(
        "--thorough",
        action="store_true",
        help="tests/test_conformance.py: the sampling check with its thorough number of draws (minutes per method)",
    )


def pytest_configure(config):
    """The user's config folders join the search path before any test composes a config."""
    from specbench.config import add_user_config_dirs

    add_user_config_dirs(config.getoption("--config-dir"))


def pytest_terminal_summary(terminalreporter):
    """Under ``make fuzz``: the examples tests/test_fuzz.py tried per boundary and how they ended."""
    fuzz = sys.modules.get("tests.test_fuzz")
    if fuzz is not None and fuzz.FUZZ_SECONDS:
        for line in fuzz.example_counts():
            terminalreporter.write_line(line)
