"""The latency profiler: grid, cache restoration, plot/report and the Hydra app (never speed asserts)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbench.config import compose_config
from specbench.core.tree import flatten
from specbench.core.verify import cache_length
from specbench.models.embedded import embedded_checkpoint
from specbench.models.loading import build_tiny_llama
from specbench.profile import (
    CSV_FIELDS,
    MASKS,
    critical_length,
    format_report,
    measure,
    plot,
    prefilled_cache,
    probe_tree,
    profile_latency,
)

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Llama on CPU (vocab 256)."""
    return build_tiny_llama(
        vocab_size=256,
        seed=0,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
    )


@pytest.fixture(scope="module")
def rows(tiny):
    """Profile rows of the tiny model over a 2 x 3 grid."""
    return profile_latency(tiny, [4, 9], [1, 3, 5], repeats=2, warmup=1, seed=0, device=CPU, name="tiny")


def test_one_row_per_cell_and_mask_with_positive_timings(rows):
    """Every (c, n, mask) appears once, with the CSV columns and positive median/min timings."""
    cells = [(r["context_length"], r["num_tokens"], r["mask"]) for r in rows]
    assert sorted(cells) == sorted((c, n, m) for c in (4, 9) for n in (1, 3, 5) for m in MASKS)
    assert all(list(r) == CSV_FIELDS for r in rows)
    assert all(0 < r["min_ms"] <= r["median_ms"] and r["repeats"] == 2 for r in rows)
    assert {r["model"] for r in rows} == {"tiny"} and {r["dtype"] for r in rows} == {"float32"}


def test_cells_beyond_the_context_length_are_skipped(tiny):
    """c + n above max_context is not measured; c + n equal to it is."""
    rows = profile_latency(tiny, [4, 6], [1, 4], repeats=1, warmup=0, seed=0, device=CPU, max_context=8)
    assert {(r["context_length"], r["num_tokens"]) for r in rows} == {(4, 1), (4, 4), (6, 1)}


def test_measure_restores_the_cache_to_the_context(tiny):
    """After every warm-up and timed forward the cache holds exactly the original c rows again."""
    trees = [probe_tree(mask, [5, 6, 7, 8, 9]) for mask in MASKS]
    with torch.inference_mode():
        cache = prefilled_cache(tiny, 7, torch.Generator().manual_seed(0))
        before = [layer.keys.clone() for layer in cache.layers]
        lengths = []
        timings = measure(
            tiny, cache, trees, repeats=2, warmup=1, device=CPU, on_forward=lambda: lengths.append(cache_length(cache))
        )
    assert [len(t) for t in timings] == [2, 2] and lengths == [7] * 6
    assert all(torch.equal(layer.keys, old) for layer, old in zip(cache.layers, before))


def test_probe_trees_take_the_causal_and_the_mask_paths():
    """A chain gets no mask (fast path); a star of n >= 3 nodes gets the 4-D mask."""
    chain, star = probe_tree("chain", [1, 2, 3, 4]), probe_tree("tree", [1, 2, 3, 4])
    assert chain.is_chain and star.parents == [-1, 0, 0, 0]
    assert flatten(chain, 10, torch.float32, CPU).attention_mask is None
    assert flatten(star, 10, torch.float32, CPU).attention_mask.shape == (1, 1, 4, 14)


def test_plot_writes_a_png(rows, tmp_path):
    """The figure is a non-empty PNG file."""
    path = tmp_path / "latency.png"
    plot(rows, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_shows_ratios_and_critical_length():
    """Ratios are relative to the n=1 chain step; the critical length is the last n within tolerance."""
    rows = [
        {
            "model": "m",
            "device_name": "d",
            "dtype": "float32",
            "context_length": 8,
            "num_tokens": n,
            "mask": mask,
            "median_ms": ms,
            "min_ms": ms,
            "repeats": 1,
        }
        for n, ms in ((1, 10.0), (2, 10.5), (4, 20.0))
        for mask in MASKS
    ]
    report = format_report(rows, tolerance=1.1)
    assert "2.00" in report and "critical decoding length (chain <= 1.1x): 2" in report
    assert critical_length([1, 2, 4], [1.0, 1.05, 2.0], 1.1) == 2


def test_config_composes_with_no_output_folders():
    """profile.yaml composes with the shared model group and keeps Hydra out of the cwd."""
    cfg = compose_config(config_name="profile", hydra_node=True)
    assert cfg.model.name == "smollm2_135m" and cfg.output_dir == "results/profile/smollm2_135m"
    assert list(cfg.num_tokens) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512] and cfg.repeats == 5
    assert cfg.hydra.run.dir == "." and cfg.hydra.output_subdir is None


def test_app_end_to_end_on_the_tiny_model(tmp_path):
    """``python -m specbench.profile model=tiny_llama`` writes CSV/PNG/JSON and nothing else in the cwd."""
    try:
        embedded_checkpoint()  # the tiny source uses the embedded tokenizer
    except FileNotFoundError as err:
        pytest.skip(str(err))
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "specbench.profile",
        "model=tiny_llama",
        "device=cpu",
        "context_lengths=[8]",
        "num_tokens=[1,4]",
        "repeats=1",
        "warmup=0",
        f"output_dir={out}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "critical decoding length" in result.stdout
    with (out / "latency_cpu_float32.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4
    assert {p.name for p in out.iterdir()} == {f"latency_cpu_float32.{ext}" for ext in ("csv", "png", "json")}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
