"""Self-distilled training data (Medusa paper 3.3.2): seed prompts answered by the target itself.

A draft model or Medusa heads must predict what the TARGET will say, not what a dataset says, so
the training text is the target's own (greedy by default) answers to public seed prompts. Answers
are generated once per (model, prompts, generation settings) with batched HF ``generate`` (left
padding); a logits processor records the target's top-k next-token log-probs at every answer
position on the way (soft labels for distillation without a second target pass). Prompts come from
``specbench.train.sources`` (never from an evaluation split) and are rendered like the runner's.
The answers are cached as JSON Lines under ``$SPECBENCH_CACHE/selfdistill/<model>/<digest>.jsonl``:
a header line (settings, digest) and one record per prompt. Generation appends each finished batch
to ``<digest>.jsonl.partial`` (fsynced), so an interrupted run resumes where it stopped; the file is
renamed into place when complete, and a lock file makes a concurrent second process wait for it.
``prompts.batch_size`` only changes speed, so it is not part of the digest.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList

from specbench.core.acceptance import sampling_problems
from specbench.data.prompts import conversation, render
from specbench.errors import ConfigError
from specbench.files import write_atomic
from specbench.manifest import digest
from specbench.models.loading import LoadedModel
from specbench.paths import cache_root
from specbench.train.common import container, model_identity
from specbench.train.sources import SOURCES, drop_evaluation_prompts, source_prompts

FORMAT_VERSION = 1
GENERATION_KEYS = ("max_new_tokens", "temperature", "top_p", "seed", "teacher_topk")
PROMPT_KEYS = (
    "sources",
    "per_source_limit",
    "max_prompts",
    "shuffle_seed",
    "max_prompt_tokens",
    "prompt_format",
    "system_prompt",
)


@dataclass
class SelfDistilled:
    """One training sequence: a rendered prompt and the target's own answer to it."""

    prompt_ids: list[int]
    output_ids: list[int]  # the target's own response (greedy by default), EOS included if emitted
    source: str = ""  # the prompt source it came from (prompts.sources)
    # The target's next-token distribution at each answer position, as it generated it: the ids and
    # log-probabilities of its top prompts.teacher_topk tokens, best first ([len(output_ids)][k]);
    # None when teacher_topk = 0. Soft labels for distillation at no extra target forward.
    topk_ids: list[list[int]] | None = None
    topk_logprobs: list[list[float]] | None = None


def validate(prompts_cfg) -> None:
    """Reject impossible prompt / generation settings before anything is loaded."""
    problems = []
    if not prompts_cfg.sources:
        problems.append("prompts.sources must name at least one source")
    unknown = [name for name in prompts_cfg.sources if name not in SOURCES]
    if unknown:
        problems.append(f"unknown prompt source(s) {unknown} in prompts.sources; choose from {', '.join(SOURCES)}")
    if prompts_cfg.max_new_tokens is None or prompts_cfg.max_new_tokens < 1:
        problems.append(f"prompts.max_new_tokens must be >= 1 (got {prompts_cfg.max_new_tokens})")
    if prompts_cfg.teacher_topk < 0:
        problems.append(f"prompts.teacher_topk must be >= 0 (got {prompts_cfg.teacher_topk})")
    if prompts_cfg.batch_size < 1:
        problems.append(f"prompts.batch_size must be >= 1 (got {prompts_cfg.batch_size})")
    problems += sampling_problems(prompts_cfg.temperature, prompts_cfg.top_p, prefix="prompts.")
    for key in ("max_prompts", "per_source_limit"):
        if prompts_cfg[key] is not None and prompts_cfg[key] < 1:
            problems.append(f"prompts.{key} must be >= 1 or null (got {prompts_cfg[key]})")
    if problems:
        raise ConfigError("invalid self-distillation settings: " + "; ".join(problems))


def tagged_prompts(prompts_cfg, data_dir: str | None) -> list[tuple[str, str]]:
    """(source, user turn) pairs: every source, evaluation prompts removed, seeded shuffle, capped."""
    tagged = [(name, text) for name in prompts_cfg.sources for text in source_prompts(name, prompts_cfg, data_dir)]
    tagged, _ = drop_evaluation_prompts(tagged, data_dir)
    order = torch.randperm(len(tagged), generator=torch.Generator().manual_seed(prompts_cfg.shuffle_seed))
    tagged = [tagged[i] for i in order.tolist()]
    return tagged[: prompts_cfg.max_prompts] if prompts_cfg.max_prompts is not None else tagged


def training_prompts(prompts_cfg, data_dir) -> list[str]:
    """The seed prompts' user turns from the configured sources (rendered per model by ``self_distilled``)."""
    return [text for _, text in tagged_prompts(prompts_cfg, data_dir)]


def rendered_prompts(tokenizer, prompts_cfg, tagged: list[tuple[str, str]]) -> list[tuple[str, list[int]]]:
    """(source, prompt ids) in the model's prompt format, like the runner; too-long prompts skipped."""
    rendered = []
    for source, text in tagged:
        ids = render(tokenizer, conversation(prompts_cfg.system_prompt, [text], []), prompts_cfg.prompt_format)
        if prompts_cfg.max_prompt_tokens is None or len(ids) <= prompts_cfg.max_prompt_tokens:
            rendered.append((source, ids))
    return rendered


def header_for(lm: LoadedModel, prompts_cfg, prompts: list[tuple[str, list[int]]]) -> dict:
    """Everything that determines the cached answers (the digest covers the prompts' token ids)."""
    settings = container(prompts_cfg)
    header = {
        "format": FORMAT_VERSION,
        "model": model_identity(lm),
        "generation": {k: settings[k] for k in GENERATION_KEYS},
        "prompts": {k: settings[k] for k in PROMPT_KEYS},
        "n_prompts": len(prompts),
        "prompt_ids_digest": digest(prompts),
    }
    return {**header, "digest": digest(header)}


def cache_path(model_name: str, data_digest: str) -> Path:
    """Where the finished self-distilled data of a model lives."""
    return cache_root() / "selfdistill" / model_name / f"{data_digest}.jsonl"


def read_records(path: Path, data_digest: str) -> dict[int, dict]:
    """Records of a (partial) cache file by prompt index; empty if its header is for other settings."""
    if not path.is_file():
        return {}
    records = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by an interrupt: that batch is generated again
            if number == 0 and item.get("header", {}).get("digest") != data_digest:
                return {}
            if number > 0:
                records[item["index"]] = item
    return records


def append_lines(path: Path, items: list[dict]) -> None:
    """Append JSON lines in one flushed, fsynced write (a crash loses at most this batch)."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(item) + "\n" for item in items))
        handle.flush()
        os.fsync(handle.fileno())


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a second process generating the same data waits here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[specbench] waiting for another process generating {path.with_suffix('.jsonl')}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cut_at_eos(tokens: list[int], eos_ids: frozenset[int]) -> list[int]:
    """Tokens up to and including the first EOS (HF pads finished rows after it)."""
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1]
    return tokens


def generation_config(prompts_cfg, eos_ids: frozenset[int]) -> GenerationConfig:
    """A complete GenerationConfig, so nothing is inherited from the checkpoint's defaults."""
    greedy = prompts_cfg.temperature <= 0
    return GenerationConfig(
        max_new_tokens=prompts_cfg.max_new_tokens,
        do_sample=not greedy,
        temperature=None if greedy else prompts_cfg.temperature,
        top_p=None if greedy else prompts_cfg.top_p,
        top_k=None if greedy else 0,
        eos_token_id=sorted(eos_ids) or None,
        pad_token_id=min(eos_ids) if eos_ids else 0,
    )


class TopKRecorder(LogitsProcessor):
    """Records the top-k log-probabilities of each generation step's raw logits (changes nothing).

    Custom processors run before temperature / top-p warpers in ``generate``, so with the complete
    GenerationConfig above they see the model's own logits in greedy and sampling mode alike.
    """

    def __init__(self, k: int):
        self.k = k
        self.ids: list[torch.Tensor] = []  # per step: [batch, k]
        self.logprobs: list[torch.Tensor] = []  # per step: [batch, k]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        values, ids = torch.log_softmax(scores.float(), dim=-1).topk(self.k, dim=-1)  # [batch, k]
        self.ids.append(ids.cpu())
        self.logprobs.append(values.cpu())
        return scores

    def rows(self) -> tuple[list, list]:
        """Per batch row: [steps][k] ids and log-probabilities (rounded to 4 decimals)."""
        ids = torch.stack(self.ids, dim=1).tolist()  # [batch, steps, k]
        logprobs = torch.stack(self.logprobs, dim=1).tolist()
        return ids, [[[round(v, 4) for v in step] for step in row] for row in logprobs]


def generate_batch(
    lm: LoadedModel, prompts: list[list[int]], config: GenerationConfig, teacher_topk: int
) -> list[dict]:
    """The target's answers to a batch of prompts (one left-padded ``generate``), with top-k records."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), config.pad_token_id, dtype=torch.long)  # [batch, width]
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    recorder = TopKRecorder(teacher_topk) if teacher_topk > 0 else None
    model = lm.model
    assert isinstance(model, GenerationMixin)  # every causal LM the loader returns can generate
    device = model.device
    with torch.inference_mode():
        out = model.generate(
            ids.to(device),
            attention_mask=mask.to(device),
            generation_config=config,
            logits_processor=LogitsProcessorList([recorder] if recorder else []),
        )
    answers = [cut_at_eos(row, lm.eos_ids) for row in out[:, width:].tolist()]
    if recorder is None:
        return [{"output_ids": answer} for answer in answers]
    topk_ids, topk_logprobs = recorder.rows()
    return [
        {
            "output_ids": answer,
            "topk_ids": topk_ids[row][: len(answer)],
            "topk_logprobs": topk_logprobs[row][: len(answer)],
        }
        for row, answer in enumerate(answers)
    ]


def batches(pending: list[int], lengths: list[int], batch_size: int) -> list[list[int]]:
    """Pending prompt indices grouped by similar length (less padding), in a deterministic order."""
    ordered = sorted(pending, key=lambda i: (lengths[i], i))
    return [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]


def generate_missing(
    lm: LoadedModel, prompts_cfg, prompts: list[tuple[str, list[int]]], header: dict, partial: Path, progress: bool
) -> None:
    """Generate every prompt without a record in ``partial``, appending each batch as it finishes."""
    done = read_records(partial, header["digest"])
    if done:
        print(f"[specbench] resuming self-distillation: {len(done)}/{len(prompts)} answers already in {partial}")
    # rewritten to its complete lines: a torn last line must not swallow the next appended record
    lines = [{"header": header}, *(done[i] for i in sorted(done))]
    write_atomic(partial, "".join(json.dumps(line) + "\n" for line in lines))
    pending = [i for i in range(len(prompts)) if i not in done]
    config = generation_config(prompts_cfg, lm.eos_ids)
    bar = tqdm(
        total=len(prompts), initial=len(done), desc=f"self-distill {lm.name}", unit="prompt", disable=not progress
    )
    start, tokens = time.perf_counter(), 0
    for batch in batches(pending, [len(ids) for _, ids in prompts], prompts_cfg.batch_size):
        torch.manual_seed(prompts_cfg.seed + batch[0])  # sampling only: reproducible per batch, on resume too
        answers = generate_batch(lm, [prompts[i][1] for i in batch], config, prompts_cfg.teacher_topk)
        append_lines(
            partial,
            [
                {"index": i, "source": prompts[i][0], "prompt_ids": prompts[i][1], **answer}
                for i, answer in zip(batch, answers)
            ],
        )
        tokens += sum(len(answer["output_ids"]) for answer in answers)
        bar.update(len(batch))
        bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.0f}")
    bar.close()


def load_cache(path: Path, data_digest: str) -> list[SelfDistilled]:
    """The finished cache file as SelfDistilled records in prompt order."""
    records = read_records(path, data_digest)
    return [
        SelfDistilled(r["prompt_ids"], r["output_ids"], r.get("source", ""), r.get("topk_ids"), r.get("topk_logprobs"))
        for _, r in sorted(records.items())
    ]


def self_distilled(lm: LoadedModel, prompts_cfg, data_dir, progress=True, held_out: int = 0) -> list[SelfDistilled]:
    """Generate (batched) or load from $SPECBENCH_CACHE/selfdistill/<model>/<digest>.jsonl; resumable. The trainer
    holds ``held_out`` answers out (``train.eval_sequences``): prompts too few to leave any to train on are refused
    before any answer is generated."""
    validate(prompts_cfg)
    prompts = rendered_prompts(lm.tokenizer, prompts_cfg, tagged_prompts(prompts_cfg, data_dir))
    if not prompts:
        raise ConfigError(
            "no training prompts left: the sources gave none, or every prompt is longer than "
            f"prompts.max_prompt_tokens={prompts_cfg.max_prompt_tokens}"
        )
    if len(prompts) <= held_out:
        raise ConfigError(
            f"{len(prompts)} training prompt(s) left (the sources' prompts, less the evaluation ones and those longer "
            f"than prompts.max_prompt_tokens={prompts_cfg.max_prompt_tokens}), and train.eval_sequences={held_out} "
            f"holds out that many: nothing to train on; add sources, raise the caps or lower train.eval_sequences"
        )
    header = header_for(lm, prompts_cfg, prompts)
    path = cache_path(lm.name, header["digest"])
    if not path.is_file():
        with file_lock(path.with_suffix(".lock")):
            if not path.is_file():
                partial = path.with_suffix(".jsonl.partial")
                generate_missing(lm, prompts_cfg, prompts, header, partial, progress)
                os.replace(partial, path)
    data = load_cache(path, header["digest"])
    print(
        f"[specbench] self-distilled data: {len(data)} answers, {sum(len(d.output_ids) for d in data)} tokens in {path}"
    )
    return data


def data_summary(data: list[SelfDistilled]) -> dict:
    """Counts of a self-distilled data set: sequences, prompt and answer tokens, sequences per source."""
    sources = sorted({d.source for d in data})
    return {
        "sequences": len(data),
        "prompt_tokens": sum(len(d.prompt_ids) for d in data),
        "answer_tokens": sum(len(d.output_ids) for d in data),
        "by_source": {s: sum(d.source == s for d in data) for s in sources},
    }
