"""Drawing helpers shared by the papers' figures: sweeps of stored runs, error bars, the papers' marks,
figures with their footers (hardware, commits, samples) and byte-reproducible saving options."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import LogLocator, NullLocator, StrMethodFormatter

from specbench.report.compare import commit_text, provenance_warning
from specbench.reproduce.results import Results, format_value, knob, stamp

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
COMPARABLE = {"tokens_per_step": "tokens_per_step", "speedup": "speedup", "throughput_total": "speedup"}
"""The published metric a panel's y axis can show beside the measured one (throughput through the paper's speedup)."""
LINE_STYLES = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", (0, (5, 1))), ("P", (0, (1, 1))))
"""Marker and dash of the k-th line of a panel, so lines that coincide stay visible (later ones hollow)."""
PAPER_MARKERS = ("*", "X", "P", "h", "d", "p")
PAPER_COLOUR = "black"
PAPER_CELLS = (
    "red box: the setting the paper reports, its numbers printed in red (tokens per step and speedup as "
    "published; 'paper-derived' throughput: the paper's speedup × the measured AR throughput)"
)
SAVE_OPTIONS: dict[str, dict[str, Any]] = {
    ".png": {"dpi": 150, "metadata": {"Software": None}},
    ".pdf": {"metadata": {"CreationDate": None, "Producer": None, "Creator": None}},
}
"""No date or version in the files: the same runs rebuild the same bytes."""


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


def of_sessions(ctx: Context, *experiments: str) -> pd.DataFrame:
    """Every run the named experiments' sessions measured, their own copy of a setting other sessions measured too
    included: a figure of one sweep draws one session's runs, so its points (and their AR partners) were timed in
    one sitting."""
    every = ctx.results.every_run
    return every[every["experiment"].isin(experiments)]


def sweep(
    runs: pd.DataFrame,
    methods: list[str],
    dataset: str | None,
    axes: tuple[str, ...] = (),
    temperature: float | None = 0.0,
    coupled: tuple[str, ...] = (),
    categories: str = "",
) -> pd.DataFrame:
    """The runs of ``methods`` on ``dataset`` (None: any; its categories too) at ``temperature`` (None: any)
    that change no knob besides ``axes`` and ``coupled``, with each axis's value as a column; only runs of the
    whole dataset, or of the ``categories`` it names (``dataset.categories`` joined by commas)."""
    chosen = runs[runs["method"].isin(methods) & (runs["categories"] == categories)]
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
    throughput = results.every_run.set_index("run_dir")["throughput_total"]
    return runs["ar_run_dir"].map(throughput).astype(float)


# --- points, error bars and paper marks ------------------------------------------------------------


def points(frame: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Per x value: the mean of ``y`` over its runs and an error interval (std over 2+ runs; a single run's
    bootstrap interval over its samples for speedup, throughput and tokens per step), as ``mean``, ``low``,
    ``high``; NaN where there is none (peak memory is one value per run)."""
    rows = []
    for value, group in frame.dropna(subset=[y]).groupby(x, sort=True, observed=True):
        mean = float(group[y].mean())
        if len(group) > 1:
            low, high = mean - float(group[y].std()), mean + float(group[y].std())
        elif {f"{y}_ci_low", f"{y}_ci_high"} <= set(group):
            low, high = float(group[f"{y}_ci_low"].iloc[0]), float(group[f"{y}_ci_high"].iloc[0])
        else:
            low = high = math.nan
        rows.append((value, mean, low, high))
    return pd.DataFrame(rows, columns=[x, "mean", "low", "high"]).set_index(x)


def error_bars(shown: pd.DataFrame) -> np.ndarray:
    """[2, points] distances from each mean down to ``low`` and up to ``high`` (NaN: no bar; a bootstrap interval
    that misses its point estimate is cut at it)."""
    return np.clip(np.vstack([shown["mean"] - shown["low"], shown["high"] - shown["mean"]]), 0, None)


def paper_marks(ctx: Context, runs: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The published numbers of the drawn runs' settings (the settings of the runs the tables match to a paper row,
    whichever session drew them), placed at the run's x (``x``, ``value``, ``model``: the paper's method and model):
    tokens per step and speedup as published, throughput as the paper's speedup x the measured AR throughput."""
    metric = COMPARABLE.get(y)
    rows = ctx.paper[ctx.paper["metric"] == metric] if metric else ctx.paper.iloc[0:0]
    scale = ar_throughput(ctx.results, runs) if y == "throughput_total" else pd.Series(1.0, index=runs.index)
    every = ctx.results.every_run.set_index("run_dir")
    drawn = pd.Series(list(zip(runs["config_digest"], runs["dataset"], runs["repeat"])), index=runs.index)
    marks = []
    for _, row in rows.iterrows():
        measured = every.reindex(list(row["matched"]))[["config_digest", "dataset", "repeat"]].dropna()
        hit = runs[drawn.isin(list(measured.itertuples(index=False, name=None)))]  # the same setting, any session
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
    """The footer of a figure of runs (stamp, commits, run and sample counts, their AR partners') and its warnings."""
    samples, uneven = sample_note(runs)
    partners, partner_warnings = partner_note(runs)
    warnings = [warning for warning in (provenance_warning(runs), uneven, *partner_warnings) if warning]
    footer = f"measured on: {stamp(runs)} | {commit_text(runs)} | {len(runs)} runs, {samples}"
    return footer + (f" | {partners}" if partners else ""), warnings


def partner_note(runs: pd.DataFrame) -> tuple[str, list[str]]:
    """The AR partners' provenance (commits, dates, sessions: ``results.with_partner_provenance``) of the plotted
    runs, and a warning where a partner was measured by another commit than its run; ("", []) without partners."""
    if "ar.sessions" not in runs:
        return "", []
    paired = runs[runs["ar_run_dir"].notna() & (runs["ar_run_dir"] != runs["run_dir"])]
    if paired.empty:
        return "", []
    partners = paired.drop_duplicates("ar_run_dir")
    provenance = partners[["ar.env.git_commit", "ar.env.git_dirty"]].rename(columns=lambda column: column[3:])
    dates = ", ".join(sorted(set(partners["ar.measured_on"].dropna().astype(str)) - {""})) or "unknown dates"
    apart = paired[paired["pairing"] != ""]
    sessions = (
        "each in its run's session"
        if apart.empty
        else f"{len(apart)} of {len(paired)} runs not timed wholly in their partner's session: their speedups count "
        "only the sample pairs timed together (none: not drawn)"
    )
    note = f"AR partners: {len(partners)} runs, {commit_text(provenance)}, on {dates}, {sessions}"
    mine = paired["env.git_commit"].astype(str) + paired["env.git_dirty"].astype(str)
    theirs = paired["ar.env.git_commit"].astype(str) + paired["ar.env.git_dirty"].astype(str)
    other = paired[mine != theirs]
    warnings = (
        [f"WARNING: {len(other)} of {len(paired)} runs' AR partners were measured by another commit than the run"]
        if len(other)
        else []
    )
    return note, warnings


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


def mark_cells(ax, grid: pd.DataFrame, marks: pd.DataFrame, derived: bool) -> None:
    """Outline each cell that has published numbers and print them (red) under the measured value, labelled as
    derived where they are (a throughput: the paper's speedup x the measured AR throughput)."""
    for (row, col), values in marks.groupby("x", sort=True)["value"]:
        if row in grid.index and col in grid.columns:
            i, j = grid.index.get_loc(row), grid.columns.get_loc(col)
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
            ax.text(
                j,
                i - 0.3,
                ("paper-derived " if derived else "paper ") + " / ".join(f"{value:.3g}" for value in values),
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
                mark_cells(axes[i, j], grid, marks, derived=value == "throughput_total")
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
