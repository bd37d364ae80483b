"""The papers' sweep figures from the stored runs (and the latency profiles), as PNG and PDF.

Each builder picks the runs of one sweep (method, dataset, temperature and the knobs the sweep
varies; a run that changed any other knob is left out), plots the paper's axes with units and
stamps the hardware, the measuring commit(s) and the sample counts under the plot (with a warning
when the runs come from several commits, a dirty tree or different sample counts). Points of runs
with the same setting (repeats, or one setting reached by two experiments) are averaged, with the std
over them as the error bar; a single run's speedup carries the report's bootstrap interval instead.
Where ``paper_values`` holds a published number for a drawn setting, it is marked beside the
measured point: tokens per step and speedup as published, throughput as the paper's speedup times
the measured AR throughput (other hardware: only the ratio carries over). A builder returns None when
the results hold no sweep for it (fewer than two values of its x axis), and ``build_figures`` skips it.
Files are written without timestamps or version strings, so the same runs rebuild the same bytes.

Modules: ``drawing`` (the helpers every figure shares), ``papers`` (one builder per figure, ``FIGURES``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from specbench.profile import CSV_FIELDS
from specbench.report.compare import commit_text
from specbench.reproduce.figures.drawing import SAVE_OPTIONS, Context, run_footer
from specbench.reproduce.figures.papers import FIGURES
from specbench.reproduce.results import Results
from specbench.reproduce.tables import Built

CATEGORY_FIGURES = frozenset({"self_draft_fig8_ablation", "medusa_fig4b_categories"})
"""The figures built from the results split by MT-Bench category (``load_results(root, by="category")``)."""


def read_profiles(profile_root: Path) -> pd.DataFrame:
    """Every ``latency_*.csv`` under ``profile_root`` as one frame (empty, with the CSV columns, if none)."""
    paths = sorted(Path(profile_root).rglob("latency_*.csv"))
    return pd.concat(map(pd.read_csv, paths), ignore_index=True) if paths else pd.DataFrame(columns=CSV_FIELDS)


def save(figure: Figure, paths: list[Path]) -> None:
    """Write the figure to each path without a date or version in the file (``SAVE_OPTIONS``)."""
    for path in paths:
        figure.savefig(path, **SAVE_OPTIONS[path.suffix])


def build_figures(
    results: Results, by_category: Results, profile_root: Path, out_dir: Path, paper: pd.DataFrame
) -> dict[str, Built]:
    """Write every figure the results hold runs for as ``out_dir/<name>.png`` and ``.pdf`` (removing a skipped
    figure's stale files); {name: Built}, with no paths for a skipped one. ``paper``: ``tables.compare``'s rows."""
    profile = read_profiles(profile_root)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    built = {}
    for name, builder in FIGURES.items():
        drawn = builder(Context(by_category if name in CATEGORY_FIGURES else results, profile, paper))
        paths = [out_dir / f"{name}.{suffix}" for suffix in ("png", "pdf")]
        if drawn is None:
            for path in paths:
                path.unlink(missing_ok=True)
            built[name] = Built([], "no runs of its sweep, or only speedups the same-session rule refuses", None)
            continue
        save(drawn.figure, paths)
        warnings = run_footer(drawn.runs)[1] if len(drawn.runs) else []
        built[name] = Built(
            paths, commit_text(drawn.runs) if len(drawn.runs) else "latency profile", "; ".join(warnings) or None
        )
    return built
