"""One builder per paper figure (and the Lookahead tables drawn as figures), by paper, and their registry."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from specbench.reproduce.figures.drawing import (
    METHOD_NAMES,
    PAPER_COLOUR,
    SPEEDUP,
    THROUGHPUT,
    Builder,
    Context,
    Drawn,
    bar_figure,
    drafted_per_step,
    finish,
    heat_figure,
    is_set,
    line_figure,
    new_figure,
    of_sessions,
    plot_lines,
    run_footer,
    scope,
    step_pairs,
    sweep,
    text,
)
from specbench.reproduce.results import knob
from specbench.reproduce.tables import paper_values

# the knobs the papers sweep (method config keys below `method.`)
L, NB = "drafter.branch_len", "drafter.branch_num"
CONTEXT_CACHE, CORPUS_CACHE = "drafter.use_context_cache", "drafter.use_corpus_cache"
K, N = "drafter.draft_len", "drafter.max_ngram_size"
NODES, THRESHOLD = "drafter.nodes", "drafter.threshold"
TREE_KIND, EPSILON = "drafter.tree.kind", "acceptance_kwargs.posterior_threshold"
DECODING_LENGTH, BRANCH_LENGTH = "drafter.decoding_length", "drafter.branch_length"
WINDOW, NGRAM, GUESS_SET = "drafter.window_size", "drafter.ngram_size", "drafter.guess_set_size"
WARMUP, CAPACITY, CAPACITY_DEFAULT = "drafter.warmup.dataset", "drafter.output_node_capacity_factor", 16
SUBSTITUTE = {WARMUP: "dolly", BRANCH_LENGTH: 8}
"""Lookahead's Dolly substitute setting (r5_table4: the dev warm-up, L_b 8), which the public substitutes of its
Tables 5, 6 and Fig 6 share; each varies one knob from it."""
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
MEMORY_KINDS = {"process_peak_rss": "process peak RSS, CPU", "cuda_max_allocated": "CUDA allocator peak"}
SELF_DRAFT_VARIANTS = {(True, True): "full", (True, False): "w/o corpus", (False, True): "w/o context"}
AUX_ROWS = "additional draft tokens per step (aux rows)"
"""Self-Draft Fig 4's x axis: the rows each verify forward runs besides the root and the drafted candidates."""
DRAFT_EFFICIENCY_LINES = {"self_draft": "Self-Draft (w/o corpus cache)", "lade": "LADE (N = 5, G = W)"}
OPT_TREE_DRAFTS = {"opt_tree": "OPT-Tree, draft model", "opt_tree_eagle": "OPT-Tree, EAGLE head"}
"""OPT-Tree Fig 6's lines: the draft model config's draft (L-68M in the paper) and the model's EAGLE head."""
NODE_BUDGET_LINES = {"opt_tree": "OPT-Tree", "sequoia_tree": "Sequoia"}
"""OPT-Tree Fig 5's lines: OPT-Tree's adaptive trees and Sequoia's static trees, both filled by the draft model."""
CALIBRATION_SOURCE = "drafter.calibration.dataset"
"""Where sequoia_tree measures its acceptance vector (C4 in the paper; the smoke plan's offline substitute)."""


def lines_of(*sweeps: pd.DataFrame) -> pd.DataFrame:
    """The runs of several sweeps drawn in one figure (each its own line), the empty ones left out."""
    drawn = [frame for frame in sweeps if len(frame)]
    return pd.concat(drawn) if drawn else pd.DataFrame()


def aux_rows_per_step(samples: pd.DataFrame) -> pd.Series:
    """Mean aux rows per step of each run (run_dir -> rows), from the records' verify widths: the rows of each verify
    forward besides the root and the drafted nodes (``verify_tokens - 1 - draft_tokens``: LADE's lookahead window,
    Self-Draft's drafting branches with their random pads); records without widths (HF ``generate``) are left out."""
    rows = [
        (run_dir, sum(widths) - len(widths) - sum(drafted if isinstance(drafted, list) else []), len(widths))
        for run_dir, widths, drafted in zip(samples["run_dir"], samples["verify_tokens"], samples["draft_tokens"])
        if isinstance(widths, list)
    ]
    totals = pd.DataFrame(rows, columns=["run_dir", "aux", "steps"]).groupby("run_dir").sum()
    return totals["aux"] / totals["steps"].replace(0, np.nan)


def self_draft_fig4_draft_efficiency(ctx: Context) -> Drawn | None:
    """Self-Draft Fig 4: throughput (TP) and DE against the additional draft tokens per step (aux rows, random pads
    counted), Self-Draft without its corpus cache over the branch number N_b (r1_draft_efficiency's session) beside
    LADE over its window W (r1_draft_efficiency_lade's); each point at the mean aux rows of its setting's runs. The
    two curves are timed in two sessions: the speedup row (each run over its own session's AR) compares them free of
    the machine's drift between the two."""
    runs = of_sessions(ctx, "r1_draft_efficiency", "r1_draft_efficiency_lade")
    self_draft = sweep(runs, ["self_draft"], "mt_bench", (NB,), coupled=(CORPUS_CACHE,))
    self_draft = self_draft[np.array([not value for value in knob(self_draft, CORPUS_CACHE)], dtype=bool)]
    lade = sweep(runs, ["lade"], "mt_bench", (WINDOW,), coupled=(GUESS_SET,))
    runs = lines_of(self_draft, lade)
    if runs.empty:
        return None
    aux = runs["run_dir"].map(aux_rows_per_step(ctx.results.samples)).astype(float)
    runs = runs.assign(
        method=runs["method"].map(DRAFT_EFFICIENCY_LINES),
        **{AUX_ROWS: aux.groupby([runs["model"], runs["method"], runs["setting"]]).transform("mean")},
    )
    return line_figure(
        ctx,
        "Self-Draft Fig 4: draft efficiency, throughput (TP) and DE vs additional draft tokens per step",
        runs,
        AUX_ROWS,
        {**THROUGHPUT, "tokens_per_step": "DE (tokens per step)", **SPEEDUP},
        by=("method",),
    )


def self_draft_grid(ctx: Context) -> pd.DataFrame:
    """Self-Draft's L x N_b runs on MT-Bench (the defaults included), of r1_branch_grid's session."""
    return sweep(of_sessions(ctx, "r1_branch_grid"), ["self_draft"], "mt_bench", (L, NB))


def self_draft_fig5_branch_length(ctx: Context) -> Drawn | None:
    """Self-Draft Fig 5: TP and DE against branch length L at N_b = 6 (at each N_b when 6 was not run)."""
    runs = self_draft_grid(ctx)
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
        self_draft_grid(ctx),
        NB,
        {**THROUGHPUT, "tokens_per_step": "DE (tokens per step)"},
        by=(L,),
    )


def self_draft_fig7_heatmap(ctx: Context) -> Drawn | None:
    """Self-Draft Fig 7: throughput and DE over branch length L x branch number N_b, one row per model."""
    return heat_figure(
        ctx,
        "Self-Draft Fig 7: throughput and DE over L × N_b",
        self_draft_grid(ctx),
        L,
        NB,
        {**THROUGHPUT, "tokens_per_step": "DE (tokens per step)"},
    )


def self_draft_fig8_ablation(ctx: Context) -> Drawn | None:
    """Self-Draft Fig 8: per-category speedup, full / w/o corpus / w/o context (split results)."""
    runs = sweep(of_sessions(ctx, "r1_ablation"), ["self_draft"], "mt_bench", (CONTEXT_CACHE, CORPUS_CACHE))
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


def anpd_grid(ctx: Context, experiment: str) -> pd.DataFrame:
    """ANPD's K x N runs on CNN/DM of one experiment's session (the defaults included)."""
    return sweep(of_sessions(ctx, experiment), ["anpd"], "cnndm", (K, N))


def anpd_fig3_draft_len(ctx: Context) -> Drawn | None:
    """ANPD Fig 3: speed-up against drafted tokens K at N = 2."""
    runs = anpd_grid(ctx, "r2_draft_len")
    return line_figure(
        ctx, "ANPD Fig 3: speed-up vs drafted tokens K (N = 2)", runs[runs[N] == 2], K, SPEEDUP, label="ANPD, N = 2"
    )


def anpd_fig4_5_ngram_size(ctx: Context) -> Drawn | None:
    """ANPD Figs 4/5: speed-up against the n-gram size N, one line per K in {6, 7, 8}."""
    runs = anpd_grid(ctx, "r2_draft_len_ngram")
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
    runs = sweep(of_sessions(ctx, "r3_tables"), ["opt_tree"], None)
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
    """OPT-Tree Fig 5: mean acceptance length (MAL) against the node budget n, a panel per target model: OPT-Tree
    (r3_node_budget's session) beside Sequoia's static trees at the same budgets (sequoia_tree, r3_node_budget_sequoia's
    session; its acceptance vector measured on C4, or on the smoke plan's offline substitute)."""
    opt_tree = sweep(of_sessions(ctx, "r3_node_budget"), ["opt_tree"], "mt_bench", (NODES,))
    sequoia = sweep(
        of_sessions(ctx, "r3_node_budget_sequoia"),
        ["sequoia_tree"],
        "mt_bench",
        (NODES,),
        coupled=(CALIBRATION_SOURCE,),
    )
    runs = lines_of(opt_tree, sequoia)
    if runs.empty:
        return None
    return line_figure(
        ctx,
        "OPT-Tree Fig 5: mean acceptance length vs node budget n, OPT-Tree and Sequoia",
        runs.assign(method=runs["method"].map(NODE_BUDGET_LINES)),
        NODES,
        {"tokens_per_step": "MAL (tokens per step)"},
        by=("method",),
        panels="model",
        log2=True,
    )


def with_draft_names(paper: pd.DataFrame) -> pd.DataFrame:
    """The paper rows with their draft in the method's name (``OPT-Tree [EAGLE]``), so that a figure drawing two
    drafts marks and labels each draft's published numbers apart."""
    drafts = paper["draft"].fillna("").astype(str)
    named = paper["paper_method"].astype(str) + " [" + drafts + "]"
    return paper.assign(paper_method=named.where(drafts != "", paper["paper_method"]))


def opt_tree_fig6_threshold(ctx: Context) -> Drawn | None:
    """OPT-Tree Fig 6: MAL and tokens/s against the threshold δ, a line per draft: the model config's draft model
    (method opt_tree, r3_threshold's session) and the model's EAGLE head (opt_tree_eagle, r3_threshold_eagle's); the
    paper's numbers marked per draft."""
    runs = sweep(
        of_sessions(ctx, "r3_threshold", "r3_threshold_eagle"), list(OPT_TREE_DRAFTS), "mt_bench", (THRESHOLD,)
    )
    return line_figure(
        replace(ctx, paper=with_draft_names(ctx.paper)),
        "OPT-Tree Fig 6: MAL and throughput vs threshold δ, draft model and EAGLE head",
        runs.assign(method=runs["method"].map(OPT_TREE_DRAFTS)),
        THRESHOLD,
        {"tokens_per_step": "MAL (tokens per step)", **THROUGHPUT},
        by=("method",),
    )


def opt_tree_fig7_temperature(ctx: Context) -> Drawn | None:
    """OPT-Tree Fig 7: MAL and tokens/s against temperature, OPT-Tree at its defaults beside AR."""
    runs = sweep(of_sessions(ctx, "r3_temperature"), ["opt_tree", "ar"], "mt_bench", temperature=None)
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
    """Medusa Fig 4b: speedup of Medusa over AR per MT-Bench category (results split by category), Medusa-1's heads
    (r4_speedup's session) and the Medusa-2 checkpoints the paper's bars show (r4_medusa2's, r4_medusa2_zephyr's)."""
    return bar_figure(
        ctx,
        "Medusa Fig 4b: speedup per MT-Bench category",
        sweep(of_sessions(ctx, "r4_speedup", "r4_medusa2", "r4_medusa2_zephyr"), ["medusa"], "mt_bench"),
        "method",
        "speedup",
        SPEEDUP["speedup"],
    )


MEDUSA_ABLATION = "writing,roleplay"
"""The MT-Bench categories of Medusa's tree and typical-acceptance ablations (Fig 6, Fig 7)."""


def medusa_fig6_tree_size(ctx: Context) -> Drawn | None:
    """Medusa Fig 6: acceleration rate and tokens/s against the drafted nodes per step, sparse vs dense trees, on
    the writing and roleplay questions (the paper's subset; Vicuna-7B is the only model that runs there)."""
    runs = sweep(
        of_sessions(ctx, "r4_tree_sparse", "r4_tree_dense"),  # two sessions: each tree kind its own
        ["medusa"],
        "mt_bench",
        (TREE_KIND,),
        coupled=("drafter.tree.sizes", "drafter.tree.node_budget"),
        categories=MEDUSA_ABLATION,
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
    exact sample-and-match (T = 0.7) and greedy (T = 0) runs as references (r4_epsilon's and r4_sampling's
    sessions)."""
    runs = of_sessions(ctx, "r4_epsilon", "r4_sampling")
    references = {
        "Medusa, sample-and-match (T = 0.7)": sweep(
            runs, ["medusa"], "mt_bench", temperature=0.7, categories=MEDUSA_ABLATION
        ),
        "Medusa, greedy (T = 0)": sweep(runs, ["medusa"], "mt_bench", categories=MEDUSA_ABLATION),
    }
    return line_figure(
        ctx,
        "Medusa Fig 7: typical acceptance, acceleration rate vs ε (δ = √ε)",
        sweep(runs, ["medusa_typical"], "mt_bench", (EPSILON,), temperature=0.7, categories=MEDUSA_ABLATION),
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
    runs = sweep(
        of_sessions(ctx, "r5_length_grid"),
        list(METHOD_NAMES),
        "dolly",
        (DECODING_LENGTH, BRANCH_LENGTH),
        coupled=(WARMUP,),
    )
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
    runs = substitute_sweep(of_sessions(ctx, "r5_memory"), (DECODING_LENGTH,))
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


def substitute_sweep(runs: pd.DataFrame, axes: tuple[str, ...] = (), coupled: tuple[str, ...] = ()) -> pd.DataFrame:
    """Hierarchical Lookahead's Dolly runs at the substitute setting (``SUBSTITUTE``'s knob values, defaults
    counted) that vary ``axes`` (and ``coupled``) from it: ``sweep`` with the setting's knobs allowed, then held."""
    runs = sweep(runs, ["lookahead"], "dolly", axes, coupled=(*SUBSTITUTE, *coupled))
    kept = [
        all(text(value) == text(setting) for value, setting in zip(values, SUBSTITUTE.values()))
        for values in zip(*(knob(runs, key) for key in SUBSTITUTE))
    ]
    return runs[np.array(kept, dtype=bool)] if len(runs) else runs


def lookahead_table5_rows(ctx: Context) -> pd.DataFrame:
    """Hierarchical Lookahead on Dolly with the dev warm-up: full and one Table 5 switch each (r5_ablation's
    session), labelled, throughput relative to the full runs of the same model."""
    runs = substitute_sweep(of_sessions(ctx, "r5_ablation"), coupled=tuple(ABLATIONS))
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


def lookahead_capacity_rows(ctx: Context) -> pd.DataFrame:
    """Hierarchical Lookahead on Dolly per trie capacity (r5_capacity's session), throughput relative to the default
    (16 x L_d)."""
    capacity = substitute_sweep(of_sessions(ctx, "r5_capacity"), (CAPACITY,))
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
    frames = {"table5": lookahead_table5_rows(ctx), "table6": lookahead_capacity_rows(ctx)}
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
    runs = sweep(
        of_sessions(ctx, "r6_window_ngram"), ["lade"], "mt_bench", (WINDOW, NGRAM), coupled=("drafter.guess_set_size",)
    )
    return heat_figure(
        ctx,
        "LADE window size W × n-gram size N (G = W)",
        runs,
        WINDOW,
        NGRAM,
        {"tokens_per_step": "tokens per step", **SPEEDUP},
    )


FIGURES: dict[str, Builder] = {
    "self_draft_fig4_draft_efficiency": self_draft_fig4_draft_efficiency,
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
