"""Build a scale's tables and figures from its stored runs, and an index that lists them with the stamp."""

from __future__ import annotations

import os
from pathlib import Path

from specbench.errors import UserError
from specbench.reproduce.figures import build_figures
from specbench.report import split_by
from specbench.reproduce.plan import Plan
from specbench.reproduce.results import Results, read_measured, results_of, stamp
from specbench.reproduce.tables import build_tables


def index_text(plan: Plan, results: Results, tables: dict[str, list[Path]], figures: dict[str, list[Path]]) -> str:
    """Markdown index of what was built (links relative to the tables folder) and what was skipped."""
    def link(path: Path) -> str:
        return f"[{path.name}]({os.path.relpath(path, plan.tables_dir)})"

    lines = [f"# Reproduction, scale `{plan.scale}`", "", f"Runs: {len(results.runs)} under `{plan.results_root.name}`; "
             f"measured on: {stamp(results.runs)}", "", "## Tables", ""]
    lines += [f"- {name}: " + ", ".join(link(path) for path in paths) for name, paths in tables.items()]
    lines += ["", "## Figures", ""]
    lines += [f"- {name}: " + (", ".join(link(path) for path in paths) if paths else "no runs for it (skipped)")
              for name, paths in figures.items()]
    return "\n".join(lines) + "\n"


def build(plan: Plan) -> None:
    """Write every table and figure of the plan from the runs under its results root."""
    if not plan.results_root.is_dir():
        raise UserError(f"no results under {plan.results_root}; run `python -m specbench.reproduce run "
                        f"--scale {plan.scale}` first (or `make reproduce-tables SCALE={plan.scale}`)")
    runs = read_measured(plan.results_root)  # read once, then viewed whole and split by MT-Bench category
    results, by_category = results_of(runs), results_of(split_by(runs, "category"))
    tables = build_tables(results, by_category, plan.tables_dir, plan.scale, plan.stand_in_model)
    figures = build_figures(results, by_category, plan.profile_root, plan.figures_dir)
    index = plan.tables_dir / "README.md"
    index.write_text(index_text(plan, results, tables, figures))
    print(f"[reproduce] {len(tables)} tables in {plan.tables_dir}, "
          f"{sum(bool(paths) for paths in figures.values())}/{len(figures)} figures in {plan.figures_dir}; "
          f"index: {index}")
