"""The same-session rule of the reproduction's tables and figures: every built speedup divides times measured in one
session (a walk over every built cell's run pairs, on a synthetic plan and on the stored smoke results), a pair
across sessions is refused with its reason, and a figure whose AR partners come from another commit warns."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specbench.metrics import machine_seconds
from specbench.report.read import split_by
from specbench.reproduce.figures.drawing import Context, run_footer
from specbench.reproduce.figures.papers import FIGURES
from specbench.reproduce.results import read_measured, results_of
from specbench.reproduce.tables import PAIRED, REFUSED, build_tables, paper_comparison, parse_setting
from tests.conftest import ROOT
from tests.reproduce_fixture import write_fixture_results

EXPERIMENTS = ["r2_table1_code", "r3_node_budget", "r4_speedup", "r5_table4"]
"""Model-free (ANPD), a draft tree's sweep (with no AR job of its own), per-category Medusa rows, repeats."""
STORED = ROOT / "results" / "experiments" / "smoke"
STORED_TABLES = ROOT / "results" / "tables" / "smoke"


def records(folder: Path) -> list[dict]:
    """A run folder's records."""
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]


def summary(folder: Path) -> dict:
    """A run folder's summary."""
    return json.loads((folder / "summary.json").read_text())


def partner_of(folder: Path, candidates: list[Path]) -> Path | None:
    """The AR run among ``candidates`` that ``folder`` pairs with: its session's baseline entry (bench), same repeat."""
    own = summary(folder)
    bench = own.get("bench") or {}
    for candidate in candidates:
        theirs = summary(candidate)
        if (
            theirs["method"] == "ar"
            and (theirs.get("bench") or {}).get("session") == bench.get("session")
            and (theirs.get("bench") or {}).get("entry") == bench.get("baseline")
            and theirs.get("repeat", 0) == own.get("repeat", 0)
        ):
            return candidate
    return None


def same_session_speedup(folder: Path, partner: Path, category: str | None) -> tuple[float, int]:
    """Total/total speedup of ``folder`` over ``partner`` on the samples both timed in one measuring session (of one
    category when given), computed here from the records alone; and how many such samples there are."""
    key = ("sample_id", "turn")
    theirs = {tuple(r[k] for k in key): r for r in records(partner)}
    pairs = [
        (mine, theirs[tuple(mine[k] for k in key)])
        for mine in records(folder)
        if tuple(mine[k] for k in key) in theirs and (category is None or mine.get("category") == category)
    ]
    timed_together = [
        (a, b) for a, b in pairs if a.get("measuring_session") and a["measuring_session"] == b.get("measuring_session")
    ]
    if not timed_together:
        return np.nan, 0
    tokens = sum(a["new_tokens"] for a, _ in timed_together) / sum(machine_seconds(a) for a, _ in timed_together)
    ar_tokens = sum(b["new_tokens"] for _, b in timed_together) / sum(machine_seconds(b) for _, b in timed_together)
    return tokens / ar_tokens, len(timed_together)


def unpaired_cells(tables: Path, root: Path) -> list[str]:
    """Every built cell of a paired metric (speedup, overhead) with a value, walked run by run: each run it rests on
    must name its AR partner among the cell's runs (same session), share measuring sessions with it on the samples
    that count, and give the cell's value from those samples alone. The cells that do not, described."""
    problems = []
    for csv in sorted(tables.glob("*.csv")):
        frame = pd.read_csv(csv, keep_default_na=False, dtype=str)
        if "runs" not in frame:
            continue
        cells = frame[frame["metric"].isin(["speedup"]) & (frame["measured"] != "")].drop_duplicates("group")
        for _, cell in cells.iterrows():
            folders = [root / folder for folder in cell["runs"].split()]
            category = parse_setting(cell["setting"]).get("category")
            speedups = []
            for folder in folders:
                if summary(folder)["method"] == "ar":  # a partner, or an AR row's run: over itself, 1
                    speedups += [1.0] if cell["method"] == "ar" else []
                    continue
                partner = partner_of(folder, folders)
                if partner is None:
                    problems.append(f"{csv.name}: {folder.relative_to(root)} has no AR partner of its session")
                    continue
                value, count = same_session_speedup(folder, partner, category)
                if not count:
                    problems.append(f"{csv.name}: {folder.relative_to(root)} shares no session with {partner.name}")
                speedups.append(value)
            if speedups and not np.isclose(np.mean(speedups), float(cell["measured"]), rtol=1e-6):
                problems.append(f"{csv.name}: {cell['method']} {cell['dataset']} {cell['measured']} != {speedups}")
    return problems


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return write_fixture_results(tmp_path_factory.mktemp("experiments") / "smoke", experiments=EXPERIMENTS)


def build(root: Path, out: Path) -> tuple[pd.DataFrame, dict]:
    """The compared rows and the built tables of the results under ``root``."""
    runs = read_measured(root)
    results, by_category = results_of(runs, EXPERIMENTS), results_of(split_by(runs, "category"), EXPERIMENTS)
    compared = paper_comparison(results, by_category, "smollm2_135m")
    return compared, build_tables(compared, results, out, "smoke", "smollm2_135m", root)


def test_every_built_cells_run_pairs_were_timed_in_one_session(root, tmp_path):
    """Each speedup a table shows rests on runs whose AR partner was timed in the run's own session, and equals the
    total/total ratio of the samples both timed there (recomputed from the records)."""
    compared, _ = build(root, tmp_path)
    shown = compared[compared["metric"].isin(PAIRED) & (compared["repeats"] > 0)]
    assert len(shown) >= 6 and (shown["refused"] == "").all()
    assert unpaired_cells(tmp_path, root) == []


def test_an_ar_partner_timed_in_another_session_is_refused_with_its_reason(root, tmp_path):
    """The AR partner of r2_table1_code timed again in another sitting: ANPD's HumanEval speedup shows ``—``, the
    note says why, the statistics list the run without a speedup; tokens per step stay."""
    copy = tmp_path / "smoke"
    shutil.copytree(root, copy)
    ar = copy / "r2_table1_code" / "smollm2_135m" / "humaneval" / "T0.0-n48" / "method=ar" / "samples.jsonl"
    moved = [{**record, "measuring_session": "20260102T000000Z-f1x7re-9"} for record in records(ar.parent)]
    ar.write_text("".join(json.dumps(record) + "\n" for record in moved))
    compared, _ = build(copy, tmp_path / "tables")
    anpd = compared[(compared["paper"] == "anpd") & (compared["dataset"] == "humaneval")]
    speedup = anpd[(anpd["method"] == "anpd") & (anpd["metric"] == "speedup")]
    assert (speedup["repeats"] == 0).all() and speedup["refused"].str.contains("in another session").all()
    table = (tmp_path / "tables" / "anpd_table_1.md").read_text()
    assert f"| {REFUSED} |" in table and "one sitting): 8 of 8 samples' AR partner" in table
    statistics = (tmp_path / "tables" / "speedup_statistics.md").read_text()
    assert any(line.startswith("| humaneval | anpd |") and f"| {REFUSED} |" in line for line in statistics.splitlines())
    assert unpaired_cells(tmp_path / "tables", copy) == []  # the walk finds no refused pair in a shown cell


def test_a_figure_whose_ar_partners_come_from_another_commit_warns(root):
    """The AR partners' commit, date and session are part of a figure's footer; another commit is a warning."""
    runs = read_measured(root)
    results = results_of(runs, EXPERIMENTS)
    context = Context(results, pd.DataFrame(), paper_comparison(results, results, "smollm2_135m"))
    drawn = FIGURES["opt_tree_fig5_node_budget"](context)
    footer, warnings = run_footer(drawn.runs)
    assert "AR partners: " in footer and "on 2026-01-01, each in its run's session" in footer and not warnings
    _, warnings = run_footer(drawn.runs.assign(**{"ar.env.git_commit": "f" * 40}))
    assert any("AR partners were measured by another commit" in warning for warning in warnings)


def test_the_stored_smoke_tables_divide_only_times_of_one_session():
    """The committed smoke tables, walked cell by cell against the committed runs: no speedup divides times of two
    sessions (cells whose runs predate sessions show ``—`` until the plan is rerun)."""
    assert unpaired_cells(STORED_TABLES, STORED) == []
