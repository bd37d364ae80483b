"""Hydra head training (Ankner et al. 2024): grounded heads on a FROZEN target, by teacher distillation.

``python -m specbench.train hydra model=smollm2_135m [heads.*=...] [train.*=...] [prompts.*=...]``

Hydra++ (the paper's best recipe, the default here): the ``prefix-mlp`` architecture (one extra decoder layer over
the target's hidden states), ``num_layers`` residual blocks per head, dropout, and the teacher loss only: head i at
position t learns the target's own next-token law at t + i + 1 (the law of x_{t+i+2}), read from the self-distilled
data's top-k records (renormalised over those k tokens; the authors use the full distribution). The heads read the
TRUE tokens along the sequence (teacher forcing), as they read the accepted or drafted tokens when drafting.

Each step takes ``batch_size`` sequences; the target's hidden states come once per sequence (frozen), the prefix
layer runs over each whole sequence, and each head's loss is taken on at most ``rows_per_head`` random answer
positions (its LM head is the costly part). Evaluation on held-out sequences measures each head's rank accuracies
a_k^(i) against the target's greedy continuation (teacher-forced along it), saved in ``training.json``: the drafter
builds its sparse tree from them, as for Medusa heads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.errors import ConfigError
from specbench.files import building
from specbench.manifest import finished_training
from specbench.models.hydra_heads import ARCHS, HydraHeads, heads_for, save_hydra
from specbench.train.common import (
    OptimizerSettings,
    TrainerSettings,
    check_types,
    data_problems,
    head_training_checks,
)
from specbench.train.eagle import Sequence, extract_features
from specbench.train.medusa import autocast, fit, split
from specbench.train.selfdistill import data_summary, head_training
from specbench.train.selfdistill import validate as validate_prompts


@dataclass
class HydraHeadSettings:
    """The types of ``heads.*``."""

    num_heads: int
    num_layers: int
    arch: str


@dataclass
class HydraTraining(OptimizerSettings):
    """The types of ``train.*`` of the Hydra heads."""

    max_steps: int
    rows_per_head: int
    dropout: float
    amp_dtype: str | None
    max_length: int
    eval_sequences: int
    eval_top_k: int
    seed: int


@dataclass
class HydraSettings(TrainerSettings):
    """The types of every setting of ``python -m specbench.train hydra`` (conf/train/hydra.yaml)."""

    heads: HydraHeadSettings
    train: HydraTraining


def validate(cfg) -> None:
    """Reject impossible head / training settings (types first, then ranges) with the key and its valid range."""
    check_types(cfg, HydraSettings, "Hydra training")
    heads, train = cfg.heads, cfg.train
    checks = [
        (heads.num_heads >= 1, f"heads.num_heads must be >= 1 (got {heads.num_heads})"),
        (heads.num_layers >= 1, f"heads.num_layers must be >= 1 (got {heads.num_layers})"),
        (heads.arch in ARCHS, f"heads.arch must be one of {list(ARCHS)} (got {heads.arch!r})"),
        (train.rows_per_head >= 1, f"train.rows_per_head must be >= 1 (got {train.rows_per_head})"),
        (0 <= train.dropout < 1, f"train.dropout must be in [0, 1) (got {train.dropout})"),
        (train.max_length >= 4, f"train.max_length must be >= 4 (got {train.max_length})"),
        *head_training_checks(train),
    ]
    problems = [message for ok, message in checks if not ok] + data_problems(cfg, soft_labels=True)
    if problems:
        raise ConfigError("invalid Hydra training settings: " + "; ".join(problems))
    validate_prompts(cfg.prompts)


def head_rows(items: list[Sequence], head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions where head ``head`` has a teacher law: (sequence index, t, row of that sequence's top-k records).

    Head i at t predicts x_{t+i+2}; its law is recorded at position t + i + 1 for t + i + 1 in [P - 1, T - 2].
    """
    batch, positions, records = [], [], []
    for b, item in enumerate(items):
        first, last = item.prompt_len - 1, item.ids.numel() - 2
        for law_at in range(max(first, head + 1), last + 1):
            batch.append(b)
            positions.append(law_at - head - 1)
            records.append(law_at - first)
    return torch.tensor(batch, dtype=torch.long), torch.tensor(positions, dtype=torch.long), torch.tensor(records)


def head_inputs(base: torch.Tensor, embeds: torch.Tensor, head: int, batch: torch.Tensor, t: torch.Tensor):
    """[n, (head + 2) H]: base[b, t] then the embeddings of tokens t + 1 .. t + head + 1 of sequence b."""
    parts = [base[batch, t]] + [embeds[batch, t + j] for j in range(1, head + 2)]
    return torch.cat(parts, dim=-1)


def padded(items: list[Sequence], embed) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded target features [B, L, H] and token embeddings [B, L, H] (frozen) of ``items``."""
    width = max(item.ids.numel() for item in items)
    hidden = items[0].features.shape[1]
    features = torch.zeros(len(items), width, hidden)
    ids = torch.zeros(len(items), width, dtype=torch.long)
    for b, item in enumerate(items):
        features[b, : item.ids.numel()] = item.features
        ids[b, : item.ids.numel()] = item.ids
    with torch.no_grad():
        embeds = embed(ids.to(embed.weight.device)).float()
    return features, embeds


def step_loss(heads: HydraHeads, embed, items: list[Sequence], cfg, generator, device) -> torch.Tensor:
    """Mean over heads of the teacher cross-entropy on up to ``rows_per_head`` random rows per head; [K]."""
    features, embeds = padded(items, embed)
    features, embeds = features.to(device), embeds.to(device)
    positions = torch.arange(features.shape[1], device=device)[None].expand(features.shape[0], -1)  # [B, L]
    losses = []
    with autocast(device, cfg.amp_dtype):
        base = heads.prefix(features, positions)  # [B, L, H]
        for i in range(heads.num_heads):
            batch, t, records = head_rows(items, i)
            if len(batch) > cfg.rows_per_head:
                keep = torch.randperm(len(batch), generator=generator)[: cfg.rows_per_head]
                batch, t, records = batch[keep], t[keep], records[keep]
            logits = heads.head_logits(i, head_inputs(base, embeds, i, batch.to(device), t.to(device)))  # [n, V]
            ids = torch.stack([items[b].topk_ids[r] for b, r in zip(batch.tolist(), records.tolist())])  # [n, k]
            logprobs = torch.stack([items[b].topk_logprobs[r] for b, r in zip(batch.tolist(), records.tolist())])
            teacher = torch.softmax(logprobs.to(device), dim=-1)  # [n, k] the renormalised top-k law
            logq = torch.log_softmax(logits.float(), dim=-1)
            losses.append(-(teacher * logq.gather(1, ids.to(device))).sum(dim=-1).mean())
    return torch.stack(losses)


def train_heads(heads: HydraHeads, embed, train: list[Sequence], cfg, device: torch.device, progress: bool) -> dict:
    """AdamW on the heads' summed teacher losses until train.max_steps or train.max_minutes; returns a record whose
    loss curve holds [step, loss of head 1, ..., head K]."""

    def losses_of(index: list[int], generator: torch.Generator) -> tuple[torch.Tensor, list[float]]:
        losses = step_loss(heads, embed, [train[i] for i in index], cfg, generator, device)  # [K]
        return losses.sum(), losses.tolist()

    return fit(heads, len(train), cfg, "hydra heads", progress, losses_of)


@torch.no_grad()
def evaluate(heads: HydraHeads, embed, sequences: list[Sequence], top_k: int, device: torch.device) -> dict:
    """Rank accuracies a_k^(i) and top-1 / top-k per head on held-out answer positions, teacher-forced along the
    target's greedy continuation (the truth is the next token of the sequence)."""
    counts = torch.zeros(heads.num_heads, top_k)
    seen = torch.zeros(heads.num_heads)
    for item in sequences:
        features, embeds = padded([item], embed)
        positions = torch.arange(features.shape[1], device=device)[None]
        base = heads.prefix(features.to(device), positions)
        for i in range(heads.num_heads):
            batch, t, _ = head_rows([item], i)
            if not len(batch):
                continue
            logits = heads.head_logits(i, head_inputs(base, embeds.to(device), i, batch.to(device), t.to(device)))
            truth = item.ids[t + i + 2].to(device)  # [n]
            rank = (logits.float() > logits.float().gather(1, truth[:, None])).sum(dim=1)  # ties in the token's favour
            counts[i] += torch.bincount(rank[rank < top_k].cpu(), minlength=top_k).float()
            seen[i] += len(batch)
    rank_accuracy = counts / seen.clamp(min=1)[:, None]  # [K, top_k]
    return {
        "positions": [int(n) for n in seen],
        "top_k": top_k,
        "top1": [round(x, 4) for x in rank_accuracy[:, 0].tolist()],
        "topk": [round(x, 4) for x in rank_accuracy.sum(dim=1).tolist()],
        "rank_accuracy": [[round(a, 5) for a in row] for row in rank_accuracy.tolist()],
    }


def accuracy_table(result: dict) -> str:
    """Per-head top-1 / top-k held-out accuracy as printable lines."""
    lines = [f"head  top-1   top-{result['top_k']}  positions"]
    for k, (top1, topk, n) in enumerate(zip(result["top1"], result["topk"], result["positions"]), start=1):
        lines.append(f"{k:>4}  {top1:6.3f}  {topk:6.3f}  {n}")
    return "\n".join(lines)


def main(overrides: list[str]) -> Path:
    """Train (or reuse) Hydra heads for ``model``; print and save per-head held-out accuracies."""
    started = time.monotonic()
    job = head_training("hydra", "heads", overrides, validate)
    cfg, lm, data, folder = job.cfg, job.lm, job.data, job.folder
    previous = None if cfg.force else finished_training(folder, job.digest)
    if previous is not None:
        print(f"[specbench] Hydra heads in {folder} are up to date (same settings; force=true retrains)")
        print(accuracy_table(previous["accuracy"]))
        return folder
    with building(folder):  # one builder of this folder at a time
        train_data, eval_data = split(data, cfg.train.eval_sequences, cfg.train.seed)
        backbone = lm.model.base_model
        train = extract_features(backbone, train_data, cfg.train.max_length, cfg.progress)
        held_out = extract_features(backbone, eval_data, cfg.train.max_length, cfg.progress)
        device = lm.model.device
        torch.manual_seed(cfg.train.seed)
        heads = heads_for(lm.model, cfg.heads.num_heads, cfg.heads.num_layers, cfg.heads.arch, cfg.train.dropout)
        heads = heads.to(device)
        embed = lm.model.get_input_embeddings()
        answer_rows = sum(item.ids.numel() - item.prompt_len for item in train)
        print(
            f"[specbench] training {cfg.heads.num_heads} Hydra heads ({cfg.heads.arch}) on {len(train)} sequences "
            f"({answer_rows} answer positions); {len(held_out)} held-out sequences"
        )
        result = train_heads(heads, embed, train, cfg.train, device, cfg.progress)
        accuracy = evaluate(heads, embed, held_out, cfg.train.eval_top_k, device)
        print(accuracy_table(accuracy))
        record = {
            "digest": job.digest,
            **job.settings,
            "data_summary": data_summary(data),
            "train_answer_positions": answer_rows,
            "result": result,
            "accuracy": accuracy,
            "rank_accuracy": accuracy["rank_accuracy"],
            "total_seconds": round(time.monotonic() - started, 1),
        }
        save_hydra(heads, folder, lm.path, record)
    print(
        f"[specbench] Hydra heads saved to {folder} ({result['steps']} steps, {result['seconds']} s of training, "
        f"stopped by {result['stopped_by']}; {record['total_seconds']} s in all)"
    )
    return folder
