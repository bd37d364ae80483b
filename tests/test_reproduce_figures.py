"""The reproduce figure builders on a synthetic smoke-scale results folder (tests/reproduce_fixture.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specbench.profile import CSV_FIELDS
from specbench.reproduce.figures import FIGURES, build_figures, read_profiles
from specbench.reproduce.results import Results, load_results, measured_runs
from tests.reproduce_fixture import write_fixture_results


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return write_fixture_results(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def results(root) -> Results:
    return load_results(root)


@pytest.fixture(scope="module")
def built(root, results, tmp_path_factory) -> dict[str, list[Path]]:
    return build_figures(results, load_results(root, by="category"), root / "profile",
                         tmp_path_factory.mktemp("figures"))


def test_every_figure_is_written_as_png_and_pdf(built):
    """The fixture holds every sweep, so each registered figure has a non-empty PNG and PDF."""
    assert set(built) == set(FIGURES)
    for name, paths in built.items():
        assert [path.name for path in paths] == [f"{name}.png", f"{name}.pdf"], name
        assert all(path.stat().st_size > 0 for path in paths), name


def test_builders_skip_results_without_their_runs(results):
    """With only AR runs and no latency profile, no builder has anything to draw."""
    ar = results.runs["method"] == "ar"
    only_ar = Results(results.runs[ar], results.samples[results.samples["method"] == "ar"],
                      results.pairs[results.pairs["method"] == "ar"])
    empty_profile = pd.DataFrame(columns=CSV_FIELDS)
    assert {name: builder(only_ar, empty_profile) for name, builder in FIGURES.items()} == dict.fromkeys(FIGURES)


def test_lade_heat_map_holds_the_runs_tokens_per_step(root, results):
    """The LADE W x N panel shows the tokens per step of the W x N runs as the runner summarised them
    (a configuration stored in two folders counts once: ``measured_runs``)."""
    cells = {}
    folders = [folder for folder in measured_runs(root) if folder.parent.name == "T0.0-n64"
               and folder.parent.parent.name == "mt_bench"]
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        if summary["method"] == "lade":
            drafter = summary["hyperparameters"]["drafter"]
            key = (drafter["window_size"], drafter["ngram_size"])
            cells.setdefault(key, []).append(summary["metrics"]["tokens_per_step"])
    windows, ngrams = sorted({w for w, _ in cells}), sorted({n for _, n in cells})
    expected = np.array([[np.mean(cells[w, n]) if (w, n) in cells else np.nan for n in ngrams] for w in windows])
    fig = FIGURES["lade_window_ngram"](results, read_profiles(root / "profile"))
    shown = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(np.ma.filled(shown.astype(float), np.nan), expected)
    assert (15, 5) in cells and len(cells[15, 5]) == 1  # the default run and the sweep's (15, 5) run: one config
