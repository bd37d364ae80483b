"""The results schema: the written contract between the runner, the report and the notebooks.

A run directory holds:
- ``samples.jsonl``: one JSON object per (sample, turn), appended and flushed as each sample ends;
- ``summary.json``: run identity, aggregate metrics, environment and config digest (rewritten
  atomically after every sample, so an interrupted run still has a valid one);
- ``config.yaml``: the Hydra-resolved config of the run, its config digest on the first line.

Bump ``SCHEMA_VERSION`` whenever a field changes meaning; readers check it. Readers still read
``specbench.samples/1`` records (before the step breakdown), ``/2`` (before ``prompt_sha``), ``/3``
(before the tree depth, side branch and energy traces) up to ``/6`` (before ``measuring_session``):
``upgrade_record`` fills the fields added since with null (not measured; a null prompt digest pairs as before, on
sample id and turn alone; a null session pairs with nothing in the reproduction's tables).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeGuard

SCHEMA_VERSION = "specbench.samples/7"
SUMMARY_VERSION = "specbench.summary/1"

PHASES = ("draft", "verify", "accept", "update")
"""The step breakdown's phases, in step order (record fields ``<phase>_s``)."""


def step_field(items: str, doc: str, traced_with: tuple[str, ...] = ()) -> Any:
    """One per-step trace of ``StepLists``: its items' kind (FIELD_TYPES' ``list of <items>``), its schema doc and
    the traces measured with it (the metrics read them together, so it is never null without them)."""
    return field(default=None, metadata={"kind": f"optional list of {items}", "doc": doc, "traced_with": traced_with})


@dataclass(kw_only=True)
class StepLists:
    """The per-step traces of one generation, declared once: the loop's ``Generation`` holds them, the runner writes
    them as record fields of the same names, and SAMPLE_FIELDS, FIELD_TYPES, STEP_FIELDS and TRACED_WITH derive from
    them. Each is one entry per target forward after the prefill, or None (not measured)."""

    accept_lengths: list[int] | None = step_field(
        "integers", "tokens emitted per step, bonus/correction included (null for hf_generate)", ("draft_tokens",)
    )
    draft_tokens: list[int] | None = step_field(
        "integers", "drafted nodes verified per step, root excluded (null for hf_generate)"
    )
    draft_depth: list[int] | None = step_field(
        "integers",
        "depth of the verified draft tree per step, after pruning to the budget; 0 when nothing was drafted (null for "
        "hf_generate)",
    )
    verify_tokens: list[int] | None = step_field(
        "integers",
        "rows of each step's verify forward: the root, the drafted nodes and any aux rows (LADE's lookahead window); "
        "what the latency curve prices (null for hf_generate)",
    )
    side_branch: list[bool] | None = step_field(
        "booleans",
        "per step, whether the accepted path used a child other than its parent's first-listed (top-ranked) one (null "
        "for hf_generate)",
    )
    step_s: list[float] | None = step_field(
        "numbers", "wall time per step, device synchronized at its end (null for hf_generate)"
    )
    draft_s: list[float] | None = step_field(
        "numbers",
        "step breakdown (null unless step_breakdown is on; auto = on for CPU): time per step in drafter.propose and "
        "in laying the tree out for the forward (tokens, positions, mask)",
        ("step_s", "verify_s", "accept_s", "update_s"),
    )
    verify_s: list[float] | None = step_field(
        "numbers",
        "step breakdown: time per step in the target verify forward; step_s - verify_s is the method's overhead "
        "(drafting, acceptance, cache bookkeeping). Always present in specbench.samples/1 records (then null only "
        "for hf_generate)",
        ("step_s",),
    )
    accept_s: list[float] | None = step_field(
        "numbers", "step breakdown: time per step in the acceptance rule and the KV-cache compaction", ("draft_s",)
    )
    update_s: list[float] | None = step_field(
        "numbers",
        "step breakdown: time per step in drafter.observe (pools, tries, draft caches) and in freeing the step's "
        "trees and logits",
        ("draft_s",),
    )


SAMPLE_FIELDS: dict[str, str] = {
    "schema": "SCHEMA_VERSION of the writer",
    "run_id": "id of the run that wrote the line (output directory name + start time)",
    "sample_id": "dataset sample id (string)",
    "turn": "turn index within the sample, 0-based",
    "n_turns": "number of turns of the sample (a sample is complete when all are written)",
    "category": "dataset category or null (Spec-Bench: its task group)",
    "fine_category": "finer category where the dataset has one (Spec-Bench's MT-Bench categories), else null",
    "prompt_tokens": "tokens in the rendered prompt of this turn",
    "prompt_sha": "sha256 (16 hex digits) of the prompt's token ids: the report pairs a sample with its AR "
    "baseline's only when they answered the same prompt",
    "new_tokens": "generated tokens (EOS included when emitted)",
    "output_ids": "generated token ids",
    "output_text": "decoded generated text (special tokens skipped)",
    "wall_s": "wall time of the whole generation, prefill included, device synchronized (in a batch: from the "
    "batch's submission to this request's last token, by the engine's clock)",
    "batch_size": "requests the engine generated together with this one, itself included (1: one at a time; "
    "engine=vllm batch_size=N: N; concurrency=N: every request of the load against the server)",
    "batch_wall_s": "wall time of the engine call that generated the batch (= wall_s at batch size 1); the record's "
    "share of the machine's time is batch_wall_s / batch_size (specbench.metrics.machine_seconds)",
    "prefill_s": "wall time of the prefill forward (it emits the first token)",
    "target_forwards": "target forwards after the prefill (= decoding steps)",
    **{step.name: step.metadata["doc"] for step in fields(StepLists)},
    "energy_j": "joules the energy counter read over the generation (NVML on GPU, RAPL on CPU; in a batch, the "
    "batch's joules over its size), null where none is readable (the summary's environment.energy says why)",
    "stop_reason": "'eos' or 'max_new_tokens'",
    "measuring_session": "the measuring session that timed it (environment.measuring_session: UTC start, machine, "
    "process): the reproduction's tables divide only times of one session (null: written before sessions were "
    "recorded)",
    "drafter_stats": "the drafter's stats() after this turn (pool sizes, hit rates, ...)",
}

SUMMARY_FIELDS: dict[str, str] = {
    "schema": "SUMMARY_VERSION of the writer",
    "run_id": "id of the latest writer",
    "status": "'running', 'complete', 'interrupted' (Ctrl-C) or 'failed' (an error; finished samples kept)",
    "model": "model config name; model_path: Hub id / local dir / tiny spec",
    "method": "method config name",
    "dataset": "dataset config name",
    "dataset_info": "Dataset.describe(): source (local:PATH, package, hub:ID), variant (e.g. MBPP "
    "full/sanitized), counts, the categories kept (null: all), sampler and seed",
    "prompt_format": "prompt format actually used (chat, raw, vicuna, llama2)",
    "lossless": "whether the method's output distribution equals the target's",
    "hyperparameters": "resolved method node (the drafter's knobs)",
    "sampling": "{temperature, top_p, seed}",
    "repeat": "index of a repeated timing run of the same configuration (0 for a single run)",
    "experiment": "the experiment config that last wrote the run (conf/experiment/<scale>/<name>), or null",
    "max_new_tokens": "generation budget per turn",
    "limit": "requested sample limit (null = all)",
    "n_samples": "samples finished (all turns); n_records: lines in samples.jsonl",
    "warmup": "warm-up generations run before timing (never recorded)",
    "started_at": "ISO time the first writer started; updated_at: time of the last write",
    "ended_at": "ISO time the latest writer stopped (null while running)",
    "metrics": "aggregates: see specbench.metrics.aggregate",
    "peak_memory": "{kind, bytes}: the largest per-sample peak over the timed samples of every writer "
    "(reset before each sample): 'cuda_max_allocated' (torch's allocator peak, summed over "
    "the GPUs) on GPU, 'process_peak_rss' (Linux VmHWM) on CPU; null if unreadable",
    "device_map": "module -> device where model.device_map placed the target (null: all on `device`)",
    "environment": "device, CPU, library versions, dtype, git commit and dirty flag",
    "config_digest": "sha256 of the result-determining config (see runner.config_digest)",
    "bench": "for runs written by a benchmark suite (python -m specbench.bench): {suite, session, entry, "
    "baseline, index}: the suite, its session folder, this run's entry label, the baseline entry's "
    "label (the report pairs the run with it) and the entry's position in the suite; absent or "
    "null for ordinary runs",
    "target": "sha256 (16 hex digits) of the target's identity: its model config without drafts, heads and "
    "machine locations, and the dtype; the report pairs runs with AR only when equal (absent before: '')",
    "artefacts": "the trained or published parts the engine loaded (`draft:<weights digest>`, "
    "`medusa:<Hub id>`, `corpus:<cache id>`); a folder never mixes samples of different ones, and "
    "the report never merges runs that differ in them",
    "budget": "the method's size knob when set by budget= (null: the method's default): {mode: given|auto, key, "
    "value, default}; auto adds predicted_speedup, every candidate's measured costs, AR's, the latency curve "
    "and its digest, and the calibration (held-out sample ids, max_new_tokens, seconds); see specbench.budget",
    "engine": "the engine that generated: {name: hf (specbench's own: the shared loop or HF generate) | vllm, "
    "batch_size, concurrency (null: offline)}; vLLM adds its version, torch's and transformers' in its "
    "environment, the ArcticInference build, load_s and the engine arguments it was built with "
    "(speculative_config among them); absent before engine= existed (hf, batch 1)",
    "latency_curves": "the latency curves cached for this model, device and dtype when the summary was written "
    "(specbench.profile.cached_curve; one per context length): the report's ideal speedup prices steps with them",
    "compile": "the compiled path (specbench.core.compiled): {setting (the compile run setting), compiled (whether the "
    "target's verify forwards ran compiled), eager_because (why not, when the setting asked for it: null otherwise), "
    "buckets (the compiled widths), compile_s (the latest writer's seconds compiling every bucket before its first "
    "timed sample), graphs (graphs that compilation made; 0 when an earlier run of the process had made them), "
    "timed_compilations (graphs compiled inside timed generations, every writer: 0 unless something recompiled)}; "
    "null in runs before the compiled path",
    "memory_traffic": "what a step reads and how fast the device can read it (specbench.bandwidth): {weight_bytes, "
    "kv_bytes_per_token, peak_bytes_per_s, peak_source}; the metrics' bandwidth_share derives from it; null in runs "
    "before it was recorded",
}


SESSION_FIELDS = ("measuring_session",)
"""The fields ``specbench.samples/7`` added."""
BATCH_FIELDS = ("batch_size", "batch_wall_s")
"""The fields ``specbench.samples/6`` added."""
WIDTH_FIELDS = ("verify_tokens",)
"""The fields ``specbench.samples/5`` added."""
TRACED_FIELDS = ("draft_depth", "side_branch", "energy_j", *WIDTH_FIELDS)
"""The fields ``specbench.samples/4`` and later added."""
ADDED_FIELDS: dict[str, tuple[str, ...]] = {
    "specbench.samples/1": ("draft_s", "accept_s", "update_s", "prompt_sha", *TRACED_FIELDS, *BATCH_FIELDS),
    "specbench.samples/2": ("prompt_sha", *TRACED_FIELDS, *BATCH_FIELDS),
    "specbench.samples/3": (*TRACED_FIELDS, *BATCH_FIELDS),
    "specbench.samples/4": (*WIDTH_FIELDS, *BATCH_FIELDS),
    "specbench.samples/5": BATCH_FIELDS,
    "specbench.samples/6": (),
}
ADDED_FIELDS = {schema: (*fields, *SESSION_FIELDS) for schema, fields in ADDED_FIELDS.items()}
"""Per readable older schema: the SAMPLE_FIELDS its records lack (null when read)."""


FIELD_TYPES: dict[str, str] = {
    "sample_id": "string",
    "turn": "count",
    "new_tokens": "count",
    "prompt_tokens": "optional count",
    "target_forwards": "count",
    "wall_s": "seconds",
    "batch_size": "optional count",
    "batch_wall_s": "optional seconds",
    "prefill_s": "seconds",
    "energy_j": "optional number",
    "output_text": "optional string",
    "measuring_session": "optional string",
    "output_ids": "optional list of integers",
    **{step.name: step.metadata["kind"] for step in fields(StepLists)},
}
"""The type of every field the metrics read: a record that breaks one is refused, naming the field."""


def is_number(value: object) -> TypeGuard[float]:
    """A JSON number (booleans excluded)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_integer(value: object) -> TypeGuard[int]:
    """A JSON integer (booleans excluded)."""
    return isinstance(value, int) and not isinstance(value, bool)


def has_type(value: object, kind: str) -> bool:
    """Whether ``value`` is of a FIELD_TYPES kind (an ``optional`` kind also takes null)."""
    if kind.startswith("optional "):
        return value is None or has_type(value, kind.removeprefix("optional "))
    items = {"list of numbers": is_number, "list of integers": is_integer, "list of booleans": is_bool}.get(kind)
    if items is not None:
        return isinstance(value, list) and all(items(item) for item in value)
    if kind == "string":
        return isinstance(value, str)
    if kind == "count":
        return is_integer(value) and value >= 0
    return is_number(value) and value >= 0  # seconds


def is_bool(value: object) -> bool:
    """A JSON boolean."""
    return isinstance(value, bool)


def validate_record(record: dict) -> None:
    """Raise ValueError when a samples.jsonl record is of an unknown schema, lacks one of its fields or holds a
    field of the wrong type (FIELD_TYPES)."""
    if not isinstance(record, dict):
        raise ValueError(f"a record must be a JSON object, got {type(record).__name__}")
    schema = record.get("schema")
    if schema != SCHEMA_VERSION and (not isinstance(schema, str) or schema not in ADDED_FIELDS):
        raise ValueError(f"schema {schema!r}; this reader reads {[SCHEMA_VERSION, *ADDED_FIELDS]}")
    added = ADDED_FIELDS.get(schema, ())
    missing = [name for name in SAMPLE_FIELDS if name not in record and name not in added]
    if missing:
        raise ValueError(f"record is missing schema fields: {missing}")
    wrong = [
        f"{name} ({kind})" for name, kind in FIELD_TYPES.items() if name in record and not has_type(record[name], kind)
    ]
    if wrong:
        raise ValueError(f"record has field(s) of the wrong type: {', '.join(wrong)}")
    disagreeing = step_problems(record)
    if disagreeing:
        raise ValueError(f"record's per-step fields disagree: {'; '.join(disagreeing)}")


STEP_FIELDS = tuple(step.name for step in fields(StepLists))
"""The per-step traces: each one that is not null holds one entry per step."""
TRACED_WITH = {step.name: step.metadata["traced_with"] for step in fields(StepLists) if step.metadata["traced_with"]}
"""A per-step trace -> the traces the metrics read beside it (measured together, so never null without it)."""


def step_problems(record: dict) -> list[str]:
    """What makes a record's per-step traces disagree: lists of different lengths, a trace without the ones
    measured with it (TRACED_WITH), or accept lengths that do not describe the record (``acceptance_problems``)."""
    lengths = {name: len(record[name]) for name in STEP_FIELDS if record.get(name) is not None}
    problems = [f"lengths {lengths}"] if len(set(lengths.values())) > 1 else []
    return (
        problems
        + [
            f"{name} without {other}"
            for name, others in TRACED_WITH.items()
            if record.get(name) is not None
            for other in others
            if record.get(other) is None
        ]
        + acceptance_problems(record)
    )


def acceptance_problems(record: dict) -> list[str]:
    """Where a record's accept lengths contradict it: one per target forward, emitting together every token after the
    prefill's, each step at least one token and no more drafted tokens than the step drafted (its nodes, its tree's
    depth). Records that keep these keep tokens per step = 1 + the sum of the marginal acceptance rates."""
    lengths = record.get("accept_lengths")
    if lengths is None:
        return []
    problems = []
    if len(lengths) != record["target_forwards"]:
        problems.append(f"{len(lengths)} accept lengths for {record['target_forwards']} target forwards")
    if sum(lengths) != max(record["new_tokens"] - 1, 0):
        problems.append(f"accept lengths emit {sum(lengths)} tokens, the record {record['new_tokens']} - 1")
    if any(length < 1 for length in lengths):
        problems.append("a step emitted no token")
    for name in ("draft_tokens", "draft_depth"):
        if any(length - 1 > cap for length, cap in zip(lengths, record.get(name) or [])):
            problems.append(f"a step accepted more drafted tokens than its {name}")
    return problems


def upgrade_record(record: dict) -> dict:
    """A valid record in the current layout: fields added since its schema are null (not measured)."""
    return {**dict.fromkeys(ADDED_FIELDS.get(record["schema"], ())), **record}
