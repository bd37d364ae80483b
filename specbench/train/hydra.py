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

from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.models.hydra_heads import ARCHS, HydraHeads, heads_for, save_hydra
from specbench.train.common import (
    TrainerSettings,
)
from specbench.train.eagle import Sequence, answer_rows, extract_features
from specbench.train.heads import HeadOptimizerSettings, HeadTrainer, at_least_one, run_head_trainer
from specbench.train.medusa import autocast, fit
from specbench.train.selfdistill import SelfDistilled


@dataclass
class HydraHeadSettings:
    """The types of ``heads.*``."""

    num_heads: int
    num_layers: int
    arch: str


@dataclass
class HydraTraining(HeadOptimizerSettings):
    """The types of ``train.*`` of the Hydra heads."""

    rows_per_head: int
    dropout: float


@dataclass
class HydraSettings(TrainerSettings):
    """The types of every setting of ``python -m specbench.train hydra`` (conf/train/hydra.yaml)."""

    heads: HydraHeadSettings
    train: HydraTraining


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


class HydraTrainer(
    HeadTrainer[list[Sequence]], command="hydra", name="Hydra", head_key="heads", schema=HydraSettings, soft_labels=True
):
    """The Hydra part of the shared head-training flow: sequentially dependent heads on the frozen target."""

    heads: HydraHeads

    @classmethod
    def range_checks(cls, heads, train) -> list[tuple[bool, str]]:
        """(holds, message) for ``heads.*`` and Hydra's own ``train.*`` keys."""
        return [
            *at_least_one("heads", heads, ("num_heads", "num_layers")),
            (heads.arch in ARCHS, f"heads.arch must be one of {list(ARCHS)} (got {heads.arch!r})"),
            (train.rows_per_head >= 1, f"train.rows_per_head must be >= 1 (got {train.rows_per_head})"),
            (0 <= train.dropout < 1, f"train.dropout must be in [0, 1) (got {train.dropout})"),
            (train.max_length >= 4, f"train.max_length must be >= 4 (got {train.max_length})"),
        ]

    def features(self, data: list[SelfDistilled]) -> list[Sequence]:
        """The target's last hidden states of every sequence, with its recorded top-k laws."""
        return extract_features(self.lm.model.base_model, data, self.cfg.train.max_length, self.cfg.progress)

    def build(self, train: list[Sequence]) -> str:
        """Fresh heads of the configured architecture."""
        heads, model = self.cfg.heads, self.lm.model
        built = heads_for(model, heads.num_heads, heads.num_layers, heads.arch, self.cfg.train.dropout)
        self.heads = built.to(model.device)
        rows = answer_rows(train)
        return f"{heads.num_heads} Hydra heads ({heads.arch}) on {len(train)} sequences ({rows} answer positions)"

    def fit(self, train: list[Sequence]) -> dict:
        """AdamW on the heads' distillation losses."""
        model, cfg = self.lm.model, self.cfg
        return train_heads(self.heads, model.get_input_embeddings(), train, cfg.train, model.device, cfg.progress)

    def evaluate(self, held_out: list[Sequence]) -> dict:
        """Per-head rank accuracies on the held-out sequences."""
        model = self.lm.model
        return evaluate(self.heads, model.get_input_embeddings(), held_out, self.cfg.train.eval_top_k, model.device)

    def record(self, train: list[Sequence], accuracy: dict) -> dict:
        """The answer positions trained on and the rank accuracies the tree calibration reads."""
        return {"train_answer_positions": answer_rows(train), "rank_accuracy": accuracy["rank_accuracy"]}

    def save(self, folder: Path, record: dict) -> None:
        """The heads and their record."""
        save_hydra(self.heads, folder, self.lm.path, record)


def main(overrides: list[str]) -> Path:
    """Train (or reuse) Hydra heads for ``model``; print and save per-head held-out accuracies."""
    return run_head_trainer(HydraTrainer, overrides)
