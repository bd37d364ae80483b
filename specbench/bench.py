"""Benchmark suites: several methods in ONE process on the same prompts, ratios measured in that run.

    python -m specbench.bench SUITE [--limit N] [--max-new-tokens N] [--rounds R] [--device D]
                                    [--dtype T] [--out DIR] [OVERRIDE ...]
    python -m specbench.bench --list

A suite (``conf/bench/<SUITE>.yaml``) names a model, a dataset and entries: a label plus the Hydra
overrides of one method (``grid`` entries expand into one entry per combination, for sweeps). The
model is loaded once; every prompt runs through every entry, in an order that rotates from prompt
to prompt so drift in machine speed hits all entries alike. Each round builds fresh engines (after
an untimed warm-up on a throwaway engine), so drafters that learn across requests never see a
prompt twice. Prints per entry: tokens per step, tokens/s, speedup and step-latency overhead vs
the baseline entry, exact-match rate vs the baseline's outputs, and the share of step time spent
outside the target forward; writes everything (environment included) to a new JSON file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specbench.config import CONF_DIR, compose_config
from specbench.core.acceptance import Sampling
from specbench.core.loop import synchronize
from specbench.data.base import build_dataset
from specbench.engines import build_engine
from specbench.environment import PROJECT_ROOT, capture, dtype_name
from specbench.errors import ConfigError, UserError
from specbench.metrics import aggregate
from specbench.models.loading import LoadedModel, load_model, resolve_device, resolve_dtype
from specbench.runner import sample_generator
from specbench.schema import PHASES

SUITES_DIR = CONF_DIR / "bench"
RESULTS_DIR = PROJECT_ROOT / "results" / "bench"
COLUMNS = [("label", "entry", "{}"), ("lossless", "lossless", "{}"), ("tokens_per_step", "tok/step", "{:.2f}"),
           ("throughput_total", "tok/s", "{:.2f}"), ("speedup", "speedup", "{:.3f}"),
           ("overhead", "overhead", "{:.2f}"), ("exact_match_rate", "exact", "{:.2f}"),
           ("step_latency_s", "step_ms", "{:.1f}"), ("outside_forward_s", "outside_ms", "{:.2f}"),
           ("outside_forward_share", "outside_fwd", "{:.1%}"), ("draft_share", "draft", "{:.1%}"),
           ("accept_share", "accept", "{:.1%}"), ("update_share", "update", "{:.1%}")]
MILLISECONDS = ("step_latency_s", "outside_forward_s")


@dataclass(frozen=True)
class Entry:
    """One benchmarked configuration: a label and the Hydra overrides that select it."""

    label: str
    overrides: tuple[str, ...]


def suite_names() -> list[str]:
    """The suites in conf/bench/, sorted."""
    return sorted(path.stem for path in SUITES_DIR.glob("*.yaml"))


def load_suite(name: str) -> DictConfig:
    """conf/bench/<name>.yaml, or a ConfigError listing the suites."""
    path = SUITES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown benchmark suite {name!r}; choose one of {suite_names()}")
    return OmegaConf.load(path)


def expand_entries(suite: DictConfig) -> list[Entry]:
    """The suite's entries, each ``grid`` entry expanded into one entry per combination of values."""
    entries = []
    for spec in suite.entries:
        base = tuple(spec.get("overrides") or ())
        grid = spec.get("grid") or {}
        keys = list(grid)
        for values in itertools.product(*(list(grid[key]) for key in keys)):
            setting = dict(zip(keys, values))
            label = spec.label.format(**{key.split(".")[-1]: value for key, value in setting.items()})
            entries.append(Entry(label, base + tuple(f"{key}={value}" for key, value in setting.items())))
    labels = [entry.label for entry in entries]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ConfigError(f"benchmark suite has duplicate entry labels {duplicates}; give grid "
                          f"entries a label with {{placeholders}} for the swept keys")
    return entries


def entry_configs(suite: DictConfig, entries: list[Entry], args: argparse.Namespace) -> dict[str, DictConfig]:
    """The composed run config of every entry; all must share the model, device and dtype."""
    common = [f"model={suite.model}", f"dataset={suite.dataset}", *(suite.get("overrides") or ()),
              *args.overrides]
    for key in ("max_new_tokens", "device", "dtype"):
        if getattr(args, key) is not None:
            common.append(f"{key}={getattr(args, key)}")
    configs = {entry.label: compose_config(*common, *entry.overrides) for entry in entries}
    models = {OmegaConf.to_yaml(cfg.model) for cfg in configs.values()}
    if len(models) > 1:
        raise ConfigError("benchmark entries must not change the model (one model is loaded per suite)")
    return configs


def timed_generation(engine, prompt_ids: list[int], cfg: DictConfig, sample_id: str,
                     device: torch.device) -> dict:
    """One generation as a record with the runner's timing fields, plus its output ids."""
    generator = sample_generator(cfg.seed, sample_id)
    with torch.inference_mode():
        synchronize(device)
        start = time.perf_counter()
        gen = engine.generate(prompt_ids, cfg.max_new_tokens, generator)
        synchronize(device)
    wall = time.perf_counter() - start
    return {"new_tokens": len(gen.output_ids), "wall_s": wall, "prefill_s": gen.prefill_s,
            "target_forwards": gen.target_forwards, "draft_tokens": gen.draft_tokens,
            **{f"{key}_s": getattr(gen, f"{key}_s") for key in ("step", *PHASES)},
            "output_ids": gen.output_ids, "drafter_stats": engine.stats()}


def fresh_engines(configs: dict[str, DictConfig], lm: LoadedModel, prompt_ids: list[int]) -> dict:
    """Measured engines, built after one untimed generation on a throwaway engine of each entry."""
    engines = {}
    for label, cfg in configs.items():
        sampling = Sampling(cfg.temperature, cfg.top_p)
        timed_generation(build_engine(cfg.method, lm, sampling, cfg.step_breakdown), prompt_ids, cfg, "warmup",
                         lm.model.device)
        engines[label] = build_engine(cfg.method, lm, sampling, cfg.step_breakdown)
    return engines


def run_entries(configs: dict[str, DictConfig], lm: LoadedModel, prompts: list[tuple[str, list[int]]],
                rounds: int) -> dict[str, list[dict]]:
    """Records per entry label: every prompt of every round, the entry order rotating per prompt."""
    labels = list(configs)
    records: dict[str, list[dict]] = {label: [] for label in labels}
    bar = tqdm(total=rounds * len(prompts) * len(labels), desc="bench", unit="gen", file=sys.stderr)
    for round_index in range(rounds):
        engines = fresh_engines(configs, lm, prompts[0][1])
        for i, (sample_id, prompt_ids) in enumerate(prompts):
            shift = (i + round_index) % len(labels)
            for label in labels[shift:] + labels[:shift]:
                record = timed_generation(engines[label], prompt_ids, configs[label], sample_id,
                                          lm.model.device)
                records[label].append({"round": round_index, "sample_id": sample_id, **record})
                bar.update()
    bar.close()
    return records


def summarize(configs: dict[str, DictConfig], records: dict[str, list[dict]], baseline: str) -> list[dict]:
    """Per entry: aggregate metrics, speedup/overhead vs the baseline, exact match of round-0 outputs."""
    base = aggregate(records[baseline])
    base_out = {r["sample_id"]: r["output_ids"] for r in records[baseline] if r["round"] == 0}
    rows = []
    for label, recs in records.items():
        metrics = aggregate(recs)
        first = [r for r in recs if r["round"] == 0]
        same = [r["output_ids"] == base_out[r["sample_id"]] for r in first]
        rows.append({
            "label": label, "method": configs[label].method.name,
            "lossless": bool(configs[label].method.get("lossless", True)), **metrics,
            "speedup": metrics["throughput_total"] / base["throughput_total"],
            "overhead": (metrics["step_latency_s"] / base["step_latency_s"]
                         if metrics["step_latency_s"] and base["step_latency_s"] else None),
            "exact_match_rate": sum(same) / len(same),
        })
    return rows


def format_rows(rows: list[dict]) -> str:
    """A fixed-width table of the summary rows ('-' where a value does not apply)."""
    table = [[header for _, header, _ in COLUMNS]]
    for row in rows:
        cells = []
        for key, _, fmt in COLUMNS:
            value = row.get(key)
            cells.append("-" if value is None else fmt.format(value * 1000 if key in MILLISECONDS else value))
        table.append(cells)
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) for line in table)


def write_results(path: Path, payload: dict) -> Path:
    """Write the JSON to a new file, adding ``-1``, ``-2``... to the name rather than overwrite one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for attempt in itertools.count():
        candidate = path if attempt == 0 else path.with_stem(f"{path.stem}-{attempt}")
        try:
            with open(candidate, "x") as handle:
                json.dump(payload, handle, indent=1)
            return candidate
        except FileExistsError:
            continue


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options; leftover ``key=value`` words are Hydra overrides for every entry."""
    parser = argparse.ArgumentParser(prog="python -m specbench.bench", description=__doc__.splitlines()[0])
    parser.add_argument("suite", nargs="?", help="a suite in conf/bench/ (see --list)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to every entry")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    parser.add_argument("--limit", type=int, help="prompts (default: the suite's)")
    parser.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    parser.add_argument("--rounds", type=int, help="passes over the prompts (default: the suite's, else 1)")
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help=f"results folder (default {RESULTS_DIR})")
    return parser.parse_intermixed_args(argv)


def run(args: argparse.Namespace) -> Path:
    """Run one suite end to end; print the table; return the results file."""
    suite = load_suite(args.suite)
    entries = expand_entries(suite)
    configs = entry_configs(suite, entries, args)
    first = next(iter(configs.values()))
    device = resolve_device(first.device)
    dtype = resolve_dtype(first.dtype, device)
    lm = load_model(first.model, device, dtype)
    dataset = build_dataset(first.dataset, first.data_dir)
    limit = args.limit or suite.get("limit")
    prompts = [(s.sample_id, dataset.prompt_ids(lm.tokenizer, s, [])) for s in dataset.samples(limit)]
    rounds = args.rounds or suite.get("rounds", 1)
    records = run_entries(configs, lm, prompts, rounds)
    rows = summarize(configs, records, suite.get("baseline") or entries[0].label)
    environment = capture(device, dtype)
    print(f"suite={args.suite} model={lm.name} dataset={dataset.name} prompts={len(prompts)} "
          f"max_new_tokens={first.max_new_tokens} temperature={first.temperature} rounds={rounds} "
          f"device={environment['device_name']} dtype={dtype_name(dtype)} threads={torch.get_num_threads()}")
    print(format_rows(rows))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    payload = {"suite": args.suite, "model": lm.name, "dataset": dataset.name, "prompts": len(prompts),
               "rounds": rounds, "max_new_tokens": first.max_new_tokens, "temperature": first.temperature,
               "environment": environment, "rows": rows,
               "entries": {e.label: {"overrides": list(e.overrides),
                                     "method": OmegaConf.to_container(configs[e.label].method, resolve=True)}
                           for e in entries},
               "records": records}
    path = write_results(args.out / args.suite / f"{lm.name}_{device.type}_{dtype_name(dtype)}_{stamp}.json",
                         payload)
    print(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: ``error: ...`` and exit 2 on a user error."""
    args = parse_args(argv)
    if args.list or not args.suite:
        for name in suite_names():
            print(f"{name:16s} {load_suite(name).get('description', '')}")
        return 0
    try:
        run(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
