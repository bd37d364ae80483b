"""Latency profiler: one-forward latency against the number of new tokens in the pass, per context length.

Reproduces Lookahead's Fig 1 and OPT-Tree's Fig 3 on the local hardware: the "critical decoding
length" up to which a verify pass of n tokens costs about what a one-token step costs. Every
speculative method pays this curve, so it decides how many tokens per step a method must reach.

    python -m specbench.profile [model=tiny_llama] [device=cuda] [context_lengths=[256]] \
        [num_tokens=[1,2,4,8]] [repeats=5] [warmup=2] [output_dir=...]

Writes ``latency_<device>_<dtype>.csv``, ``.png`` and ``.json`` (environment) under ``output_dir``.
``cached_curve`` measures (once per model, device, dtype and context bucket) the curve ``budget=auto`` prices
verify steps with, kept under ``$SPECBENCH_CACHE/profile``.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import time
from collections.abc import Callable
from itertools import groupby
from pathlib import Path

import hydra
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specbench.cli import run_hydra_app, user_errors
from specbench.config import CONF_DIR
from specbench.core.loop import synchronize
from specbench.core.tree import DraftTree
from specbench.core.verify import cache_length, compact_cache, forward_tree, new_cache, prefill
from specbench.costmodel import LatencyCurve, curve_from_rows
from specbench.environment import capture, device_name, dtype_name
from specbench.files import write_atomic
from specbench.models.loading import LoadedModel, load_model, resolve_device, resolve_dtype
from specbench.paths import cache_root

MASKS = ("chain", "tree")
CSV_FIELDS = ["model", "device_name", "dtype", "context_length", "num_tokens", "mask", "median_ms", "min_ms", "repeats"]


def split_grid(
    context_lengths: list[int], num_tokens: list[int], max_context: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(c, n) cells sorted by c, split into those that fit the model's context and those that do not."""
    if min(context_lengths) < 1 or min(num_tokens) < 1:
        raise ValueError(f"context_lengths and num_tokens must be >= 1; got {context_lengths}, {num_tokens}")
    cells = sorted({(c, n) for c in context_lengths for n in num_tokens})
    fits = [sum(cell) <= max_context for cell in cells]
    return [cell for cell, ok in zip(cells, fits) if ok], [cell for cell, ok in zip(cells, fits) if not ok]


def random_tokens(generator: torch.Generator, vocab_size: int, count: int) -> torch.Tensor:
    """``count`` uniform token ids (content does not change dense-attention cost; seeded for repeatability)."""
    return torch.randint(vocab_size, (count,), generator=generator)  # [count]


def probe_tree(mask: str, tokens: list[int]) -> DraftTree:
    """The n-node tree a cell verifies: a chain (causal fast path) or a star (4-D mask path).

    NOTE: a star of n <= 2 nodes is a chain, so ``flatten`` gives it the causal fast path, exactly
    as the real verify would for such a tree.
    """
    if mask == "chain":
        return DraftTree.chain(tokens[0], tokens[1:])
    return DraftTree(tokens, [-1] + [0] * (len(tokens) - 1))


def prefilled_cache(model, context_length: int, generator: torch.Generator):
    """A KV cache holding ``context_length`` random tokens: the context the probes run on top of."""
    cache = new_cache(model)
    prefill(model, cache, random_tokens(generator, model.config.vocab_size, context_length))
    return cache


def timed_forward_ms(model, cache, tree: DraftTree, device: torch.device) -> float:
    """Time one verify forward of ``tree`` on ``cache`` (device synchronized), then crop its rows off."""
    past_len = cache_length(cache)
    synchronize(device)
    start = time.perf_counter()
    forward_tree(model, cache, tree)
    synchronize(device)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    compact_cache(cache, past_len, [])
    return elapsed_ms


def measure(
    model,
    cache,
    trees: list[DraftTree],
    repeats: int,
    warmup: int,
    device: torch.device,
    on_forward: Callable[[], object] = lambda: None,
) -> list[list[float]]:
    """Per tree, ``repeats`` timings (ms) after ``warmup`` untimed runs (allocator, kernel choice).

    NOTE: the trees are timed round-robin rather than one after another, so a burst of load from
    other processes (shared CPUs) spreads over every cell's samples instead of ruining one median.
    """
    timings: list[list[float]] = [[] for _ in trees]
    for _ in range(warmup + repeats):
        for tree, samples in zip(trees, timings):
            samples.append(timed_forward_ms(model, cache, tree, device))
            on_forward()
    return [samples[warmup:] for samples in timings]


def timing_row(context: int, num_tokens: int, mask: str, timings: list[float]) -> dict:
    """The measured columns of one (c, n, mask) cell."""
    return {
        "context_length": context,
        "num_tokens": num_tokens,
        "mask": mask,
        "median_ms": statistics.median(timings),
        "min_ms": min(timings),
        "repeats": len(timings),
    }


@torch.inference_mode()
def profile_latency(
    model,
    context_lengths: list[int],
    num_tokens: list[int],
    repeats: int,
    warmup: int,
    seed: int,
    device: torch.device,
    *,
    name: str | None = None,
    max_context: int | None = None,
) -> list[dict]:
    """Median/min one-forward latency per (context length, new tokens, mask): rows with ``CSV_FIELDS``.

    ``name`` labels the rows (default: the model's config name); cells with c + n beyond
    ``max_context`` (default: ``max_position_embeddings``) are skipped with a note on stderr.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0; got repeats={repeats}, warmup={warmup}")
    max_context = max_context or model.config.max_position_embeddings
    cells, skipped = split_grid(list(context_lengths), list(num_tokens), max_context)
    if skipped:
        print(
            f"[specbench.profile] skipping (c, n) beyond the context length {max_context}: {skipped}", file=sys.stderr
        )
    identity = {
        "model": name or model.config.name_or_path or model.config.model_type,
        "device_name": device_name(device),
        "dtype": dtype_name(model.dtype),
    }
    generator = torch.Generator().manual_seed(seed)
    rows = []
    forwards = len(cells) * len(MASKS) * (warmup + repeats)
    with tqdm(total=forwards, desc="profile (c, n) grid", unit="fwd") as bar:
        for context, group in groupby(cells, key=lambda cell: cell[0]):
            cache = prefilled_cache(model, context, generator)
            tokens = {n: random_tokens(generator, model.config.vocab_size, n).tolist() for _, n in group}
            probes = [(n, mask) for n in tokens for mask in MASKS]
            trees = [probe_tree(mask, tokens[n]) for n, mask in probes]
            timings = measure(model, cache, trees, repeats, warmup, device, bar.update)
            rows += [{**identity, **timing_row(context, n, mask, t)} for (n, mask), t in zip(probes, timings)]
    return rows


def series(rows: list[dict], context: int, mask: str) -> tuple[list[int], list[float]]:
    """(num_tokens, median_ms) of one context length and mask, sorted by num_tokens."""
    points = sorted(
        (r["num_tokens"], r["median_ms"]) for r in rows if r["context_length"] == context and r["mask"] == mask
    )
    return [n for n, _ in points], [ms for _, ms in points]


def contexts(rows: list[dict]) -> list[int]:
    """The context lengths present in ``rows``, ascending."""
    return sorted({r["context_length"] for r in rows})


def plot(rows: list[dict], path: Path | str) -> None:
    """Latency vs new tokens (log2 x), one colour per context length, tree mask dashed; saved as PNG."""
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for index, context in enumerate(contexts(rows)):
        for mask, style in zip(MASKS, ("-", "--")):
            ax.plot(
                *series(rows, context, mask),
                style,
                marker="o",
                markersize=3,
                color=f"C{index}",
                label=f"context {context}, {mask}",
            )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))  # 1, 2, 4, ... rather than 2^k
    ax.set_xlabel("new tokens in the forward pass")
    ax.set_ylabel("latency (ms, median)")
    ax.set_title(f"{rows[0]['model']} on {rows[0]['device_name']}, {rows[0]['dtype']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def critical_length(ns: list[int], ratios: list[float], tolerance: float) -> int:
    """Largest n whose latency stays within ``tolerance`` x the one-token step (the flat region's end)."""
    return max(n for n, ratio in zip(ns, ratios) if ratio <= tolerance)


def context_table(rows: list[dict], context: int, tolerance: float) -> str:
    """Per-n chain/tree medians and their ratio to the smallest-n chain step, for one context length."""
    ns, chain = series(rows, context, "chain")
    _, tree = series(rows, context, "tree")
    base = chain[0]  # latency(1) when 1 is in num_tokens, else the smallest n measured
    lines = [
        f"context {context}: median ms, x = / chain latency at n={ns[0]}",
        f"{'n':>6} {'chain':>9} {'x':>6} {'tree':>9} {'x':>6}",
    ]
    lines += [f"{n:>6} {c:>9.2f} {c / base:>6.2f} {t:>9.2f} {t / base:>6.2f}" for n, c, t in zip(ns, chain, tree)]
    lines.append(
        f"critical decoding length (chain <= {tolerance}x): {critical_length(ns, [c / base for c in chain], tolerance)}"
    )
    return "\n".join(lines)


def format_report(rows: list[dict], tolerance: float) -> str:
    """The stdout summary: a header line and one table per context length."""
    first = rows[0]
    header = f"{first['model']} on {first['device_name']}, {first['dtype']}, {first['repeats']} repeats"
    return "\n\n".join([header, *(context_table(rows, c, tolerance) for c in contexts(rows))])


def write_csv(rows: list[dict], path: Path) -> None:
    """One line per (context, n, mask) with the ``CSV_FIELDS`` columns (the data every figure derives from)."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


CURVE_TOKENS = (*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128)
"""New tokens per forward a cached curve measures: every count to 16, where budgets are chosen (a CPU's matrix
product is not smooth in the row count: 11 rows cost more than 12 on the embedded model, docs/measuring.md), then
sparser to 128 (LADE's 15 x 5 window)."""
CURVE_REPEATS, CURVE_WARMUP = 5, 2


def context_bucket(context_tokens: float) -> int:
    """The power of two (at least 64) nearest to a mean context length: the curves cached per model are few."""
    return int(2 ** max(6, round(float(np.log2(max(context_tokens, 1.0))))))


def curve_folder(model_name: str, device: torch.device, dtype: torch.dtype) -> Path:
    """Where the cached curves of one (model, device, dtype) live; the device's name, not its index, keys them."""
    slug = "".join(char if char.isalnum() else "_" for char in device_name(device)).strip("_")
    return cache_root() / "profile" / model_name / f"{slug}_{dtype_name(dtype)}"


def cached_curves(model_name: str, device: torch.device, dtype: torch.dtype) -> list[LatencyCurve]:
    """Every curve cached for this (model, device, dtype), by context length (none: an empty list)."""
    paths = sorted(curve_folder(model_name, device, dtype).glob("c*.json"))
    return sorted((read_curve(path) for path in paths), key=lambda curve: curve.context_length)


def read_curve(path: Path) -> LatencyCurve:
    """A cached curve file (written by ``cached_curve``)."""
    return LatencyCurve.from_dict(json.loads(path.read_text())["curve"])


def curve_path(lm: LoadedModel, device: torch.device, context_length: int) -> Path:
    """Where the latency curve of ``lm`` on ``device`` at ``context_length`` cached tokens is (or will be) cached."""
    return curve_folder(lm.name, device, lm.model.dtype) / f"c{context_length}.json"


def stored_curve(lm: LoadedModel, device: torch.device, context_length: int) -> LatencyCurve | None:
    """The cached curve of ``lm`` at ``context_length``, or None when there is none or it was measured at other token
    counts than ``CURVE_TOKENS`` (an older release's grid: measured again)."""
    path = curve_path(lm, device, context_length)
    cached = read_curve(path) if path.is_file() else None
    return cached if cached is not None and cached.num_tokens == CURVE_TOKENS else None


def cached_curve(lm: LoadedModel, device: torch.device, context_length: int, remeasure: bool = False) -> LatencyCurve:
    """The latency curve of ``lm`` at ``context_length`` cached tokens: read from the cache (``stored_curve``), else
    measured (a few hundred forwards, round-robin over the cells) and cached with when and where it was measured."""
    cached = None if remeasure else stored_curve(lm, device, context_length)
    if cached is not None:
        return cached
    rows = profile_latency(
        lm.model,
        [context_length],
        list(CURVE_TOKENS),
        CURVE_REPEATS,
        CURVE_WARMUP,
        0,
        device,
        name=lm.name,
        max_context=lm.context_length,
    )
    curve = curve_from_rows(rows, context_length)
    path = curve_path(lm, device, context_length)
    path.parent.mkdir(parents=True, exist_ok=True)
    measured = {"curve": curve.to_dict(), "device_name": device_name(device), "measured_at": time.time()}
    write_atomic(path, json.dumps(measured, indent=2) + "\n")
    return curve


def run(cfg: DictConfig) -> Path:
    """Load the configured model, profile it, write CSV/PNG/JSON and print the table; return the CSV path."""
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    loaded = load_model(cfg.model, device, dtype)
    rows = profile_latency(
        loaded.model,
        cfg.context_lengths,
        cfg.num_tokens,
        cfg.repeats,
        cfg.warmup,
        cfg.seed,
        device,
        name=loaded.name,
        max_context=loaded.context_length,
    )
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"latency_{device.type}_{dtype_name(dtype)}"
    write_csv(rows, stem.with_suffix(".csv"))
    plot(rows, stem.with_suffix(".png"))
    sidecar = {
        "environment": capture(device, dtype),
        "model_path": loaded.path,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    stem.with_suffix(".json").write_text(json.dumps(sidecar, indent=2) + "\n")
    print(format_report(rows, cfg.flat_tolerance))
    print(f"\nwrote {stem}.csv, .png, .json")
    return stem.with_suffix(".csv")


@hydra.main(config_path=str(CONF_DIR), config_name="profile", version_base=None)
def main(cfg: DictConfig) -> None:
    """Hydra entry point of ``python -m specbench.profile``."""
    with user_errors():
        run(cfg)


if __name__ == "__main__":
    run_hydra_app(main, "profile")
