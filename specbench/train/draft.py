"""``python -m specbench.train draft``: distil a small draft model from its target (SpeDe, OPT-Tree).

- Architecture: the target's own config with ``draft.num_layers`` decoder layers, so hidden size,
  heads, vocabulary and tokenizer are the target's. Embeddings, final norm and LM head are copied
  from the target (frozen by default: ``draft.train_embeddings``); layers are copied from the
  target's first layers (``draft.init: first``, the early-exit model: it learned fastest), evenly
  spaced ones (``spread``) or initialized at random. Trade-off: the shared LM head (hidden x vocab)
  is a large fixed part of each draft step; docs/training.md has the measured draft/target latency.
- Data: the target's self-distilled answers (``specbench.train.selfdistill``) with its top-k
  next-token log-probs recorded while generating (no extra teacher pass).
- Loss at every answer position: ``train.soft_weight`` x cross-entropy of the draft against the
  teacher's top-k distribution renormalized (= forward KL to it, up to a constant) +
  ``train.hard_weight`` x cross-entropy on the target's greedy token.
- Budget: ``train.steps`` (cosine schedule) and ``train.max_minutes`` (training stops early).
- Output: ``save_pretrained`` + tokenizer + ``training.json`` (settings, data digest, loss curve,
  held-out agreement before/after, latency) in ``$SPECBENCH_CACHE/drafts/<model>-distilled``,
  replaced atomically; a second run with the same settings only prints where it is.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from specbench import environment
from specbench.errors import ConfigError
from specbench.files import atomic_dir, building
from specbench.manifest import digest, trained_with, write_manifest
from specbench.models.parts import part_kind
from specbench.train.agreement import agreement_report, expected_speedup, latency_report
from specbench.train.batches import Batch, answer_logits, check_soft_labels, collate
from specbench.train.common import (
    OptimizerSettings,
    TimeBudget,
    TrainerSettings,
    check_types,
    compose_train,
    container,
    data_problems,
    load_target,
    write_json,
)
from specbench.train.selfdistill import SelfDistilled, data_summary, self_distilled
from specbench.train.selfdistill import validate as validate_prompts

INITS = ("spread", "first", "random")
TRAINING_JSON = "training.json"
LATENCY_CONTEXT = 256  # tokens of context for the step-latency measurement
SIZES = ("steps", "batch_size", "eval_sequences")
"""The ``train.*`` counts a draft-model trainer needs at least one of."""


@dataclass
class DraftArchitecture:
    """The types of ``draft.*``."""

    num_layers: int
    init: str
    train_embeddings: bool


@dataclass
class DistillationTraining(OptimizerSettings):
    """The types of the ``train.*`` keys the draft-model trainers share (the distilled draft, PARD)."""

    steps: int
    soft_weight: float
    hard_weight: float
    eval_sequences: int
    seed: int


@dataclass
class DraftTraining(DistillationTraining):
    """The types of ``train.*`` of the draft: the chain lengths its held-out report measures too."""

    gammas: list[int]


@dataclass
class DraftSettings(TrainerSettings):
    """The types of every setting of ``python -m specbench.train draft`` (conf/train/draft.yaml)."""

    draft: DraftArchitecture
    train: DraftTraining


def distillation_checks(train) -> list[tuple[bool, str]]:
    """(holds, message) for the ``train.*`` keys the draft-model trainers share (the distilled draft, PARD)."""
    return [
        *((train[key] >= 1, f"train.{key} must be >= 1 (got {train[key]})") for key in SIZES),
        (train.lr > 0, f"train.lr must be > 0 (got {train.lr})"),
        (
            train.soft_weight >= 0 and train.hard_weight >= 0 and train.soft_weight + train.hard_weight > 0,
            f"train.soft_weight and train.hard_weight must be >= 0, not both 0 "
            f"(got {train.soft_weight}, {train.hard_weight})",
        ),
        (
            train.max_minutes is None or train.max_minutes > 0,
            f"train.max_minutes must be > 0 or null (got {train.max_minutes})",
        ),
    ]


def validate(cfg: DictConfig) -> None:
    """Reject impossible draft / training settings (types first, then ranges) before anything is loaded."""
    check_types(cfg, DraftSettings, "draft training")
    d, t = cfg.draft, cfg.train
    checks = [
        (d.num_layers >= 1, f"draft.num_layers must be >= 1 (got {d.num_layers})"),
        (d.init in INITS, f"draft.init must be one of {INITS} (got {d.init!r})"),
        *distillation_checks(t),
        (
            bool(t.gammas) and all(g >= 1 for g in t.gammas),
            f"train.gammas must be a non-empty list of chain lengths >= 1 (got {list(t.gammas)})",
        ),
    ]
    problems = [message for ok, message in checks if not ok] + data_problems(cfg, soft_labels=True)
    if problems:
        raise ConfigError("invalid draft training settings: " + "; ".join(problems))
    validate_prompts(cfg.prompts)


def settings_digest(cfg: DictConfig) -> str:
    """Digest of the settings that define the draft; budgets and speed knobs are left out.

    ``prompts.batch_size`` is a speed knob. ``train.max_minutes`` is part of the schedule (the cosine
    decay follows the larger of the step and time fractions), so it is a setting. The model's
    ``draft.rank_hits`` is a measurement of the trained draft (this command reports it), not a setting.
    """
    prompts, train, model = container(cfg.prompts), container(cfg.train), container(cfg.model)
    prompts.pop("batch_size")
    (model.get("draft") or {}).pop("rank_hits", None)
    return digest(
        {"model": model, "dtype": cfg.dtype, "prompts": prompts, "draft": container(cfg.draft), "train": train}
    )


# --- the draft model ------------------------------------------------------------------------------


def layer_plan(target_layers: int, draft_layers: int, init: str) -> list[int] | None:
    """Target layer indices copied into the draft's layers (None = random initialization)."""
    if init == "random":
        return None
    if draft_layers > target_layers:
        raise ConfigError(
            f"draft.num_layers={draft_layers} exceeds the target's {target_layers} layers "
            f"(draft.init={init} copies target layers)"
        )
    if init == "first" or draft_layers == 1:
        return list(range(draft_layers))
    return [round(i * (target_layers - 1) / (draft_layers - 1)) for i in range(draft_layers)]


def build_draft(target, draft_cfg) -> tuple[torch.nn.Module, list[int] | None]:
    """A float32 draft: the target's config with fewer layers, target weights copied per ``draft.init``."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.config)
    plan = layer_plan(config.num_hidden_layers, draft_cfg.num_layers, draft_cfg.init)
    config.num_hidden_layers = draft_cfg.num_layers
    if isinstance(getattr(config, "layer_types", None), list):  # per-layer attention kinds (Qwen2, Gemma)
        config.layer_types = [config.layer_types[i] for i in plan or range(draft_cfg.num_layers)]
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    draft.get_input_embeddings().load_state_dict(target.get_input_embeddings().state_dict())
    draft.get_output_embeddings().load_state_dict(target.get_output_embeddings().state_dict())
    draft.get_decoder().norm.load_state_dict(target.get_decoder().norm.state_dict())
    for mine, theirs in enumerate(plan or []):
        draft.get_decoder().layers[mine].load_state_dict(target.get_decoder().layers[theirs].state_dict())
    draft.generation_config = copy.deepcopy(target.generation_config)
    frozen = [draft.get_input_embeddings(), draft.get_output_embeddings()]
    for module in frozen if not draft_cfg.train_embeddings else []:
        module.requires_grad_(False)
    return draft.to(target.device), plan


def parameter_counts(model) -> dict:
    """Total and trainable parameters (tied embeddings counted once)."""
    params = {id(p): p for p in model.parameters()}.values()
    return {"total": sum(p.numel() for p in params), "trained": sum(p.numel() for p in params if p.requires_grad)}


# --- training -------------------------------------------------------------------------------------


def distillation_loss(logits: torch.Tensor, batch: Batch, soft_weight: float, hard_weight: float) -> torch.Tensor:
    """Soft (teacher top-k, renormalized) + hard (teacher argmax) cross-entropy, mean over answer rows."""
    logq = torch.log_softmax(logits, dim=-1)  # [rows, vocab]
    logq_topk = logq.gather(1, batch.topk_ids)  # [rows, k]
    soft = -(torch.softmax(batch.topk_logprobs, dim=-1) * logq_topk).sum(dim=-1).mean()
    hard = -logq_topk[:, 0].mean()
    return soft_weight * soft + hard_weight * hard


def learning_rate(step: int, train_cfg, time_fraction: float = 0.0) -> float:
    """Linear warm-up to ``train.lr``, then cosine decay to 10% of it at ``train.steps`` or at the end of
    ``train.max_minutes``, whichever comes first (``time_fraction``: the share of the time budget used)."""
    if step < train_cfg.warmup_steps:
        return train_cfg.lr * (step + 1) / train_cfg.warmup_steps
    progress = max((step - train_cfg.warmup_steps) / max(1, train_cfg.steps - train_cfg.warmup_steps), time_fraction)
    return train_cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def batch_order(n_items: int, batch_size: int, generator: torch.Generator):
    """Endless mini-batches of item indices: a fresh seeded permutation every epoch."""
    size = min(batch_size, n_items)
    while True:
        order = torch.randperm(n_items, generator=generator).tolist()
        for start in range(0, n_items - size + 1, size):
            yield order[start : start + size]


def train_draft(draft, items: list[SelfDistilled], train_cfg, pad_id: int, progress: bool) -> dict:
    """Distil the draft's trainable weights on the teacher's soft labels; the loss curve and why training stopped."""
    device = next(draft.parameters()).device

    def loss_of(chosen: list[SelfDistilled]) -> torch.Tensor:
        batch = collate(chosen, pad_id).to(device)
        return distillation_loss(answer_logits(draft, batch), batch, train_cfg.soft_weight, train_cfg.hard_weight)

    return train_loop(draft, items, train_cfg, progress, "distil draft", loss_of)


def train_loop(
    model, items: list[SelfDistilled], train_cfg, progress: bool, desc: str, loss_of: Callable[[list], torch.Tensor]
) -> dict:
    """Optimize the model's trainable weights over seeded mini-batches of ``items`` (``loss_of`` a batch's loss), on
    the schedule of ``learning_rate`` within ``train.steps`` and ``train.max_minutes``; the loss curve and why
    training stopped."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=train_cfg.lr, weight_decay=train_cfg.weight_decay)
    batches = batch_order(len(items), train_cfg.batch_size, torch.Generator().manual_seed(train_cfg.seed))
    budget = TimeBudget(train_cfg.max_minutes)
    model.train()
    curve, window, stopped_by = [], [], "steps"
    bar = tqdm(range(train_cfg.steps), desc=desc, unit="step", disable=not progress)
    for step in bar:
        if not budget.allows_step():
            stopped_by = "max_minutes"  # the schedule has annealed with the time fraction: training is complete
            break
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, train_cfg, budget.fraction())
        loss = loss_of([items[i] for i in next(batches)])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, train_cfg.grad_clip)
        optimizer.step()
        window.append(loss.item())
        budget.step_done()
        if len(window) == 10 or step == train_cfg.steps - 1 or not budget.allows_step():
            curve.append([step + 1, round(sum(window) / len(window), 4)])
            bar.set_postfix(loss=curve[-1][1])
            window = []
    bar.close()
    model.eval()
    return {
        "steps_done": curve[-1][0] if curve else 0,
        "steps_planned": train_cfg.steps,
        "stopped_by": stopped_by,
        "seconds": round(budget.elapsed(), 1),
        "loss_curve": curve,
    }


# --- the command ----------------------------------------------------------------------------------


def split_heldout(data: list[SelfDistilled], eval_sequences: int) -> tuple[list, list]:
    """(train, held-out): the last ``eval_sequences`` answers (the data is already a seeded shuffle)."""
    if eval_sequences >= len(data):
        raise ConfigError(
            f"train.eval_sequences={eval_sequences} leaves nothing to train on: the "
            f"self-distilled data has {len(data)} sequences"
        )
    return data[:-eval_sequences], data[-eval_sequences:]


def latency_context(items: list[SelfDistilled]) -> list[int]:
    """Up to LATENCY_CONTEXT tokens of real text (the longest held-out sequence) for the timing."""
    longest = max(items, key=lambda item: len(item.prompt_ids) + len(item.output_ids))
    return (longest.prompt_ids + longest.output_ids)[:LATENCY_CONTEXT]


def save_draft(
    draft, tokenizer, out_dir: Path, record: dict, title: str = "distilled draft", summary: str = "agreement"
) -> None:
    """Write weights, tokenizer, training.json and, last, the manifest into ``out_dir`` atomically (``title``: what
    the part is; ``summary``: the held-out number after training that the manifest carries)."""
    with atomic_dir(out_dir) as staging:
        draft.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        write_json(staging / TRAINING_JSON, record)
        training = record["training"]
        weights = sorted(path.name for path in staging.glob("*.safetensors"))
        write_manifest(
            staging,
            title,
            weights,
            record["settings_digest"],
            record["data"]["digest"],
            training["steps_done"],
            training["steps_planned"],
            training["stopped_by"],
            {f"heldout_{summary}": record["heldout"]["after_training"][summary]},
        )


def distil(cfg: DictConfig, lm, data: list[SelfDistilled]) -> tuple[torch.nn.Module, dict]:
    """Build, train and measure the draft on ``data``; returns it with its training record."""
    check_soft_labels(data)
    train_items, heldout_items = split_heldout(data, cfg.train.eval_sequences)
    torch.manual_seed(cfg.train.seed)
    draft, plan = build_draft(lm.model, cfg.draft)
    pad_id = min(lm.eos_ids) if lm.eos_ids else 0
    gammas = list(cfg.train.gammas)
    before = agreement_report(draft, heldout_items, pad_id, gammas)
    training = train_draft(draft, train_items, cfg.train, pad_id, cfg.progress)
    after = agreement_report(draft, heldout_items, pad_id, gammas)
    timed = draft if draft.dtype == lm.model.dtype else copy.deepcopy(draft).to(lm.model.dtype)
    latency = latency_report(lm.model, timed, latency_context(heldout_items), gammas)
    return draft, {
        "target": {"name": lm.name, "path": lm.path},
        "settings": {"prompts": container(cfg.prompts), "draft": container(cfg.draft), "train": container(cfg.train)},
        "data": {
            "digest": digest([asdict(item) for item in data]),
            **data_summary(data),
            "train_sequences": len(train_items),
            "heldout_sequences": len(heldout_items),
        },
        "draft": {"num_layers": cfg.draft.num_layers, "copied_target_layers": plan, **parameter_counts(draft)},
        "training": training,
        "heldout": {"before_training": before, "after_training": after},
        "latency": latency,
        "expected_speedup": expected_speedup(after, latency, gammas),
        "environment": environment.capture(lm.model.device, lm.model.dtype),
    }


def print_report(out_dir: Path, record: dict) -> None:
    """Where the draft went and its held-out agreement, tokens per step and latency."""
    print(f"[specbench] distilled draft for {record['target']['name']}: {out_dir}")
    for name, report in (
        ("before", record["heldout"]["before_training"]),
        ("after", record["heldout"]["after_training"]),
    ):
        chains = ", ".join(
            f"{k.removeprefix('tokens_per_step_')}: {v}" for k, v in report.items() if k.startswith("tokens_per_step_")
        )
        print(f"  {name:7s} agreement {report['agreement']:.3f}; tokens/step {chains}")
    print(
        f"  rank hits a^(r) after training (model.draft.rank_hits for static_tree shape=static): "
        f"{record['heldout']['after_training'].get('rank_hits')}"
    )
    latency = record["latency"]
    print(
        f"  draft step {latency['draft_step_ms']} ms vs target {latency['target_step_ms']} ms "
        f"(ratio {latency['draft_to_target']}); ideal speedup {record['expected_speedup']}"
    )


def main(overrides: list[str]) -> None:
    """Train (or find) the distilled draft of ``model`` and report its held-out agreement."""
    cfg = compose_train("draft", overrides)
    validate(cfg)
    out_dir = Path(cfg.output_dir).expanduser() if cfg.output_dir else part_kind("draft").folder(cfg.model.name)
    settings = settings_digest(cfg)
    if not cfg.force and trained_with(out_dir, settings):
        print(
            f"[specbench] the distilled draft for {cfg.model.name} is up to date: {out_dir} "
            f"(same settings; force=true retrains)"
        )
        return
    began = time.perf_counter()
    with building(out_dir):
        lm = load_target(cfg)
        layer_plan(lm.model.config.num_hidden_layers, cfg.draft.num_layers, cfg.draft.init)  # before the data
        data = self_distilled(lm, cfg.prompts, cfg.data_dir, cfg.progress, cfg.train.eval_sequences)
        data_s = time.perf_counter() - began
        draft, record = distil(cfg, lm, data)
        record.update(
            settings_digest=settings, data_seconds=round(data_s, 1), total_seconds=round(time.perf_counter() - began, 1)
        )
        save_draft(draft, lm.tokenizer, out_dir, record)
    print_report(out_dir, record)
