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

from collections.abc import Iterable, Sequence

import numpy as np

from specbench.costmodel import LatencyCurve, ideal_speedup, modelled_ms_per_token, nearest_curve, step_costs
from specbench.schema import PHASES, SUMMARY_FIELDS, SUMMARY_VERSION

PERCENTILES = (50, 90, 99)
"""The latency percentiles every run reports (``<quantity>_p<q>_s``)."""


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def machine_seconds(record: dict) -> float:
    """The record's share of the machine's time: its batch's wall time over the batch's requests (its own wall time
    when it ran alone, or was written before batches existed). Summed over a run, each batch counts once."""
    if record.get("batch_size") is None:
        return record["wall_s"]
    return record["batch_wall_s"] / record["batch_size"]


def ratio_parts(record: dict) -> dict[str, tuple[float, float]]:
    """Each total/total metric's numerator and denominator in one record (the run's value = sum of numerators /
    sum of denominators): throughput (tokens / the machine's seconds: ``machine_seconds``) and tokens per step
    (tokens after the prefill's / verify forwards). ``aggregate`` and the bootstrap intervals of the report both
    sum these."""
    return {
        "throughput_total": (record["new_tokens"], machine_seconds(record)),
        "tokens_per_step": (max(record["new_tokens"] - 1, 0), record["target_forwards"]),
    }


RATIO_METRICS = ("throughput_total", "tokens_per_step")
"""The metrics ``ratio_parts`` splits."""


def summed_parts(records: list[dict]) -> dict[str, tuple[float, float]]:
    """Each ``ratio_parts`` metric's numerators and denominators summed over ``records``."""
    parts = [ratio_parts(r) for r in records]
    return {metric: (sum(p[metric][0] for p in parts), sum(p[metric][1] for p in parts)) for metric in RATIO_METRICS}


def aggregate(records: Iterable[dict]) -> dict:
    """Throughput (total/total and mean per sample), tokens/step, acceptance, latency per step."""
    records = list(records)
    check_acceptance(records)
    totals = summed_parts(records)
    new, wall = totals["throughput_total"]
    step_tokens, steps = totals["tokens_per_step"]
    drafted = sum(sum(r["draft_tokens"]) for r in records if r.get("draft_tokens") is not None)
    stepped = [r for r in records if r.get("step_s") is not None]
    timed = [r for r in records if r.get("verify_s") is not None]
    timed_step_s = sum(sum(r["step_s"]) for r in timed)
    outside_s = timed_step_s - sum(sum(r["verify_s"]) for r in timed)
    per_sample = [r["new_tokens"] / r["wall_s"] for r in records if r["wall_s"] > 0]
    tokens_per_step = _ratio(step_tokens, steps)
    return {
        "n_records": len(records),
        "prompt_tokens_mean": _ratio(sum(r.get("prompt_tokens") or 0 for r in records), len(records))
        if all(r.get("prompt_tokens") is not None for r in records)
        else None,
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
        "accepted_per_draft_forward": accepted_per_draft_forward(records, step_tokens - steps),
        "step_latency_s": _ratio(sum(sum(r["step_s"]) for r in stepped), sum(r["target_forwards"] for r in stepped)),
        "outside_forward_share": _ratio(outside_s, timed_step_s),
        "outside_forward_s": _ratio(outside_s, sum(r["target_forwards"] for r in timed)),
        **phase_shares(records),
        "side_branch_share": side_branch_share(records),
        **drafting_metrics(records),
        **latency_percentiles(records),
        **energy_per_token(records),
    }


DRAFT_FORWARD_COUNTERS = ("draft_forwards", "head_forwards")
"""The ``drafter_stats`` counters of a drafter's own forwards this generation: a draft model's, an EAGLE head's."""


def draft_forwards(record: dict) -> int | None:
    """The draft forwards of one record (a draft model's or a head's), None when its drafter counts none."""
    stats = record.get("drafter_stats") or {}
    counts = [stats[key] for key in DRAFT_FORWARD_COUNTERS if isinstance(stats.get(key), int)]
    return sum(counts) if counts else None


def accepted_per_draft_forward(records: list[dict], accepted: float) -> float | None:
    """The run's accepted drafted tokens over its draft forwards (docs/metrics.md#accepted-per-draft-forward): what
    one forward of the drafter buys; None unless every record counts its draft forwards and there was one."""
    forwards = [draft_forwards(r) for r in records]
    if not records or any(count is None for count in forwards):
        return None
    return _ratio(accepted, sum(count for count in forwards if count is not None))


def phase_shares(records: list[dict]) -> dict:
    """``<phase>_share``: the phase's time over the step time, for records with the step breakdown."""
    broken = [r for r in records if r.get("draft_s") is not None]
    step_s = sum(sum(r["step_s"]) for r in broken)
    return {f"{phase}_share": _ratio(sum(sum(r[f"{phase}_s"]) for r in broken), step_s) for phase in PHASES}


def percentiles(values: list[float], name: str) -> dict:
    """``<name>_p50_s`` ... of ``values`` (linear interpolation between order statistics; None when empty)."""
    points = np.percentile(values, PERCENTILES).tolist() if values else [None] * len(PERCENTILES)
    return {f"{name}_p{q}_s": point for q, point in zip(PERCENTILES, points, strict=True)}


def latency_percentiles(records: list[dict]) -> dict:
    """TTFT (the prefill, per record), time per output token (per record) and step latency (per step)."""
    decoding = [r for r in records if r["new_tokens"] > 1]
    return {
        **percentiles([r["prefill_s"] for r in records], "ttft"),
        "tpot_s": _ratio(
            sum(r["wall_s"] - r["prefill_s"] for r in decoding), sum(r["new_tokens"] - 1 for r in decoding)
        ),
        **percentiles([(r["wall_s"] - r["prefill_s"]) / (r["new_tokens"] - 1) for r in decoding], "tpot"),
        **percentiles([s for r in records for s in r.get("step_s") or []], "step"),
    }


def energy_per_token(records: list[dict]) -> dict:
    """Joules of the generations that read an energy counter, per token they generated (None: no counter)."""
    metered = [r for r in records if r.get("energy_j") is not None]
    energy = sum(r["energy_j"] for r in metered)
    return {
        "energy_j": energy if metered else None,
        "joules_per_token": _ratio(energy, sum(r["new_tokens"] for r in metered)) if metered else None,
    }


def step_traces(records: Iterable[dict]) -> list[tuple[int, int, int | None, bool | None]]:
    """Every step of the records as (accepted drafted tokens, drafted nodes, tree depth, side branch).

    Depth and side branch are None for records written before they were traced (``specbench.samples/3``).
    """
    steps: list[tuple[int, int, int | None, bool | None]] = []
    for record in records:
        lengths = record.get("accept_lengths")
        if not lengths:  # no steps, or not traced (hf_generate, results converted from the old bench format)
            continue
        depths = record.get("draft_depth") or [None] * len(lengths)
        sides = record.get("side_branch") or [None] * len(lengths)
        steps += zip([n - 1 for n in lengths], record["draft_tokens"], depths, sides, strict=True)
    return steps


def acceptance_by_depth(records: Iterable[dict]) -> list[dict]:
    """Per draft depth d (0 = nothing accepted): steps whose tree reached d, the share of them that accepted
    exactly d drafted tokens, the joint rate P(accepted >= d | reached d) and the conditional rate
    P(accepted >= d | accepted >= d-1, reached d); over every step, reached or not: ``marginal`` P(accepted >= d)
    (``marginal_rates``: tokens per step = 1 + their sum, ``check_acceptance``) and ``share``, the histogram of
    accepted drafted tokens per step. A step of unknown depth counts as reaching every depth if it drafted anything
    (exact for fixed-depth drafts). Empty for runs without drafts.
    """
    records = list(records)
    steps = [(accepted, reach(drafted, depth)) for accepted, drafted, depth, _ in step_traces(records)]
    if not any(depth for _, depth in steps):
        return []
    deepest = int(max([accepted for accepted, _ in steps] + [depth for _, depth in steps if depth != np.inf]))
    marginal: list[float] = [*marginal_rates(records).tolist(), *[0.0] * (deepest + 1)]  # 0 beyond the most accepted
    rows = []
    for d in range(deepest + 1):
        reached = [accepted for accepted, depth in steps if depth >= d]
        survived = sum(accepted >= d for accepted in reached)
        before = sum(accepted >= d - 1 for accepted in reached)
        rows.append(
            {
                "depth": d,
                "steps": len(reached),
                "exactly": _ratio(sum(accepted == d for accepted in reached), len(reached)),
                "joint": _ratio(survived, len(reached)) if d else None,
                "conditional": _ratio(survived, before) if d else None,
                "marginal": marginal[d - 1] if d else None,
                "share": _ratio(sum(accepted == d for accepted, _ in steps), len(steps)),
            }
        )
    return rows


ACCEPTANCE_TOLERANCE = 1e-9
"""How far tokens per step may sit from 1 + the sum of the marginal rates (float rounding only)."""


def marginal_rates(records: Iterable[dict]) -> np.ndarray:
    """P(accepted >= d) over every traced step, for d = 1 .. the most accepted drafted tokens (the histogram of
    accepted drafted tokens per step, summed from the top): tokens per step = 1 + their sum."""
    accepted = [n - 1 for r in records for n in r.get("accept_lengths") or []]
    if not accepted:
        return np.zeros(0)
    counts = np.bincount(accepted)  # steps that accepted exactly d drafted tokens
    return (counts[::-1].cumsum()[::-1] / len(accepted))[1:]


def check_acceptance(records: list[dict]) -> None:
    """Refuse records whose tokens per step (their tokens after the prefill over their target forwards) is not 1 + the
    sum of the marginal acceptance rates of their traced steps (``marginal_rates``): the per-step trace then
    disagrees with what the run emitted, a bug of the drafter or of its record (ValueError naming both numbers)."""
    traced = [r for r in records if r.get("accept_lengths") is not None]
    tokens, steps = summed_parts(traced)["tokens_per_step"]
    if not steps:
        return
    per_step, from_rates = tokens / steps, 1 + float(marginal_rates(traced).sum())
    if abs(per_step - from_rates) > ACCEPTANCE_TOLERANCE * max(1.0, per_step):
        raise ValueError(
            f"tokens per step {per_step:.6f} (new tokens after the prefill over target forwards) is not 1 + the sum "
            f"of the marginal acceptance rates ({from_rates:.6f}) of the same records: their accept_lengths do not "
            "describe what they emitted (a drafter or record bug)"
        )


REQUEST_PERCENTILES = (10, 50, 90)
"""The percentiles of the per-request acceptance length each run reports (``acceptance_length_request_p<q>``)."""
DRAFTING_METRICS = (
    "acceptance_length",
    "acceptance_length_per_request",
    *(f"acceptance_length_request_p{q}" for q in REQUEST_PERCENTILES),
    "drafting_share",
    "oracle_tokens_per_step",
    "oracle_share",
    "draft_length_bound",
)


def drafting_metrics(records: list[dict]) -> dict:
    """Acceptance per drafting step and per request, and how far from perfect drafting (docs/metrics.md), over the
    traced records (None where nothing was traced or drafted):

    - ``acceptance_length``: tokens per step over the steps that drafted (vLLM's mean acceptance length);
    - ``acceptance_length_per_request``: the mean over requests of each request's tokens per step, and the
      distribution's ``acceptance_length_request_p<q>`` (``REQUEST_PERCENTILES``);
    - ``drafting_share``: the share of steps that drafted anything;
    - ``oracle_tokens_per_step``: the tokens per step had every drafted token been right (1 + each step's draft depth,
      its drafted nodes where the depth is not traced), and ``oracle_share`` = tokens per step over it;
    - ``draft_length_bound``: the tokens per step a drafter of the run's deepest draft K could reach at best on these
      outputs (every step K + 1 tokens, the last one what is left: (n - 1) / ceil((n - 1) / (K + 1)) summed).
    """
    traced = [r for r in records if r.get("accept_lengths")]
    steps = [
        (1 + accepted, drafted, drafted if depth is None else depth)
        for accepted, drafted, depth, _ in step_traces(traced)
    ]
    if not steps:
        return dict.fromkeys(DRAFTING_METRICS)
    drafting = [length for length, drafted, _ in steps if drafted]
    oracle = float(np.mean([1 + depth for _, _, depth in steps]))
    per_step = float(np.mean([length for length, _, _ in steps]))
    deepest = max(depth for _, _, depth in steps)
    emitted = [r["new_tokens"] - 1 for r in traced if r["new_tokens"] > 1]
    per_request = [float(np.mean(r["accept_lengths"])) for r in traced]
    spread: list[float] = np.percentile(per_request, REQUEST_PERCENTILES).tolist()
    return {
        "acceptance_length": float(np.mean(drafting)) if drafting else None,
        "acceptance_length_per_request": float(np.mean(per_request)),
        **{f"acceptance_length_request_p{q}": value for q, value in zip(REQUEST_PERCENTILES, spread, strict=True)},
        "drafting_share": len(drafting) / len(steps),
        "oracle_tokens_per_step": oracle,
        "oracle_share": per_step / oracle,
        "draft_length_bound": _ratio(sum(emitted), sum(-(-n // (deepest + 1)) for n in emitted)),
    }


def reach(drafted: int, depth: int | None) -> float:
    """How deep a step's tree reached: its depth, or for an untraced step everywhere if it drafted at all."""
    if depth is not None:
        return depth
    return np.inf if drafted else 0


def side_branch_share(records: Iterable[dict]) -> float | None:
    """Of the steps whose tree branched (more nodes than depth) and that accepted a drafted token, the share
    whose accepted path used a child other than its parent's first-listed (top-ranked) one."""
    branched = [
        side
        for accepted, drafted, depth, side in step_traces(records)
        if depth is not None and drafted > depth and accepted > 0
    ]
    return _ratio(sum(bool(side) for side in branched), len(branched)) if branched else None


COST_METRICS = ("ideal_speedup", "verify_ms", "modelled_ms_per_token", "curve_context")


def cost_metrics(records: list[dict], curves: Sequence[LatencyCurve]) -> dict:
    """The run's steps priced with the latency curve nearest its mean context: ``verify_ms`` (mean T(k) per
    step), ``ideal_speedup`` (tau * T(1) / mean T(k)) and ``modelled_ms_per_token`` ((mean T(k) + the measured
    time outside the forward per step) / tau: the cost model's price of a token of this run, None without the
    step breakdown); None without a curve or without traced steps."""
    priced = [r for r in records if r.get("accept_lengths") and r.get("draft_tokens") is not None]
    if not curves or not priced:
        return dict.fromkeys(COST_METRICS)
    context = np.mean([(r["prompt_tokens"] or 0) + r["new_tokens"] / 2 for r in priced])
    curve = nearest_curve(curves, float(context))
    timed = all(r.get("verify_s") is not None and r.get("step_s") is not None for r in priced)
    costs = step_costs(
        [n for r in priced for n in r["accept_lengths"]],
        [n for r in priced for n in r["draft_tokens"]],
        [d for r in priced for d in (r.get("draft_depth") or [None] * len(r["draft_tokens"]))],
        [w for r in priced for w in (r.get("verify_tokens") or [None] * len(r["draft_tokens"]))],
        [s - v for r in priced for s, v in zip(r["step_s"], r["verify_s"], strict=True)]
        if timed
        else [0.0] * sum(len(r["accept_lengths"]) for r in priced),
        curve,
    )
    return {
        "ideal_speedup": ideal_speedup(costs, curve),
        "verify_ms": costs.verify_ms,
        "modelled_ms_per_token": modelled_ms_per_token(costs) if timed else None,
        "curve_context": curve.context_length,
    }


TRAFFIC_METRICS = ("step_bytes", "achieved_bandwidth", "bandwidth_share", "floor_ms_per_token")


def traffic_metrics(records: list[dict], traffic: dict | None) -> dict:
    """The memory traffic of the run's steps against the device's peak bandwidth (docs/metrics.md#bandwidth-share).

    A step at context c (the prompt and the tokens committed before it) reads the weights once and c tokens' keys and
    values: ``weight_bytes + kv_bytes_per_token * c`` (``traffic``, the summary's ``memory_traffic``). Over the
    records with per-step times: ``step_bytes`` (mean per step), ``achieved_bandwidth`` (bytes over step time, B/s),
    ``bandwidth_share`` (that over ``peak_bytes_per_s``) and ``floor_ms_per_token`` (the bytes at peak bandwidth, per
    token the steps emitted: no step of this run could be faster); None without ``traffic`` or steps.
    """
    timed = [r for r in records if r.get("step_s") and r.get("accept_lengths")]
    if not traffic or not timed:
        return dict.fromkeys(TRAFFIC_METRICS)
    contexts = [  # the cached tokens before each step
        (r["prompt_tokens"] or 0) + before for r in timed for before in np.cumsum([0, *r["accept_lengths"][:-1]])
    ]
    total = len(contexts) * traffic["weight_bytes"] + traffic["kv_bytes_per_token"] * float(np.sum(contexts))
    seconds = sum(sum(r["step_s"]) for r in timed)
    emitted = sum(sum(r["accept_lengths"]) for r in timed)
    achieved = _ratio(total, seconds)
    return {
        "step_bytes": total / len(contexts),
        "achieved_bandwidth": achieved,
        "bandwidth_share": None if achieved is None else achieved / traffic["peak_bytes_per_s"],
        "floor_ms_per_token": 1e3 * total / traffic["peak_bytes_per_s"] / emitted if emitted else None,
    }


def run_summary(records: list[dict], **fields) -> dict:
    """summary.json of a run from its records: ``n_samples`` and ``metrics`` computed here, ``schema`` stamped,
    every other SUMMARY_FIELDS entry given by the writer (extras such as ``model_path`` kept); ``metrics`` adds the
    bandwidth share of the writer's ``memory_traffic``.

    The one builder of run summaries (the runner, the bench's converter of old results, test fixtures), so
    every writer agrees on the schema; a writer that leaves a field out gets a ValueError naming it.
    """
    computed = {
        "schema": SUMMARY_VERSION,
        "n_samples": len({record["sample_id"] for record in records}),
        "metrics": {**aggregate(records), **traffic_metrics(records, fields.get("memory_traffic"))},
    }
    missing = [name for name in SUMMARY_FIELDS if name not in computed and name not in fields]
    if missing:
        raise ValueError(f"a run summary needs the field(s) {missing} (see specbench.schema.SUMMARY_FIELDS)")
    clashing = sorted(set(fields) & set(computed))
    if clashing:
        raise ValueError(f"{clashing} are computed from the records, not given")
    return {**computed, **fields}
