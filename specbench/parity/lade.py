"""LADE parity: the official ``lade`` package vs specbench's ``Lade`` drafter on the same token prompts.

The official side runs ``scripts/parity/lade_official.py`` in ``.venv-parity-lade`` (PyPI ``lade`` and
the transformers it was written for, see ``OFFICIAL_PINS``); the specbench side composes the ``lade``
method config (with W, N, G set) and runs it through the shared loop exactly as the runner does
(``build_engine`` + the per-sample seeded generator). A step is a verify forward after the prefill on
both sides: specbench's ``target_forwards``; on the official side the calls of its multi-level forward
minus the first (its prefill, which, as ours, emits the first token).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from specbench.parity.common import (
    REPO,
    SideEnv,
    official_python,
    parse_datasets,
    render_prompts,
    run_ar,
    timed_generation,
)

OFFICIAL_PACKAGE = "lade==0.0.2"
OFFICIAL_PINS = ("lade==0.0.2", "transformers==4.34.0")
"""What ``make parity`` installs beside torch in ``.venv-parity-lade``. lade 0.0.2 (the only release on
PyPI) declares no dependencies, but imports ``_expand_mask`` from transformers' Llama module (gone in
4.35) and passes ``padding_mask`` to the decoder layers (new in 4.34): only 4.34.x runs it."""

VENV = ".venv-parity-lade"
SIDE = SideEnv(VENV, OFFICIAL_PINS)
OFFICIAL_SCRIPT = "scripts/parity/lade_official.py"

TOLERANCE = 0.02
"""Parity bar: |ours - official| / official on the total steps, or the seed noise if larger."""

REMAINING_DIFFERENCES = """\
- **Random initial window (seed noise).** Both sides draw the `W+N-3` level-0 tokens uniformly from the
  prompt, but from different generators (official: Python's `random`, reseeded per `generate` call,
  10 built in; specbench: the run's per-sample torch generator). The same seed number therefore gives
  other windows, and one generation's step count moves by several steps either way; only totals over
  prompts and seeds compare. The `official-start` diagnostic (`--official-start`: specbench's default
  code path, drawing its window as the official code does for the same seed) takes exactly the
  official number of steps (`results/parity/lade-diagnostics*.md`: every generation), so no rule differs.
- **Float rounding.** The two sides run different transformers versions (4.34 eager attention vs 5.x)
  on the same float32 weights. Greedy outputs equal AR on both sides; a near-tie in a Jacobi argmax
  could still flip a window token, which the diagnostic above would show as a step-count mismatch.
- **EOS inside the window.** lade 0.0.2 (PyPI) keeps a Jacobi token equal to EOS in the window; the
  later GitHub code, and specbench by default, replace it by a random prompt token
  (`method.drafter.window_eos=keep` gives the 0.0.2 behaviour; the diagnostic uses it). It only
  matters once a window column predicts EOS, near the end of an answer (GSM-100 at (7, 5, 7): about
  2 % fewer steps with `replace` than with `keep`, inside the seed noise).
"""


@dataclass
class Setting:
    """One (W, N, G) window setting."""

    window: int
    ngram: int
    guess: int

    @classmethod
    def parse(cls, text: str) -> Setting:
        parts = [int(p) for p in text.split(",")]
        if len(parts) != 3:
            raise SystemExit(f"error: a setting is W,N,G (e.g. 15,5,15); got {text!r}")
        return cls(*parts)

    @property
    def label(self) -> str:
        return f"W={self.window} N={self.ngram} G={self.guess}"

    def overrides(self) -> list[str]:
        return [
            f"method.drafter.window_size={self.window}",
            f"method.drafter.ngram_size={self.ngram}",
            f"method.drafter.guess_set_size={self.guess}",
        ]


@dataclass
class Variant:
    """A specbench configuration to compare (``label=override;override``; the first is the default).

    ``official_start`` (diagnostic only, never a specbench setting): draw the initial window exactly as
    the official code does for the same seed, see ``start_like_official``.
    """

    label: str
    overrides: list[str] = field(default_factory=list)
    official_start: bool = False

    @classmethod
    def parse(cls, text: str) -> Variant:
        label, _, rest = text.partition("=")
        return cls(label, [o for o in rest.split(";") if o])


# -- prompts ----------------------------------------------------------------------------------------


# -- the official side ------------------------------------------------------------------------------


def start_official(
    setting: Setting,
    prompts: list[tuple[str, list[int]]],
    seeds: list[int],
    eos_ids,
    max_new_tokens: int,
    model_dir: str,
    threads: int,
    workdir: Path,
    cache: OfficialCache,
) -> subprocess.Popen:
    """Launch the official code on ``prompts`` in the side env; ``finish_official`` collects its JSON.

    The script also saves every record into ``cache`` as soon as it is done, so an interrupted run
    keeps what it measured.
    """
    save = (
        {
            f"{sid}|{seed}": str(cache.key(setting, ids, seed, max_new_tokens))
            for sid, ids in prompts
            for seed in [None, *seeds]
        }
        if cache.enabled
        else {}
    )
    job = {
        "model_dir": model_dir,
        "window": setting.window,
        "ngram": setting.ngram,
        "guess": setting.guess,
        "max_new_tokens": max_new_tokens,
        "seeds": seeds,
        "eos_ids": sorted(eos_ids),
        "ar": True,
        "prompts": [{"id": sid, "ids": ids} for sid, ids in prompts],
        "save": save,
    }
    job_path = workdir / f"job-{setting.window}-{setting.ngram}-{setting.guess}-{len(prompts)}-{time.time_ns()}.json"
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    with open(job_path.with_suffix(".out"), "w") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [str(official_python(VENV)), str(REPO / OFFICIAL_SCRIPT), str(job_path)], stdout=out, env=env, cwd=REPO
        )


def finish_official(proc: subprocess.Popen | None) -> dict:
    """Wait for an official run and parse what it printed (None: nothing was left to run)."""
    if proc is None:
        return {"versions": None, "patches": [], "records": []}
    code = proc.wait()
    assert isinstance(proc.args, list)  # start_official passes an argument list, the job file last
    out_path = Path(proc.args[-1]).with_suffix(".out")
    text = out_path.read_text()
    if code != 0:
        raise SystemExit(f"error: the official LADE run failed (exit {code}); see its messages above")
    return json.loads(text)


class OfficialCache:
    """Official results per (setting, prompt ids, seed, budget, script) in ``$SPECBENCH_CACHE/parity``.

    The official code is deterministic for a given seed, so a rerun with other specbench variants or
    more prompts only runs what is missing (``--no-cache`` runs everything again).
    """

    def __init__(self, enabled: bool):
        from specbench.models.embedded import cache_root

        self.dir = cache_root() / "parity" / "lade"
        self.enabled = enabled
        self.script = hashlib.sha256((REPO / OFFICIAL_SCRIPT).read_bytes()).hexdigest()[:12]

    def key(self, setting: Setting, ids: list[int], seed, max_new_tokens: int) -> Path:
        knobs = [] if seed is None else [setting.window, setting.ngram, setting.guess]  # AR: any setting
        text = json.dumps([*knobs, ids, seed, max_new_tokens, self.script])
        return self.dir / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"

    def get(self, setting, ids, seed, max_new_tokens) -> dict | None:
        path = self.key(setting, ids, seed, max_new_tokens)
        return json.loads(path.read_text()) if self.enabled and path.is_file() else None

    def put(self, setting, ids, record: dict, max_new_tokens: int, meta: dict) -> None:
        path = self.key(setting, ids, record["seed"], max_new_tokens)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**record, "meta": meta}))


# -- the specbench side -----------------------------------------------------------------------------


def official_draws(prompt: list[int], n: int, seed: int) -> list[int]:
    """The official initial window: ``random.seed(seed)`` then ``n`` x ``random.choice(prompt)``.

    ``random.Random(seed)`` yields the same Mersenne Twister stream without touching the global one.
    """
    import random

    rng = random.Random(seed)
    return [rng.choice(prompt) for _ in range(n)]


def start_like_official(engine, seed: int) -> None:
    """Diagnostic: the drafter draws its initial window as the official code does for ``seed``.

    Everything else is specbench's own code path (the window still rides in specbench's prefill,
    ``prefill_window``); EOS is kept in the window as in lade 0.0.2 (``window_eos=keep``). With the
    same initial window and equal rules, the step counts must equal the official ones, up to float
    near-ties between the two transformers versions.
    """
    drafter = engine.drafter
    if not drafter.prefill_window:
        raise SystemExit("error: the official-start diagnostic needs method.drafter.prefill_window=true")

    def prefill_tail(generator):
        drafter.generator = generator
        drafter.levels = [official_draws(drafter.prompt, drafter.window + drafter.ngram - 3, seed)]
        return list(drafter.levels[0])

    drafter.prefill_tail = prefill_tail
    drafter.window_eos = "keep"


def run_ours(
    lm, setting: Setting, variant: Variant, dataset: str, prompts, seeds: list[int], max_new_tokens: int
) -> list[dict]:
    """specbench LADE through the runner's own path: composed config, ``build_engine``, seeded generator."""
    from specbench.config import compose_config
    from specbench.core.acceptance import Sampling
    from specbench.engines import build_engine
    from specbench.runner import sample_generator

    cfg = compose_config(
        "model=smollm2_135m",
        "method=lade",
        f"dataset={dataset}",
        "temperature=0",
        f"max_new_tokens={max_new_tokens}",
        *setting.overrides(),
        *variant.overrides,
    )
    records = []
    for seed in seeds:
        engine = build_engine(cfg.method, lm, Sampling(0.0, 1.0), step_breakdown=False)
        if variant.official_start:
            start_like_official(engine, seed)
        records += [
            timed_generation(
                engine, ids, max_new_tokens, sample_generator(seed, sample_id), variant.label, id=sample_id, seed=seed
            )
            for sample_id, ids in prompts
        ]
    return records


# -- the table --------------------------------------------------------------------------------------


def seed_totals(records: list[dict], seeds: list[int]) -> list[int]:
    """Total steps over all prompts, one number per seed."""
    return [sum(r["steps"] for r in records if r["seed"] == seed) for seed in seeds]


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def verdict(official: list[int], ours: list[int]) -> tuple[float, float, bool]:
    """Relative difference of the mean totals, the seed-noise band (2 standard errors), and pass/fail."""
    mo, so = spread(official)
    ms, ss = spread(ours)
    diff = (ms - mo) / mo
    noise = 2 * ((so**2 / len(official) + ss**2 / len(ours)) ** 0.5) / mo
    return diff, noise, abs(diff) <= max(TOLERANCE, noise)


def fmt_pm(values: Sequence[float], digits: int = 1) -> str:
    mean, sd = spread(values)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def total_over(blocks: list[dict], variant: Variant) -> tuple[list[int], list[int]]:
    """Per-seed total steps (official, specbench ``variant``) summed over several blocks."""
    off_seeds = blocks[0]["seeds"]["official"]
    ours_seeds = blocks[0]["seeds"]["official" if variant.official_start else "ours"]
    off = [
        sum(t)
        for t in zip(
            *(seed_totals([r for r in b["official"]["records"] if r["seed"] is not None], off_seeds) for b in blocks)
        )
    ]
    ours = [sum(t) for t in zip(*(seed_totals(b["ours"][variant.label], ours_seeds) for b in blocks))]
    return off, ours


def block_rows(block: dict, variants: list[Variant]) -> tuple[list[str], list[str]]:
    """Summary row(s) and per-prompt rows of one (setting, dataset) block."""
    seeds = block["seeds"]
    off = block["official"]["records"]
    off_ar = {r["id"]: r["ar_output_ids"] for r in off if r["seed"] is None}
    off_runs = [r for r in off if r["seed"] is not None]
    ar = block["ar"]
    off_totals = seed_totals(off_runs, seeds["official"])
    summary, rows = [], []
    tokens_total = sum(len(ar[sid]) for sid, _ in block["prompts"])
    for variant in variants:
        ours = block["ours"][variant.label]
        ours_totals = seed_totals(ours, seeds["official" if variant.official_start else "ours"])
        diff, noise, ok = verdict(off_totals, ours_totals)
        equal_off = sum(r["output_ids"] == off_ar[r["id"]] for r in off_runs)
        equal_ours = sum(r["output_ids"] == ar[r["id"]] for r in ours)
        same = "–"
        if variant.official_start:  # same prompt, same seed, same starting window: same steps?
            steps = {(r["id"], r["seed"]): r["steps"] for r in off_runs}
            same = f"{sum(r['steps'] == steps.get((r['id'], r['seed'])) for r in ours)}/{len(ours)}"
        summary.append(
            f"| {block['setting']} | {block['dataset']} | {len(block['prompts'])} | {variant.label} | "
            f"{fmt_pm(off_totals)} ({min(off_totals)}–{max(off_totals)}) | "
            f"{fmt_pm(ours_totals)} ({min(ours_totals)}–{max(ours_totals)}) | {diff:+.1%} | ±{noise:.1%} | "
            f"{'yes' if ok else 'NO'} | {tokens_total / statistics.fmean(off_totals):.2f} / "
            f"{tokens_total / statistics.fmean(ours_totals):.2f} | {equal_off}/{len(off_runs)} · "
            f"{equal_ours}/{len(ours)} | {same} |"
        )
    main = variants[0].label
    for sid, ids in block["prompts"]:
        o = [r for r in off_runs if r["id"] == sid]
        s = [r for r in block["ours"][main] if r["id"] == sid]
        om = statistics.fmean(r["steps"] for r in o)
        sm = statistics.fmean(r["steps"] for r in s)
        new = len(ar[sid])
        rows.append(
            f"| {block['setting']} | {block['dataset']} | {sid} | {len(ids)} | {new} | "
            f"{' '.join(str(r['steps']) for r in o)} | {om:.1f} | {' '.join(str(r['steps']) for r in s)} | "
            f"{sm:.1f} | {(sm - om) / om:+.0%} | {new / om:.2f} | {new / sm:.2f} | "
            f"{'yes' if all(r['output_ids'] == off_ar[sid] for r in o) else 'NO'} | "
            f"{'yes' if all(r['output_ids'] == ar[sid] for r in s) else 'NO'} | "
            f"{'yes' if off_ar[sid] == ar[sid] else 'NO'} |"
        )
    return summary, rows


def write_table(path: Path, payload: dict) -> None:
    """The markdown report: provenance, summary per setting and dataset, per-prompt rows, notes."""
    variants = [Variant(v["label"], v["overrides"], v.get("official_start", False)) for v in payload["variants"]]
    env = payload["environment"]
    lines = [
        "# LADE parity: official `lade` vs specbench `lade`",
        "",
        f"Generated by `{payload['command']}` on {payload['finished_at']} ({env['cpu']}, float32, greedy, "
        f"{payload['max_new_tokens']} new tokens, {payload['wall_min']:.0f} min).",
        "",
        f"- official: `{env['official']['lade']}` (PyPI `lade`) with transformers {env['official']['transformers']}, "
        f"torch {env['official']['torch']}, Python {env['official']['python']}, in `{VENV}`; seeds "
        f"{payload['seeds']['official']} (the run-time seed for its `random.seed(10)`)",
        f"- specbench: commit `{env['specbench']['git_commit']}`"
        f"{' (uncommitted changes)' if env['specbench']['git_dirty'] else ''}, "
        f"transformers {env['specbench']['transformers']}, torch {env['specbench']['torch']}; run seeds "
        f"{payload['seeds']['ours']} (per-sample generator, as the runner)",
        f"- model: the embedded SmolLM2-135M-Instruct checkpoint (`{payload['model_dir']}`), both sides",
        "- prompts: specbench's dataset loader (chat template), the same token ids passed to both sides",
        "- step = one verify forward after the prefill (specbench `target_forwards`; official: calls of "
        "`jforward_multilevel` minus its first, the prefill); tokens/step = new tokens / steps",
        "- specbench variants: "
        + "; ".join(
            f"`{v.label}` = default `method=lade`"
            + (f" + `{' '.join(v.overrides)}`" if v.overrides else "")
            + (
                " drawing its initial window as the official code does for the same seed, EOS kept in the "
                "window (diagnostic)"
                if v.official_start
                else ""
            )
            for v in variants
        ),
        "",
        "Run-time patches applied to the official code (nothing vendored; `scripts/parity/lade_official.py`):",
        "",
        *[f"{i}. {p}" for i, p in enumerate(payload["patches"], 1)],
        "",
        "## Total steps over the prompts (mean ± sd over seeds, range)",
        "",
        "Δ = (specbench - official) / official on the mean totals; noise = 2 standard errors of that "
        f"difference from the seed-to-seed spread; parity = |Δ| <= max({TOLERANCE:.0%}, noise). "
        "= AR: generations equal to their own side's AR output (official: HF 4.34 greedy in the side env; "
        "specbench: `method=ar`). Same steps as official: generations of the diagnostic `official-start` "
        "variant (specbench's default, drawing its initial window as the official code does for the same "
        "seed) whose step count equals the official one exactly.",
        "",
        "| setting | dataset | prompts | specbench variant | official steps | specbench steps | Δ | noise | parity | "
        "tokens/step off / ours | = AR off · ours | same steps as official |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    per_prompt = []
    for block in payload["blocks"]:
        summary, rows = block_rows(block, variants)
        lines += summary
        per_prompt += rows
    lines += [
        "",
        "All datasets together (per-seed totals summed over the datasets of a setting, then over both settings):",
        "",
        "| setting | prompts | specbench variant | official steps | specbench steps | Δ | noise | parity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    settings = list(dict.fromkeys(b["setting"] for b in payload["blocks"]))
    groups = [(label, [b for b in payload["blocks"] if b["setting"] == label]) for label in settings]
    if len(settings) > 1:
        groups.append(("all settings", payload["blocks"]))
    for label, blocks in groups:
        for variant in variants:
            off, ours = total_over(blocks, variant)
            diff, noise, ok = verdict(off, ours)
            lines.append(
                f"| {label} | {sum(len(b['prompts']) for b in blocks)} | {variant.label} | {fmt_pm(off)} | "
                f"{fmt_pm(ours)} | {diff:+.1%} | ±{noise:.1%} | {'yes' if ok else 'NO'} |"
            )
    lines += [
        "",
        f"## Per prompt (specbench variant `{variants[0].label}`)",
        "",
        "| setting | dataset | prompt | prompt tokens | new tokens | official steps per seed | mean | "
        "specbench steps per seed | mean | Δ | tok/step off | tok/step ours | off = AR | ours = AR | "
        "ARs agree |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *per_prompt,
        "",
        "## Differences that remain",
        "",
        REMAINING_DIFFERENCES,
        "What changed in specbench to get here, and the numbers before it: docs/methods/lade.md "
        '("Parity with the official code").',
        "",
    ]
    path.write_text("\n".join(lines))


# -- orchestration ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None):
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specbench.parity lade", description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", default=["15,5,15", "7,5,7"], help="W,N,G per setting")
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=["humaneval=20", "gsm100=10"],
        help="dataset=limit (first `limit` samples in specbench's order)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds for both sides")
    parser.add_argument(
        "--official-seeds",
        nargs="+",
        type=int,
        default=None,
        help="seeds for the official side only (default: --seeds)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="LABEL=OVERRIDE;OVERRIDE",
        help="a specbench configuration to compare (repeatable; the first is the one per prompt); "
        "default: `specbench=` (the default lade config)",
    )
    parser.add_argument(
        "--official-start",
        action="store_true",
        help="diagnostic: add a specbench variant `official-start` (the default config) that draws "
        "its initial window as the official code does for the same seed (EOS kept in the "
        "window, as lade 0.0.2): with equal rules its steps equal the official ones",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per side; both sides run at the same time (more than the free "
        "cores make OpenMP spin: keep 1 on a shared 2-core machine)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="rerun the official code even where its result for the same prompt and seed is cached",
    )
    parser.add_argument("--out", default="results/parity/lade.md")
    parser.add_argument("--from-json", default=None, help="only rebuild the table from a stored JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        write_table(out, json.loads(Path(args.from_json).read_text()))
        print(f"[parity] wrote {out}")
        return 0

    import transformers

    from specbench import environment
    from specbench.config import compose_config
    from specbench.models.loading import checkpoint_path, load_model

    started = time.perf_counter()
    settings = [Setting.parse(s) for s in args.settings]
    datasets = parse_datasets(args.datasets)
    variants = [Variant.parse(v) for v in (args.variant or ["specbench="])]
    seeds = {"official": args.official_seeds or args.seeds, "ours": args.seeds}
    if args.official_start:
        variants.append(Variant("official-start", [], official_start=True))  # the default code path
    torch.set_num_threads(args.threads)
    cfg = compose_config("model=smollm2_135m")
    lm = load_model(cfg.model, torch.device("cpu"), torch.float32)
    model_dir = checkpoint_path(cfg.model)
    prompts = render_prompts(datasets, lm.tokenizer)
    blocks, official_env, patches = [], None, []
    cache = OfficialCache(not args.no_cache)
    ar_outputs: dict[str, dict[str, list[int]]] = {}
    with tempfile.TemporaryDirectory(prefix="parity-lade-") as tmp:
        for setting in settings:
            for dataset, _ in datasets:
                wanted = [None, *seeds["official"]]  # None: the official side's own AR output
                cached = {
                    (sid, seed): cache.get(setting, ids, seed, args.max_new_tokens)
                    for sid, ids in prompts[dataset]
                    for seed in wanted
                }
                missing = [
                    (sid, ids) for sid, ids in prompts[dataset] if any(cached[sid, seed] is None for seed in wanted)
                ]
                proc = (
                    start_official(
                        setting,
                        missing,
                        seeds["official"],
                        lm.eos_ids,
                        args.max_new_tokens,
                        model_dir,
                        args.threads,
                        Path(tmp),
                        cache,
                    )
                    if missing
                    else None
                )
                if dataset not in ar_outputs:  # specbench AR: the same for every setting
                    ar_outputs[dataset] = run_ar(lm, dataset, prompts[dataset], args.max_new_tokens)
                ar = ar_outputs[dataset]
                ours = {
                    v.label: run_ours(
                        lm,
                        setting,
                        v,
                        dataset,
                        prompts[dataset],
                        seeds["official" if v.official_start else "ours"],
                        args.max_new_tokens,
                    )
                    for v in variants
                }
                official = finish_official(proc)
                meta = {"versions": official["versions"], "patches": official["patches"]}
                ids_of = dict(prompts[dataset])
                for record in official["records"]:
                    cached[record["id"], record["seed"]] = {**record, "meta": meta}
                    cache.put(setting, ids_of[record["id"]], record, args.max_new_tokens, meta)
                records = []
                for sid, _ in prompts[dataset]:
                    for seed in wanted:
                        stored = cached[sid, seed]
                        assert stored is not None  # cached before, or run by the official side just now
                        records.append(stored)
                official = {"records": [{k: v for k, v in r.items() if k != "meta"} for r in records]}
                official_env, patches = records[0]["meta"]["versions"], records[0]["meta"]["patches"]
                blocks.append(
                    {
                        "setting": setting.label,
                        "dataset": dataset,
                        "prompts": prompts[dataset],
                        "seeds": seeds,
                        "ar": ar,
                        "official": official,
                        "ours": ours,
                    }
                )
    spec_env = environment.git_state()
    payload = {
        "command": "python -m specbench.parity lade " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_min": (time.perf_counter() - started) / 60,
        "max_new_tokens": args.max_new_tokens,
        "model_dir": model_dir,
        "seeds": seeds,
        "variants": [
            {"label": v.label, "overrides": v.overrides, "official_start": v.official_start} for v in variants
        ],
        "patches": patches,
        "environment": {
            "cpu": environment.cpu_name(),
            "official": official_env,
            "specbench": {**spec_env, "transformers": transformers.__version__, "torch": torch.__version__},
        },
        "blocks": blocks,
    }
    out.with_suffix(".json").write_text(json.dumps(payload))
    write_table(out, payload)
    print(f"[parity] wrote {out} and {out.with_suffix('.json')}")
    return 0
