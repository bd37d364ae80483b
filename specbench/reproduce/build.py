"""Build a scale's tables and figures from its stored runs, and an index that lists them with the stamp, the
commits that measured them and a warning wherever runs of different commits (or a dirty tree) are compared."""

from __future__ import annotations

import os
from pathlib import Path

from specbench.errors import UserError
from specbench.report.compare import commit_text, provenance_warning
from specbench.report.read import split_by
from specbench.reproduce.figures import build_figures
from specbench.reproduce.plan import Plan
from specbench.reproduce.results import Results, read_measured, results_of, stamp
from specbench.reproduce.tables import REFUSED, Built, build_tables, paper_comparison


def entry(name: str, built: Built, base: Path) -> list[str]:
    """One index line (links relative to ``base``, the commits), and the item's warning on its own line."""
    links = ", ".join(f"[{path.name}]({os.path.relpath(path, base)})" for path in built.paths)
    refused = f"; {built.refused} speedup(s) refused ({REFUSED}: AR partner not timed in the same session)"
    lines = [f"- {name}: {links or 'nothing to draw (skipped)'} ({built.commits}{refused if built.refused else ''})"]
    return lines + ([f"  - **{built.warning}**"] if built.warning else [])


def index_text(plan: Plan, results: Results, tables: dict[str, Built], figures: dict[str, Built]) -> str:
    """Markdown index of what was built, by which commits, with the warnings first."""
    runs = results.every_run
    warned = [name for name, built in {**tables, **figures}.items() if built.warning]
    lines = [
        f"# Reproduction, scale `{plan.scale}`",
        "",
        f"Runs: {len(runs)} under `{plan.results_root.name}`; measured on: {stamp(runs)}; {commit_text(runs)}.",
        "",
    ]
    warning = provenance_warning(runs)
    if warning:
        lines += [f"> **{warning}**. Tables and figures that compare such runs: {', '.join(warned)}.", ""]
    refused = sum(built.refused for built in tables.values())
    if refused:
        lines += [
            f"> **{refused} speedup measurement(s) refused** ({REFUSED} in their tables): their runs' AR partners were "
            "not timed in the same measuring session. Delete those experiments' folders and rerun them: "
            "docs/reproduction.md#rerunning-the-smoke-plan.",
            "",
        ]
    lines += ["## Tables", ""]
    lines += [line for name, built in tables.items() for line in entry(name, built, plan.tables_dir)]
    lines += ["", "## Figures", ""]
    lines += [line for name, built in figures.items() for line in entry(name, built, plan.tables_dir)]
    return "\n".join(lines) + "\n"


def build(plan: Plan) -> None:
    """Write every table and figure of the plan from the runs under its results root (no model is loaded)."""
    if not plan.results_root.is_dir():
        raise UserError(
            f"no results under {plan.results_root}; run `python -m specbench.reproduce run "
            f"--scale {plan.scale}` first (or `make reproduce-tables SCALE={plan.scale}`)"
        )
    runs = read_measured(plan.results_root)  # read once, then viewed whole and split by MT-Bench category
    results = results_of(runs, plan.experiments)
    by_category = results_of(split_by(runs, "category"), plan.experiments)
    compared = paper_comparison(results, by_category, plan.stand_in_model)
    tables = build_tables(compared, results, plan.tables_dir, plan.scale, plan.stand_in_model, plan.results_root)
    figures = build_figures(results, by_category, plan.profile_root, plan.figures_dir, compared)
    index = plan.tables_dir / "README.md"
    index.write_text(index_text(plan, results, tables, figures))
    print(
        f"[reproduce] {len(tables)} tables in {plan.tables_dir}, "
        f"{sum(bool(built.paths) for built in figures.values())}/{len(figures)} figures in {plan.figures_dir}; "
        f"index: {index}"
    )
