"""The report's tables: the ``runs`` and ``steps`` views of loaded runs, formatted for a terminal (the
benchmark suites print the ``steps`` view of their sessions)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from specbench.report.compare import match_ar
from specbench.report.read import PathLike, load

TABLE_COLUMNS = [
    "run_dir",
    "model",
    "method",
    "dataset",
    "temperature",
    "n_samples",
    "throughput_total",
    "throughput_mean",
    "tokens_per_step",
    "accepted_per_step",
    "draft_efficiency",
    "step_latency_s",
    "outside_forward_share",
    "n_common",
    "overhead",
    "speedup",
    "speedup_mean",
    "exact_match_rate",
]
# The benchmark-suite view: one row per entry, where each step's time goes.
STEP_COLUMNS = [
    "entry",
    "method",
    "lossless",
    "n_samples",
    "tokens_per_step",
    "throughput_total",
    "speedup",
    "overhead",
    "exact_match_rate",
    "step_latency_s",
    "outside_forward_s",
    "outside_forward_share",
    "draft_share",
    "accept_share",
    "update_share",
]
VIEWS = {"runs": TABLE_COLUMNS, "steps": STEP_COLUMNS}
MILLISECONDS = ("step_latency_s", "outside_forward_s")
SHARES = ("outside_forward_share", "draft_share", "verify_share", "accept_share", "update_share")
# Short headers so a full table fits a terminal; the CSV keeps the full column names.
DISPLAY_NAMES = {
    "run_dir": "run",
    "ar_run_dir": "ar_run",
    "temperature": "temp",
    "n_samples": "n",
    "throughput_total": "tok/s",
    "throughput_mean": "tok/s_mean",
    "tokens_per_step": "tok/step",
    "accepted_per_step": "acc/step",
    "draft_efficiency": "draft_eff",
    "step_latency_s": "step_ms",
    "outside_forward_s": "outside_ms",
    "outside_forward_share": "outside_fwd",
    "draft_share": "draft",
    "accept_share": "accept",
    "update_share": "update",
    "exact_match_rate": "exact",
    "first_divergence": "diverges_at",
}


def report_table(runs: pd.DataFrame, samples: pd.DataFrame, view: str = "runs") -> pd.DataFrame:
    """One view's table from loaded frames: bench entries in suite order, other runs by model and dataset."""
    order = ["session", "entry_index", "model", "dataset", "temperature", "method", "run_dir"]
    report = match_ar(runs, samples).sort_values(order)
    return report[VIEWS[view]].reset_index(drop=True)


def table(paths: Iterable[PathLike], by: str | None = None, repeats: bool = False, view: str = "runs") -> pd.DataFrame:
    """The report: recomputed metrics, speedup, overhead and exact-match rate vs the AR baseline.

    ``view`` picks the columns (``runs``: throughput and acceptance; ``steps``: the bench view of
    where step time goes); ``repeats`` merges the repeats of each setting (see ``merge_repeats``).
    """
    return report_table(*load(paths, by, repeats), view)


def _for_display(frame: pd.DataFrame) -> pd.DataFrame:
    """Run folder names instead of paths, times in ms, shares in %, short headers, to fit a terminal."""
    shown = frame.copy()
    for column in {"run_dir", "ar_run_dir"} & set(shown.columns):
        shown[column] = shown[column].map(lambda path: Path(path).name, na_action="ignore")
    for column in set(MILLISECONDS) & set(shown.columns):
        shown[column] = shown[column] * 1000
    for column in set(SHARES) & set(shown.columns):
        shown[column] = shown[column].map(lambda share: "-" if pd.isna(share) else f"{share:.1%}")
    return shown.rename(columns=DISPLAY_NAMES)


def format_table(frame: pd.DataFrame) -> str:
    """Fixed-width text of a report frame: floats to 2 decimals, '-' where a value is missing."""
    return _for_display(frame).to_string(index=False, float_format="{:.2f}".format, na_rep="-")


def divergence_text(compared: pd.DataFrame) -> str:
    """The first-divergence table of the samples that differ from AR, or a line saying none do."""
    differing = compared[~compared["exact_match"]]
    if differing.empty:
        return "no compared sample differs from its AR baseline"
    return format_table(differing.drop(columns="exact_match"))
