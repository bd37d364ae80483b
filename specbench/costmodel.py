"""The cost model of a decoding step, from measurements: what a setting should gain on this hardware.

A step verifies k tokens (the root and k - 1 drafted nodes) in one target forward of measured latency
T(k) (``specbench.profile``), spends some time outside that forward (drafting, acceptance, drafter
updates: the step breakdown) and emits tau tokens. Against AR, which emits one token per step of
T(1) plus its own small overhead:

    ideal speedup     = tau * T(1) / mean_steps T(k)                  (the forward's cost only)
    predicted speedup = tau * (T(1) + o_AR) / (mean_steps T(k) + o)   (o: time per step outside the forward)

``choose_budget`` picks the budget whose calibration predicts the largest speedup. Everything here is a
pure function of a latency curve and per-step measurements (docs/metrics.md#cost-model).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class LatencyCurve:
    """Median latency (ms) of one target forward of n new tokens on ``context_length`` cached tokens, with the
    causal (chain) mask and with the 4-D tree mask; measured at ``num_tokens`` and interpolated between."""

    context_length: int
    num_tokens: tuple[int, ...]  # ascending, starting at 1
    chain_ms: tuple[float, ...]
    tree_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.num_tokens or self.num_tokens[0] != 1 or list(self.num_tokens) != sorted(set(self.num_tokens)):
            raise ValueError(f"a latency curve needs ascending distinct num_tokens from 1; got {self.num_tokens}")
        if not len(self.chain_ms) == len(self.tree_ms) == len(self.num_tokens):
            raise ValueError("a latency curve needs one chain and one tree latency per num_tokens")

    def at(self, n: float, chain: bool = False) -> float:
        """T(n) in ms: linear between measured points, extended along the last segment beyond the largest."""
        xs, ys = self.num_tokens, self.chain_ms if chain else self.tree_ms
        if len(xs) > 1 and n > xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + slope * (n - xs[-1])
        return float(np.interp(n, xs, ys))

    @property
    def step_ms(self) -> float:
        """T(1): the AR step's forward."""
        return self.chain_ms[0]

    def to_dict(self) -> dict:
        """JSON form (stored in run summaries and the profile cache)."""
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping) -> LatencyCurve:
        """The curve ``to_dict`` wrote."""
        return cls(
            int(data["context_length"]),
            tuple(int(n) for n in data["num_tokens"]),
            tuple(float(ms) for ms in data["chain_ms"]),
            tuple(float(ms) for ms in data["tree_ms"]),
        )

    def digest(self) -> str:
        """A short sha256 of the curve's numbers (recorded beside every choice made from it)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def curve_from_rows(rows: Sequence[Mapping], context_length: int) -> LatencyCurve:
    """The curve of one context length from ``specbench.profile`` rows (``num_tokens``, ``mask``, ``median_ms``)."""
    cells = {(r["num_tokens"], r["mask"]): r["median_ms"] for r in rows if r["context_length"] == context_length}
    num_tokens = tuple(sorted({n for n, _ in cells}))
    return LatencyCurve(
        context_length,
        num_tokens,
        tuple(cells[n, "chain"] for n in num_tokens),
        tuple(cells[n, "tree"] for n in num_tokens),
    )


def nearest_curve(curves: Sequence[LatencyCurve], context_length: float) -> LatencyCurve:
    """The curve measured at the context length closest to ``context_length`` (ratio, not difference)."""
    return min(curves, key=lambda curve: abs(np.log(curve.context_length / max(context_length, 1.0))))


@dataclass(frozen=True)
class StepCosts:
    """A setting's measured behaviour per decoding step: what the cost model needs of it."""

    steps: int
    tokens_per_step: float  # tau: tokens emitted per step (bonus included)
    verify_ms: float  # mean over steps of T(k_s) from the latency curve
    overhead_ms: float  # mean over steps of the measured time outside the verify forward
    forwards: Mapping[str, int] = field(default_factory=dict, compare=False)  # steps by forward shape (shape_key)


def shape_key(rows: int, chain: bool) -> str:
    """A verify forward's shape as ``forwards`` counts it: its rows, ``t`` appended when it takes the tree mask."""
    return f"{rows}" if chain else f"{rows}t"


def shape_ms(key: str, curve: LatencyCurve) -> float:
    """T(k) of a forward of shape ``key`` (``shape_key``) on ``curve``."""
    return curve.at(int(key.removesuffix("t")), chain=not key.endswith("t"))


def repriced(costs: StepCosts, curve: LatencyCurve, overhead_ms: float) -> StepCosts:
    """The same steps on another latency curve (another device, dtype or context) with another overhead per step:
    what the calibration would have priced there, had acceptance been the same."""
    if sum(costs.forwards.values()) != costs.steps:
        raise ValueError("these costs carry no forward shapes (priced before shapes were recorded): cannot reprice")
    verify_ms = sum(count * shape_ms(key, curve) for key, count in costs.forwards.items()) / costs.steps
    return replace(costs, verify_ms=verify_ms, overhead_ms=overhead_ms)


def step_costs(
    accept_lengths: Sequence[int],
    draft_tokens: Sequence[int],
    draft_depth: Sequence[int | None],
    verify_tokens: Sequence[int | None],
    outside_s: Sequence[float],
    curve: LatencyCurve,
) -> StepCosts:
    """Per-step lists (of one or several generations, concatenated) -> StepCosts.

    Each step is priced at the rows its verify forward held (``verify_tokens``: root, drafted nodes and aux
    rows such as LADE's window; records without it: drafted + 1). A step whose rows are one chain (no aux
    rows, depth == drafted) is priced with the chain mask, as the forward takes the causal fast path for it;
    any other with the tree mask.
    """
    if not accept_lengths:
        raise ValueError("no decoding steps to price (every generation stopped at its first token)")
    shapes = [
        shape_key(rows, chain=rows == drafted + 1 and (depth is None or depth == drafted))
        for drafted, depth, rows in (
            (drafted, depth, drafted + 1 if width is None else width)
            for drafted, depth, width in zip(draft_tokens, draft_depth, verify_tokens, strict=True)
        )
    ]
    return StepCosts(
        len(accept_lengths),
        float(np.mean(accept_lengths)),
        float(np.mean([shape_ms(key, curve) for key in shapes])),
        1e3 * float(np.mean(outside_s)),
        dict(sorted(Counter(shapes).items())),
    )


def ideal_speedup(costs: StepCosts, curve: LatencyCurve) -> float:
    """tau * T(1) / mean T(k): the speedup if drafting, acceptance and updates cost nothing."""
    return costs.tokens_per_step * curve.step_ms / costs.verify_ms


def modelled_ms_per_token(costs: StepCosts) -> float:
    """The cost model's price of one emitted token: a step's forward T(k) plus its measured overhead, over tau."""
    return (costs.verify_ms + costs.overhead_ms) / costs.tokens_per_step


def predicted_speedup(costs: StepCosts, ar: StepCosts) -> float:
    """Tokens per ms of the setting over AR's, each step priced at its forward plus its measured overhead."""
    return modelled_ms_per_token(ar) / modelled_ms_per_token(costs)


def choose_budget(
    candidates: Mapping[int, StepCosts], ar: StepCosts, default: int | None = None, margin: float = 0.0
) -> int:
    """The budget of the largest predicted speedup (the smaller budget on a tie: cheaper at equal gain), unless
    it beats ``default`` by no more than ``margin`` (a relative gain the calibration cannot resolve): then the
    default stays."""
    if not candidates:
        raise ValueError("no budget to choose from")
    best = max(sorted(candidates), key=lambda budget: predicted_speedup(candidates[budget], ar))
    if default is not None and default in candidates:
        gain = predicted_speedup(candidates[best], ar) / predicted_speedup(candidates[default], ar) - 1
        return best if gain > margin else default
    return best
