"""The papers' sweep figures from the stored runs (and the latency profiles), as PNG and PDF.

Each builder picks the runs of one sweep (method, dataset, temperature and the knobs the sweep
varies; a run that changed any other knob is left out), plots the paper's axes with units and
stamps the hardware and sample counts under the plot. Points of runs with the same setting
(repeats, or one setting reached by two experiments) are averaged. A builder returns None when the
results hold no sweep for it (fewer than two values of its x axis), and ``build_figures`` skips it.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from specbench.profile import CSV_FIELDS
from specbench.reproduce.results import Results, format_value, knob, stamp

Builder = Callable[[Results, pd.DataFrame], "Figure | None"]

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
PANEL_SIZE = (4.6, 3.4)       # inches per panel
MIN_WIDTH = 6.4               # inches, so that a one-panel figure still fits its title
MARGIN = 1.0                  # inches above and below the panels for the title and the footer
CHARS_PER_INCH = {"title": 12, "footer": 21}   # at 10 pt and 6 pt
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
METHOD_NAMES = {"lookahead_single": "LLMA (single branch)", "lookahead_parallel": "Lookahead (Parallel)",
                "lookahead": "Lookahead (Hierarchical)"}
MEMORY_KINDS = {"process_peak_rss": "process peak RSS, CPU", "cuda_max_allocated": "CUDA allocator peak"}
SELF_DRAFT_VARIANTS = {(True, True): "full", (True, False): "w/o corpus", (False, True): "w/o context"}

L, NB = "drafter.branch_len", "drafter.branch_num"
CONTEXT_CACHE, CORPUS_CACHE = "drafter.use_context_cache", "drafter.use_corpus_cache"
K, N = "drafter.draft_len", "drafter.max_ngram_size"
NODES, THRESHOLD = "drafter.nodes", "drafter.threshold"
TREE_KIND, EPSILON = "drafter.tree.kind", "acceptance_kwargs.posterior_threshold"
DECODING_LENGTH, BRANCH_LENGTH = "drafter.decoding_length", "drafter.branch_length"
WINDOW, NGRAM = "drafter.window_size", "drafter.ngram_size"
WARMUP, CAPACITY, CAPACITY_DEFAULT = "drafter.warmup.dataset", "drafter.output_node_capacity_factor", 16
ABLATIONS = {"drafter.insert_prompt": "w/o prompt", "drafter.insert_output": "w/o output",  # conf/lookahead_ablation
             "drafter.prune_min_trees": "w/o pruning", "drafter.eliminate_input": "w/o elimination"}
PAPER_ABLATIONS = {"Lookahead": "full", "Lookahead W/o prompt": "w/o prompt", "Lookahead W/o output": "w/o output",
                   "Lookahead W/o pruning": "w/o pruning", "Lookahead W/o elimin": "w/o elimination"}


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


def sweep(runs: pd.DataFrame, methods: list[str], dataset: str | None, axes: tuple[str, ...] = (),
          temperature: float | None = 0.0, coupled: tuple[str, ...] = ()) -> pd.DataFrame:
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
    rows = [(model, math.floor(expected + 0.5), accepted) for model, stats in traces
            for expected, accepted in zip(stats.get("step_expected_accept", []), stats.get("step_accepted", []))]
    return pd.DataFrame(rows, columns=["model", "expected", "accepted"]).assign(steps=1)


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


def run_footer(runs: pd.DataFrame) -> str:
    """The footer of a figure of runs: hardware stamp, run count and samples per run."""
    counts = sorted(set(runs["n_samples"]))
    samples = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return f"measured on: {stamp(runs)} | {len(runs)} runs, samples per run: {samples}"


def new_figure(rows: int, cols: int) -> tuple[Figure, np.ndarray]:
    """A figure on the Agg canvas (no pyplot state) with a ``rows`` x ``cols`` array of axes."""
    fig = Figure(figsize=(max(PANEL_SIZE[0] * cols, MIN_WIDTH), PANEL_SIZE[1] * rows + MARGIN))
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def finish(fig: Figure, title: str, footer: str) -> Figure:
    """Title on top, the footer line(s) at the bottom (both wrapped to the width), panels between; the figure."""
    width, height = fig.get_figwidth(), fig.get_figheight()
    heading = [part for line in title.splitlines()
               for part in textwrap.wrap(line, int(width * CHARS_PER_INCH["title"]))]
    notes = textwrap.wrap(footer, int(width * CHARS_PER_INCH["footer"]))
    fig.suptitle("\n".join(heading), fontsize=10)
    fig.text(0.005, 0.005, "\n".join(notes), fontsize=6, ha="left", va="bottom")
    fig.tight_layout(rect=(0, (0.05 + 0.1 * len(notes)) / height, 1, 1 - (0.05 + 0.16 * len(heading)) / height))
    return fig


def plot_lines(ax, frame: pd.DataFrame, x: str, y: str, by: list[str], log2: bool = False) -> None:
    """Mean ``y`` against ``x``, one line per group of ``by`` (and per model when several), labelled axes."""
    by = (["model"] if frame["model"].nunique() > 1 else []) + list(by)
    for key, group in frame.groupby(by, sort=True) if by else [((), frame)]:
        points = group.groupby(x, sort=True)[y].mean().dropna()
        label = ", ".join(text(v) if c in ("model", "method") else f"{symbol(c)} = {text(v)}" for c, v in zip(by, key))
        ax.plot(points.index, points.to_numpy(), marker="o", markersize=3, label=label or None)
    if log2:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax.set_xlabel(axis_label(x))
    ax.grid(True, alpha=0.3)
    if by:
        ax.legend(fontsize=7)


def plot_heatmap(ax, frame: pd.DataFrame, row: str, col: str, value: str, aggfunc: str = "mean") -> None:
    """``value`` aggregated over a ``row`` x ``col`` grid as an annotated heat map with a colour bar."""
    grid = frame.pivot_table(index=row, columns=col, values=value, aggfunc=aggfunc).sort_index().sort_index(axis=1)
    if grid.empty:
        ax.text(0.5, 0.5, f"no {value} values", ha="center", va="center", transform=ax.transAxes)
        return
    cells = grid.to_numpy(float)
    image = ax.imshow(cells, origin="lower", aspect="auto", cmap="viridis")
    for (i, j), cell in np.ndenumerate(cells):
        if not np.isnan(cell):
            ax.text(j, i, f"{cell:.3g}", ha="center", va="center", fontsize=6,
                    color="black" if image.norm(cell) > 0.6 else "white")
    ax.set_xticks(range(len(grid.columns)), [text(v) for v in grid.columns])
    ax.set_yticks(range(len(grid.index)), [text(v) for v in grid.index])
    ax.set_xlabel(axis_label(col))
    ax.set_ylabel(axis_label(row))
    ax.figure.colorbar(image, ax=ax)


def line_figure(title: str, runs: pd.DataFrame, x: str, ys: dict[str, str], by: tuple[str, ...] = (),
                panels: str | None = None, log2: bool = False,
                references: dict[str, pd.DataFrame] | None = None) -> Figure | None:
    """One row of panels per metric in ``ys`` (and one column per value of ``panels``), lines per ``by``,
    dashed horizontal ``references`` (label -> runs); None with fewer than two x values or no y value."""
    if runs.empty or runs[x].nunique() < 2 or runs[list(ys)].isna().all(axis=None):
        return None
    groups = list(runs.groupby(panels, sort=True)) if panels else [(None, runs)]
    fig, axes = new_figure(len(ys), len(groups))
    for column, (panel, group) in enumerate(groups):
        for row, (y, label) in enumerate(ys.items()):
            ax = axes[row, column]
            plot_lines(ax, group, x, y, list(by), log2)
            for index, (name, reference) in enumerate((references or {}).items()):
                if reference[y].notna().any():
                    ax.axhline(reference[y].mean(), linestyle="--", color=f"C{index + 5}", label=name)
                    ax.legend(fontsize=7)
            ax.set_ylabel(label)
            if panel is not None:
                ax.set_title(METHOD_NAMES.get(panel, str(panel)), fontsize=9)
    shown = pd.concat([runs, *(references or {}).values()])
    return finish(fig, f"{title}\n{scope(runs)}", run_footer(shown))


def heat_figure(title: str, frame: pd.DataFrame, row: str, col: str, values: dict[str, str],
                runs: pd.DataFrame | None = None, aggfunc: str = "mean") -> Figure | None:
    """One heat map per model (rows) and metric in ``values`` (columns); None with fewer than two cells."""
    runs = frame if runs is None else runs
    if frame.empty or frame.groupby([row, col]).ngroups < 2:
        return None
    models = sorted(set(frame["model"]))
    fig, axes = new_figure(len(models), len(values))
    for i, model in enumerate(models):
        for j, (value, label) in enumerate(values.items()):
            plot_heatmap(axes[i, j], frame[frame["model"] == model], row, col, value, aggfunc)
            axes[i, j].set_title(f"{model}: {label}", fontsize=9)
    return finish(fig, f"{title}\n{scope(runs)}", run_footer(runs))


def bar_figure(title: str, runs: pd.DataFrame, series: str, value: str, label: str) -> Figure | None:
    """Grouped bars of the mean ``value`` per MT-Bench category (one bar per ``series`` value), a panel
    per model, a dashed line at 1 (AR); None when no run has a category and a value."""
    runs = runs.assign(category=categories(runs)).dropna(subset=["category", value])
    if runs.empty:
        return None
    models = sorted(set(runs["model"]))
    fig, axes = new_figure(1, len(models))
    for ax, model in zip(axes.flat, models):
        table = runs[runs["model"] == model].pivot_table(index="category", columns=series, values=value,
                                                         aggfunc="mean", observed=True)
        width = 0.8 / len(table.columns)
        for index, name in enumerate(table.columns):
            offset = (index - (len(table.columns) - 1) / 2) * width
            ax.bar(np.arange(len(table)) + offset, table[name].to_numpy(), width, label=text(name))
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(table)), [str(name) for name in table.index], rotation=30, ha="right")
        ax.set_xlabel(axis_label("category"))
        ax.set_ylabel(label)
        ax.set_ylim(0, 1.3 * np.nanmax(table.to_numpy(float)))
        ax.set_title(model, fontsize=9)
        ax.legend(fontsize=7, loc="upper center", ncols=len(table.columns))
    return finish(fig, f"{title}\n{scope(runs)}", run_footer(runs))


# --- the figures -------------------------------------------------------------------------------------

def self_draft_grid(results: Results) -> pd.DataFrame:
    """Self-Draft's L x N_b runs on MT-Bench (the defaults included)."""
    return sweep(results.runs, ["self_draft"], "mt_bench", (L, NB))


def self_draft_fig5_branch_length(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Self-Draft Fig 5: TP and DE against branch length L at N_b = 6 (at each N_b when 6 was not run)."""
    runs = self_draft_grid(results)
    runs = runs[runs[NB] == 6] if (runs[NB] == 6).any() else runs
    return line_figure("Self-Draft Fig 5: throughput (TP) and DE vs branch length L", runs, L,
                       {**THROUGHPUT, "tokens_per_step": "DE (tokens per step)"}, by=(NB,))


def self_draft_fig6_branch_number(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Self-Draft Fig 6: TP and DE against branch number N_b, one line per branch length L."""
    return line_figure("Self-Draft Fig 6: throughput (TP) and DE vs branch number N_b",
                       self_draft_grid(results), NB, {**THROUGHPUT, "tokens_per_step": "DE (tokens per step)"},
                       by=(L,))


def self_draft_fig7_heatmap(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Self-Draft Fig 7: throughput over branch length L x branch number N_b, one panel per model."""
    return heat_figure("Self-Draft Fig 7: throughput over L × N_b", self_draft_grid(results), L, NB, THROUGHPUT)


def self_draft_fig8_ablation(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Self-Draft Fig 8: per-category speedup, full / w/o corpus / w/o context (split results)."""
    runs = sweep(results.runs, ["self_draft"], "mt_bench", (CONTEXT_CACHE, CORPUS_CACHE))
    variants = [SELF_DRAFT_VARIANTS[bool(context), bool(corpus)]
                for context, corpus in zip(runs[CONTEXT_CACHE], runs[CORPUS_CACHE])]
    runs = runs.assign(variant=pd.Categorical(variants, categories=list(SELF_DRAFT_VARIANTS.values())))
    if runs["variant"].nunique() < 2:
        return None
    return bar_figure("Self-Draft Fig 8: cache ablation, speedup per MT-Bench category", runs, "variant",
                      "speedup", SPEEDUP["speedup"])


def anpd_grid(results: Results) -> pd.DataFrame:
    """ANPD's K x N runs on CNN/DM (the defaults included)."""
    return sweep(results.runs, ["anpd"], "cnndm", (K, N))


def anpd_fig3_draft_len(results: Results, profile: pd.DataFrame) -> Figure | None:
    """ANPD Fig 3: speed-up against drafted tokens K at N = 2."""
    runs = anpd_grid(results)
    return line_figure("ANPD Fig 3: speed-up vs drafted tokens K (N = 2)", runs[runs[N] == 2], K, SPEEDUP)


def anpd_fig4_5_ngram_size(results: Results, profile: pd.DataFrame) -> Figure | None:
    """ANPD Figs 4/5: speed-up against the n-gram size N, one line per K in {6, 7, 8}."""
    runs = anpd_grid(results)
    return line_figure("ANPD Figs 4/5: speed-up vs n-gram size N (multi-level n-gram)", runs[runs[K].isin([6, 7, 8])],
                       N, SPEEDUP, by=(K,))


def opt_tree_fig4_expected_vs_accepted(results: Results, profile: pd.DataFrame) -> Figure | None:
    """OPT-Tree Fig 4: step counts over round(E) x actual accepted tokens, OPT-Tree at its defaults, T = 0."""
    runs = sweep(results.runs, ["opt_tree"], None)
    return heat_figure("OPT-Tree Fig 4: expected vs actual acceptance per step", step_pairs(results.samples, runs),
                       "accepted", "expected", {"steps": "steps"}, runs=runs, aggfunc="sum")


def opt_tree_fig5_node_budget(results: Results, profile: pd.DataFrame) -> Figure | None:
    """OPT-Tree Fig 5: mean acceptance length (MAL) against the node budget n."""
    return line_figure("OPT-Tree Fig 5: mean acceptance length vs node budget n",
                       sweep(results.runs, ["opt_tree"], "mt_bench", (NODES,)), NODES,
                       {"tokens_per_step": "MAL (tokens per step)"})


def opt_tree_fig6_threshold(results: Results, profile: pd.DataFrame) -> Figure | None:
    """OPT-Tree Fig 6: MAL and tokens/s against the threshold δ."""
    return line_figure("OPT-Tree Fig 6: MAL and throughput vs threshold δ",
                       sweep(results.runs, ["opt_tree"], "mt_bench", (THRESHOLD,)), THRESHOLD,
                       {"tokens_per_step": "MAL (tokens per step)", **THROUGHPUT})


def opt_tree_fig7_temperature(results: Results, profile: pd.DataFrame) -> Figure | None:
    """OPT-Tree Fig 7: MAL and tokens/s against temperature, OPT-Tree at its defaults beside AR."""
    runs = sweep(results.runs, ["opt_tree", "ar"], "mt_bench", temperature=None)
    runs = runs[runs["temperature"].isin(runs.loc[runs["method"] == "opt_tree", "temperature"])]
    return line_figure("OPT-Tree Fig 7: MAL and throughput vs temperature", runs, "temperature",
                       {"tokens_per_step": "MAL (tokens per step)", **THROUGHPUT}, by=("method",))


def medusa_fig4b_categories(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Medusa Fig 4b: speedup of Medusa over AR per MT-Bench category (results split by category)."""
    return bar_figure("Medusa Fig 4b: speedup per MT-Bench category",
                      sweep(results.runs, ["medusa"], "mt_bench"), "method", "speedup", SPEEDUP["speedup"])


def medusa_fig6_tree_size(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Medusa Fig 6: acceleration rate and tokens/s against the drafted nodes per step, sparse vs dense trees."""
    runs = sweep(results.runs, ["medusa"], "mt_bench", (TREE_KIND,),
                 coupled=("drafter.tree.sizes", "drafter.tree.node_budget"))
    runs = runs.assign(drafted_per_step=runs["run_dir"].map(drafted_per_step(results.samples)))
    return line_figure("Medusa Fig 6: acceleration rate and throughput vs tree size", runs, "drafted_per_step",
                       {"tokens_per_step": "acceleration rate (tokens per step)", **THROUGHPUT}, by=(TREE_KIND,))


def medusa_fig7_epsilon(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Medusa Fig 7: typical acceptance's acceleration rate and tokens/s against ε at T = 0.7, with Medusa's
    exact sample-and-match (T = 0.7) and greedy (T = 0) runs as references."""
    references = {"medusa, sample-and-match (T = 0.7)": sweep(results.runs, ["medusa"], "mt_bench", temperature=0.7),
                  "medusa, greedy (T = 0)": sweep(results.runs, ["medusa"], "mt_bench")}
    return line_figure("Medusa Fig 7: typical acceptance, acceleration rate vs ε (δ = √ε)",
                       sweep(results.runs, ["medusa_typical"], "mt_bench", (EPSILON,), temperature=0.7), EPSILON,
                       {"tokens_per_step": "acceleration rate (tokens per step)", **THROUGHPUT},
                       references={name: runs for name, runs in references.items() if not runs.empty})


def lookahead_fig1_latency(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Lookahead Fig 1: one-forward latency against tokens per pass, one line per context length (chain mask)."""
    chain = profile[profile["mask"] == "chain"]
    if chain.empty:
        return None
    models = sorted(set(chain["model"]))
    fig, axes = new_figure(1, len(models))
    for ax, model in zip(axes.flat, models):
        rows = chain[chain["model"] == model]
        plot_lines(ax, rows, "num_tokens", "median_ms", ["context_length"], log2=True)
        ax.set_ylabel("forward latency (ms, median)")
        ax.set_title(f"{model}, {', '.join(sorted(set(rows['dtype'])))}", fontsize=9)
    devices = ", ".join(sorted(set(chain["device_name"])))
    repeats = ", ".join(str(r) for r in sorted(set(chain["repeats"])))
    return finish(fig, f"Lookahead Fig 1 / OPT-Tree Fig 3: forward latency vs new tokens per pass (chain mask)\n{devices}",
                  f"measured on: {devices} | latency profile, {repeats} timed repeats per cell (median)")


def lookahead_fig4_5_length_grid(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Lookahead Figs 4/5: tokens/s and EDL against decoding length, one line per branch length, a panel per mode."""
    runs = sweep(results.runs, list(METHOD_NAMES), "dolly", (DECODING_LENGTH, BRANCH_LENGTH))
    return line_figure("Lookahead Figs 4/5: throughput and EDL vs decoding length", runs, DECODING_LENGTH,
                       {**THROUGHPUT, "tokens_per_step": "EDL (tokens per step)"}, by=(BRANCH_LENGTH,),
                       panels="method", log2=True)


def lookahead_fig6_memory(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Lookahead Fig 6: peak memory against decoding length (hierarchical lookahead)."""
    runs = sweep(results.runs, ["lookahead"], "dolly", (DECODING_LENGTH,))
    kinds = ", ".join(MEMORY_KINDS.get(kind, str(kind)) for kind in sorted(set(runs["peak_memory_kind"].dropna())))
    return line_figure("Lookahead Fig 6: peak memory vs decoding length", runs, DECODING_LENGTH,
                       {"peak_memory_gib": f"peak memory (GiB, {kinds or 'unknown'})"}, log2=True)


def lookahead_table5_rows(results: Results) -> pd.DataFrame:
    """Hierarchical Lookahead on Dolly with the dev warm-up: full (r5_table4) and one Table 5 switch each
    (r5_ablation), labelled, throughput relative to the full runs of the same model."""
    runs = sweep(results.runs, ["lookahead"], "dolly", coupled=(WARMUP, *ABLATIONS))
    runs = runs[runs.get(f"hp.{WARMUP}", pd.Series(np.nan, index=runs.index)).map(is_set)]
    if runs.empty:
        return runs
    labels = [next((name for key, name in ABLATIONS.items() if is_set(row.get(f"hp.{key}"))), "full")
              for _, row in runs.iterrows()]
    runs = runs.assign(ablation=labels)
    full = runs[runs["ablation"] == "full"].groupby("model")["throughput_total"].mean()
    relative = runs["throughput_total"] / runs["model"].map(full).astype(float)
    return runs.assign(relative=relative).dropna(subset=["relative"])


def lookahead_table5_6(results: Results, profile: pd.DataFrame) -> Figure | None:
    """Lookahead Tables 5 and 6 on the public substitute (Dolly, not the private AntRAG/AntGLM-10B): throughput
    relative to full Lookahead per ablation, and relative to the 16 x L_d default per trie capacity, beside the
    paper's AntRAG ratios (paper_values); a panel per table that has runs."""
    from specbench.reproduce.tables import paper_values

    values = paper_values()
    values = values[values["paper"] == "lookahead"]
    ablation = lookahead_table5_rows(results)
    capacity = sweep(results.runs, ["lookahead"], "dolly", (CAPACITY,))
    if not capacity.empty:
        default = capacity[capacity[CAPACITY] == CAPACITY_DEFAULT].groupby("model")["throughput_total"].mean()
        capacity = capacity.assign(relative=capacity["throughput_total"] / capacity["model"].map(default).astype(float))
        capacity = capacity.dropna(subset=["relative"])
    panels = [name for name, frame in (("table5", ablation), ("table6", capacity))
              if not frame.empty and frame["ablation" if name == "table5" else CAPACITY].nunique() >= 2]
    if not panels:
        return None
    fig, axes = new_figure(1, len(panels))
    for ax, panel in zip(axes.flat, panels):
        if panel == "table5":
            paper = values[values["table"] == "Table 5"].set_index("paper_method")["value"]
            paper = (paper / paper["Lookahead"]).rename(lambda name: PAPER_ABLATIONS.get(name, name))
            order = ["full", *ABLATIONS.values()]
            measured = ablation.groupby("ablation")["relative"].mean().reindex(order)
            positions = np.arange(len(order))
            ax.bar(positions - 0.2, measured.to_numpy(), 0.4, label="measured (Dolly)")
            ax.bar(positions + 0.2, paper.reindex(order).to_numpy(), 0.4, label="paper (AntRAG)")
            ax.set_xticks(positions, order, rotation=20, ha="right")
            ax.set_ylabel("throughput / full Lookahead (×)")
            ax.set_title("Table 5: ablations", fontsize=9)
        else:
            paper = values[values["table"] == "Table 6"]
            factors = [float(parse_capacity(setting)) for setting in paper["setting"]]
            paper = pd.Series(paper["value"].to_numpy(), index=factors).sort_index()
            drawn = len(ax.lines)
            plot_lines(ax, capacity, CAPACITY, "relative", [], log2=True)
            for line in ax.lines[drawn:]:
                line.set_label(f"measured (Dolly){'' if line.get_label().startswith('_') else ', ' + line.get_label()}")
            ax.plot(paper.index, (paper / paper[float(CAPACITY_DEFAULT)]).to_numpy(), linestyle="--", marker="s",
                    markersize=3, color="C3", label="paper (AntRAG)")
            ax.set_ylabel(f"throughput / {CAPACITY_DEFAULT:g} × L_d capacity (×)")
            ax.set_title("Table 6: trie capacity", fontsize=9)
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=0.8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    shown = pd.concat([frame for frame in (ablation, capacity) if not frame.empty])
    return finish(fig, "Lookahead Tables 5 and 6 on a public substitute: relative throughput\n" + scope(shown),
                  run_footer(shown) + " | paper: AntGLM-10B on AntRAG (private), its ratios shown for the trend")


def parse_capacity(setting: str) -> float:
    """The output-node capacity factor a Table 6 row sets (the default when it sets none)."""
    for item in str(setting).split(";"):
        key, _, value = item.partition("=")
        if key.strip() == f"method.{CAPACITY}":
            return float(value)
    return float(CAPACITY_DEFAULT)


def lade_window_ngram(results: Results, profile: pd.DataFrame) -> Figure | None:
    """LADE W x N sweep (G = W): tokens per step and speedup over window size W x n-gram size N."""
    runs = sweep(results.runs, ["lade"], "mt_bench", (WINDOW, NGRAM), coupled=("drafter.guess_set_size",))
    return heat_figure("LADE window size W × n-gram size N (G = W)", runs, WINDOW, NGRAM,
                       {"tokens_per_step": "tokens per step", **SPEEDUP})


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


def build_figures(results: Results, by_category: Results, profile_root: Path, out_dir: Path) -> dict[str, list[Path]]:
    """Write every figure the results hold runs for as ``out_dir/<name>.png`` and ``.pdf`` (removing a skipped
    figure's stale files); {name: written paths}, [] for a skipped one."""
    profile = read_profiles(profile_root)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, builder in FIGURES.items():
        fig = builder(by_category if name in CATEGORY_FIGURES else results, profile)
        paths = [out_dir / f"{name}.{suffix}" for suffix in ("png", "pdf")]
        for path in paths:
            if fig is None:
                path.unlink(missing_ok=True)
            else:
                # NOTE: no creation date in the PDF, so an unchanged figure rebuilds byte for byte
                fig.savefig(path, dpi=150, metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
        written[name] = paths if fig is not None else []
    return written
