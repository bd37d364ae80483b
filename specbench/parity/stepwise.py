"""Step-for-step parity of deterministic methods: the official code's per-step trace vs specbench's.

A method's driver (``specbench.parity.medusa``, ...) names its official code (``OfficialSource``,
side env, script) and the cases to compare (``Case``: specbench overrides + the official knobs);
``run`` renders the prompts with specbench's loader, starts the official script in the side env on
those token ids (one job, every case), runs each case through specbench's own path meanwhile
(composed config, ``build_engine``, as the runner), and writes ``results/parity/<method>.md`` with
the raw records beside it (``.json``).

The official script prints, per (case, prompt), the tokens each verify forward added (``emitted``,
prefill excluded) and the tokens produced (``output_ids``: every token the official loop produced,
including one it holds for its next step, so ``len(output_ids) == 1 + sum(emitted)``), plus its own
AR output. An official prefill that also verifies drafts (PARD's) reports the tokens it committed as
``prefill_emitted`` (1 when absent), and ``len(output_ids) == prefill_emitted + sum(emitted)``. Both traces
are cut by specbench's stop rule (``cut_trace``: EOS kept, then the budget), so greedy methods with the same
rules give the same list step for step.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from specbench.core.loop import clip_emitted
from specbench.parity.common import (
    REPO,
    SideEnv,
    official_python,
    parse_datasets,
    render_prompts,
    run_ar,
    timed_generation,
)


@dataclass(frozen=True)
class Case:
    """One compared setting: specbench's overrides of ``method=<method>`` and the official script's knobs."""

    label: str
    overrides: tuple[str, ...]
    official: dict = field(default_factory=dict)
    watch: Callable[[object], Callable[[], dict]] | None = None  # called with specbench's engine before each
    # prompt; the function it returns gives fields to add to that prompt's record after the generation


@dataclass(frozen=True)
class Driver:
    """What ``run`` needs to know of one method's official code and how its steps are counted."""

    method: str  # specbench method config, e.g. medusa
    side: SideEnv  # side env (.venv-parity-<method>) and the official checkout
    script: str  # scripts/parity/<method>_official.py
    counting: str  # markdown: what a step is and how each side's count is cut
    differences: str  # markdown: the rule differences found and what was done about them
    default_datasets: tuple[str, ...] = ("mt_bench=10", "humaneval=10")
    extra: Callable[[list[Row]], list[str]] | None = None  # markdown after the per-prompt table


# -- the traces -------------------------------------------------------------------------------------


def cut_trace(
    emitted: Sequence[int], output_ids: Sequence[int], budget: int, eos_ids, first: int = 1
) -> tuple[list[int], bool]:
    """Tokens per step that specbench's stop rule keeps of a trace, and whether that rule stopped it.

    ``output_ids[:first]`` are the prefill's tokens (one, unless the official prefill verifies drafts too); step i
    adds the next ``emitted[i]`` tokens. Each step is cut as the shared loop cuts its own (``clip_emitted``: EOS
    kept, then the remaining budget). False: the trace ended (the official loop's own rule stopped it) before
    specbench's rule would have.
    """
    eos = frozenset(eos_ids)
    kept: list[int] = []
    head, stop = clip_emitted(list(output_ids[:first]), eos, budget)
    produced = len(head)
    for count in emitted:
        if stop is not None:
            break
        tokens, stop = clip_emitted(list(output_ids[produced : produced + count]), eos, budget - produced)
        kept.append(len(tokens))
        produced += len(tokens)
    return kept, stop is not None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """1-based index of the first step whose counts differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b), 1):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b)) + 1


# -- the two sides ----------------------------------------------------------------------------------


def start_official(driver: Driver, job: dict, threads: int, workdir: Path) -> subprocess.Popen:
    """Launch the official script on ``job`` in the side env; ``finish_official`` reads its JSON."""
    job_path = workdir / f"job-{driver.method}-{time.time_ns()}.json"
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    with open(job_path.with_suffix(".out"), "w") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [str(official_python(driver.side.venv)), str(REPO / driver.script), str(job_path)],
            stdout=out,
            env=env,
            cwd=REPO,
        )


def finish_official(proc: subprocess.Popen) -> dict:
    """Wait for the official run and parse what it printed."""
    code = proc.wait()
    assert isinstance(proc.args, list)  # start_official passes an argument list, the job file last
    if code != 0:
        raise SystemExit(f"error: the official run failed (exit {code}); see its messages above")
    return json.loads(Path(proc.args[-1]).with_suffix(".out").read_text())


def greedy_config(method: str, overrides: tuple[str, ...], dataset: str = "humaneval", max_new_tokens: int = 128):
    """The composed greedy run config of ``method`` on the embedded model under ``overrides``."""
    from specbench.config import compose_config

    return compose_config(
        "model=smollm2_135m",
        f"method={method}",
        f"dataset={dataset}",
        "temperature=0",
        f"max_new_tokens={max_new_tokens}",
        *overrides,
    )


def run_ours(lm, method: str, case: Case, dataset: str, prompts, max_new_tokens: int) -> list[dict]:
    """specbench through the runner's own path: composed config, ``build_engine``, greedy."""
    from specbench.core.acceptance import Sampling
    from specbench.engines import build_engine

    cfg = greedy_config(method, case.overrides, dataset, max_new_tokens)
    engine = build_engine(cfg.method, lm, Sampling(0.0, 1.0), step_breakdown=False)
    records = []
    for sample_id, ids in prompts:
        watched = case.watch(engine) if case.watch else dict
        record = timed_generation(engine, ids, max_new_tokens, None, case.label, case=case.label, id=sample_id)
        records.append({**record, **watched()})
    return records


# -- the table --------------------------------------------------------------------------------------


@dataclass
class Row:
    """One (case, dataset, prompt) compared."""

    case: str
    dataset: str
    prompt: str
    prompt_tokens: int
    official_steps: int  # by the official loop's own stop rule
    official: list[int]  # per step, cut by specbench's rule
    cut_complete: bool
    ours: list[int]
    official_equals_ar: bool
    ours_equals_ar: bool
    ars_agree: bool
    official_first: int = 1  # tokens the official prefill committed (specbench's: 1)
    official_record: dict = field(default_factory=dict)  # the raw records compared (a driver's extra section)
    ours_record: dict = field(default_factory=dict)

    @property
    def first_difference(self) -> int | None:
        """The first step whose counts differ; 0 when the official prefill committed more than specbench's."""
        return 0 if self.official_first != 1 else first_difference(self.official, self.ours)

    @property
    def new_tokens(self) -> int:
        return 1 + sum(self.ours)


def compare(payload: dict) -> list[Row]:
    """Rows from the stored raw records (both sides, both ARs)."""
    eos = payload["eos_ids"]
    budget = payload["max_new_tokens"]
    rows = []
    for block in payload["blocks"]:
        off_ar, ar = block["official_ar"], block["ar"]
        official = {(r["case"], r["id"]): r for r in block["official"]}
        for record in block["ours"]:
            off = official[record["case"], record["id"]]
            first = off.get("prefill_emitted", 1)
            head = len(clip_emitted(off["output_ids"][:first], frozenset(eos), budget)[0])  # the prefill's, cut
            kept, complete = cut_trace(off["emitted"], off["output_ids"], budget, eos, first)
            off_out = off["output_ids"][: head + sum(kept)]
            rows.append(
                Row(
                    record["case"],
                    block["dataset"],
                    record["id"],
                    len(dict(block["prompts"])[record["id"]]),
                    off["steps"],
                    kept,
                    complete,
                    record["emitted"],
                    off_out == off_ar[record["id"]][: len(off_out)],
                    record["output_ids"] == ar[record["id"]],
                    off_ar[record["id"]] == ar[record["id"]],
                    head,
                    off,
                    record,
                )
            )
    return rows


def yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def summary_lines(rows: list[Row]) -> list[str]:
    """One line per (case, dataset) and per case over all datasets."""
    lines = [
        "| case | dataset | prompts | official steps | specbench steps | Δ | same steps, step for step | "
        "tokens/step off / ours | = AR off · ours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cases = list(dict.fromkeys(r.case for r in rows))
    datasets = list(dict.fromkeys(r.dataset for r in rows))
    groups = [(c, d, [r for r in rows if r.case == c and r.dataset == d]) for c in cases for d in datasets]
    if len(datasets) > 1:  # each case's datasets together, after its own rows
        groups = [
            g for c in cases for g in [*(g for g in groups if g[0] == c), (c, "all", [r for r in rows if r.case == c])]
        ]
    for case, dataset, group in groups:
        off = sum(len(r.official) for r in group)
        ours = sum(len(r.ours) for r in group)
        tokens = sum(r.new_tokens for r in group)
        same = sum(r.first_difference is None for r in group)
        lines.append(
            f"| {case} | {dataset} | {len(group)} | {off} | {ours} | {(ours - off) / off:+.1%} | "
            f"{same}/{len(group)} | {tokens / off:.2f} / {tokens / ours:.2f} | "
            f"{sum(r.official_equals_ar for r in group)}/{len(group)} · {sum(r.ours_equals_ar for r in group)}/"
            f"{len(group)} |"
        )
    return lines


def prompt_lines(rows: list[Row]) -> list[str]:
    """One line per prompt: step counts both ways, the first step that differs, equality to AR."""
    lines = [
        "| case | dataset | prompt | prompt tokens | new tokens | official steps (own rule) | official steps "
        "(specbench's rule) | specbench steps | first differing step | tok/step off | tok/step ours | off = AR | "
        "ours = AR | ARs agree |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = r.first_difference
        lines.append(
            f"| {r.case} | {r.dataset} | {r.prompt} | {r.prompt_tokens} | {r.new_tokens} | {r.official_steps} | "
            f"{len(r.official)}{'' if r.cut_complete else ' (official stopped first)'} | {len(r.ours)} | "
            f"{'–' if diff is None else diff} | {(r.official_first + sum(r.official)) / max(len(r.official), 1):.2f} | "
            f"{r.new_tokens / max(len(r.ours), 1):.2f} | {yes(r.official_equals_ar)} | {yes(r.ours_equals_ar)} | "
            f"{yes(r.ars_agree)} |"
        )
    return lines


def write_table(path: Path, payload: dict, driver: Driver) -> None:
    """The markdown report: provenance, counting rules, patches, summary, per-prompt rows, differences."""
    env = payload["environment"]
    source = driver.side.source
    assert source is not None  # step-for-step drivers run GitHub code
    rows = compare(payload)
    cases = payload["cases"]
    lines = [
        f"# {driver.method} parity: official code vs specbench `method={driver.method}`",
        "",
        f"Generated by `{payload['command']}` on {payload['finished_at']} ({env['cpu']}, float32, greedy, "
        f"{payload['max_new_tokens']} new tokens at most, {payload['wall_min']:.0f} min).",
        "",
        f"- official: {source.url} at `{source.commit}` (`{source.folder.relative_to(REPO)}`), "
        + ", ".join(f"{k} {v}" for k, v in env["official"].items())
        + f", in `{driver.side.venv}`",
        f"- specbench: commit `{env['specbench']['git_commit']}`"
        f"{' (uncommitted changes)' if env['specbench']['git_dirty'] else ''}, "
        f"transformers {env['specbench']['transformers']}, torch {env['specbench']['torch']}",
        f"- model: the embedded SmolLM2-135M-Instruct checkpoint (`{payload['model_dir']}`), both sides; EOS ids "
        f"{payload['eos_ids']}",
        "- prompts: specbench's dataset loader (chat template), the same token ids passed to both sides",
        "- cases: "
        + "; ".join(
            f"`{c['label']}` = `method={driver.method}`"
            + (f" + `{' '.join(c['overrides'])}`" if c["overrides"] else "")
            + f", official `{json.dumps(c['official'])}`"
            for c in cases
        ),
        "",
        "## How steps are counted and cut",
        "",
        driver.counting.strip(),
        "",
        f"Run-time patches applied to the official code (nothing vendored; `{driver.script}`):",
        "",
        *[f"{i}. {p}" for i, p in enumerate(payload["patches"], 1)],
        "",
        "## Steps over the prompts",
        "",
        "Δ = (specbench - official) / official on the total steps, both cut by specbench's rule. Same steps: "
        "prompts whose per-step token counts are equal on both sides at every step. = AR: outputs equal to "
        "their own side's AR output (official: HF greedy `generate` in the side env; specbench: `method=ar`).",
        "",
        *summary_lines(rows),
        "",
        "## Per prompt",
        "",
        *prompt_lines(rows),
        "",
        *(driver.extra(rows) if driver.extra else []),
        "## Rule differences found",
        "",
        driver.differences.strip(),
        "",
    ]
    path.write_text("\n".join(lines))


# -- orchestration ----------------------------------------------------------------------------------


def parse_args(driver: Driver, argv: list[str] | None, case_labels: Sequence[str]):
    import argparse

    parser = argparse.ArgumentParser(
        prog=f"python -m specbench.parity {driver.method}",
        description=f"official {driver.method} vs specbench, step for step, on the same token prompts",
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=list(driver.default_datasets),
        help="dataset=limit (first `limit` samples in specbench's order)",
    )
    parser.add_argument("--cases", nargs="+", default=list(case_labels), choices=list(case_labels))
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per side; both sides run at the same time (keep 1 on a shared 2-core machine)",
    )
    parser.add_argument("--out", default=f"results/parity/{driver.method}.md")
    parser.add_argument("--from-json", default=None, help="only rebuild the table from a stored JSON")
    return parser.parse_args(argv)


def run(
    driver: Driver,
    argv: list[str] | None,
    cases: Callable[[object], list[Case]],
    case_labels: Sequence[str],
    job_extra: Callable[[object], dict] = lambda lm: {},
    shown_argv: list[str] | None = None,
) -> int:
    """Parse the options, run both sides on every (case, dataset, prompt), write the table and its JSON.

    ``cases(lm)`` builds the cases once the model is loaded (a case's official knobs may come from the
    drafter specbench builds, e.g. its tree); ``job_extra(lm)`` adds method-wide fields to the job;
    ``shown_argv``: the arguments the table's command shows (a driver's own options included; default ``argv``).
    """
    args = parse_args(driver, argv, case_labels)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        write_table(out, json.loads(Path(args.from_json).read_text()), driver)
        print(f"[parity] wrote {out}")
        return 0

    import transformers

    from specbench import environment
    from specbench.config import compose_config
    from specbench.models.loading import checkpoint_path, load_model

    assert driver.side.source is not None  # step-for-step drivers run GitHub code
    source = driver.side.source.check()
    official_python(driver.side.venv)
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    cfg = compose_config("model=smollm2_135m")
    lm = load_model(cfg.model, torch.device("cpu"), torch.float32)
    model_dir = checkpoint_path(cfg.model)
    chosen = [c for c in cases(lm) if c.label in args.cases]
    prompts = render_prompts(parse_datasets(args.datasets), lm.tokenizer)
    eos_ids = sorted(lm.eos_ids)
    blocks, official_env, patches = [], {}, []
    with tempfile.TemporaryDirectory(prefix=f"parity-{driver.method}-") as tmp:
        for dataset, items in prompts.items():
            job = {
                "source": str(source),
                "model_dir": model_dir,
                "max_new_tokens": args.max_new_tokens,
                "eos_ids": eos_ids,
                "cases": [{"label": c.label, **c.official} for c in chosen],
                "prompts": [{"id": sid, "ids": ids} for sid, ids in items],
                **job_extra(lm),
            }
            proc = start_official(driver, job, args.threads, Path(tmp))
            ar = run_ar(lm, dataset, items, args.max_new_tokens)
            ours = [r for c in chosen for r in run_ours(lm, driver.method, c, dataset, items, args.max_new_tokens)]
            official = finish_official(proc)
            official_env, patches = official["versions"], official["patches"]
            blocks.append(
                {
                    "dataset": dataset,
                    "prompts": items,
                    "ar": ar,
                    "official_ar": official["ar"],
                    "official": official["records"],
                    "ours": ours,
                }
            )
    payload = {
        "command": f"python -m specbench.parity {driver.method} "
        + shlex.join(shown_argv if shown_argv is not None else argv if argv is not None else sys.argv[2:]),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_min": (time.perf_counter() - started) / 60,
        "max_new_tokens": args.max_new_tokens,
        "model_dir": model_dir,
        "eos_ids": eos_ids,
        "cases": [{"label": c.label, "overrides": list(c.overrides), "official": c.official} for c in chosen],
        "patches": patches,
        "environment": {
            "cpu": environment.cpu_name(),
            "official": official_env,
            "specbench": {
                **environment.git_state(),
                "transformers": transformers.__version__,
                "torch": torch.__version__,
            },
        },
        "blocks": blocks,
    }
    out.with_suffix(".json").write_text(json.dumps(payload))
    write_table(out, payload, driver)
    print(f"[parity] wrote {out} and {out.with_suffix('.json')}")
    return 0
