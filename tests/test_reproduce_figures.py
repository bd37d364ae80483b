"""The reproduce figure builders on a synthetic smoke-scale results folder (tests/reproduce_fixture.py): every
figure is drawn, rebuilds byte for byte, marks the paper's numbers, carries error bars, and the defects the
first stored figures had stay fixed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specbench.profile import CSV_FIELDS
from specbench.report.read import split_by
from specbench.reproduce.figures import build_figures, read_profiles
from specbench.reproduce.figures.drawing import Context, coinciding, points
from specbench.reproduce.figures.papers import FIGURES
from specbench.reproduce.results import Results, measured_runs, read_measured, results_of
from specbench.reproduce.tables import paper_comparison
from tests.reproduce_fixture import write_fixture_results

BUILD = """
import sys
from pathlib import Path
from specbench.report.read import split_by
from specbench.reproduce.figures import build_figures
from specbench.reproduce.results import read_measured, results_of
from specbench.reproduce.tables import paper_comparison
root, out = Path(sys.argv[1]), Path(sys.argv[2])
runs = read_measured(root)
results, by_category = results_of(runs), results_of(split_by(runs, "category"))
build_figures(results, by_category, root / "profile", out, paper_comparison(results, by_category, "smollm2_135m"))
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return write_fixture_results(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def contexts(root) -> tuple[Context, Context]:
    runs = read_measured(root)
    results, by_category = results_of(runs), results_of(split_by(runs, "category"))
    paper = paper_comparison(results, by_category, "smollm2_135m")
    profile = read_profiles(root / "profile")
    return Context(results, profile, paper), Context(by_category, profile, paper)


@pytest.fixture(scope="module")
def built(root, contexts, tmp_path_factory):
    whole, split = contexts
    out = tmp_path_factory.mktemp("figures")
    return out, build_figures(whole.results, split.results, root / "profile", out, whole.paper)


def draw(name: str, contexts):
    """One figure of the fixture (the split context for the per-category ones)."""
    whole, split = contexts
    return FIGURES[name](split if name in ("self_draft_fig8_ablation", "medusa_fig4b_categories") else whole)


def test_every_figure_is_written_as_png_and_pdf(built):
    """The fixture holds every sweep, so each registered figure has a non-empty PNG and PDF, stamped with its
    commit."""
    _, figures = built
    assert set(figures) == set(FIGURES)
    for name, entry in figures.items():
        assert [path.name for path in entry.paths] == [f"{name}.png", f"{name}.pdf"], name
        assert all(path.stat().st_size > 0 for path in entry.paths), name
        assert entry.warning is None, (name, entry.warning)
        assert entry.commits == "latency profile" or entry.commits.startswith("measured by commit 0000000 ("), name


@pytest.mark.slow
def test_figures_rebuild_byte_for_byte(root, built, tmp_path):
    """A second build in another process (another hash seed, another working directory) writes the same bytes."""
    out, _ = built
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run(
        [sys.executable, "-c", BUILD, str(root), str(tmp_path)], cwd=tmp_path, env=env, check=True, capture_output=True
    )
    first = sorted(path.name for path in out.iterdir())
    assert first == sorted(path.name for path in tmp_path.iterdir() if path.suffix in (".png", ".pdf"))
    changed = [name for name in first if (out / name).read_bytes() != (tmp_path / name).read_bytes()]
    assert not changed


def test_builders_skip_results_without_their_runs(contexts):
    """With only AR runs and no latency profile, no builder has anything to draw."""
    whole, _ = contexts
    results = whole.results
    ar = results.runs["method"] == "ar"
    only_ar = Results(
        results.runs[ar],
        results.samples[results.samples["method"] == "ar"],
        results.pairs[results.pairs["method"] == "ar"],
    )
    context = Context(only_ar, pd.DataFrame(columns=CSV_FIELDS), whole.paper)
    assert {name: builder(context) for name, builder in FIGURES.items()} == dict.fromkeys(FIGURES)


def test_lade_heat_map_holds_the_runs_tokens_per_step(root, contexts):
    """The LADE W x N panel shows the tokens per step of r6_window_ngram's runs as the runner summarised them: one
    session's runs, its (15, 5) point its own although other sessions measured the default too."""
    cells = {}
    folders = [folder for folder in measured_runs(root) if folder.relative_to(root).parts[0] == "r6_window_ngram"]
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        if summary["method"] == "lade":
            drafter = summary["hyperparameters"]["drafter"]
            key = (drafter["window_size"], drafter["ngram_size"])
            cells.setdefault(key, []).append(summary["metrics"]["tokens_per_step"])
    windows, ngrams = sorted({w for w, _ in cells}), sorted({n for _, n in cells})
    expected = np.array([[np.mean(cells[w, n]) if (w, n) in cells else np.nan for n in ngrams] for w in windows])
    drawn = draw("lade_window_ngram", contexts)
    shown = drawn.figure.axes[0].images[0].get_array()
    np.testing.assert_allclose(np.ma.filled(shown.astype(float), np.nan), expected)
    assert (15, 5) in cells and len(cells[15, 5]) == 1
    whole, _ = contexts
    default = whole.results.runs.query("method == 'lade' and dataset == 'mt_bench' and setting == ''")
    assert len(default) == 1 and not default["run_dir"].iloc[0].startswith(str(root / "r6_window_ngram"))


def paper_lines(ax) -> list:
    """The lines of an axes that mark the paper's numbers."""
    return [line for line in ax.get_lines() if str(line.get_label()).startswith("paper")]


def test_the_papers_numbers_are_marked_at_the_settings_they_were_published_for(contexts):
    """OPT-Tree Fig 5 marks Table 1's MAL of OPT-Tree with the L-68M draft (MT-Bench) at the default n = 50."""
    whole, _ = contexts
    ax = draw("opt_tree_fig5_node_budget", contexts).figure.axes[0]
    marks = paper_lines(ax)
    rows = whole.paper[
        (whole.paper["paper"] == "opt_tree")
        & (whole.paper["table"] == "Table 1")
        & (whole.paper["method"] == "opt_tree")
        & (whole.paper["metric"] == "tokens_per_step")
        & (whole.paper["draft"] == "L-68M")
        & (whole.paper["dataset"] == "mt_bench")
    ]
    assert len(rows) and sorted(y for line in marks for y in line.get_ydata()) == sorted(rows["value"])
    assert {x for line in marks for x in line.get_xdata()} == {50}


def test_throughput_marks_are_the_papers_speedup_times_the_measured_ar(contexts):
    """Self-Draft Fig 5's TP panel marks the paper's speedup times the measured AR throughput of the drawn run's own
    session (its GPU's tokens/s would be off the scale and meaningless here)."""
    whole, _ = contexts
    ax = draw("self_draft_fig5_branch_length", contexts).figure.axes[0]
    speedups = whole.paper[
        (whole.paper["paper"] == "self_draft")
        & (whole.paper["method"] == "self_draft")
        & (whole.paper["dataset"] == "mt_bench")
        & (whole.paper["metric"] == "speedup")
    ]
    every = whole.results.every_run
    drawn = every.query("experiment == 'r1_branch_grid' and method == 'self_draft' and setting == ''")
    partner = every.set_index("run_dir").loc[
        drawn["ar_run_dir"], "throughput_total"
    ]  # timed in the drawn run's session
    marked = sorted(y for line in paper_lines(ax) for y in line.get_ydata())
    assert len(drawn) == 1 and marked == pytest.approx(sorted(speedups["value"] * partner.iloc[0]))


def test_speedup_panels_show_ar_and_intervals(contexts):
    """ANPD Fig 3 (speedups near 1): a line at 1 inside the view and each point's bootstrap interval."""
    ax = draw("anpd_fig3_draft_len", contexts).figure.axes[0]
    assert any(list(line.get_ydata()) == [1, 1] for line in ax.get_lines())
    low, high = ax.get_ylim()
    assert low < 1 < high
    assert ax.containers and any(container.has_yerr for container in ax.containers)


def test_repeats_give_error_bars():
    """A point of several runs (repeats) has the std over them as its error; a single run its bootstrap interval."""
    frame = pd.DataFrame(
        {
            "x": [1, 1, 1, 2],
            "speedup": [1.0, 1.2, 1.4, 2.0],
            "speedup_ci_low": [0.9, 1.1, 1.3, 1.8],
            "speedup_ci_high": [1.1, 1.3, 1.5, 2.3],
        }
    )
    shown = points(frame, "x", "speedup")
    assert shown.loc[1, "mean"] == pytest.approx(1.2) and shown.loc[1, "high"] - shown.loc[1, "mean"] == pytest.approx(
        0.2
    )
    assert (shown.loc[2, "low"], shown.loc[2, "high"]) == (1.8, 2.3)


def test_the_defects_of_the_first_stored_figures_stay_fixed(contexts):
    """Memory from zero, latency on log-log axes, Medusa Fig 7's main curve in its legend, footers inside the
    figure."""
    memory = draw("lookahead_fig6_memory", contexts).figure.axes[0]
    assert memory.get_ylim()[0] == 0
    latency = draw("lookahead_fig1_latency", contexts).figure.axes[0]
    assert latency.get_xscale() == "log" and latency.get_yscale() == "log"
    legend = draw("medusa_fig7_epsilon", contexts).figure.axes[0].get_legend()
    assert any("typical acceptance" in text.get_text() for text in legend.get_texts())
    for name in FIGURES:
        figure = draw(name, contexts).figure
        renderer = figure.canvas.get_renderer()
        width = figure.bbox.width
        for text in figure.texts:
            extent = text.get_window_extent(renderer)
            assert extent.x0 >= 0 and extent.x1 <= width, (name, text.get_text()[:60])


def test_coinciding_lines_are_named_in_the_legend():
    """A line equal to an earlier one at every point says so (else it hides under it unnoticed)."""
    line = pd.Series([1.09, 1.09], index=[16, 64])
    assert coinciding(line, {"L_b = 4": line.copy()}) == " (= L_b = 4: they coincide)"
    assert coinciding(line, {"L_b = 4": line + 0.01}) == ""
