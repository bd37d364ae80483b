"""Every notebook runs top to bottom on a synthetic reproduction results folder through ``make notebook``
(jupyter nbconvert), which saves each as HTML with its plots inline."""

import os
import subprocess
import sys

import nbformat
import pytest

from tests.conftest import ROOT
from tests.reproduce_fixture import write_fixture_results

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPERIMENTS = ["r1_table2_chat", "r1_table2_code", "r1_ablation", "r4_speedup"]
"""Enough of the smoke plan for every view: a paper table, MT-Bench per category, lossy and lossless runs."""


@pytest.fixture(scope="module")
def results_root(tmp_path_factory):
    return write_fixture_results(tmp_path_factory.mktemp("experiments") / "smoke", experiments=EXPERIMENTS)


@pytest.mark.slow
def test_make_notebook_runs_every_notebook_and_saves_it_with_its_plots(results_root, tmp_path):
    """``make notebook``'s command (jupyter nbconvert, from the dev extra) runs every notebook top to bottom on
    SPECBENCH_RESULTS and writes each as HTML with every plot inline; a cell that fails fails the command."""
    dry = subprocess.run(
        ["make", "-s", "-n", "notebook", f"NOTEBOOK_OUT={tmp_path}", f"PY={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    command = next(line for line in dry.stdout.splitlines() if "nbconvert" in line)
    env = {**os.environ, "SPECBENCH_RESULTS": str(results_root)}
    done = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(path.stem for path in tmp_path.glob("*.html")) == [path.stem for path in NOTEBOOKS]
    html = (tmp_path / "explore_results.html").read_text(encoding="utf-8")
    assert html.count("<img") >= 4  # every plot cell leaves its PNG inline
    assert "measured runs (the tables" in html and "measured by commit" in html


def test_notebook_reads_the_stored_results_of_the_checkout_by_default():
    """Without SPECBENCH_RESULTS the notebook reads the smoke plan's results root (resolved from the package's
    location, so a fresh clone finds its stored runs from any working directory), inline, as the tables do."""
    source = "\n".join(
        cell.source
        for cell in nbformat.read(ROOT / "notebooks" / "explore_results.ipynb", as_version=4).cells
        if cell.cell_type == "code"
    )
    assert 'os.environ.get("SPECBENCH_RESULTS", plan.results_root)' in source
    assert "%matplotlib inline" in source and "matplotlib.use" not in source
    assert "read_measured(RESULTS)" in source
