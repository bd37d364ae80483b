"""scripts/diagnose_divergence.py: a tampered output is flagged as a bug, identical runs pass."""

from __future__ import annotations

import importlib.util
import json

from specbench.config import compose_config
from specbench.runner import Runner
from tests.conftest import ROOT

SPEC = importlib.util.spec_from_file_location("diagnose_divergence", ROOT / "scripts" / "diagnose_divergence.py")
diagnose = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(diagnose)


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
    assert diagnose.main([str(ar), str(other)]) == 0
    assert "no divergences" in capsys.readouterr().out
    path = other / "samples.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[1]["output_ids"][4] = (lines[1]["output_ids"][4] + 1) % 97
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = diagnose.diagnose([ar, other], max_samples=5, gap_limit=1e-4)
    assert table[["sample_id", "first_divergence", "verdict"]].values.tolist() == [[lines[1]["sample_id"], 4, "BUG"]]
    assert table["float64_agrees"].iloc[0] and abs(table["logit_gap"].iloc[0]) > 1e-4
