"""ANPD parity (component): the official n-gram classes vs specbench's ``MultiLevelNgram``, draft for draft.

oujieww/ANPD releases the Multi-Level N-gram classes (``base_ngram.py``) but not the draft/verify loop
(``decoding_ml_ngram`` is imported and absent), so no official generation can run. What can be
compared is the drafter: both sides read the same token streams (a prompt and the greedy output
specbench's ANPD produced for it: a stored bench run's records, or a live run) and propose a K-token
draft after every committed prefix; ``scripts/parity/anpd_official.py`` runs the official classes in
``.venv-parity-anpd`` (numpy 1.23.5, the release's pin) and, for the tie order, with specbench's numpy.
Official variants with one release artifact switched off each attribute every differing draft to its
cause. A replay of specbench's loop (``replay``; at T = 0 the steps are a function of the drafts and
the output) turns each side's drafts into step counts; the replay of specbench's own drafts must give
the steps the real run recorded.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from specbench.parity.common import REPO, OfficialSource, SideEnv, official_python, parse_datasets, render_prompts
from specbench.structures.ngram import MultiLevelNgram

SOURCE = OfficialSource("anpd", "https://github.com/oujieww/ANPD", "19b2e5aa5272ca43c17e18bc05209760214c2cfa")
"""The last commit (2024-09-02, "Create base_decoding.py"): base_ngram.py, base_decoding.py (an AR
baseline), requriments.txt and a README that says the code "will be available soon"."""

OFFICIAL_PINS = ("numpy==1.23.5",)
"""The release's numpy pin (requriments.txt): its ``argsort`` decides ties between equal counts."""

SIDE = SideEnv(".venv-parity-anpd", OFFICIAL_PINS, SOURCE)
SCRIPT = "scripts/parity/anpd_official.py"
STORED_RUN = "results/bench/model_free/smollm2_135m_cpu_float32_20261126T094213Z"
"""The ``model_free`` suite's run whose ANPD records (HumanEval-20, 128 tokens) the notes replayed."""

PAD = 1
"""The official dummy id: its drafts are always K tokens, a miss drafting id 1 (specbench ``on_miss=pad``)."""

ARTIFACTS = {
    "first_tie+id1_token": "prompt counted twice",
    "once+id1_token": "tie order",
    "once+first_tie": "id 1 treated as a miss",
}
"""The variants that keep one release artifact each (the script's flags switch the others off)."""

VARIANTS = ("released", *ARTIFACTS, "once+first_tie+id1_token")
KEPT = {"released": "all three", **ARTIFACTS, "once+first_tie+id1_token": "none (specbench's rules)"}
"""What each variant keeps of the release's artifacts."""

DIFFERENCES = """\
- **Prompt counted twice** (official artifact; specbench not changed). Every `NGramModel` reads the
  prompt in its constructor and `MultiLevelNgram._process_text` then feeds it to every level again, so
  the prompt's counts are doubled and one transition from the prompt's last n-1 tokens to its first
  token is added. It shifts the balance between prompt and generated counts at every position, not
  only near the junction. The paper's Algorithm 1 initialises the MLN from the prompt once; the
  release has no loop that shows how the authors built it per request, so this is read as a quirk of
  the wrapper, not as a rule: no option reproduces it.
- **Tie order** (numpy-dependent; documented, no option). The official greedy pick is
  `np.argsort(counts)[-1]` over successors in insertion order. With numpy 1.23.5 (the pin) argsort's
  default introsort sorts 16 or fewer entries by insertion sort, which keeps equal counts in index
  order, so the *last*-seen of the most frequent successors wins; above 16 entries, and with newer
  numpy builds that dispatch to SIMD sorts (numpy 2.x on AVX-512), the order among equal counts is
  unspecified. specbench takes the first-seen successor on ties, a fixed rule.
- **Token id 1 treated as a miss** (official artifact; specbench not changed). A level whose favourite
  is the real token 1 answers like a miss (the dummy id is the string "1"), so the query falls back to a
  lower level. SmolLM2's id 1 is `<|im_start|>` (every chat turn; Llama's is `<s>`). specbench treats
  id 1 as any token.
- **Miss** (a rule; option exists). The official class drafts the dummy id 1 on a miss and goes on;
  specbench stops the draft (`on_miss=stop`, the paper's NULL) unless `method.drafter.on_miss=pad`
  (`pad_id=1`), which the draft comparison uses. In the replay both give the same steps unless the
  output itself holds id 1 right after a miss.
- **Keys** (not changed): the official keys are whitespace-split id strings and a context shorter than
  n-1 tokens can match a short key; specbench's are int tuples and skips such levels. Equal for prompts
  of at least N-1 tokens (all here).
- **Not comparable**: the loop (draft length near the budget, EOS, step counting), the per-dataset
  prompt handling and the HumanEval prompt: none is in the release.
"""


@dataclass
class Stream:
    """One prompt and the greedy output specbench's ANPD produced for it, with its recorded steps."""

    dataset: str
    id: str
    prompt: list[int]
    output: list[int]
    budget: int
    steps: list[int]  # tokens emitted per verify step by specbench's loop, as recorded

    @property
    def key(self) -> str:
        return f"{self.dataset}:{self.id}"


# -- the two drafters and the replay ----------------------------------------------------------------


def our_drafts(stream: Stream, max_n: int, k: int, pad: int | None) -> list[list[int]]:
    """specbench's draft (``MultiLevelNgram.chain``) after each committed prefix ``output[:p]``, p = 1..len-1."""
    table = MultiLevelNgram(max_n)
    table.extend(stream.prompt)
    result = []
    for token in stream.output[:-1]:
        table.append(token)
        result.append(table.chain(k, pad))
    return result


def replay(output: Sequence[int], drafts: Sequence[list[int]], draft_len: int, budget: int) -> list[int]:
    """Tokens per step of specbench's greedy loop on ``output`` when it drafts ``drafts[p - 1]`` after p tokens.

    The prefill emits ``output[0]``; a step drafts at most ``min(K, remaining - 1)`` tokens, accepts the
    longest prefix equal to the output and emits it plus the target's next token.
    """
    emitted: list[int] = []
    produced = 1
    while produced < len(output):
        draft = drafts[produced - 1][: max(min(draft_len, budget - produced - 1), 0)]
        count = min(accepted_length(draft, output, produced) + 1, len(output) - produced)
        emitted.append(count)
        produced += count
    return emitted


def accepted_length(draft: Sequence[int], output: Sequence[int], start: int) -> int:
    """How many leading draft tokens equal the output from ``start`` on (what a greedy verify accepts)."""
    for i, (token, target) in enumerate(zip(draft, output[start:])):
        if token != target:
            return i
    return min(len(draft), len(output) - start)


def cause(position: int, ours: list[int], official: dict[str, list[list[int]]]) -> str:
    """Why the released draft at ``position`` differs: the artifacts that change it on their own."""
    alone = [reason for variant, reason in ARTIFACTS.items() if official[variant][position] != ours]
    return " + ".join(alone) or "only the three together"


# -- the streams ------------------------------------------------------------------------------------


def stored_streams(run: Path, tokenizer) -> list[Stream]:
    """The ANPD records of a stored bench run, with the prompts re-rendered and checked by their digest."""
    from omegaconf import OmegaConf

    from specbench.runner import prompt_sha

    cfg = OmegaConf.load(run / "anpd" / "r0" / "config.yaml")
    records = [json.loads(line) for line in (run / "anpd" / "r0" / "samples.jsonl").read_text().splitlines()]
    name = cfg.dataset.name
    prompts = dict(render_prompts([(name, int(cfg.limit))], tokenizer)[name])
    streams = []
    for r in records:
        prompt = prompts[r["sample_id"]]
        if prompt_sha(prompt) != r["prompt_sha"]:
            raise SystemExit(f"error: {r['sample_id']}'s prompt renders differently now than in {run}")
        streams.append(
            Stream(name, r["sample_id"], prompt, r["output_ids"], int(cfg.max_new_tokens), r["accept_lengths"])
        )
    return streams


def live_streams(datasets: list[tuple[str, int]], max_new_tokens: int, lm) -> list[Stream]:
    """specbench's ANPD (default config, greedy) on the first prompts of each dataset, run now."""
    from specbench.config import compose_config
    from specbench.core.acceptance import Sampling
    from specbench.engines import build_engine
    from specbench.parity.common import timed_generation

    streams = []
    for name, items in render_prompts(datasets, lm.tokenizer).items():
        cfg = compose_config("model=smollm2_135m", "method=anpd", f"dataset={name}", "temperature=0")
        engine = build_engine(cfg.method, lm, Sampling(0.0, 1.0), step_breakdown=False)
        for sample_id, ids in items:
            record = timed_generation(engine, ids, max_new_tokens, None, "anpd", id=sample_id)
            streams.append(Stream(name, sample_id, ids, record["output_ids"], max_new_tokens, record["emitted"]))
    return streams


# -- the official side ------------------------------------------------------------------------------


def run_official(python: Path, job: dict, workdir: Path) -> dict:
    """The official script on ``job`` under ``python``; its parsed JSON."""
    job_path = workdir / f"job-{time.time_ns()}.json"
    job_path.write_text(json.dumps(job))
    done = subprocess.run([str(python), str(REPO / SCRIPT), str(job_path)], capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"error: the official script failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def sparse(drafts: list[list[int]], ours: list[list[int]]) -> dict[str, list[int]]:
    """The drafts that differ from ours, keyed by position (ours fill the rest back in)."""
    return {str(p): d for p, (d, o) in enumerate(zip(drafts, ours)) if d != o}


def dense(diff: dict[str, list[int]], ours: list[list[int]]) -> list[list[int]]:
    """Official drafts from their differences to ours."""
    return [diff.get(str(p), o) for p, o in enumerate(ours)]


# -- the report -------------------------------------------------------------------------------------


@dataclass
class Compared:
    """One stream with every side's drafts and replayed steps."""

    stream: Stream
    ours: list[list[int]]  # on_miss=pad, pad 1: the official miss rule
    official: dict[str, list[list[int]]]  # label -> drafts
    steps: dict[str, int]  # label -> replayed steps ("ours", "ours pad", official labels)


def compared(payload: dict) -> list[Compared]:
    """Every stream's drafts (ours recomputed, the official ones from their stored differences) and replays."""
    max_n, k = payload["max_ngram_size"], payload["draft_len"]
    rows = []
    for raw in payload["streams"]:
        stream = Stream(**raw)
        ours = our_drafts(stream, max_n, k, PAD)
        official = {label: dense(side["diff"][stream.key], ours) for label, side in payload["official"].items()}
        at = {"ours": our_drafts(stream, max_n, k, None), "ours pad": ours, **official}
        steps = {label: len(replay(stream.output, drafts, k, stream.budget)) for label, drafts in at.items()}
        if replay(stream.output, at["ours"], k, stream.budget) != stream.steps:
            raise SystemExit(f"error: the replay of {stream.key} does not give the steps specbench recorded")
        rows.append(Compared(stream, ours, official, steps))
    return rows


def pct(part: int, whole: int) -> str:
    return f"{part / max(whole, 1):.1%}"


def agreement_lines(rows: list[Compared], labels: dict[str, str]) -> list[str]:
    """Per (variant, dataset): drafts and first tokens equal to ours, and the replayed steps."""
    lines = [
        "| official variant | release artifacts kept | numpy | dataset | queries | drafts = ours | "
        "first token = ours | accepted length = ours | replayed steps official / ours | tokens/step official / ours |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[str, list[Compared]] = {}
    for row in rows:
        groups.setdefault(row.stream.dataset, []).append(row)
    groups["all"] = rows
    for label, numpy in labels.items():
        for dataset, group in groups.items():
            pairs = [
                (t, o, accepted_length(t, row.stream.output, p + 1) == accepted_length(o, row.stream.output, p + 1))
                for row in group
                for p, (t, o) in enumerate(zip(row.official[label], row.ours))
            ]
            equal = sum(t == o for t, o, _ in pairs)
            first = sum(t[:1] == o[:1] for t, o, _ in pairs)
            accepted = sum(same for _, _, same in pairs)
            tokens = sum(len(row.stream.output) for row in group)
            off = sum(row.steps[label] for row in group)
            ours = sum(row.steps["ours"] for row in group)
            lines.append(
                f"| {label} | {KEPT[label.partition(',')[0]]} | {numpy} | {dataset} | {len(pairs)} | "
                f"{pct(equal, len(pairs))} | {pct(first, len(pairs))} | {pct(accepted, len(pairs))} | {off} / {ours} | "
                f"{tokens / off:.3f} / {tokens / ours:.3f} |"
            )
    return lines


def cause_lines(rows: list[Compared]) -> list[str]:
    """The released drafts that differ from ours, by the artifacts that change them on their own."""
    counts: dict[str, int] = {}
    for row in rows:
        for p, (theirs, ours) in enumerate(zip(row.official["released"], row.ours)):
            if theirs != ours:
                reason = cause(p, ours, row.official)
                counts[reason] = counts.get(reason, 0) + 1
    queries = sum(len(row.ours) for row in rows)
    lines = [
        "| cause (artifacts that change the draft on their own) | drafts | share of all queries |",
        "|---|---|---|",
    ]
    lines += [f"| {reason} | {n} | {pct(n, queries)} |" for reason, n in sorted(counts.items(), key=lambda x: -x[1])]
    return lines


def first_difference_lines(rows: list[Compared], labels: Sequence[str]) -> list[str]:
    """Per variant: the first query (in stream order) whose official draft differs from ours, and why."""
    lines = [
        "| official variant | stream | after output token | context (last 4 ids) | ours | official | "
        "why (variants: what they keep) |"
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for label in labels:
        found = next(
            ((row, p) for row in rows for p, (t, o) in enumerate(zip(row.official[label], row.ours)) if t != o), None
        )
        if found is None:
            lines.append(f"| {label} | none | | | | | |")
            continue
        row, p = found
        context = (row.stream.prompt + row.stream.output[: p + 1])[-4:]
        why = cause(p, row.ours[p], row.official) if label == "released" else KEPT[label.partition(",")[0]]
        lines.append(
            f"| {label} | {row.stream.key} | {p + 1} | {context} | {row.ours[p]} | {row.official[label][p]} | {why} |"
        )
    return lines


def stream_lines(rows: list[Compared], labels: Sequence[str]) -> list[str]:
    """One line per stream: replayed steps of every side and the recorded steps."""
    head = " | ".join(f"steps {label}" for label in labels)
    lines = [
        f"| stream | prompt tokens | new tokens | steps recorded | steps ours (replay) | steps ours, pad 1 | {head} |",
        "|---|---|---|---|---|---|" + "---|" * len(labels),
    ]
    for row in rows:
        s = row.stream
        cells = " | ".join(str(row.steps[label]) for label in labels)
        lines.append(
            f"| {s.key} | {len(s.prompt)} | {len(s.output)} | {len(s.steps)} | {row.steps['ours']} | "
            f"{row.steps['ours pad']} | {cells} |"
        )
    return lines


def write_table(path: Path, payload: dict) -> None:
    """The markdown report: provenance, protocol, agreement, first differences, per-stream replays, differences."""
    rows = compared(payload)
    labels = {label: side["versions"]["numpy"] for label, side in payload["official"].items()}
    env = payload["environment"]
    sources = sorted({row.stream.dataset for row in rows})
    lines = [
        "# anpd parity: the official n-gram classes vs specbench's `MultiLevelNgram` (component check)",
        "",
        f"Generated by `{payload['command']}` on {payload['finished_at']} ({env['cpu']}, "
        f"{payload['wall_min']:.1f} min).",
        "",
        f"- official: {SOURCE.url} at `{SOURCE.commit}` (`{SOURCE.folder.relative_to(REPO)}`), `base_ngram.py`, "
        f"in `{SIDE.venv}` (numpy as pinned) and, for the tie order, in specbench's env",
        f"- specbench: commit `{env['specbench']['git_commit']}`"
        f"{' (uncommitted changes)' if env['specbench']['git_dirty'] else ''}, "
        "`specbench.structures.ngram.MultiLevelNgram`",
        f"- N = {payload['max_ngram_size']}, K = {payload['draft_len']} (`method=anpd` defaults, the paper's)",
        f"- streams: {'; '.join(payload['stream_sources'])} ({len(rows)} streams: {', '.join(sources)})",
        "",
        "## What is compared",
        "",
        "The release has the n-gram classes and no draft/verify loop, so no official generation can run. Both "
        "sides read the same token streams (a prompt rendered by specbench's loader and the greedy output "
        "specbench's ANPD produced for it) and propose a K-token draft after every committed prefix "
        "(`after output token` p = 1 .. len - 1, the positions where the loop can draft). The official "
        "drafts are always K tokens (a miss drafts the dummy id 1), so specbench's are taken with "
        "`on_miss=pad pad_id=1` for the draft comparison. The official variants keep one release artifact "
        "each and switch the other two off (run-time patches below), so each measures what that artifact "
        "changes on its own; a released draft that differs from ours is attributed to the artifacts that "
        "change it on their own. The variant that keeps none has specbench's rules and must agree everywhere. "
        '"accepted length = ours": the official draft would have as many leading tokens accepted by a greedy '
        "verify against the output as specbench's (what moves step counts; a draft that differs only after "
        "its first wrong token, e.g. in the padding after a miss, counts as equal here).",
        "",
        "Replay: at T = 0 specbench's steps are a function of the drafts and the output, so each side's "
        "drafts are replayed through specbench's loop rule (draft at most min(K, remaining - 1), accept the "
        "longest equal prefix, emit it plus the target's token). The replay of specbench's own drafts "
        "(`on_miss=stop`, the default) equals the recorded steps of every stream (checked), so "
        '"steps official" is specbench\'s loop with the official n-gram model in place of its own.',
        "",
        f"Run-time patches and protocol on the official side (nothing vendored; `{SCRIPT}`):",
        "",
        *[f"{i}. {p}" for i, p in enumerate(payload["patches"], 1)],
        "",
        "## Drafts and replayed steps",
        "",
        *agreement_lines(rows, labels),
        "",
        "The released drafts that differ from specbench's, by cause:",
        "",
        *cause_lines(rows),
        "",
        "## First differing draft",
        "",
        *first_difference_lines(rows, list(labels)),
        "",
        "## Per stream (replayed steps)",
        "",
        *stream_lines(rows, list(labels)),
        "",
        "## Rule differences found",
        "",
        DIFFERENCES.strip(),
        "",
    ]
    path.write_text("\n".join(lines))


# -- orchestration ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m specbench.parity anpd",
        description="the official ANPD n-gram classes vs specbench's MultiLevelNgram on the same token streams",
    )
    parser.add_argument("--run", default=STORED_RUN, help="a stored bench run with an anpd entry ('' for none)")
    parser.add_argument(
        "--datasets", nargs="*", default=["mt_bench=10"], help="dataset=limit: streams from a live specbench run"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128, help="budget of the live run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the live run")
    parser.add_argument("--out", default="results/parity/anpd.md")
    parser.add_argument("--from-json", default=None, help="only rebuild the table from a stored JSON")
    return parser.parse_args(argv)


def official_sides(streams: list[Stream], max_n: int, k: int) -> tuple[dict, list[str]]:
    """The official drafts, as differences to ours: every variant with the pinned numpy, the release with ours."""
    job = {
        "source": str(SOURCE.check()),
        "max_ngram_size": max_n,
        "draft_len": k,
        "streams": [{"key": s.key, "prompt": s.prompt, "output": s.output} for s in streams],
    }
    ours = {s.key: our_drafts(s, max_n, k, PAD) for s in streams}
    sides: dict[str, dict] = {}
    patches: list[str] = []
    runs = (
        (official_python(SIDE.venv), VARIANTS, ""),
        (Path(sys.executable), ("released", "once+id1_token"), ", numpy {}"),
    )
    with tempfile.TemporaryDirectory(prefix="parity-anpd-") as tmp:
        for python, variants, suffix in runs:
            out = run_official(python, {**job, "variants": list(variants)}, Path(tmp))
            patches = out["patches"]
            for variant, drafts in out["drafts"].items():
                diff = {key: sparse(d, ours[key]) for key, d in drafts.items()}
                sides[variant + suffix.format(out["versions"]["numpy"])] = {"versions": out["versions"], "diff": diff}
    return sides, patches


def measure(args: argparse.Namespace, command: str) -> dict:
    """Both sides on every stream: the raw records the table is built from."""
    import torch

    from specbench import environment
    from specbench.config import compose_config
    from specbench.models.loading import load_model

    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    SOURCE.check()
    official_python(SIDE.venv)
    cfg = compose_config("model=smollm2_135m", "method=anpd")
    max_n, k = int(cfg.method.drafter.max_ngram_size), int(cfg.method.drafter.draft_len)
    lm = load_model(cfg.model, torch.device("cpu"), torch.float32)
    streams, sources = [], []
    if args.run:
        streams += stored_streams(REPO / args.run, lm.tokenizer)
        sources.append(f"the stored run `{args.run}` (its `anpd` records)")
    if args.datasets:
        streams += live_streams(parse_datasets(args.datasets), args.max_new_tokens, lm)
        sources.append(f"a live `method=anpd` run on {', '.join(args.datasets)}, {args.max_new_tokens} new tokens")
    official, patches = official_sides(streams, max_n, k)
    return {
        "command": command,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_min": (time.perf_counter() - started) / 60,
        "max_ngram_size": max_n,
        "draft_len": k,
        "stream_sources": sources,
        "patches": patches,
        "environment": {"cpu": environment.cpu_name(), "specbench": environment.git_state()},
        "streams": [vars(s) for s in streams],
        "official": official,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        payload = json.loads(Path(args.from_json).read_text())
    else:
        command = f"python -m specbench.parity anpd {shlex.join(argv if argv is not None else sys.argv[2:])}"
        payload = measure(args, command.rstrip())
        out.with_suffix(".json").write_text(json.dumps(payload))
    write_table(out, payload)
    print(f"[parity] wrote {out}")
    return 0
