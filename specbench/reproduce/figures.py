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
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import LogLocator, NullLocator, StrMethodFormatter

from specbench.profile import CSV_FIELDS
from specbench.report.compare import commit_text, provenance_warning
from specbench.reproduce.results import Results, format_value, knob, stamp
from specbench.reproduce.tables import Built, paper_values

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
PANEL_SIZE = (4.6, 3.4)  # inches per panel
MIN_WIDTH = 6.4  # inches, so that a one-panel figure still fits its title
CHARS_PER_INCH = {"title": 11, "footer": 16}  # at 10 pt and 6 pt, with room to spare (digits are wide)
LINE_HEIGHT = {"title": 0.17, "footer": 0.1}  # inches per wrapped line
LABELS = {  # column -> (legend symbol, axis label with unit)
    "drafter.branch_len": ("L", "branch length L (tokens)"),
    "drafter.branch_num": ("N_b", "branch number N_b (branches)"),
    "drafter.draft_len": ("K", "drafted tokens per step K (tokens)"),
    "drafter.max_ngram_size": ("N", "n-gram size N (tokens)"),
    "drafter.nodes": ("n", "node budget n (drafted nodes)"),
    "drafter.threshold": ("δ", "threshold δ (expected tokens per layer)"),
    "drafter.tree.kind": ("tree", "tree kind"),
    "acceptance_kwargs.posterior_threshold": ("ε", "posterior threshold ε (probability)"),
    "drafter.decoding_length": ("L_d", "decoding length L_d (tokens per forward)"),
    "drafter.branch_length": ("L_b", "branch length L_b (tokens)"),
    "drafter.output_node_capacity_factor": ("capacity", "trie capacity (output nodes per L_d)"),
    "drafter.window_size": ("W", "window size W (columns)"),
    "drafter.ngram_size": ("N", "n-gram size N (tokens)"),
    "temperature": ("T", "temperature T"),
    "drafted_per_step": ("nodes", "tree size (drafted nodes per step)"),
    "num_tokens": ("n", "new tokens per forward pass (tokens)"),
    "context_length": ("context", "context length (tokens)"),
    "expected": ("E", "expected accepted tokens E, rounded (tokens)"),
    "accepted": ("A", "accepted drafted tokens A (tokens)"),
    "category": ("category", "MT-Bench category"),
}
THROUGHPUT = {"throughput_total": "throughput (tokens/s)"}
SPEEDUP = {"speedup": "speedup over AR (×)"}
METHOD_NAMES = {
    "lookahead_single": "LLMA (single branch)",
    "lookahead_parallel": "Lookahead (Parallel)",
    "lookahead": "Lookahead (Hierarchical)",
}
MEMORY_KINDS = {"process_peak_rss": "process peak RSS, CPU", "cuda_max_allocated": "CUDA allocator peak"}
SELF_DRAFT_VARIANTS = {(True, True): "full", (True, False): "w/o corpus", (False, True): "w/o context"}
COMPARABLE = {"tokens_per_step": "tokens_per_step", "speedup": "speedup", "throughput_total": "speedup"}
"""The published metric a panel's y axis can show beside the measured one (throughput through the paper's speedup)."""
LINE_STYLES = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", (0, (5, 1))), ("P", (0, (1, 1))))
"""Marker and dash of the k-th line of a panel, so lines that coincide stay visible (later ones hollow)."""
PAPER_MARKERS = ("*", "X", "P", "h", "d", "p")
PAPER_COLOUR = "black"
PAPER_CELLS = (
    "red box: the setting the paper reports, its numbers printed in red (tokens per step and speedup as "
    "published, throughput as the paper's speedup × the measured AR throughput)"
)
SAVE_OPTIONS: dict[str, dict[str, Any]] = {
    ".png": {"dpi": 150, "metadata": {"Software": None}},
    ".pdf": {"metadata": {"CreationDate": None, "Producer": None, "Creator": None}},
}
"""No date or version in the files: the same runs rebuild the same bytes."""

L, NB = "drafter.branch_len", "drafter.branch_num"
CONTEXT_CACHE, CORPUS_CACHE = "drafter.use_context_cache", "drafter.use_corpus_cache"
K, N = "drafter.draft_len", "drafter.max_ngram_size"
NODES, THRESHOLD = "drafter.nodes", "drafter.threshold"
TREE_KIND, EPSILON = "drafter.tree.kind", "acceptance_kwargs.posterior_threshold"
DECODING_LENGTH, BRANCH_LENGTH = "drafter.decoding_length", "drafter.branch_length"
WINDOW, NGRAM = "drafter.window_size", "drafter.ngram_size"
WARMUP, CAPACITY, CAPACITY_DEFAULT = "drafter.warmup.dataset", "drafter.output_node_capacity_factor", 16
ABLATIONS = {
    "drafter.insert_prompt": "w/o prompt",
    "drafter.insert_output": "w/o output",  # conf/lookahead_ablation
    "drafter.prune_min_trees": "w/o pruning",
    "drafter.eliminate_input": "w/o elimination",
}
PAPER_ABLATIONS = {
    "Lookahead": "full",
    "Lookahead W/o prompt": "w/o prompt",
    "Lookahead W/o output": "w/o output",
    "Lookahead W/o pruning": "w/o pruning",
    "Lookahead W/o elimin": "w/o elimination",
}


@dataclass(frozen=True)
class Context:
    """What a builder draws from: the runs (whole, or split by category), the latency profiles and the paper rows
    with the runs that measure them (``tables.compare``)."""

    results: Results
    profile: pd.DataFrame
    paper: pd.DataFrame


@dataclass(frozen=True)
class Drawn:
    """A built figure and the runs it shows (for the stamp, the commit check and the index)."""

    figure: Figure
    runs: pd.DataFrame


Builder = Callable[[Context], "Drawn | None"]


# --- selecting runs ----------------------------------------------------------------------------------


def is_set(value) -> bool:
    """Whether a ``hp.*`` cell holds a changed knob (NaN marks a knob left at its default)."""
    return not (value is None or (isinstance(value, float) and math.isnan(value)))


def numeric(values: pd.Series) -> pd.Series:
    """Knob values (objects) as numbers when they all are numbers, else unchanged."""
    try:
        return pd.to_numeric(values)
    except (TypeError, ValueError):
        return values


def sweep(
    runs: pd.DataFrame,
    methods: list[str],
    dataset: str | None,
    axes: tuple[str, ...] = (),
    temperature: float | None = 0.0,
    coupled: tuple[str, ...] = (),
) -> pd.DataFrame:
    """The runs of ``methods`` on ``dataset`` (None: any; its categories too) at ``temperature`` (None: any)
    that change no knob besides ``axes`` and ``coupled``, with each axis's value as a column."""
    chosen = runs[runs["method"].isin(methods)]
    if dataset is not None:
        chosen = chosen[chosen["dataset"].str.split("/", n=1).str[0] == dataset]
    if temperature is not None:
        chosen = chosen[np.isclose(chosen["temperature"], temperature)]
    allowed = {f"hp.{key}" for key in (*axes, *coupled)}
    others = [column for column in chosen.columns if column.startswith("hp.") and column not in allowed]
    unchanged = [not any(map(is_set, row)) for row in chosen[others].itertuples(index=False)]
    chosen = chosen[np.array(unchanged, dtype=bool)]
    return chosen.assign(**{axis: numeric(knob(chosen, axis)) for axis in axes})


def categories(runs: pd.DataFrame) -> pd.Categorical:
    """The category of each run split by category (``dataset/category``), in MT-Bench's order."""
    names = runs["dataset"].str.split("/", n=1).str[1]
    present = set(names.dropna())
    order = [name for name in MT_BENCH_CATEGORIES if name in present] + sorted(present - set(MT_BENCH_CATEGORIES))
    return pd.Categorical(names, categories=order)


def drafted_per_step(samples: pd.DataFrame) -> pd.Series:
    """Mean drafted nodes verified per step of each run (run_dir -> nodes), from the records' ``draft_tokens``."""
    steps = samples["draft_tokens"].map(lambda drafted: drafted or [])
    totals = pd.DataFrame({"run_dir": samples["run_dir"], "nodes": steps.map(sum), "steps": steps.map(len)})
    totals = totals.groupby("run_dir").sum()
    return totals["nodes"] / totals["steps"].replace(0, np.nan)


def step_pairs(samples: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per OPT-Tree step of the runs' records: the model, round(E) and the accepted drafted tokens."""
    chosen = samples[samples["run_dir"].isin(runs["run_dir"])]
    traces = [(model, stats or {}) for model, stats in zip(chosen["model"], chosen["drafter_stats"])]
    rows = [
        (model, math.floor(expected + 0.5), accepted)
        for model, stats in traces
        for expected, accepted in zip(stats.get("step_expected_accept", []), stats.get("step_accepted", []))
    ]
    return pd.DataFrame(rows, columns=["model", "expected", "accepted"]).assign(steps=1)


def ar_throughput(results: Results, runs: pd.DataFrame) -> pd.Series:
    """The throughput of each run's AR baseline (NaN when it has none)."""
    throughput = results.runs.set_index("run_dir")["throughput_total"]
    return runs["ar_run_dir"].map(throughput).astype(float)


# --- points, error bars and paper marks ------------------------------------------------------------


def points(frame: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Per x value: the mean of ``y`` over its runs and an error interval (std over 2+ runs; a single run's
    bootstrap interval for speedup), as ``mean``, ``low``, ``high``."""
    rows = []
    for value, group in frame.dropna(subset=[y]).groupby(x, sort=True, observed=True):
        mean = float(group[y].mean())
        if len(group) > 1:
            low, high = mean - float(group[y].std()), mean + float(group[y].std())
        elif y == "speedup" and {"speedup_ci_low", "speedup_ci_high"} <= set(group):
            low, high = float(group["speedup_ci_low"].iloc[0]), float(group["speedup_ci_high"].iloc[0])
        else:
            low = high = math.nan
        rows.append((value, mean, low, high))
    return pd.DataFrame(rows, columns=[x, "mean", "low", "high"]).set_index(x)


def error_bars(shown: pd.DataFrame) -> np.ndarray:
    """[2, points] distances from each mean down to ``low`` and up to ``high`` (NaN: no bar; a bootstrap interval
    that misses its point estimate is cut at it)."""
    return np.clip(np.vstack([shown["mean"] - shown["low"], shown["high"] - shown["mean"]]), 0, None)


def paper_marks(ctx: Context, runs: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The published numbers of the drawn runs' settings, placed at the run's x (``x``, ``value``, ``model``: the
    paper's method and model): tokens per step and speedup as published, throughput as the paper's speedup x the
    measured AR throughput."""
    metric = COMPARABLE.get(y)
    rows = ctx.paper[ctx.paper["metric"] == metric] if metric else ctx.paper.iloc[0:0]
    scale = ar_throughput(ctx.results, runs) if y == "throughput_total" else pd.Series(1.0, index=runs.index)
    marks = []
    for _, row in rows.iterrows():
        hit = runs[runs["run_dir"].isin(row["matched"])]
        if len(hit) and scale[hit.index].notna().all():
            label = f"{row['paper_method']}, {row['paper_model'] or '?'}"
            marks.append((hit[x].iloc[0], row["value"] * float(scale[hit.index].mean()), label))
    return pd.DataFrame(marks, columns=["x", "value", "model"]).drop_duplicates(ignore_index=True)


def draw_marks(ax, marks: pd.DataFrame, normalised: bool) -> None:
    """The paper's numbers as black markers, one shape per paper model."""
    for index, (model, group) in enumerate(marks.groupby("model", sort=True)):
        label = f"paper: {model}" + (" (its speedup × our AR)" if normalised else "")
        ax.plot(
            group["x"],
            group["value"],
            linestyle="none",
            marker=PAPER_MARKERS[index % len(PAPER_MARKERS)],
            markersize=8,
            color=PAPER_COLOUR,
            markerfacecolor="none",
            label=label,
        )


def unity(ax) -> None:
    """A grey line at 1 (AR) on a speedup axis, inside the view."""
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="AR (1×)")
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, 0.95), max(high, 1.05))


# --- drawing -----------------------------------------------------------------------------------------


def symbol(column: str) -> str:
    """The legend symbol of a column (``N_b``), or the column name."""
    return LABELS.get(column, (column,))[0]


def axis_label(column: str) -> str:
    """The axis label (with unit) of a column, or the column name."""
    return LABELS.get(column, (column, column))[1]


def text(value) -> str:
    """A value as a legend or tick shows it (``6``, ``0.5``, ``sparse``)."""
    return format_value(value.item() if isinstance(value, np.generic) else value)


def scope(runs: pd.DataFrame) -> str:
    """``model(s) on dataset(s), T = ...`` of the plotted runs."""
    datasets = sorted(set(runs["dataset"].str.split("/", n=1).str[0]))
    temperatures = ", ".join(text(t) for t in sorted(set(runs["temperature"])))
    return f"{', '.join(sorted(set(runs['model'])))} on {', '.join(datasets)}, T = {temperatures}"


def sample_note(runs: pd.DataFrame) -> tuple[str, str | None]:
    """``samples per run: 8`` and a warning when the runs' sample counts differ (different sample sets)."""
    counts = sorted(set(runs["n_samples"]))
    if len(counts) == 1:
        return f"samples per run: {counts[0]}", None
    text_ = f"samples per run: {counts[0]}–{counts[-1]}"
    return text_, f"WARNING: points over different sample sets ({text_})"


def run_footer(runs: pd.DataFrame) -> tuple[str, list[str]]:
    """The footer of a figure of runs (stamp, commits, run and sample counts) and its warnings."""
    samples, uneven = sample_note(runs)
    warnings = [warning for warning in (provenance_warning(runs), uneven) if warning]
    return f"measured on: {stamp(runs)} | {commit_text(runs)} | {len(runs)} runs, {samples}", warnings


def new_figure(rows: int, cols: int) -> tuple[Figure, Any]:
    """A figure on the Agg canvas (no pyplot state) with a ``rows`` x ``cols`` array of axes (object ndarray)."""
    fig = Figure(figsize=(max(PANEL_SIZE[0] * cols, MIN_WIDTH), PANEL_SIZE[1] * rows + 0.2))
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def wrapped(text_: str, width: float, kind: str) -> list[str]:
    """``text_`` wrapped to the figure width (a line per paragraph at least)."""
    return [part for line in text_.splitlines() for part in textwrap.wrap(line, int(width * CHARS_PER_INCH[kind]))]


def finish(
    fig: Figure, title: str, runs: pd.DataFrame, footer: str | None = None, warnings: list[str] | None = None
) -> Drawn:
    """Title on top, the footer and warnings (red) at the bottom, wrapped to the width, the panels between."""
    if footer is None:
        footer, warnings = run_footer(runs)
    width = fig.get_figwidth()
    heading = wrapped(title, width, "title")
    notes = wrapped(footer, width, "footer")
    alarms = [part for warning in warnings or [] for part in wrapped(warning, width, "footer")]
    bottom = LINE_HEIGHT["footer"] * (len(notes) + len(alarms)) + 0.1
    fig.set_figheight(fig.get_figheight() + bottom + LINE_HEIGHT["title"] * len(heading))
    height = fig.get_figheight()
    fig.suptitle("\n".join(heading), fontsize=10)
    fig.text(0.005, 0.005, "\n".join(notes), fontsize=6, ha="left", va="bottom")
    if alarms:
        fig.text(
            0.005,
            (0.005 * height + LINE_HEIGHT["footer"] * len(notes) + 0.02) / height,
            "\n".join(alarms),
            fontsize=6,
            ha="left",
            va="bottom",
            color="firebrick",
            fontweight="bold",
        )
    fig.tight_layout(rect=(0, (bottom + 0.05) / height, 1, 1 - (0.1 + LINE_HEIGHT["title"] * len(heading)) / height))
    return Drawn(fig, runs)


def style(index: int) -> dict:
    """Marker, dash and fill of the ``index``-th line of a panel (hollow from the second on)."""
    marker, dash = LINE_STYLES[index % len(LINE_STYLES)]
    return {
        "marker": marker,
        "linestyle": dash,
        "markersize": 5 if index else 4,
        "markerfacecolor": None if index == 0 else "none",
        "color": f"C{index % 10}",
    }


def coinciding(line: pd.Series, drawn: dict[str, pd.Series]) -> str:
    """`` (= L_b = 4, hidden under it)`` when ``line`` equals an earlier line of the panel at every point."""
    for name, other in drawn.items():
        if line.index.equals(other.index) and np.allclose(line.to_numpy(), other.to_numpy(), equal_nan=True):
            return f" (= {name}: they coincide)"
    return ""


def log2_axis(axis, values: pd.Series) -> None:
    """A base-2 log axis with plain numbers as ticks: the drawn values when they are whole numbers (knob settings),
    else powers of 2."""
    whole = sorted({float(value) for value in values.dropna()})
    if whole and all(value.is_integer() for value in whole):
        axis.set_ticks(whole)
        axis.set_minor_locator(NullLocator())
    else:
        axis.set_major_locator(LogLocator(base=2))
    axis.set_major_formatter(StrMethodFormatter("{x:g}"))


def plot_lines(
    ax, frame: pd.DataFrame, x: str, y: str, by: list[str], log2: bool = False, label: str | None = None
) -> None:
    """Mean ``y`` against ``x`` with error bars, one line per group of ``by`` (and per model when several)."""
    by = (["model"] if frame["model"].nunique() > 1 else []) + list(by)
    drawn: dict[str, pd.Series] = {}
    for index, (key, group) in enumerate(frame.groupby(by, sort=True) if by else [((), frame)]):
        shown = points(group, x, y)
        name = ", ".join(text(v) if c in ("model", "method") else f"{symbol(c)} = {text(v)}" for c, v in zip(by, key))
        name = name or label or ""
        errors = error_bars(shown)
        ax.errorbar(
            shown.index,
            shown["mean"],
            yerr=errors,
            capsize=2,
            linewidth=1.2,
            label=name + coinciding(shown["mean"], drawn),
            **style(index),
        )
        drawn[name] = shown["mean"]
    if log2:
        ax.set_xscale("log", base=2)
        log2_axis(ax.xaxis, frame[x])
    ax.set_xlabel(axis_label(x))
    ax.grid(True, alpha=0.3)


def plot_heatmap(ax, frame: pd.DataFrame, row: str, col: str, value: str, aggfunc: str = "mean") -> pd.DataFrame:
    """``value`` aggregated over a ``row`` x ``col`` grid as an annotated heat map with a colour bar; the grid."""
    grid = frame.pivot_table(index=row, columns=col, values=value, aggfunc=aggfunc).sort_index().sort_index(axis=1)
    if grid.empty:
        ax.text(0.5, 0.5, f"no {value} values", ha="center", va="center", transform=ax.transAxes)
        return grid
    cells = grid.to_numpy(float)
    image = ax.imshow(cells, origin="lower", aspect="auto", cmap="viridis")
    for (i, j), cell in np.ndenumerate(cells):
        if not np.isnan(cell):
            ax.text(
                j,
                i,
                f"{cell:.3g}",
                ha="center",
                va="center",
                fontsize=7,
                color="black" if image.norm(cell) > 0.6 else "white",
            )
    ax.set_xticks(range(len(grid.columns)), [text(v) for v in grid.columns])
    ax.set_yticks(range(len(grid.index)), [text(v) for v in grid.index])
    ax.set_xlabel(axis_label(col))
    ax.set_ylabel(axis_label(row))
    ax.figure.colorbar(image, ax=ax)
    return grid


def mark_cells(ax, grid: pd.DataFrame, marks: pd.DataFrame) -> None:
    """Outline each cell that has published numbers and print them (red) under the measured value."""
    for (row, col), values in marks.groupby("x", sort=True)["value"]:
        if row in grid.index and col in grid.columns:
            i, j = grid.index.get_loc(row), grid.columns.get_loc(col)
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
            ax.text(
                j,
                i - 0.3,
                "paper " + " / ".join(f"{value:.3g}" for value in values),
                ha="center",
                va="center",
                fontsize=5.5,
                color="red",
                fontweight="bold",
            )


def line_figure(
    ctx: Context,
    title: str,
    runs: pd.DataFrame,
    x: str,
    ys: dict[str, str],
    by: tuple[str, ...] = (),
    panels: str | None = None,
    log2: bool = False,
    label: str | None = None,
    references: dict[str, pd.DataFrame] | None = None,
) -> Drawn | None:
    """One row of panels per metric in ``ys`` (and one column per value of ``panels``), lines per ``by`` with error
    bars, the paper's numbers marked, dashed horizontal ``references`` (label -> runs) and a line at 1 under a
    speedup; None with fewer than two x values or no y value."""
    if runs.empty or runs[x].nunique() < 2 or runs[list(ys)].isna().all(axis=None):
        return None
    groups = list(runs.groupby(panels, sort=True)) if panels else [(None, runs)]
    fig, axes = new_figure(len(ys), len(groups))
    for column, (panel, group) in enumerate(groups):
        for row, (y, y_label) in enumerate(ys.items()):
            ax = axes[row, column]
            plot_lines(ax, group, x, y, list(by), log2, label)
            draw_references(ax, y, references or {})
            draw_marks(ax, paper_marks(ctx, group, x, y), y == "throughput_total")
            if y == "speedup":
                unity(ax)
            ax.set_ylabel(y_label)
            ax.legend(fontsize=6)
            if panel is not None:
                ax.set_title(METHOD_NAMES.get(panel, str(panel)), fontsize=9)
    shown = pd.concat([runs, *(references or {}).values()])
    return finish(fig, f"{title}\n{scope(runs)}", shown)


def draw_references(ax, y: str, references: dict[str, pd.DataFrame]) -> None:
    """Each reference's mean ``y`` as a dashed horizontal line (skipped when it has no value)."""
    for index, (name, reference) in enumerate(references.items()):
        if reference[y].notna().any():
            ax.axhline(reference[y].mean(), linestyle="--", color=f"C{index + 5}", label=name)


def heat_figure(
    ctx: Context,
    title: str,
    frame: pd.DataFrame,
    row: str,
    col: str,
    values: dict[str, str],
    runs: pd.DataFrame | None = None,
    aggfunc: str = "mean",
) -> Drawn | None:
    """One heat map per model (rows) and metric in ``values`` (columns), published numbers printed in red in their
    cells; None with fewer than two cells."""
    runs = frame if runs is None else runs
    if frame.empty or frame.groupby([row, col]).ngroups < 2:
        return None
    models = sorted(set(frame["model"]))
    fig, axes = new_figure(len(models), len(values))
    marked = 0
    for i, model in enumerate(models):
        for j, (value, label) in enumerate(values.items()):
            chosen = frame[frame["model"] == model]
            grid = plot_heatmap(axes[i, j], chosen, row, col, value, aggfunc)
            if "run_dir" in chosen:
                marks = paper_marks(ctx, chosen.assign(cell=list(zip(chosen[row], chosen[col]))), "cell", value)
                mark_cells(axes[i, j], grid, marks)
                marked += len(marks)
            axes[i, j].set_title(f"{model}: {label}", fontsize=9)
    footer, warnings = run_footer(runs)
    if marked:
        footer += f" | {PAPER_CELLS}"
    return finish(fig, f"{title}\n{scope(runs)}", runs, footer, warnings)


def bar_figure(ctx: Context, title: str, runs: pd.DataFrame, series: str, value: str, label: str) -> Drawn | None:
    """Grouped bars of the mean ``value`` per MT-Bench category (one bar per ``series`` value) with the bootstrap
    interval of each run, the paper's numbers marked, a line at 1 (AR); a panel per model; None without values."""
    runs = runs.assign(category=categories(runs)).dropna(subset=["category", value])
    if runs.empty:
        return None
    models = sorted(set(runs["model"]))
    fig, axes = new_figure(1, len(models))
    for ax, model in zip(axes.flat, models):
        chosen = runs[runs["model"] == model]
        names = list(chosen[series].cat.categories if hasattr(chosen[series], "cat") else sorted(set(chosen[series])))
        names = [name for name in names if (chosen[series] == name).any()]
        order = list(chosen["category"].cat.categories)
        width = 0.8 / len(names)
        for index, name in enumerate(names):
            shown = points(chosen[chosen[series] == name], "category", value).reindex(order)
            offset = (index - (len(names) - 1) / 2) * width
            errors = error_bars(shown)
            ax.bar(
                np.arange(len(order)) + offset,
                shown["mean"],
                width,
                yerr=errors,
                capsize=2,
                label=text(name),
                color=f"C{index}",
            )
        marks = paper_marks(
            ctx, chosen.assign(position=[order.index(c) for c in chosen["category"]]), "position", value
        )
        draw_marks(ax, marks, False)
        unity(ax)
        ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
        ax.set_xlabel(axis_label("category"))
        ax.set_ylabel(label)
        ax.set_ylim(0, 1.25 * max(np.nanmax(ax.get_ylim()), 1.0))
        ax.set_title(model, fontsize=9)
        ax.legend(fontsize=6, loc="upper left", ncols=2)
    return finish(fig, f"{title}\n{scope(runs)}", runs)


# --- the figures -------------------------------------------------------------------------------------


def self_draft_grid(results: Results) -> pd.DataFrame:
    """Self-Draft's L x N_b runs on MT-Bench (the defaults included)."""
    return sweep(results.runs, ["self_draft"], "mt_bench", (L, NB))


def self_draft_fig5_branch_length(ctx: Context) -> Drawn | None:
    """Self-Draft Fig 5: TP and DE against branch length L at N_b = 6 (at each N_b when 6 was not run)."""
    runs = self_draft_grid(ctx.results)
    runs = runs[runs[NB] == 6] if (runs[NB] == 6).any() else runs
    return line_figure(
        ctx,
        "Self-Draft Fig 5: throughput (TP) and DE vs branch length L",
        runs,
        L,
        {**THROUGHPUT, "tokens_per_step": "DE (tokens per step)"},
        by=(NB,),
    )


def self_draft_fig6_branch_number(ctx: Context) -> Drawn | None:
    """Self-Draft Fig 6: TP and DE against branch number N_b, one line per branch length L."""
    return line_figure(
        ctx,
        "Self-Draft Fig 6: throughput (TP) and DE vs branch number N_b",
        self_draft_grid(ctx.results),
        NB,
        {**THROUGHPUT, "tokens_per_step": "DE (tokens per step)"},
        by=(L,),
    )


def self_draft_fig7_heatmap(ctx: Context) -> Drawn | None:
    """Self-Draft Fig 7: throughput and DE over branch length L x branch number N_b, one row per model."""
    return heat_figure(
        ctx,
        "Self-Draft Fig 7: throughput and DE over L × N_b",
        self_draft_grid(ctx.results),
        L,
        NB,
        {**THROUGHPUT, "tokens_per_step": "DE (tokens per step)"},
    )


def self_draft_fig8_ablation(ctx: Context) -> Drawn | None:
    """Self-Draft Fig 8: per-category speedup, full / w/o corpus / w/o context (split results)."""
    runs = sweep(ctx.results.runs, ["self_draft"], "mt_bench", (CONTEXT_CACHE, CORPUS_CACHE))
    variants = [
        SELF_DRAFT_VARIANTS[bool(context), bool(corpus)]
        for context, corpus in zip(runs[CONTEXT_CACHE], runs[CORPUS_CACHE])
    ]
    runs = runs.assign(variant=pd.Categorical(variants, categories=list(SELF_DRAFT_VARIANTS.values())))
    if runs["variant"].nunique() < 2:
        return None
    return bar_figure(
        ctx,
        "Self-Draft Fig 8: cache ablation, speedup per MT-Bench category",
        runs,
        "variant",
        "speedup",
        SPEEDUP["speedup"],
    )


def anpd_grid(results: Results) -> pd.DataFrame:
    """ANPD's K x N runs on CNN/DM (the defaults included)."""
    return sweep(results.runs, ["anpd"], "cnndm", (K, N))


def anpd_fig3_draft_len(ctx: Context) -> Drawn | None:
    """ANPD Fig 3: speed-up against drafted tokens K at N = 2."""
    runs = anpd_grid(ctx.results)
    return line_figure(
        ctx, "ANPD Fig 3: speed-up vs drafted tokens K (N = 2)", runs[runs[N] == 2], K, SPEEDUP, label="ANPD, N = 2"
    )


def anpd_fig4_5_ngram_size(ctx: Context) -> Drawn | None:
    """ANPD Figs 4/5: speed-up against the n-gram size N, one line per K in {6, 7, 8}."""
    runs = anpd_grid(ctx.results)
    return line_figure(
        ctx,
        "ANPD Figs 4/5: speed-up vs n-gram size N (multi-level n-gram)",
        runs[runs[K].isin([6, 7, 8])],
        N,
        SPEEDUP,
        by=(K,),
    )


def opt_tree_fig4_expected_vs_accepted(ctx: Context) -> Drawn | None:
    """OPT-Tree Fig 4: step counts over round(E) x actual accepted tokens, OPT-Tree at its defaults, T = 0."""
    runs = sweep(ctx.results.runs, ["opt_tree"], None)
    return heat_figure(
        ctx,
        "OPT-Tree Fig 4: expected vs actual acceptance per step",
        step_pairs(ctx.results.samples, runs),
        "accepted",
        "expected",
        {"steps": "steps"},
        runs=runs,
        aggfunc="sum",
    )


def opt_tree_fig5_node_budget(ctx: Context) -> Drawn | None:
    """OPT-Tree Fig 5: mean acceptance length (MAL) against the node budget n."""
    return line_figure(
        ctx,
        "OPT-Tree Fig 5: mean acceptance length vs node budget n",
        sweep(ctx.results.runs, ["opt_tree"], "mt_bench", (NODES,)),
        NODES,
        {"tokens_per_step": "MAL (tokens per step)"},
        log2=True,
        label="OPT-Tree",
    )


def opt_tree_fig6_threshold(ctx: Context) -> Drawn | None:
    """OPT-Tree Fig 6: MAL and tokens/s against the threshold δ."""
    return line_figure(
        ctx,
        "OPT-Tree Fig 6: MAL and throughput vs threshold δ",
        sweep(ctx.results.runs, ["opt_tree"], "mt_bench", (THRESHOLD,)),
        THRESHOLD,
        {"tokens_per_step": "MAL (tokens per step)", **THROUGHPUT},
        label="OPT-Tree",
    )


def opt_tree_fig7_temperature(ctx: Context) -> Drawn | None:
    """OPT-Tree Fig 7: MAL and tokens/s against temperature, OPT-Tree at its defaults beside AR."""
    runs = sweep(ctx.results.runs, ["opt_tree", "ar"], "mt_bench", temperature=None)
    runs = runs[runs["temperature"].isin(runs.loc[runs["method"] == "opt_tree", "temperature"])]
    return line_figure(
        ctx,
        "OPT-Tree Fig 7: MAL and throughput vs temperature",
        runs,
        "temperature",
        {"tokens_per_step": "MAL (tokens per step)", **THROUGHPUT},
        by=("method",),
    )


def medusa_fig4b_categories(ctx: Context) -> Drawn | None:
    """Medusa Fig 4b: speedup of Medusa over AR per MT-Bench category (results split by category)."""
    return bar_figure(
        ctx,
        "Medusa Fig 4b: speedup per MT-Bench category",
        sweep(ctx.results.runs, ["medusa"], "mt_bench"),
        "method",
        "speedup",
        SPEEDUP["speedup"],
    )


def medusa_fig6_tree_size(ctx: Context) -> Drawn | None:
    """Medusa Fig 6: acceleration rate and tokens/s against the drafted nodes per step, sparse vs dense trees."""
    runs = sweep(
        ctx.results.runs,
        ["medusa"],
        "mt_bench",
        (TREE_KIND,),
        coupled=("drafter.tree.sizes", "drafter.tree.node_budget"),
    )
    runs = runs.assign(drafted_per_step=runs["run_dir"].map(drafted_per_step(ctx.results.samples)))
    return line_figure(
        ctx,
        "Medusa Fig 6: acceleration rate and throughput vs tree size",
        runs,
        "drafted_per_step",
        {"tokens_per_step": "acceleration rate (tokens per step)", **THROUGHPUT},
        by=(TREE_KIND,),
        log2=True,
    )


def medusa_fig7_epsilon(ctx: Context) -> Drawn | None:
    """Medusa Fig 7: typical acceptance's acceleration rate and tokens/s against ε at T = 0.7, with Medusa's
    exact sample-and-match (T = 0.7) and greedy (T = 0) runs as references."""
    runs = ctx.results.runs
    references = {
        "Medusa, sample-and-match (T = 0.7)": sweep(runs, ["medusa"], "mt_bench", temperature=0.7),
        "Medusa, greedy (T = 0)": sweep(runs, ["medusa"], "mt_bench"),
    }
    return line_figure(
        ctx,
        "Medusa Fig 7: typical acceptance, acceleration rate vs ε (δ = √ε)",
        sweep(runs, ["medusa_typical"], "mt_bench", (EPSILON,), temperature=0.7),
        EPSILON,
        {"tokens_per_step": "acceleration rate (tokens per step)", **THROUGHPUT},
        label="Medusa, typical acceptance (T = 0.7)",
        references={name: chosen for name, chosen in references.items() if not chosen.empty},
    )


def lookahead_fig1_latency(ctx: Context) -> Drawn | None:
    """Lookahead Fig 1: one-forward latency against tokens per pass, one line per context length (chain mask), on
    log-log axes so that the flat region of small passes shows."""
    chain = ctx.profile[ctx.profile["mask"] == "chain"]
    if chain.empty:
        return None
    models = sorted(set(chain["model"]))
    fig, axes = new_figure(1, len(models))
    for ax, model in zip(axes.flat, models):
        rows = chain[chain["model"] == model]
        plot_lines(ax, rows, "num_tokens", "median_ms", ["context_length"], log2=True)
        ax.set_yscale("log")
        ax.set_ylabel("forward latency (ms, median, log scale)")
        ax.set_title(f"{model}, {', '.join(sorted(set(rows['dtype'])))}", fontsize=9)
        ax.legend(fontsize=6)
    devices = ", ".join(sorted(set(chain["device_name"])))
    repeats = ", ".join(str(r) for r in sorted(set(chain["repeats"])))
    return finish(
        fig,
        f"Lookahead Fig 1 / OPT-Tree Fig 3: forward latency vs new tokens per pass (chain mask)\n{devices}",
        chain.iloc[0:0],
        f"measured on: {devices} | latency profile, {repeats} timed repeats per cell (median)",
    )


def lookahead_fig4_5_length_grid(ctx: Context) -> Drawn | None:
    """Lookahead Figs 4/5: tokens/s and EDL against decoding length, one line per branch length, a panel per mode."""
    runs = sweep(ctx.results.runs, list(METHOD_NAMES), "dolly", (DECODING_LENGTH, BRANCH_LENGTH))
    return line_figure(
        ctx,
        "Lookahead Figs 4/5: throughput and EDL vs decoding length",
        runs,
        DECODING_LENGTH,
        {**THROUGHPUT, "tokens_per_step": "EDL (tokens per step)"},
        by=(BRANCH_LENGTH,),
        panels="method",
        log2=True,
    )


def relative_memory(runs: pd.DataFrame) -> pd.Series:
    """Peak memory of each run over the run with the shortest decoding length of the same model."""
    base = runs.sort_values(DECODING_LENGTH).groupby("model")["peak_memory_gib"].first()
    return runs["peak_memory_gib"] / runs["model"].map(base).astype(float)


def lookahead_fig6_memory(ctx: Context) -> Drawn | None:
    """Lookahead Fig 6: peak memory against decoding length (hierarchical lookahead), from zero, and relative to the
    shortest decoding length beside the paper's relative increase (its GPU and model differ)."""
    runs = sweep(ctx.results.runs, ["lookahead"], "dolly", (DECODING_LENGTH,))
    if runs.empty or runs[DECODING_LENGTH].nunique() < 2:
        return None
    runs = runs.assign(relative=relative_memory(runs))
    kinds = ", ".join(MEMORY_KINDS.get(kind, str(kind)) for kind in sorted(set(runs["peak_memory_kind"].dropna())))
    fig, axes = new_figure(1, 2)
    absolute, relative = axes[0]
    plot_lines(absolute, runs, DECODING_LENGTH, "peak_memory_gib", [], log2=True, label="measured (Dolly)")
    absolute.set_ylim(bottom=0, top=1.15 * runs["peak_memory_gib"].max())
    absolute.set_ylabel(f"peak memory (GiB, {kinds or 'unknown'})")
    plot_lines(relative, runs, DECODING_LENGTH, "relative", [], log2=True, label="measured (Dolly)")
    paper = paper_values()
    paper = paper[(paper["paper"] == "lookahead") & (paper["table"] == "Fig 6")]
    lengths = [float(parse_knob(setting, f"method.{DECODING_LENGTH}", 64)) for setting in paper["setting"]]
    paper = pd.Series(paper["value"].to_numpy(), index=lengths).sort_index()
    relative.plot(
        paper.index,
        paper / paper.iloc[0],
        linestyle="none",
        marker="*",
        markersize=9,
        color=PAPER_COLOUR,
        markerfacecolor="none",
        label="paper (GPU, its model and data)",
    )
    relative.set_ylabel(f"peak memory / at L_d = {text(runs[DECODING_LENGTH].min())} (×)")
    for ax in (absolute, relative):
        ax.legend(fontsize=6)
    return finish(fig, f"Lookahead Fig 6: peak memory vs decoding length\n{scope(runs)}", runs)


def lookahead_table5_rows(results: Results) -> pd.DataFrame:
    """Hierarchical Lookahead on Dolly with the dev warm-up: full (r5_table4) and one Table 5 switch each
    (r5_ablation), labelled, throughput relative to the full runs of the same model."""
    runs = sweep(results.runs, ["lookahead"], "dolly", coupled=(WARMUP, *ABLATIONS))
    runs = runs[runs.get(f"hp.{WARMUP}", pd.Series(np.nan, index=runs.index)).map(is_set)]
    if runs.empty:
        return runs
    labels = [
        next((name for key, name in ABLATIONS.items() if is_set(row.get(f"hp.{key}"))), "full")
        for _, row in runs.iterrows()
    ]
    runs = runs.assign(ablation=labels)
    full = runs[runs["ablation"] == "full"].groupby("model")["throughput_total"].mean()
    relative = runs["throughput_total"] / runs["model"].map(full).astype(float)
    return runs.assign(relative=relative).dropna(subset=["relative"])


def lookahead_capacity_rows(results: Results) -> pd.DataFrame:
    """Hierarchical Lookahead on Dolly per trie capacity, throughput relative to the default (16 x L_d)."""
    capacity = sweep(results.runs, ["lookahead"], "dolly", (CAPACITY,))
    if capacity.empty:
        return capacity
    default = capacity[capacity[CAPACITY] == CAPACITY_DEFAULT].groupby("model")["throughput_total"].mean()
    capacity = capacity.assign(relative=capacity["throughput_total"] / capacity["model"].map(default).astype(float))
    return capacity.dropna(subset=["relative"])


def draw_table5(ax, ablation: pd.DataFrame, paper: pd.DataFrame) -> None:
    """Lookahead Table 5: measured (Dolly) and paper (AntRAG) throughput relative to full Lookahead per ablation."""
    paper = paper[paper["table"] == "Table 5"].set_index("paper_method")["value"]
    paper = (paper / paper["Lookahead"]).rename(lambda name: PAPER_ABLATIONS.get(name, name))
    order = ["full", *ABLATIONS.values()]
    measured = ablation.groupby("ablation")["relative"].agg(["mean", "std"]).reindex(order)
    positions = np.arange(len(order))
    ax.bar(positions - 0.2, measured["mean"], 0.4, yerr=measured["std"].to_numpy(), capsize=2, label="measured (Dolly)")
    ax.bar(positions + 0.2, paper.reindex(order).to_numpy(), 0.4, label="paper (AntRAG)", color="grey")
    ax.set_xticks(positions, order, rotation=20, ha="right")
    ax.set_ylabel("throughput / full Lookahead (×)")
    ax.set_title("Table 5: ablations", fontsize=9)


def draw_table6(ax, capacity: pd.DataFrame, paper: pd.DataFrame) -> None:
    """Lookahead Table 6: measured (Dolly) and paper (AntRAG) throughput relative to the default trie capacity."""
    paper = paper[paper["table"] == "Table 6"]
    factors = [float(parse_knob(setting, f"method.{CAPACITY}", CAPACITY_DEFAULT)) for setting in paper["setting"]]
    paper = pd.Series(paper["value"].to_numpy(), index=factors).sort_index()
    plot_lines(ax, capacity, CAPACITY, "relative", [], log2=True, label="measured (Dolly)")
    ax.plot(
        paper.index,
        (paper / paper[float(CAPACITY_DEFAULT)]).to_numpy(),
        linestyle="--",
        marker="*",
        markersize=7,
        color=PAPER_COLOUR,
        markerfacecolor="none",
        label="paper (AntRAG)",
    )
    ax.set_ylabel(f"throughput / {CAPACITY_DEFAULT:g} × L_d capacity (×)")
    ax.set_title("Table 6: trie capacity", fontsize=9)


def lookahead_table5_6(ctx: Context) -> Drawn | None:
    """Lookahead Tables 5 and 6 on the public substitute (Dolly, not the private AntRAG/AntGLM-10B): throughput
    relative to full Lookahead per ablation, and relative to the 16 x L_d default per trie capacity, beside the
    paper's AntRAG ratios (paper_values); a panel per table that has runs."""
    values = paper_values()
    values = values[values["paper"] == "lookahead"]
    frames = {"table5": lookahead_table5_rows(ctx.results), "table6": lookahead_capacity_rows(ctx.results)}
    panels = [
        name
        for name, frame in frames.items()
        if not frame.empty and frame["ablation" if name == "table5" else CAPACITY].nunique() >= 2
    ]
    if not panels:
        return None
    fig, axes = new_figure(1, len(panels))
    for ax, panel in zip(axes.flat, panels):
        (draw_table5 if panel == "table5" else draw_table6)(ax, frames[panel], values)
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=0.8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    shown = pd.concat([frames[panel] for panel in panels])
    runs_footer, warnings = run_footer(shown)
    return finish(
        fig,
        "Lookahead Tables 5 and 6 on a public substitute: relative throughput\n" + scope(shown),
        shown,
        runs_footer + " | paper: AntGLM-10B on AntRAG (private), its ratios shown for the trend",
        warnings,
    )


def parse_knob(setting: str, key: str, default: float) -> float:
    """The value a paper row's setting gives ``key`` (``default`` when it sets none)."""
    for item in str(setting).split(";"):
        name, _, value = item.partition("=")
        if name.strip() == key:
            return float(value)
    return float(default)


def lade_window_ngram(ctx: Context) -> Drawn | None:
    """LADE W x N sweep (G = W): tokens per step and speedup over window size W x n-gram size N."""
    runs = sweep(ctx.results.runs, ["lade"], "mt_bench", (WINDOW, NGRAM), coupled=("drafter.guess_set_size",))
    return heat_figure(
        ctx,
        "LADE window size W × n-gram size N (G = W)",
        runs,
        WINDOW,
        NGRAM,
        {"tokens_per_step": "tokens per step", **SPEEDUP},
    )


FIGURES: dict[str, Builder] = {
    "self_draft_fig5_branch_length": self_draft_fig5_branch_length,
    "self_draft_fig6_branch_number": self_draft_fig6_branch_number,
    "self_draft_fig7_heatmap": self_draft_fig7_heatmap,
    "self_draft_fig8_ablation": self_draft_fig8_ablation,
    "anpd_fig3_draft_len": anpd_fig3_draft_len,
    "anpd_fig4_5_ngram_size": anpd_fig4_5_ngram_size,
    "opt_tree_fig4_expected_vs_accepted": opt_tree_fig4_expected_vs_accepted,
    "opt_tree_fig5_node_budget": opt_tree_fig5_node_budget,
    "opt_tree_fig6_threshold": opt_tree_fig6_threshold,
    "opt_tree_fig7_temperature": opt_tree_fig7_temperature,
    "medusa_fig4b_categories": medusa_fig4b_categories,
    "medusa_fig6_tree_size": medusa_fig6_tree_size,
    "medusa_fig7_epsilon": medusa_fig7_epsilon,
    "lookahead_fig1_latency": lookahead_fig1_latency,
    "lookahead_fig4_5_length_grid": lookahead_fig4_5_length_grid,
    "lookahead_fig6_memory": lookahead_fig6_memory,
    "lookahead_table5_6": lookahead_table5_6,
    "lade_window_ngram": lade_window_ngram,
}
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
            built[name] = Built([], "no runs", None)
            continue
        save(drawn.figure, paths)
        warnings = run_footer(drawn.runs)[1] if len(drawn.runs) else []
        built[name] = Built(
            paths, commit_text(drawn.runs) if len(drawn.runs) else "latency profile", "; ".join(warnings) or None
        )
    return built
