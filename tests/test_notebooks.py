"""Every notebook runs top to bottom on a synthetic reproduction results folder and draws its plots inline."""

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT
from tests.reproduce_fixture import write_fixture_results

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPERIMENTS = ["r1_table2_chat", "r1_table2_code", "r1_ablation", "r4_speedup"]
"""Enough of the smoke plan for every view: a paper table, MT-Bench per category, lossy and lossless runs."""


@pytest.fixture(scope="module")
def results_root(tmp_path_factory):
    return write_fixture_results(tmp_path_factory.mktemp("experiments") / "smoke", experiments=EXPERIMENTS)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_draws_its_plots(path, results_root, monkeypatch):
    monkeypatch.setenv("SPECBENCH_RESULTS", str(results_root))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # inline backend: every plot cell leaves its PNG in the notebook
    text = "".join(o.get("text", "") for o in outputs)
    assert "measured runs (the tables' count)" in text and "measured by commit" in text


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
