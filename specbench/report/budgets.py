"""budget=auto's choices re-priced on another latency curve: which budget the same calibration would pick on other
hardware (``python -m specbench.report SESSION --reprice CURVE``).

A calibration stores each candidate's steps by forward shape (``costmodel.StepCosts.forwards``), so its verify
cost can be read off any curve. The overhead per step outside the forward is not known for hardware the run did
not measure, so both sides of the comparison choose by ideal speedup (tau x T(1) / mean T(k)): a choice that
assumes the acceptance measured here holds there (the same model and prompts), nothing more.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd

from specbench.costmodel import LatencyCurve, StepCosts, choose_budget, curve_from_rows, nearest_curve, repriced
from specbench.errors import UserError
from specbench.report.view import ORDER, run_label

REPRICE_COLUMNS = [
    "run",
    "method",
    "key",
    "chosen",
    "ideal_choice_here",
    "ideal_choice_there",
    "ideal_here",
    "ideal_there",
    "curve_there",
]


def curves_in(path: Path) -> list[LatencyCurve]:
    """The latency curves in a ``python -m specbench.profile`` CSV, a cached curve (``c<context>.json``) or a
    run's ``budget.json``; a file of none of these is one UserError."""
    if not path.is_file():
        raise UserError(f"--reprice {path}: no such file (give a profile CSV, a cached curve or a budget.json)")
    if path.suffix == ".csv":
        with path.open(newline="") as f:
            rows = [
                {
                    "context_length": int(row["context_length"]),
                    "num_tokens": int(row["num_tokens"]),
                    "mask": row["mask"],
                    "median_ms": float(row["median_ms"]),
                }
                for row in csv.DictReader(f)
            ]
        return [curve_from_rows(rows, context) for context in sorted({int(row["context_length"]) for row in rows})]
    try:
        return [LatencyCurve.from_dict(json.loads(path.read_text())["curve"])]
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"--reprice {path}: not a latency curve ({error})") from None


def candidate_costs(record: dict) -> tuple[dict[int, StepCosts], StepCosts]:
    """A budget=auto record's candidates (by knob value) and AR's costs, as the calibration measured them."""

    def costs(fields: dict) -> StepCosts:
        return StepCosts(
            fields["steps"], fields["tokens_per_step"], fields["verify_ms"], fields["overhead_ms"], fields["forwards"]
        )

    return {int(value): costs(fields) for value, fields in record["candidates"].items()}, costs(record["ar"])


def ideal_choice(record: dict, curve: LatencyCurve) -> tuple[int, float]:
    """The knob value of the largest ideal speedup on ``curve``, and that speedup."""
    candidates, ar = candidate_costs(record)
    free = {value: repriced(costs, curve, 0.0) for value, costs in candidates.items()}
    base = repriced(ar, curve, 0.0)
    value = choose_budget(free, base)
    return value, free[value].tokens_per_step * base.verify_ms / free[value].verify_ms


def reprice_table(runs: pd.DataFrame, curves: list[LatencyCurve]) -> pd.DataFrame:
    """One row per budget=auto run whose calibration recorded forward shapes: its choice, the ideal choice on its
    own curve and on the nearest of ``curves`` to its calibration's context."""
    rows = []
    for _, run in runs.sort_values(ORDER).iterrows():
        path = Path(run["run_dir"]) / "budget.json"
        record = json.loads(path.read_text()) if path.is_file() else None
        if not record or record.get("mode") != "auto" or "forwards" not in record["ar"]:
            continue
        here = LatencyCurve.from_dict(record["curve"])
        there = nearest_curve(curves, here.context_length)
        (value_here, ideal_here), (value_there, ideal_there) = ideal_choice(record, here), ideal_choice(record, there)
        rows.append(
            {
                "run": run_label(run),
                "method": run["method"],
                "key": record["key"],
                "chosen": record["value"],
                "ideal_choice_here": value_here,
                "ideal_choice_there": value_there,
                "ideal_here": ideal_here,
                "ideal_there": ideal_there,
                "curve_there": there.context_length,
            }
        )
    return pd.DataFrame(rows, columns=REPRICE_COLUMNS)
