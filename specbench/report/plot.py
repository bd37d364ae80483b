"""The report's figure: acceptance by draft depth of each run (``--view acceptance --plot OUT.png``, and the
``acceptance.png`` every benchmark session writes)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

RATES = {
    "joint": "joint: P(accepted ≥ d | tree reached d)",
    "conditional": "conditional: P(accepted ≥ d | accepted ≥ d-1)",
}


def acceptance_figure(table: pd.DataFrame, title: str) -> Figure:
    """Joint and conditional acceptance against draft depth, one line per run of an ``acceptance`` table."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(RATES), sharex=True)
    drafted = table[table["depth"] > 0]
    for ax, (rate, label) in zip(axes, RATES.items(), strict=True):
        for run, rows in drafted.groupby("run", sort=False):
            ax.plot(rows["depth"], rows[rate], marker="o", label=str(run))
        ax.set(title=label, xlabel="draft depth d (tokens)", ylabel="rate", ylim=(0, 1))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


def save_acceptance_figure(table: pd.DataFrame, path: Path, title: str) -> Path:
    """Draw the acceptance figure of ``table`` into ``path`` (PNG); return the path."""
    acceptance_figure(table, title).savefig(path, dpi=150, metadata={"Software": None})  # same table, same bytes
    return path
