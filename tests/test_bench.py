"""Benchmark suites: one process, same prompts, ordinary run folders compared by the report, never overwritten."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from specbench import bench
from specbench.config import conf_dir
from specbench.errors import ConfigError
from specbench.report import compare, read, view
from tests.helpers import exit_code


def test_smoke_suite_writes_ordinary_run_folders_and_prints_the_reports_table(tmp_path, shared_data, capsys):
    """AR vs HF generate on the tiny model: one run folder per entry, paired with the baseline entry by
    the report, identical greedy outputs; a second call writes a second session, never over the first."""
    args = ["smoke", "--out", str(tmp_path), f"data_dir={shared_data}"]
    assert bench.main(args) == 0 and bench.main(args) == 0
    sessions = sorted((tmp_path / "smoke").iterdir())
    assert len(sessions) == 2
    folders = sorted(path.parent.relative_to(sessions[0]).as_posix() for path in sessions[0].rglob("summary.json"))
    assert folders == ["ar/r0", "ar_seed=1/r0", "ar_seed=2/r0", "hf_generate/r0"]
    summary = json.loads((sessions[0] / "ar_seed=2" / "r0" / "summary.json").read_text())
    assert summary["bench"] == {
        "suite": "smoke",
        "session": sessions[0].name,
        "entry": "ar seed=2",
        "baseline": "ar",
        "index": 3,
    }
    assert summary["status"] == "complete" and summary["sampling"]["seed"] == 2 and summary["n_samples"] == 2
    assert summary["environment"]["torch_threads"] >= 1
    rows = view.table([sessions[0]], repeats=True, view="steps").set_index("entry")
    assert list(rows.index) == ["ar", "hf_generate", "ar seed=1", "ar seed=2"]  # suite order
    assert rows.loc["ar", "speedup"] == 1.0 and rows.loc["ar", "overhead"] == 1.0
    assert (rows["exact_match_rate"] == 1.0).all()  # greedy: seeds change nothing
    assert rows["overhead"].isna()["hf_generate"]  # HF generate has no per-step timing
    assert "tok/step" in capsys.readouterr().out


def test_rounds_are_repeats_paired_round_by_round(tmp_path, shared_data):
    """--rounds 2: two repeats per entry; the report merges them into one row over 4 generations."""
    assert (
        bench.main(
            [
                "smoke",
                "--rounds",
                "2",
                "--limit",
                "1",
                "--out",
                str(tmp_path),
                f"data_dir={shared_data}",
                "max_new_tokens=4",
            ]
        )
        == 0
    )
    session = next((tmp_path / "smoke").iterdir())
    assert sorted(p.name for p in (session / "ar").iterdir()) == ["r0", "r1"]
    runs, samples = read.load([session], repeats=True)
    assert set(runs["n_records"]) == {2} and set(runs["repeat"]) == {"all"}
    pairs = compare.paired_samples(runs, samples)
    assert pairs.groupby(["run_dir", "repeat"]).size().tolist() == [1] * 2 * len(runs)  # one per run and round
    ar_wall = {record["repeat"]: record["wall_s"] for record in samples[samples["entry"] == "ar"].to_dict("records")}
    assert all(row["ar_wall_s"] == ar_wall[row["repeat"]] for row in pairs.to_dict("records"))  # same round's AR


LEGACY_RECORD = {
    "round": 0,
    "sample_id": "HumanEval/0",
    "new_tokens": 3,
    "wall_s": 0.3,
    "prefill_s": 0.1,
    "target_forwards": 2,
    "draft_tokens": [0, 0],
    "step_s": [0.1, 0.1],
    "verify_s": [0.09, 0.09],
    "output_ids": [5, 6, 7],
    "drafter_stats": {},
}
"""One generation in the earlier single-JSON results format (the bench converts such files)."""
LEGACY_ENTRY = {"overrides": ["method=ar"], "method": {"name": "ar", "engine": "loop", "lossless": True}}
LEGACY_PAYLOAD = {
    "suite": "toy",
    "model": "m",
    "dataset": "humaneval",
    "prompts": 1,
    "rounds": 1,
    "max_new_tokens": 3,
    "temperature": 0.0,
    "environment": {"device_name": "cpu", "dtype": "float32"},
    "rows": [{"label": "ar", "speedup": 1.0}],
    "entries": {"ar": LEGACY_ENTRY},
    "records": {"ar": [LEGACY_RECORD]},
}
"""A results file of that format with one entry."""


def test_old_single_json_results_convert_to_run_folders(tmp_path):
    """A results file of the earlier format becomes a session of run folders the report reads alike."""
    payload = {
        **LEGACY_PAYLOAD,
        "rows": [{"label": "ar", "speedup": 1.0}, {"label": "ar seed=1", "speedup": 0.9}],
        "entries": {"ar": LEGACY_ENTRY, "ar seed=1": {**LEGACY_ENTRY, "overrides": ["method=ar", "seed=1"]}},
        "records": {"ar": [LEGACY_RECORD], "ar seed=1": [{**LEGACY_RECORD, "wall_s": 0.6}]},
    }
    old = tmp_path / "m_cpu_float32_20261121T144653Z.json"
    old.write_text(json.dumps(payload))
    assert bench.main(["--convert", str(old), "--out", str(tmp_path / "out")]) == 0
    session = tmp_path / "out" / "toy" / old.stem
    rows = view.table([session], repeats=True, view="steps").set_index("entry")
    assert rows.loc["ar seed=1", "speedup"] == pytest.approx(0.5) and rows.loc["ar seed=1", "exact_match_rate"] == 1
    summary = json.loads((session / "ar_seed=1" / "r0" / "summary.json").read_text())
    assert summary["converted_from"] == old.name and summary["started_at"] == "2026-11-21T14:46:53+00:00"


def test_unknown_suite_lists_the_valid_ones(capsys):
    """A typo gets the list of suites and exit code 2."""
    assert exit_code(bench.main, ["nope"]) == 2
    assert "smoke" in capsys.readouterr().err


def test_every_shipped_suite_expands_and_a_label_cut_at_a_comma_is_refused():
    """Shipped suites have only known entry keys; an unquoted comma in a flow-mapping label is caught."""
    for path in sorted((conf_dir() / "bench").glob("*.yaml")):
        assert bench.expand_entries(OmegaConf.load(path)), path.name
    suite = OmegaConf.create("entries:\n  - {label: eagle (tree, 25), overrides: [method=eagle]}\n")
    with pytest.raises(ConfigError, match="unknown keys.*quote the label"):
        bench.expand_entries(suite)


def test_grid_labels_must_be_distinct_and_model_fixed():
    """Grid entries need placeholders in their label; entries may not switch the model."""
    suite = OmegaConf.create({"entries": [{"label": "x", "overrides": ["method=ar"], "grid": {"seed": [1, 2]}}]})
    with pytest.raises(ConfigError, match="duplicate entry labels"):
        bench.expand_entries(suite)
    suite = OmegaConf.create(
        {
            "model": "tiny_llama",
            "dataset": "humaneval",
            "entries": [
                {"label": "a", "overrides": ["method=ar"]},
                {"label": "b", "overrides": ["model=smollm2_135m"]},
            ],
        }
    )
    args = bench.parse_args(["smoke"])
    with pytest.raises(ConfigError, match="must not change the model"):
        bench.entry_configs(suite, bench.expand_entries(suite), args)


@pytest.mark.slow
@pytest.mark.parametrize("name", bench.suite_names())
def test_every_stored_suite_composes_every_entry(name):
    """Each conf/bench suite's entries compose into run configs (a typo in a suite fails here, not after a run)."""
    suite = bench.load_suite(name)
    configs = bench.entry_configs(suite, bench.expand_entries(suite), bench.parse_args([name]))
    assert len(configs) >= 2 and all(cfg.method.name for cfg in configs.values())


def test_entries_option_keeps_the_named_entries_and_the_baseline():
    """--entries runs part of a suite: the named entries in suite order, the baseline always; a typo lists them."""
    suite = bench.load_suite("hardware_aware")
    entries = bench.expand_entries(suite)
    args = bench.parse_args(["hardware_aware", "--entries", "pld auto", "medusa"])
    kept = bench.chosen_entries(entries, args.entries, "ar", "hardware_aware")
    assert [entry.label for entry in kept] == ["ar", "medusa", "pld auto"]
    assert bench.chosen_entries(entries, None, "ar", "hardware_aware") == entries
    with pytest.raises(ConfigError, match="'pld atuo'.*its entries"):
        bench.chosen_entries(entries, ["pld atuo"], "ar", "hardware_aware")
