"""budget=auto's calibrations re-priced on another latency curve (specbench.report.budgets): the same measured
acceptance picks a larger budget on a flat curve than on a steep one, and curves are read from every file kind."""

from __future__ import annotations

import json

import pytest

from specbench.costmodel import LatencyCurve, step_costs
from specbench.errors import UserError
from specbench.report.budgets import curves_in, ideal_choice

TOKENS = (1, 2, 4, 8, 16, 32, 64)
STEEP = LatencyCurve(256, TOKENS, tuple(10.0 * n for n in TOKENS), tuple(10.0 * n for n in TOKENS))
FLAT = LatencyCurve(256, TOKENS, (10.0,) * 7, (10.0,) * 7)


def calibration_record(curve: LatencyCurve) -> dict:
    """A budget=auto record whose chain budgets 1..32 accept ever less per extra node (priced on ``curve``)."""

    def priced(budget: int) -> dict:
        accepted = round(sum(0.7**depth for depth in range(1, budget + 1)))
        costs = step_costs([1 + accepted] * 10, [budget] * 10, [budget] * 10, [None] * 10, [0.0] * 10, curve)
        return vars(costs)

    return {
        "mode": "auto",
        "candidates": {str(budget): priced(budget) for budget in (1, 2, 4, 8, 16, 32)},
        "ar": vars(step_costs([1] * 10, [0] * 10, [0] * 10, [None] * 10, [0.0] * 10, curve)),
        "curve": curve.to_dict(),
    }


def test_the_same_acceptance_picks_a_larger_budget_on_a_flat_curve():
    record = calibration_record(STEEP)
    steep_value, steep_ideal = ideal_choice(record, STEEP)
    flat_value, flat_ideal = ideal_choice(record, FLAT)
    assert flat_value == 4 and steep_value == 1  # 4: the smallest budget of the largest tau (1 + round(1.77))
    assert flat_ideal == pytest.approx(3.0) and steep_ideal == pytest.approx(1.0)


def test_curves_are_read_from_a_profile_csv_a_cached_curve_and_a_budget_record(tmp_path):
    csv = tmp_path / "latency.csv"
    lines = ["model,device_name,dtype,context_length,num_tokens,mask,median_ms,min_ms,repeats"]
    cells = [(c, n, mask) for c in (256, 1024) for n in (1, 2) for mask in ("chain", "tree")]
    lines += [f"m,gpu,float16,{c},{n},{mask},{n + c / 100},{n},5" for c, n, mask in cells]
    csv.write_text("\n".join(lines) + "\n")
    read = curves_in(csv)
    assert [curve.context_length for curve in read] == [256, 1024] and read[0].at(2) == pytest.approx(4.56)
    cached = tmp_path / "c256.json"
    cached.write_text(json.dumps({"curve": FLAT.to_dict()}))
    assert curves_in(cached) == [FLAT]
    with pytest.raises(UserError, match="no such file"):
        curves_in(tmp_path / "missing.csv")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UserError, match="not a latency curve"):
        curves_in(tmp_path / "bad.json")
