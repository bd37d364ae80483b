"""The report's quality table (``--quality``): each run's quality score beside its AR baseline's at the same
temperature, with the paired bootstrap interval of the difference (scores from ``specbench.quality``)."""

from __future__ import annotations

from functools import cache

import pandas as pd

from specbench.quality import compare_quality, score_run
from specbench.report.compare import match_ar
from specbench.report.view import ORDER, run_label

QUALITY_COLUMNS = [
    "run",
    "method",
    "temperature",
    "score",
    "n_scored",
    "value",
    "ar_value",
    "difference",
    "ci_low",
    "ci_high",
    "within_sampling_error",
]


def quality_table(runs: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """One row per run and score of its dataset's metric; AR columns where the run has an AR partner."""
    scored = cache(score_run)  # an AR run partners many runs: score (and execute) it once
    rows = []
    for _, run in match_ar(runs, samples).sort_values(ORDER).iterrows():
        report = scored(run["run_dir"])
        partner = run.get("ar_run_dir")
        compared = {}
        if isinstance(partner, str) and partner != run["run_dir"] and report.metric:
            compared = {diff.score: diff for diff in compare_quality(report, scored(partner))}
        for score, value in report.means.items():
            diff = compared.get(score)
            rows.append(
                {
                    "run": run_label(run),
                    "method": run["method"],
                    "temperature": run["temperature"],
                    "score": score,
                    "n_scored": report.n_scored,
                    "value": diff.mean if diff else value,  # over the samples both runs scored
                    **(
                        {
                            "ar_value": diff.baseline_mean,
                            "difference": diff.difference,
                            "ci_low": diff.ci_low,
                            "ci_high": diff.ci_high,
                            "within_sampling_error": diff.agrees,
                        }
                        if diff
                        else {}
                    ),
                }
            )
    return pd.DataFrame(rows, columns=QUALITY_COLUMNS)
