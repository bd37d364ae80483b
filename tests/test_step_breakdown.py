"""The switchable step breakdown: draft / verify / accept / update times that sum to the step time."""

import json

import pytest
import torch

from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.core.loop import breakdown_enabled
from specbench.engines import build_engine
from specbench.errors import ConfigError
from specbench.metrics import aggregate
from specbench.models.loading import load_model
from specbench.runner import Runner
from specbench.schema import ADDED_FIELDS, PHASES, SCHEMA_VERSION, upgrade_record, validate_record

PROMPT = [5, 9, 23, 5, 9, 23, 5, 9, 41, 7, 5, 9, 23]
# That every method's phases cover its step time is a conformance check (specbench.conformance, "breakdown").


@pytest.fixture(scope="module")
def tiny_lm():
    cfg = compose_config("model=tiny_llama")
    return load_model(cfg.model, torch.device("cpu"), torch.float32)


def generate(lm, method: str, step_breakdown, max_new_tokens: int = 48):
    """One greedy generation of ``method`` on the tiny model with the breakdown set as given."""
    cfg = compose_config("model=tiny_llama", f"method={method}")
    engine = build_engine(cfg.method, lm, Sampling(), step_breakdown)
    with torch.inference_mode():
        return engine.generate(PROMPT, max_new_tokens)


@pytest.mark.parametrize("method", ["ar", "lookahead", "spede"])
def test_breakdown_off_records_step_times_only_and_changes_no_token(tiny_lm, method):
    """Switched off, the phases are not measured (None), the steps still are, and the output is the same."""
    on, off = generate(tiny_lm, method, True), generate(tiny_lm, method, False)
    assert off.output_ids == on.output_ids
    assert len(off.step_s) == off.target_forwards
    assert all(getattr(off, f"{phase}_s") is None for phase in PHASES)


def test_auto_is_on_for_cpu_and_off_for_cuda():
    """auto turns the breakdown on only where synchronizing is free; bad values name the choices."""
    assert breakdown_enabled("auto", torch.device("cpu"))
    assert not breakdown_enabled("auto", torch.device("cuda"))
    assert breakdown_enabled(True, torch.device("cuda")) and not breakdown_enabled(False, torch.device("cpu"))
    with pytest.raises(ConfigError, match="true, false or auto"):
        breakdown_enabled("sometimes", torch.device("cpu"))


def run_records(tmp_path, *overrides) -> tuple[list[dict], dict]:
    """samples.jsonl records and summary metrics of a 2-sample Lookahead run on the tiny model."""
    cfg = compose_config(
        "model=tiny_llama",
        "method=lookahead",
        "max_new_tokens=16",
        "limit=2",
        "warmup=0",
        "progress=false",
        "data_dir=null",
        f"output_dir={tmp_path}",
        *overrides,
    )
    out = Runner(cfg).run()
    lines = (out / "samples.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], json.loads((out / "summary.json").read_text())["metrics"]


def test_runner_records_the_breakdown_and_its_shares(tmp_path):
    """Runs write the phase times per step and the summary's phase shares (the default on CPU)."""
    records, metrics = run_records(tmp_path)
    for record in records:
        validate_record(record)
        assert record["schema"] == SCHEMA_VERSION
        assert all(len(record[f"{phase}_s"]) == record["target_forwards"] for phase in PHASES)
    shares = [metrics[f"{phase}_share"] for phase in PHASES]
    assert all(0 < share < 1 for share in shares) and sum(shares) == pytest.approx(1.0, abs=0.03)
    assert metrics["outside_forward_s"] > 0
    assert metrics["outside_forward_share"] == pytest.approx(1 - metrics["verify_share"], abs=1e-9)


def test_runner_without_breakdown_writes_nulls(tmp_path):
    """step_breakdown=false: phase fields null, shares and outside-forward metrics unknown (None)."""
    records, metrics = run_records(tmp_path, "step_breakdown=false")
    assert all(record[f"{phase}_s"] is None for record in records for phase in PHASES)
    assert all(len(record["step_s"]) == record["target_forwards"] for record in records)
    assert metrics["outside_forward_share"] is None and metrics["draft_share"] is None
    assert metrics["step_latency_s"] > 0


def test_bad_step_breakdown_is_rejected_before_loading(tmp_path):
    """A typo in step_breakdown is a ConfigError naming the choices, before any model loads."""
    cfg = compose_config("model=tiny_llama", "step_breakdown=yes please", f"output_dir={tmp_path}")
    with pytest.raises(ConfigError, match="step_breakdown must be true, false or auto"):
        Runner(cfg)


def test_records_of_the_previous_schema_are_read_with_the_new_fields_null():
    """specbench.samples/1 records (before the breakdown) validate and upgrade with null phase fields."""
    old = {
        "schema": "specbench.samples/1",
        "new_tokens": 3,
        "wall_s": 1.0,
        "prefill_s": 0.1,
        "target_forwards": 2,
        "draft_tokens": [1, 1],
        "step_s": [0.4, 0.5],
        "verify_s": [0.3, 0.4],
    }
    sample_fields = {
        "run_id": "r",
        "sample_id": "s",
        "turn": 0,
        "n_turns": 1,
        "category": None,
        "fine_category": None,
        "prompt_tokens": 4,
        "output_ids": [1, 2, 3],
        "output_text": "",
        "accept_lengths": [1, 1],
        "stop_reason": "eos",
        "drafter_stats": {},
    }
    record = {**old, **sample_fields}
    validate_record(record)
    upgraded = upgrade_record(record)
    assert all(upgraded[name] is None for name in ADDED_FIELDS["specbench.samples/1"])
    metrics = aggregate([upgraded])
    assert metrics["outside_forward_share"] == pytest.approx(0.2 / 0.9)
    assert metrics["draft_share"] is None
    with pytest.raises(ValueError, match="schema 'specbench.samples/9'"):
        validate_record({**record, "schema": "specbench.samples/9"})
