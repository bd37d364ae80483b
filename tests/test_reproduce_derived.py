"""Numbers the reproduction derives rather than reads, and the sweeps added for figures that had none: ANPD's
theoretical speedup α·K + 1 computed once from each run's measured hit ratio and its K, Self-Draft Fig 4 (Self-Draft
vs LADE draft efficiency) and OPT-Tree Fig 6 with both drafts, their experiments composing at both scales."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specbench.report.read import split_by
from specbench.reproduce.coverage import coverage, job_config, job_of, jobs_frame
from specbench.reproduce.figures.drawing import Context
from specbench.reproduce.figures.papers import (
    AUX_ROWS,
    DRAFT_EFFICIENCY_LINES,
    FIGURES,
    OPT_TREE_DRAFTS,
    aux_rows_per_step,
)
from specbench.reproduce.plan import experiment_jobs, sweep_jobs
from specbench.reproduce.results import read_measured, results_of
from specbench.reproduce.tables import (
    DERIVED_METRICS,
    MEASURED_METRICS,
    METRIC_NAMES,
    measure,
    paper_comparison,
    paper_values,
    theoretical_speedup,
)
from tests.reproduce_fixture import write_fixture_results

NEW_EXPERIMENTS = {
    "r1_draft_efficiency": ("self_draft", "method.drafter.branch_num"),
    "r1_draft_efficiency_lade": ("lade", "method.drafter.window_size"),
    "r3_threshold_eagle": ("opt_tree_eagle", "method.drafter.threshold"),
}
"""The experiments added for Self-Draft Fig 4 and OPT-Tree Fig 6: method and the knob each sweeps."""


def theoretical_row() -> pd.Series:
    """ANPD Fig 6's theoretical speedup row."""
    values = paper_values()
    rows = values[(values["paper"] == "anpd") & (values["metric"] == "theoretical_speedup")]
    assert len(rows) == 1
    return rows.iloc[0]


def anpd_runs(hit_ratios: list[float], ks: list[float | None], method: str = "anpd") -> pd.DataFrame:
    """A synthetic runs frame of ANPD runs: one repeat per hit ratio, K set on each run (``hp.drafter.draft_len``;
    None: left at the method's default, NaN as in the loaded runs)."""
    count = len(hit_ratios)
    return pd.DataFrame(
        {
            "run_dir": [f"/runs/anpd-{index}" for index in range(count)],
            "method": method,
            "model": "smollm2_135m",
            "temperature": 0.0,
            "top_p": 1.0,
            "n_samples": 8,
            "draft_efficiency": hit_ratios,
            "hp.drafter.draft_len": pd.Series([np.nan if k is None else k for k in ks], dtype=object),
        }
    )


def test_the_theoretical_speedup_is_each_runs_hit_ratio_times_its_k_plus_one():
    """α·K + 1 per run (the run's own K), then averaged over repeats like every measured metric."""
    runs = anpd_runs([0.2, 0.3, 0.25], [7, 7, 5])
    assert theoretical_speedup(runs).tolist() == pytest.approx([2.4, 3.1, 2.25])
    measured = measure(theoretical_row(), runs)
    assert measured["measured"] == pytest.approx(np.mean([2.4, 3.1, 2.25]))
    assert measured["measured_std"] == pytest.approx(np.std([2.4, 3.1, 2.25], ddof=1))
    assert measured["repeats"] == 3 and measured["n_samples"] == 8
    assert measured["matched"] == tuple(runs["run_dir"])


def test_the_theoretical_speedup_is_empty_without_drafts():
    """A run that drafted nothing has no hit ratio, so no bound (no value is made up)."""
    runs = anpd_runs([np.nan], [7])
    assert theoretical_speedup(runs).isna().all()
    assert measure(theoretical_row(), runs)["repeats"] == 0


def test_the_theoretical_speedup_row_is_a_measured_metric_without_a_reason():
    row = theoretical_row()
    assert row["metric"] in MEASURED_METRICS and row["metric"] in DERIVED_METRICS and row["metric"] in METRIC_NAMES
    assert not str(row["unfillable"]).strip()
    assert "every sample" in row["note"]  # the measured value is over the run's samples, not the paper's one
    hit_ratio = paper_values().query("paper == 'anpd' and metric == 'draft_hit_ratio'").iloc[0]
    key = ["model", "dataset", "method", "setting", "temperature"]
    assert row[key].tolist() == hit_ratio[key].tolist()  # the runs of the draft_hit_ratio row fill it


@pytest.mark.slow
def test_a_run_at_the_default_k_takes_anpds_default():
    """K of a run that left ``draft_len`` at its default is ANPD's (7); a method without K gives no value."""
    runs = anpd_runs([0.2], [None])
    assert theoretical_speedup(runs).tolist() == pytest.approx([0.2 * 7 + 1])
    assert theoretical_speedup(anpd_runs([0.2], [None], method="pld")).isna().all()


@pytest.mark.slow
def test_the_theoretical_speedup_row_is_filled_by_r2_table1_alpaca():
    jobs = jobs_frame([job_of("r2_table1_alpaca", job) for job in experiment_jobs("paper", "r2_table1_alpaca")])
    covered = coverage(theoretical_row().to_frame().T, jobs)
    assert covered["status"].tolist() == ["filled"] and covered["experiments"].tolist() == ["r2_table1_alpaca"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(NEW_EXPERIMENTS))
def test_the_new_experiments_compose_at_both_scales(name):
    method, axis = NEW_EXPERIMENTS[name]
    other = job_config(sweep_jobs("smoke", "r1_branch_grid")[0])  # the smoke plan's sample set and budget
    for scale in ("paper", "smoke"):
        jobs = sweep_jobs(scale, name)
        assert {override for job in jobs for override in job if override.startswith("method=")} == {f"method={method}"}
        assert len({override for job in jobs for override in job if override.startswith(f"{axis}=")}) >= 3
        for job in experiment_jobs(scale, name):
            cfg = job_config(job)
            assert cfg.experiment == name
            assert cfg.dataset.name == "mt_bench" and cfg.temperature == 0
            if scale == "smoke":
                assert cfg.model.name == "smollm2_135m"
                assert (cfg.limit, cfg.max_new_tokens, cfg.dataset.order) == (
                    other.limit,
                    other.max_new_tokens,
                    other.dataset.order,
                )
            if cfg.method.name == "self_draft":
                assert cfg.method.drafter.use_corpus_cache is False  # Fig 4 removes the corpus cache


@pytest.mark.slow
def test_the_draft_efficiency_and_threshold_sweeps_are_drawn(tmp_path):
    """Self-Draft Fig 4 puts each run at its measured aux rows per step, a line per method; OPT-Tree Fig 6 draws a
    line per draft from the two sessions and marks each draft's published numbers apart."""
    names = ["r1_draft_efficiency", "r1_draft_efficiency_lade", "r3_threshold", "r3_threshold_eagle"]
    root = write_fixture_results(tmp_path / "smoke", experiments=names)
    expected = {}
    for summary_path in root.rglob("summary.json"):  # the fixture has no aux rows: give LADE and Self-Draft theirs
        summary = json.loads(summary_path.read_text())
        drafter = summary["hyperparameters"].get("drafter") or {}
        aux = {"self_draft": 5 * drafter.get("branch_num", 0) - 1, "lade": 4 * drafter.get("window_size", 0) - 1}
        if summary["method"] in aux:
            add_aux_rows(summary_path.parent, aux[summary["method"]])
            expected.setdefault(DRAFT_EFFICIENCY_LINES[summary["method"]], set()).add(aux[summary["method"]])
    runs = read_measured(root)
    results, by_category = results_of(runs), results_of(split_by(runs, "category"))
    context = Context(results, pd.DataFrame(), paper_comparison(results, by_category, "smollm2_135m"))
    aux = aux_rows_per_step(results.samples)
    assert (aux[results.runs.set_index("run_dir")["method"].reindex(aux.index) == "ar"] == 0).all()

    drawn = FIGURES["self_draft_fig4_draft_efficiency"](context)
    assert drawn is not None
    assert expected == {"Self-Draft (w/o corpus cache)": {9, 29, 49}, "LADE (N = 5, G = W)": {11, 27, 59}}
    assert drawn.runs.groupby("method")[AUX_ROWS].agg(lambda values: set(values)).to_dict() == expected
    legend = {text.get_text() for text in drawn.figure.axes[0].get_legend().get_texts()}
    assert set(DRAFT_EFFICIENCY_LINES.values()) <= legend

    drawn = FIGURES["opt_tree_fig6_threshold"](context)
    assert drawn is not None
    thresholds = drawn.runs.groupby("method")["drafter.threshold"].agg(lambda values: set(values)).to_dict()
    assert thresholds == dict.fromkeys(OPT_TREE_DRAFTS.values(), {0.2, 0.5, 1.0})
    legend = [text.get_text() for text in drawn.figure.axes[0].get_legend().get_texts()]
    assert set(OPT_TREE_DRAFTS.values()) <= set(legend)
    assert any("[EAGLE]" in text for text in legend) and any("[L-68M]" in text for text in legend)


def add_aux_rows(folder: Path, aux: int) -> None:
    """Rewrite a run's records as if every verify forward ran the root, the drafted nodes and ``aux`` aux rows (a
    window or drafting branches)."""
    path = folder / "samples.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for record in records:
        record["verify_tokens"] = [1 + drafted + aux for drafted in record["draft_tokens"]]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
