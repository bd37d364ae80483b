"""MEDUSA-1 training (Cai et al. 2024, 3.2.1): K heads on a FROZEN target, on its own self-distilled answers.

``python -m specbench.train medusa model=smollm2_135m [heads.*=...] [train.*=...] [prompts.*=...]``

Head k (1-based) reads the last hidden state h_t (after the final norm) and is trained with
cross-entropy on the token at t + k + 1; the loss is ``sum_k lambda_k CE_k`` with
``lambda_k = loss_decay ** k`` (Eq. 1, 0.8^k in the paper). The backbone is frozen, so its hidden
states are computed once per sequence (answer positions only) and training touches only the heads:
this is what makes CPU training of the embedded model's heads feasible.

Evaluation on held-out self-distilled sequences measures each head's rank accuracies a_k^(i) (the
probability that its i-th top token is the right one). Because the answers are the target's own
greedy outputs, "right" is the target's greedy continuation, which is what the sparse-tree
calibration (docs/methods/medusa.md#static-trees) needs; the table is saved in ``training.json``
beside the heads and the drafter builds its sparse tree from it. A second run with the same settings
(model, data, heads, train) is a no-op unless ``force=true``; the output folder is replaced atomically.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specbench.errors import ConfigError
from specbench.models.medusa_heads import MedusaHeads, save_heads
from specbench.train.common import (
    TimeBudget,
    TrainerSettings,
    autocast_dtype,
)
from specbench.train.heads import HeadOptimizerSettings, HeadTrainer, at_least_one, run_head_trainer
from specbench.train.selfdistill import SelfDistilled

IGNORE = -100  # label of a (position, head) whose target lies past the sequence end


@dataclass
class Features:
    """Frozen-backbone inputs and head labels at every answer position t of some sequences."""

    hidden: torch.Tensor  # [N, H] h_t (target dtype, CPU)
    labels: torch.Tensor  # [N, K] long: y_{t+k+1} for head k = 1..K, IGNORE past the end

    def __len__(self) -> int:
        return self.hidden.shape[0]


def seeded(seed: int) -> torch.Generator:
    """A CPU generator for the split and the batch order, independent of the global RNG."""
    return torch.Generator().manual_seed(seed)


@dataclass
class MedusaHeadSettings:
    """The types of ``heads.*``."""

    num_heads: int
    num_layers: int
    train_lm_head: bool


@dataclass
class MedusaTraining(HeadOptimizerSettings):
    """The types of ``train.*`` of the Medusa heads."""

    loss_decay: float


@dataclass
class MedusaSettings(TrainerSettings):
    """The types of every setting of ``python -m specbench.train medusa`` (conf/train/medusa.yaml)."""

    heads: MedusaHeadSettings
    train: MedusaTraining


def head_labels(ids: torch.Tensor, start: int, rows: int, num_heads: int) -> torch.Tensor:
    """[rows, K] labels for positions t = start .. start+rows-1: ids[t + k + 1], IGNORE past the end."""
    positions = torch.arange(start, start + rows)[:, None] + torch.arange(2, num_heads + 2)[None]  # [rows, K]
    inside = positions < ids.numel()
    return torch.where(inside, ids[positions.clamp(max=ids.numel() - 1)], torch.full_like(positions, IGNORE))


@torch.no_grad()
def extract_features(backbone, data: list[SelfDistilled], num_heads: int, max_length: int, progress: bool) -> Features:
    """h_t for every answer position t that has a head-1 target (t + 2 inside the sequence), once."""
    hidden, labels = [], []
    device = next(backbone.parameters()).device
    for record in tqdm(data, desc="backbone features", unit="seq", disable=not progress):
        ids = torch.tensor(record.prompt_ids + record.output_ids)[:max_length]  # [T]
        start = len(record.prompt_ids) - 1  # the last prompt token's state predicts the answer
        rows = ids.numel() - 2 - start
        if rows < 1:
            continue
        states = backbone(input_ids=ids[None].to(device)).last_hidden_state[0]  # [T, H]
        hidden.append(states[start : start + rows].cpu())
        labels.append(head_labels(ids, start, rows, num_heads))
    if not hidden:
        raise ConfigError("no training positions: every self-distilled answer is shorter than 2 tokens")
    return Features(torch.cat(hidden), torch.cat(labels))


def build_heads(lm_head: torch.nn.Linear, heads_cfg, device: torch.device) -> MedusaHeads:
    """Fresh float32 heads: W_in = 0, W_out from the LM head (own copies, or the frozen head itself)."""
    vocab, hidden = lm_head.weight.shape
    if heads_cfg.train_lm_head:
        heads = MedusaHeads(hidden, vocab, heads_cfg.num_heads, heads_cfg.num_layers)
        with torch.no_grad():
            for k in range(heads.num_heads):  # head k's own output layer (after its residual blocks)
                heads.heads.get_parameter(f"{k}.{heads.num_layers}.weight").copy_(lm_head.weight)
        return heads.to(device)
    frozen = lm_head if lm_head.weight.dtype == torch.float32 else copy.deepcopy(lm_head).float()
    heads = MedusaHeads(hidden, vocab, heads_cfg.num_heads, heads_cfg.num_layers, frozen.requires_grad_(False))
    return heads.to(device)


def head_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per head [K] from logits [K, B, V] and labels [B, K] (0 where a head has no label)."""
    losses = []
    for k in range(logits.shape[0]):
        total = torch.nn.functional.cross_entropy(logits[k].float(), labels[:, k], ignore_index=IGNORE, reduction="sum")
        losses.append(total / (labels[:, k] != IGNORE).sum().clamp(min=1))
    return torch.stack(losses)


def lr_factor(step: int, progress: float, warmup: int) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps times a cosine decay over ``progress`` in [0, 1].

    ``progress`` is the larger of the step and time fractions of the budget, so the schedule also
    anneals to 0 when ``train.max_minutes`` ends training before ``train.max_steps``.
    """
    return min(1.0, (step + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def fit(module: torch.nn.Module, count: int, cfg, desc: str, progress: bool, losses_of: Callable) -> dict:
    """AdamW (linear warm-up, cosine decay) over batches of ``cfg.batch_size`` of ``count`` items in a seeded order
    reshuffled every epoch, until train.max_steps or train.max_minutes; returns the record.

    ``losses_of(indices, generator)`` gives (the objective to minimise, or None when the batch has no loss rows;
    the per-component losses the loss curve averages over 10 steps). Used by the Hydra and EAGLE-3 trainers.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    generator = seeded(cfg.seed)
    order, cursor, seen = torch.randperm(count, generator=generator), 0, 0
    budget = TimeBudget(cfg.max_minutes)
    bar = tqdm(total=cfg.max_steps, desc=desc, unit="step", disable=not progress)
    step, curve, window = 0, [], []
    module.train()
    while step < cfg.max_steps and budget.allows_step():
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(step, max(step / cfg.max_steps, budget.fraction()), cfg.warmup_steps)
        if cursor >= len(order):
            order, cursor = torch.randperm(count, generator=generator), 0
        index = order[cursor : cursor + cfg.batch_size].tolist()
        cursor, seen = cursor + len(index), seen + len(index)
        objective, components = losses_of(index, generator)
        optimizer.zero_grad(set_to_none=True)
        if objective is not None:
            objective.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            optimizer.step()
        budget.step_done()
        step += 1
        window.append(components)
        if len(window) == 10:
            curve.append([step, *(round(sum(column) / len(window), 4) for column in zip(*window))])
            window = []
        bar.update(1)
        bar.set_postfix(loss=" ".join(f"{x:.2f}" for x in components))
    bar.close()
    module.eval()
    return {
        "steps": step,
        "steps_planned": cfg.max_steps,
        "seconds": round(budget.elapsed(), 1),
        "epochs": round(seen / count, 3),
        "stopped_by": "max_steps" if step >= cfg.max_steps else "max_minutes",
        "loss_curve": curve,  # [step, component losses...] averaged over 10 steps
    }


def autocast(device: torch.device, amp_dtype: str | None):
    """Mixed precision for the heads' forward (the LM-head matmul dominates) where it is fast, or a no-op."""
    dtype = autocast_dtype(amp_dtype, device)
    if dtype is None:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=dtype)


def train_heads(heads: MedusaHeads, train: Features, cfg, device: torch.device, progress: bool) -> dict:
    """AdamW on ``sum_k lambda_k CE_k`` until train.max_steps or train.max_minutes; returns a record."""
    params = [p for p in heads.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    weights = torch.tensor([cfg.loss_decay**k for k in range(1, heads.num_heads + 1)], device=device)  # lambda_k
    generator = seeded(cfg.seed)
    order, cursor, seen = torch.randperm(len(train), generator=generator), 0, 0
    budget = TimeBudget(cfg.max_minutes)
    bar = tqdm(total=cfg.max_steps, desc="medusa heads", unit="step", disable=not progress)
    step, losses = 0, None
    while step < cfg.max_steps and budget.allows_step():
        progress_now = max(step / cfg.max_steps, budget.fraction())
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(step, progress_now, cfg.warmup_steps)
        if cursor >= len(order):
            order, cursor = torch.randperm(len(train), generator=generator), 0
        index = order[cursor : cursor + cfg.batch_size]
        cursor, seen = cursor + len(index), seen + len(index)
        with autocast(device, cfg.amp_dtype):
            logits = heads(train.hidden[index].to(device, torch.float32))  # [K, B, V]
        losses = head_losses(logits, train.labels[index].to(device))  # [K]
        optimizer.zero_grad(set_to_none=True)
        (weights * losses).sum().backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        budget.step_done()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=" ".join(f"{x:.2f}" for x in losses.tolist()))
    bar.close()
    return {
        "steps": step,
        "steps_planned": cfg.max_steps,
        "seconds": round(budget.elapsed(), 1),
        "epochs": round(seen / len(train), 3),
        "stopped_by": "max_steps" if step >= cfg.max_steps else "max_minutes",
        "last_batch_loss": [round(x, 4) for x in losses.tolist()] if losses is not None else None,
    }


@torch.no_grad()
def evaluate(heads: MedusaHeads, features: Features, top_k: int, batch_size: int, device: torch.device) -> dict:
    """Rank accuracies a_k^(i) (i < top_k), top-1 / top-k accuracy and mean loss per head on held-out positions."""
    num_heads = heads.num_heads
    counts = torch.zeros(num_heads, top_k)
    seen = torch.zeros(num_heads)
    loss_sum = torch.zeros(num_heads)
    for begin in range(0, len(features), batch_size):
        logits = heads(features.hidden[begin : begin + batch_size].to(device, torch.float32)).float()  # [K, B, V]
        labels = features.labels[begin : begin + batch_size].to(device)  # [B, K]
        for k in range(num_heads):
            valid = labels[:, k] != IGNORE
            rows, targets = logits[k][valid], labels[valid, k]  # [b, V], [b]
            true = rows.gather(1, targets[:, None])  # [b, 1]
            rank = (rows > true).sum(dim=1)  # [b]; ties count in the token's favour
            counts[k] += torch.bincount(rank[rank < top_k].cpu(), minlength=top_k).float()
            seen[k] += valid.sum().cpu()
            loss_sum[k] += torch.nn.functional.cross_entropy(rows, targets, reduction="sum").cpu()
    rank_accuracy = counts / seen.clamp(min=1)[:, None]  # [K, top_k]
    return {
        "positions": int(seen[0]),
        "top_k": top_k,
        "top1": [round(x, 4) for x in rank_accuracy[:, 0].tolist()],
        "topk": [round(x, 4) for x in rank_accuracy.sum(dim=1).tolist()],
        "loss": [round(x, 4) for x in (loss_sum / seen.clamp(min=1)).tolist()],
        "rank_accuracy": [[round(a, 5) for a in row] for row in rank_accuracy.tolist()],
    }


class MedusaTrainer(
    HeadTrainer[Features], command="medusa", name="Medusa", head_key="heads", schema=MedusaSettings, soft_labels=False
):
    """The Medusa part of the shared head-training flow: K heads on the frozen target's last hidden states."""

    table_column = "loss"
    heads: MedusaHeads

    @classmethod
    def range_checks(cls, heads, train) -> list[tuple[bool, str]]:
        """(holds, message) for ``heads.*`` and Medusa's own ``train.*`` keys."""
        return [
            *at_least_one("heads", heads, ("num_heads", "num_layers")),
            (0 < train.loss_decay <= 1, f"train.loss_decay (lambda) must be in (0, 1] (got {train.loss_decay})"),
            (train.max_length >= 3, f"train.max_length must be >= 3 (got {train.max_length})"),
        ]

    def features(self, data: list[SelfDistilled]) -> Features:
        """h_t and the K labels of every answer position."""
        cfg = self.cfg
        return extract_features(self.lm.model.base_model, data, cfg.heads.num_heads, cfg.train.max_length, cfg.progress)

    def build(self, train: Features) -> str:
        """Fresh heads from the LM head."""
        self.heads = build_heads(self.lm.model.get_output_embeddings(), self.cfg.heads, self.lm.model.device)
        return f"{self.cfg.heads.num_heads} Medusa heads on {len(train)} positions"

    def fit(self, train: Features) -> dict:
        """AdamW on the lambda-weighted head losses."""
        return train_heads(self.heads, train, self.cfg.train, self.lm.model.device, self.cfg.progress)

    def evaluate(self, held_out: Features) -> dict:
        """Per-head rank accuracies on the held-out positions."""
        train = self.cfg.train
        return evaluate(self.heads, held_out, train.eval_top_k, train.batch_size, self.lm.model.device)

    def record(self, train: Features, accuracy: dict) -> dict:
        """The positions trained on and the rank accuracies the sparse-tree calibration reads."""
        return {"train_positions": len(train), "rank_accuracy": accuracy["rank_accuracy"]}

    def save(self, folder: Path, record: dict) -> None:
        """The heads in FasterDecoding's checkpoint format, with the record."""
        save_heads(self.heads, folder, self.lm.path, record)


def main(overrides: list[str]) -> Path:
    """Train (or reuse) Medusa heads for ``model``; print and save per-head accuracies."""
    return run_head_trainer(MedusaTrainer, overrides)
