"""The paper-vs-measured tables on a synthetic smoke results folder: one line per measurement (a stand-in's
number once, beside the paper values it stands in for), ranks on both sides, no cross-hardware difference,
LaTeX that fits the page, and a visible warning when runs of different commits (or a dirty tree) are compared."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import pandas as pd
import pytest

from specbench.report.read import split_by
from specbench.reproduce.build import build
from specbench.reproduce.plan import load_plan
from specbench.reproduce.results import read_measured, results_of
from specbench.reproduce.tables import DISPLAY_COLUMNS, LATEX_WIDTHS, breaks_after, build_tables, paper_comparison
from tests.reproduce_fixture import write_fixture_results

EXPERIMENTS = [
    "r1_table2_chat",
    "r1_table2_code",
    "r2_table1_code",
    "r3_tables",
    "r5_table4",
]
LINE_WIDTH_PT = 468  # \linewidth of a 6.5 in text block
CHAR_PT = 4.2  # a wide average character at \footnotesize (8 pt)
COLUMN_SEP_PT = 6  # 2 x \tabcolsep of 3 pt


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_fixture_results(tmp_path_factory.mktemp("experiments") / "smoke", experiments=EXPERIMENTS)


@pytest.fixture(scope="module")
def built(root, tmp_path_factory):
    runs = read_measured(root)
    results, by_category = results_of(runs), results_of(split_by(runs, "category"))
    compared = paper_comparison(results, by_category, "smollm2_135m")
    out = tmp_path_factory.mktemp("tables")
    return out, results, compared, build_tables(compared, results, out, "smoke", "smollm2_135m", root)


def markdown_rows(path) -> pd.DataFrame:
    """The table of a built Markdown file as a frame of strings."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
    return pd.DataFrame(cells[1:], columns=cells[0])


def test_a_stand_in_measurement_is_shown_once_beside_the_paper_values_it_stands_in_for(built, root):
    out, results, _, _ = built
    table = markdown_rows(out / "self_draft_table_2.md")
    assert list(table.columns) == DISPLAY_COLUMNS  # no difference column: a GPU 7B minus a CPU 135M is meaningless
    de = table[(table["dataset"] == "gsm100") & (table["method"] == "Self-Draft") & (table["metric"] == "tokens/step")]
    assert len(de) == 1  # one line for the one measurement, not one per paper model
    assert "llama-7b 2.31" in de["paper values"].iloc[0] and "llama-13b 2.28" in de["paper values"].iloc[0]
    run = results.runs[(results.runs["method"] == "self_draft") & (results.runs["dataset"] == "gsm100")]
    assert de["measured"].iloc[0].startswith(f"{run['tokens_per_step'].iloc[0]:.3g}")
    csv = pd.read_csv(out / "self_draft_table_2.csv")
    assert "difference" not in csv.columns
    rows = csv[(csv["dataset"] == "gsm100") & (csv["method"] == "self_draft") & (csv["metric"] == "tokens_per_step")]
    assert rows["group"].nunique() == 1 and len(rows) == 2  # the CSV keeps every paper row, grouped


def test_methods_are_ranked_on_both_sides(built):
    out, _, compared, _ = built
    table = compared[
        (compared["paper"] == "self_draft")
        & (compared["dataset"] == "mt_bench")
        & (compared["metric"] == "speedup")
        & (compared["paper_model"] == "llama-7b")
    ]
    assert sorted(table["paper_rank"].dropna()) == [1, 2, 3]  # Self-Draft, LADE, SpeDe as the paper ranks them
    measured = table.drop_duplicates("group").dropna(subset=["measured"])
    assert sorted(measured["measured_rank"]) == list(range(1, len(measured) + 1))
    first = table.sort_values("paper_rank").iloc[0]
    assert first["paper_method"] == "Self-Draft"
    text = (out / "self_draft_table_2.md").read_text()
    assert "#1" in text and "rank" in text


def test_latex_fits_the_page(built):
    out, _, _, tables = built
    for name, entry in tables.items():
        tex = next(path for path in entry.paths if path.name == f"{name}.tex").read_text()
        assert r"\begin{longtable}" in tex
        table = markdown_rows(out / f"{name}.md")
        widths = [LATEX_WIDTHS[column] for column in table.columns]
        assert sum(widths) * LINE_WIDTH_PT + COLUMN_SEP_PT * len(widths) <= LINE_WIDTH_PT, name
        for column in table.columns:
            capacity = LATEX_WIDTHS[column] * LINE_WIDTH_PT / CHAR_PT
            for cell in table[column]:
                assert longest_chunk(cell) <= capacity, (name, column, cell)
        if (out / f"{name}_notes.tex").is_file():  # long notes live in their own file, numbered
            assert r"\begin{description}" in (out / f"{name}_notes.tex").read_text()


def longest_chunk(cell: str) -> int:
    """The longest run of characters a LaTeX line cannot break (spaces and ``breaks_after`` characters)."""
    longest = current = 0
    for index, char in enumerate(cell):
        current = 0 if char == " " else current + 1
        longest = max(longest, current)
        if breaks_after(cell, index):
            current = 0
    return longest


def test_notes_are_numbered_under_the_table(built):
    out, _, _, _ = built
    text = (out / "lookahead_table_4.md").read_text()
    table = markdown_rows(out / "lookahead_table_4.md")
    assert table["notes"].str.fullmatch(r"[\d, ]*").all()
    assert "\nNotes:\n\n1. " in text and max(len(cell) for cell in table["notes"]) < 12


@pytest.mark.slow
@pytest.mark.parametrize(
    "change,expected",
    [({"git_commit": "f" * 40}, "compares runs of 2 different commits"), ({"git_dirty": True}, "uncommitted changes")],
)
def test_tables_and_index_warn_when_runs_of_different_commits_are_compared(root, tmp_path, change, expected):
    copy = tmp_path / "smoke"
    shutil.copytree(root, copy)
    summary = copy / "r1_table2_code" / "smollm2_135m" / "humaneval" / "T0.0-n48" / "method=ar" / "summary.json"
    data = json.loads(summary.read_text())
    data["environment"].update(change)
    summary.write_text(json.dumps(data))
    plan = replace(
        load_plan("smoke"), results_root=copy, tables_dir=tmp_path / "tables", figures_dir=tmp_path / "figures"
    )
    build(plan)
    warned = [
        line for line in (tmp_path / "tables" / "self_draft_table_2.md").read_text().splitlines() if "WARNING" in line
    ]
    assert len(warned) == 1 and expected in warned[0]  # its humaneval rows pair with the changed AR run
    assert "WARNING" not in (tmp_path / "tables" / "opt_tree_table_1.md").read_text()  # MT-Bench and GSM8K only
    index = (tmp_path / "tables" / "README.md").read_text()
    head = index.split("## Tables")[0]
    assert "**WARNING" in head and expected in head and "self_draft_table_2" in head
