"""report --divergences --diagnose: a tampered output is flagged as a bug (exit 1), identical runs pass."""

from __future__ import annotations

import json

import pytest

from specbench.config import compose_config
from specbench.diagnosis import diagnose
from specbench.report.__main__ import main as report_main
from specbench.report.read import load
from specbench.runner import Runner


def tiny_run(out, method):
    """Two HumanEval samples, 10 tokens, on the tiny random model."""
    cfg = compose_config(
        "model=tiny_llama",
        f"method={method}",
        "limit=2",
        "max_new_tokens=10",
        "warmup=0",
        "progress=false",
        "data_dir=null",
        f"output_dir={out}",
    )
    return Runner(cfg).run()


def test_identical_runs_pass_and_a_tampered_token_is_a_bug(tmp_path, capsys):
    """HF generate equals AR (exit 0); changing one stored token gives a large logit gap -> BUG, exit 1."""
    ar, other = tiny_run(tmp_path / "ar", "ar"), tiny_run(tmp_path / "hf", "hf_generate")
    report_main([str(ar), str(other), "--divergences", "--diagnose"])
    assert "no compared sample differs from its AR baseline" in capsys.readouterr().out
    path = other / "samples.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[1]["output_ids"][4] = (lines[1]["output_ids"][4] + 1) % 97
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = diagnose(*load([ar, other]), max_samples=5, gap_limit=1e-4)
    assert table[["sample_id", "first_divergence", "verdict"]].values.tolist() == [[lines[1]["sample_id"], 4, "BUG"]]
    assert table["float64_agrees"].iloc[0] and abs(table["logit_gap"].iloc[0]) > 1e-4
    with pytest.raises(SystemExit) as stop:
        report_main([str(ar), str(other), "--divergences", "--diagnose", "--gap", "1e-4"])
    assert stop.value.code == 1 and "BUG" in capsys.readouterr().out


def test_diagnose_needs_divergences():
    with pytest.raises(SystemExit) as stop:
        report_main(["results", "--diagnose"])
    assert stop.value.code == 2
