"""Aggregate metrics over samples.jsonl records, in the vocabulary of docs/metrics.md.

Conventions (papers differ; see docs/metrics.md#tokens-per-step):
- tokens_per_step (= DE = MAL = acceleration rate = EDL) counts the tokens emitted by verify steps
  divided by those steps. The prefill emits the first token and is not a step, so AR reads exactly
  1.0. ``tokens_per_forward`` is the LADE / Self-Draft convention: all generated tokens divided by
  all target forwards, prefill included.
- Speedup is never computed here: the report joins a run with its matching AR run.
- The step breakdown (``<phase>_share``: draft, verify, accept, update) is each phase's share of the
  step time, over the records timed with ``step_breakdown`` on; the rest is the loop's own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterable

from specbench.schema import PHASES, SUMMARY_FIELDS, SUMMARY_VERSION


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def aggregate(records: Iterable[dict]) -> dict:
    """Throughput (total/total and mean per sample), tokens/step, acceptance, latency per step."""
    records = list(records)
    new = sum(r["new_tokens"] for r in records)
    wall = sum(r["wall_s"] for r in records)
    steps = sum(r["target_forwards"] for r in records)
    step_tokens = sum(r["new_tokens"] - 1 for r in records if r["new_tokens"] > 0)
    drafted = sum(sum(r["draft_tokens"]) for r in records if r.get("draft_tokens") is not None)
    stepped = [r for r in records if r.get("step_s") is not None]
    timed = [r for r in records if r.get("verify_s") is not None]
    timed_step_s = sum(sum(r["step_s"]) for r in timed)
    outside_s = timed_step_s - sum(sum(r["verify_s"]) for r in timed)
    per_sample = [r["new_tokens"] / r["wall_s"] for r in records if r["wall_s"] > 0]
    tokens_per_step = _ratio(step_tokens, steps)
    return {
        "n_records": len(records),
        "new_tokens": new,
        "wall_s": wall,
        "prefill_s": sum(r["prefill_s"] for r in records),
        "target_forwards": steps,
        "throughput_total": _ratio(new, wall),
        "throughput_mean": _ratio(sum(per_sample), len(per_sample)),
        "tokens_per_step": tokens_per_step,
        "tokens_per_forward": _ratio(new, steps + len(records)),
        "accepted_per_step": None if tokens_per_step is None else tokens_per_step - 1,
        "draft_efficiency": _ratio(step_tokens - steps, drafted) if drafted else None,
        "step_latency_s": _ratio(sum(sum(r["step_s"]) for r in stepped), sum(r["target_forwards"] for r in stepped)),
        "outside_forward_share": _ratio(outside_s, timed_step_s),
        "outside_forward_s": _ratio(outside_s, sum(r["target_forwards"] for r in timed)),
        **phase_shares(records),
    }


def phase_shares(records: list[dict]) -> dict:
    """``<phase>_share``: the phase's time over the step time, for records with the step breakdown."""
    broken = [r for r in records if r.get("draft_s") is not None]
    step_s = sum(sum(r["step_s"]) for r in broken)
    return {f"{phase}_share": _ratio(sum(sum(r[f"{phase}_s"]) for r in broken), step_s) for phase in PHASES}


def run_summary(records: list[dict], **fields) -> dict:
    """summary.json of a run from its records: ``n_samples`` and ``metrics`` computed here, ``schema`` stamped,
    every other SUMMARY_FIELDS entry given by the writer (extras such as ``model_path`` kept).

    The one builder of run summaries (the runner, the bench's converter of old results, test fixtures), so
    every writer agrees on the schema; a writer that leaves a field out gets a ValueError naming it.
    """
    computed = {
        "schema": SUMMARY_VERSION,
        "n_samples": len({record["sample_id"] for record in records}),
        "metrics": aggregate(records),
    }
    missing = [name for name in SUMMARY_FIELDS if name not in computed and name not in fields]
    if missing:
        raise ValueError(f"a run summary needs the field(s) {missing} (see specbench.schema.SUMMARY_FIELDS)")
    clashing = sorted(set(fields) & set(computed))
    if clashing:
        raise ValueError(f"{clashing} are computed from the records, not given")
    return {**computed, **fields}
