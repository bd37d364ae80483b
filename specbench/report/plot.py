"""The report's figures: acceptance by draft depth of each run (``--view acceptance --plot OUT.png``, and the
``acceptance.png`` every benchmark session writes), speedup and tokens per step against the batch size
(``--view batch --plot OUT.png``, the ``batch.png`` of a session that sweeps it), and speedup, tokens per step and
step latency against the input length (``--view length --plot OUT.png``)."""

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
    return save_figure("acceptance", table, path, title)


BATCH_PANELS = {"speedup": "speedup over AR at the same batch size", "tokens_per_step": "tokens per step"}


def batch_figure(table: pd.DataFrame, title: str) -> Figure:
    """Speedup and tokens per step against the batch size (or the concurrency, for runs against a server), one line
    per method and engine of a ``batch`` table."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(BATCH_PANELS), sharex=True)
    served = bool((table["concurrency"] > 0).all())
    x = "concurrency" if served else "batch_size"
    xlabel = "concurrency (requests in flight)" if served else "batch size (requests generated together)"
    ticks = sorted(table[x].unique())
    for ax, (column, label) in zip(axes, BATCH_PANELS.items(), strict=True):
        for (method, engine), rows in table.groupby(["method", "engine"], sort=False):
            rows = rows.sort_values(x)
            ax.plot(rows[x], rows[column], marker="o", label=f"{method} ({engine})")
        ax.set(title=label, xlabel=xlabel, xscale="log", ylabel=column)
        ax.set_xticks(ticks, [str(n) for n in ticks])
        ax.grid(alpha=0.3)
    axes[0].axhline(1.0, color="grey", linewidth=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


LENGTH_PANELS = {
    "speedup": "speedup over AR at the same input length",
    "tokens_per_step": "tokens per step",
    "step_latency_s": "step latency (s)",
}


def length_figure(table: pd.DataFrame, title: str) -> Figure:
    """Speedup, tokens per step and step latency against the mean prompt length, one line per method of a
    ``length`` table."""
    fig = Figure(figsize=(14, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(LENGTH_PANELS), sharex=True)
    for ax, (column, label) in zip(axes, LENGTH_PANELS.items(), strict=True):
        for method, rows in table.groupby("method", sort=False):
            rows = rows.sort_values("prompt_tokens_mean")
            ax.plot(rows["prompt_tokens_mean"], rows[column], marker="o", label=str(method))
        ax.set(title=label, xlabel="input length (prompt tokens, mean)", xscale="log", ylabel=column)
        ax.grid(alpha=0.3)
    axes[0].axhline(1.0, color="grey", linewidth=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


FIGURES = {"acceptance": acceptance_figure, "batch": batch_figure, "length": length_figure}
"""The views ``--plot`` draws, and how."""


def save_figure(view: str, table: pd.DataFrame, path: Path, title: str) -> Path:
    """Draw ``view``'s figure of ``table`` into ``path`` (PNG; the same table gives the same bytes); return it."""
    FIGURES[view](table, title).savefig(path, dpi=150, metadata={"Software": None})
    return path
