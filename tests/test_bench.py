"""The benchmark-suite runner: one process, same prompts, ratios vs the baseline, results never overwritten."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from specbench import bench
from specbench.errors import ConfigError


def test_smoke_suite_runs_and_writes_a_new_file_each_time(tmp_path, shared_data, capsys):
    """AR vs HF generate on the tiny model: identical outputs, speedup 1 for the baseline, two files."""
    args = ["smoke", "--out", str(tmp_path), f"data_dir={shared_data}"]
    assert bench.main(args) == 0 and bench.main(args) == 0
    files = sorted((tmp_path / "smoke").glob("*.json"))
    assert len(files) == 2
    payload = json.loads(files[0].read_text())
    rows = {row["label"]: row for row in payload["rows"]}
    assert set(rows) == {"ar", "hf_generate", "ar seed=1", "ar seed=2"}
    assert rows["ar"]["speedup"] == 1.0 and rows["ar"]["overhead"] == 1.0
    assert all(row["exact_match_rate"] == 1.0 for row in rows.values())  # greedy: seeds change nothing
    assert rows["hf_generate"]["overhead"] is None  # HF generate has no per-step timing
    assert payload["entries"]["ar seed=2"]["overrides"] == ["method=ar", "seed=2"]
    assert len(payload["records"]["ar"]) == 2 and payload["environment"]["torch_threads"] >= 1
    assert "tok/step" in capsys.readouterr().out


def test_unknown_suite_lists_the_valid_ones(capsys):
    """A typo gets the list of suites and exit code 2."""
    assert bench.main(["nope"]) == 2
    assert "smoke" in capsys.readouterr().err


def test_grid_labels_must_be_distinct_and_model_fixed():
    """Grid entries need placeholders in their label; entries may not switch the model."""
    suite = OmegaConf.create({"entries": [{"label": "x", "overrides": ["method=ar"], "grid": {"seed": [1, 2]}}]})
    with pytest.raises(ConfigError, match="duplicate entry labels"):
        bench.expand_entries(suite)
    suite = OmegaConf.create({"model": "tiny_llama", "dataset": "humaneval", "entries": [
        {"label": "a", "overrides": ["method=ar"]}, {"label": "b", "overrides": ["model=smollm2_135m"]}]})
    args = bench.parse_args(["smoke"])
    with pytest.raises(ConfigError, match="must not change the model"):
        bench.entry_configs(suite, bench.expand_entries(suite), args)
