"""EAGLE head training (Li et al., ICML 2024, section 4.2): a feature-level draft head on a FROZEN target.

``python -m specbench.train eagle model=smollm2_135m [head.*=...] [train.*=...] [prompts.*=...]``

Data: the target's self-distilled answers (``specbench.train.selfdistill``, shared with the Medusa heads
and the distilled draft). The target runs once per sequence and its features f_t (last hidden states,
after the final norm) are kept; training then touches only the head. The head reads the pair
(f_t + noise, x_{t+1}) at every position t of a sequence (causal attention over the sequence) and
predicts f̂_{t+1}. Loss at the answer positions (t + 1 >= prompt length): ``w_reg`` x SmoothL1(f_{t+1},
f̂_{t+1}) (L_reg) + ``w_cls`` x the cross-entropy of the target's next-token distribution at t + 1 (its
top-k log-probs recorded during self-distillation, renormalised) against LM-head(f̂_{t+1}) (L_cls).

Held-out evaluation drafts as decoding does: from the true features up to position s, depth 1 is
LM-head(f̂_{s+1}) and depth k feeds the head's own predicted features for k - 1 more steps (teacher-forced
tokens, the target's greedy continuation): ``accuracy.top1[k-1]`` is the share of positions where the
depth-k draft's argmax is the target's token (comparable with a Medusa head's top-1 at the same depth).
A second run with the same settings is a no-op unless ``force=true``; the output folder is replaced
atomically.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specbench.core.verify import layer_rows
from specbench.errors import ConfigError
from specbench.models.eagle_heads import EagleHead, config_for_target, save_head
from specbench.train.common import (
    TrainerSettings,
)
from specbench.train.heads import HeadOptimizerSettings, HeadTrainer, at_least_one, run_head_trainer
from specbench.train.medusa import autocast, lr_factor, seeded
from specbench.train.selfdistill import SelfDistilled

INITS = ("random", "last_layer")


@dataclass
class Sequence:
    """One self-distilled sequence with the frozen target's features and its recorded next-token laws."""

    ids: torch.Tensor  # [T] prompt + answer tokens
    features: torch.Tensor  # [T, H] f_t (float32, CPU); [T, 3H] the fused layers for EAGLE-3
    prompt_len: int  # P: position P is the first answer token
    topk_ids: torch.Tensor  # [T - P, k] the target's top-k tokens at positions P - 1 .. T - 2 (predicting x_P ..)
    topk_logprobs: torch.Tensor  # [T - P, k] their log-probabilities


@dataclass
class EagleHeadSettings:
    """The types of ``head.*``."""

    num_layers: int
    fc_bias: bool
    init: str


@dataclass
class EagleTraining(HeadOptimizerSettings):
    """The types of ``train.*`` of the EAGLE head."""

    w_reg: float
    w_cls: float
    noise: float
    eval_depth: int


@dataclass
class EagleSettings(TrainerSettings):
    """The types of every setting of ``python -m specbench.train eagle`` (conf/train/eagle.yaml)."""

    head: EagleHeadSettings
    train: EagleTraining


@torch.no_grad()
def extract_features(
    backbone, data: list[SelfDistilled], max_length: int, progress: bool, layers: tuple[int, ...] = (-1,)
) -> list[Sequence]:
    """The target's features of every sequence (one forward each: the hidden states at ``layers``, concatenated;
    EAGLE reads the last, EAGLE-3 three), with its recorded top-k laws."""
    sequences = []
    device = next(backbone.parameters()).device
    for record in tqdm(data, desc="target features", unit="seq", disable=not progress):
        ids = torch.tensor(record.prompt_ids + record.output_ids)[:max_length]  # [T]
        prompt_len = len(record.prompt_ids)
        answer = ids.numel() - prompt_len
        if answer < 2 or record.topk_ids is None:
            continue
        out = backbone(input_ids=ids[None].to(device), output_hidden_states=True)
        states = layer_rows(out.hidden_states, layers, ids.numel())  # [T, layers x H]
        sequences.append(
            Sequence(
                ids,
                states.float().cpu(),
                prompt_len,
                torch.tensor(record.topk_ids[:answer]),
                torch.tensor(record.topk_logprobs[:answer]),
            )
        )
    if not sequences:
        raise ConfigError(
            "no training sequences: every self-distilled answer is shorter than 2 tokens, or the data "
            "lacks the target's top-k records (set prompts.teacher_topk >= 1)"
        )
    return sequences


def causal_mask(length: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive causal mask [1, 1, length, length]."""
    blocked = torch.ones(length, length, dtype=torch.bool).triu(1)
    return torch.zeros(length, length, dtype=dtype).masked_fill(blocked, torch.finfo(dtype).min)[None, None]


@dataclass
class Batch:
    """Right-padded pairs of a few sequences and where their losses are taken."""

    features: torch.Tensor  # [B, L, H] inputs f_t, t = 0 .. L-1 (L = longest T - 1)
    next_ids: torch.Tensor  # [B, L] x_{t+1}
    targets: torch.Tensor  # [B, L, H] f_{t+1}
    reg_rows: torch.Tensor  # [B, L] bool: L_reg rows (t + 1 in [P, T - 1])
    cls_rows: torch.Tensor  # [B, L] bool: L_cls rows (t + 1 in [P, T - 2])
    topk_ids: torch.Tensor  # [n_cls, k] the target's top-k at the L_cls rows, row-major order
    topk_logprobs: torch.Tensor  # [n_cls, k]


def collate(items: list[Sequence]) -> Batch:
    """Pad ``items`` into one batch of pairs (f_t, x_{t+1}) with their regression / cross-entropy rows."""
    width = max(item.ids.numel() for item in items) - 1
    hidden = items[0].features.shape[1]
    features = torch.zeros(len(items), width, hidden)
    targets = torch.zeros(len(items), width, hidden)
    next_ids = torch.zeros(len(items), width, dtype=torch.long)
    reg_rows = torch.zeros(len(items), width, dtype=torch.bool)
    cls_rows = torch.zeros(len(items), width, dtype=torch.bool)
    topk_ids, topk_logprobs = [], []
    for b, item in enumerate(items):
        length, prompt = item.ids.numel() - 1, item.prompt_len
        features[b, :length] = item.features[:-1]
        targets[b, :length] = item.features[1:]
        next_ids[b, :length] = item.ids[1:]
        reg_rows[b, prompt - 1 : length] = True  # t + 1 in [P, T - 1]
        cls_rows[b, prompt - 1 : length - 1] = True  # t + 1 in [P, T - 2]: the law at t + 1 is row t + 2 - P
        topk_ids.append(item.topk_ids[1 : length - prompt + 1])
        topk_logprobs.append(item.topk_logprobs[1 : length - prompt + 1])
    return Batch(features, next_ids, targets, reg_rows, cls_rows, torch.cat(topk_ids), torch.cat(topk_logprobs))


def head_losses(
    head: EagleHead,
    lm_head: torch.nn.Module,
    batch: Batch,
    noise: float,
    amp_dtype,
    generator: torch.Generator | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_reg, L_cls) of one batch: SmoothL1 on predicted features, cross-entropy against the target's top-k."""
    features = batch.features.to(device)
    if noise > 0:
        features = features + (torch.rand(features.shape, generator=generator) * 2 - 1).to(device) * noise
    length = features.shape[1]
    positions = torch.arange(length, device=device)[None].expand(features.shape[0], -1)  # [B, L]
    with autocast(device, amp_dtype):
        predicted = head(features, batch.next_ids.to(device), positions, causal_mask(length, torch.float32).to(device))
    predicted = predicted.float()  # [B, L, H]
    reg_rows, cls_rows = batch.reg_rows.to(device), batch.cls_rows.to(device)
    l_reg = torch.nn.functional.smooth_l1_loss(predicted[reg_rows], batch.targets.to(device)[reg_rows])
    with autocast(device, amp_dtype):
        logits = lm_head(predicted[cls_rows])  # [n_cls, V]
    logq = torch.log_softmax(logits.float(), dim=-1)
    teacher = torch.softmax(batch.topk_logprobs.to(device), dim=-1)  # [n_cls, k] renormalised top-k law
    l_cls = -(teacher * logq.gather(1, batch.topk_ids.to(device))).sum(dim=-1).mean()
    return l_reg, l_cls


def build_head(target, head_cfg, device: torch.device) -> EagleHead:
    """A fresh float32 head sharing the target's (frozen) embeddings; optionally its layer from the target's last."""
    embeddings = target.get_input_embeddings()
    head = EagleHead(config_for_target(target, head_cfg.num_layers), head_cfg.fc_bias, embeddings)
    if head_cfg.init == "last_layer":
        last = target.get_decoder().layers[-1].state_dict()
        for layer in head.layers:  # the first layer has no input norm: that key is skipped
            wanted = set(layer.state_dict())
            layer.load_state_dict({key: value for key, value in last.items() if key in wanted})
    return head.to(device=device, dtype=torch.float32)


def train_head(head: EagleHead, lm_head, train: list[Sequence], cfg, device: torch.device, progress: bool) -> dict:
    """AdamW on ``w_reg L_reg + w_cls L_cls`` until train.max_steps or train.max_minutes; returns a record."""
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    generator = seeded(cfg.seed)
    order, cursor, seen = torch.randperm(len(train), generator=generator), 0, 0
    budget_s = cfg.max_minutes * 60 if cfg.max_minutes else math.inf
    start = time.monotonic()
    bar = tqdm(total=cfg.max_steps, desc="eagle head", unit="step", disable=not progress)
    step, curve, window = 0, [], []
    head.train()
    while step < cfg.max_steps and time.monotonic() - start < budget_s:
        fraction = max(step / cfg.max_steps, (time.monotonic() - start) / budget_s)
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(step, fraction, cfg.warmup_steps)
        if cursor >= len(order):
            order, cursor = torch.randperm(len(train), generator=generator), 0
        index = order[cursor : cursor + cfg.batch_size].tolist()
        cursor, seen = cursor + len(index), seen + len(index)
        l_reg, l_cls = head_losses(
            head, lm_head, collate([train[i] for i in index]), cfg.noise, cfg.amp_dtype, generator, device
        )
        optimizer.zero_grad(set_to_none=True)
        (cfg.w_reg * l_reg + cfg.w_cls * l_cls).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        step += 1
        window.append((l_reg.item(), l_cls.item()))
        if len(window) == 10:
            curve.append([step, *(round(sum(column) / len(window), 4) for column in zip(*window))])
            window = []
        bar.update(1)
        bar.set_postfix(reg=f"{l_reg.item():.3f}", cls=f"{l_cls.item():.2f}")
    bar.close()
    head.eval()
    return {
        "steps": step,
        "steps_planned": cfg.max_steps,
        "seconds": round(time.monotonic() - start, 1),
        "epochs": round(seen / len(train), 3),
        "stopped_by": "max_steps" if step >= cfg.max_steps else "max_minutes",
        "loss_curve": curve,  # [step, L_reg, L_cls] averaged over 10 steps
    }


def draft_rows(length: int, starts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """Layout of one evaluation forward: true pairs 0 .. length-1, then one row per (depth k >= 2, start s).

    ``starts[k - 2]`` are the starts s drafted at depth k. Returns the additive-mask visibility [n, n] bool
    (a true pair sees earlier true pairs; row (k, s) sees true pairs 0..s and rows (2..k, s)), the
    positions [n] (row (k, s) sits at s + k - 1), and per row its depth and start.
    """
    depth, start = [1] * length, list(range(length))
    for k, row_starts in enumerate(starts, start=2):
        depth += [k] * len(row_starts)
        start += row_starts
    depth_t, start_t = torch.tensor(depth), torch.tensor(start)  # [n]
    true_row = depth_t == 1
    sees_true = true_row[None, :] & (start_t[None, :] <= start_t[:, None])  # [n, n] key j true, j <= s
    same_chain = (
        (~true_row[None, :])
        & (~true_row[:, None])
        & (start_t[None, :] == start_t[:, None])
        & (depth_t[None, :] <= depth_t[:, None])
    )
    positions = start_t + depth_t - 1
    return sees_true | same_chain, positions, depth, start


@torch.no_grad()
def evaluate(head: EagleHead, lm_head, sequences: list[Sequence], depth: int, top_k: int, device: torch.device) -> dict:
    """Held-out top-1 / top-k accuracy of the depth-k draft (k = 1..depth), drafting from the head's own features.

    The root is the token at s + 1 (an answer token or the first one: s >= P - 1); the depth-k draft
    predicts x_{s+k+1} and counts where that token exists.
    """
    hits1, hitsk, seen = torch.zeros(depth), torch.zeros(depth), torch.zeros(depth)
    for item in sequences:
        length = item.ids.numel() - 1  # true pairs t = 0 .. T-2
        first = item.prompt_len - 1
        outputs: dict[tuple[int, int], torch.Tensor] = {}  # (depth, start) -> predicted feature [H]
        for k in range(1, depth + 1):
            starts = [[s for s in range(first, length) if s + m + 1 <= length] for m in range(2, k + 1)]
            if k > 1 and not starts[-1]:
                break
            visible, positions, row_depth, row_start = draft_rows(length, starts)
            features = torch.cat(
                [item.features[:length]]
                + [
                    torch.stack([outputs[(m - 1, s)] for s in row_starts])
                    for m, row_starts in enumerate(starts, start=2)
                ]
            )  # [n, H]: row (m, s) carries the depth m-1 prediction from start s
            tokens = torch.cat(
                [item.ids[1:]]
                + [item.ids[torch.tensor(row_starts) + m] for m, row_starts in enumerate(starts, start=2)]
            )  # [n]
            mask = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
            out = (
                head(
                    features[None].to(device),
                    tokens[None].to(device),
                    positions[None].to(device),
                    mask[None, None].to(device),
                )[0]
                .float()
                .cpu()
            )  # [n, H]
            rows = [
                r for r, (d, s) in enumerate(zip(row_depth, row_start)) if d == k and s >= first and s + k + 1 <= length
            ]
            for r in rows:
                outputs[(k, row_start[r])] = out[r]
            if k == 1:  # depth-1 outputs of every start (deeper rows feed them)
                for s in range(first, length):
                    outputs[(1, s)] = out[s]
            if not rows:
                continue
            logits = lm_head(out[rows].to(device)).float()  # [r, V]
            truth = item.ids[torch.tensor([row_start[r] + k + 1 for r in rows])].to(device)  # [r]
            best = logits.topk(top_k, dim=-1).indices  # [r, top_k]
            hits1[k - 1] += (best[:, 0] == truth).sum().cpu()
            hitsk[k - 1] += (best == truth[:, None]).any(dim=-1).sum().cpu()
            seen[k - 1] += len(rows)
    return depth_accuracy(hits1, hitsk, seen, top_k)


def depth_accuracy(hits1: torch.Tensor, hitsk: torch.Tensor, seen: torch.Tensor, top_k: int) -> dict:
    """The held-out accuracy record from per-depth counts [D]: top-1 and top-k hits over positions seen."""
    top1, topk = hits1 / seen.clamp(min=1), hitsk / seen.clamp(min=1)
    return {
        "positions": [int(n) for n in seen],
        "top_k": top_k,
        "top1": [round(x, 4) for x in top1.tolist()],
        "topk": [round(x, 4) for x in topk.tolist()],
    }


def answer_rows(sequences: list[Sequence]) -> int:
    """Answer positions in ``sequences`` (what a head is trained on)."""
    return sum(item.ids.numel() - item.prompt_len for item in sequences)


class EagleTrainer(
    HeadTrainer[list[Sequence]], command="eagle", name="EAGLE", head_key="head", schema=EagleSettings, soft_labels=True
):
    """The EAGLE part of the shared head-training flow: a one-layer feature-level autoregressive head."""

    table_rows = "depth"
    head: EagleHead

    @classmethod
    def range_checks(cls, head, train) -> list[tuple[bool, str]]:
        """(holds, message) for ``head.*`` and EAGLE's own ``train.*`` keys."""
        return [
            (head.init in INITS, f"head.init must be one of {INITS} (got {head.init!r})"),
            *at_least_one("head", head, ("num_layers",)),
            (
                train.w_reg >= 0 and train.w_cls >= 0 and train.w_reg + train.w_cls > 0,
                f"train.w_reg and train.w_cls must be >= 0, not both 0 (got {train.w_reg}, {train.w_cls})",
            ),
            (train.noise >= 0, f"train.noise must be >= 0 (got {train.noise})"),
            (train.eval_depth >= 1, f"train.eval_depth must be >= 1 (got {train.eval_depth})"),
            (train.max_length >= 4, f"train.max_length must be >= 4 (got {train.max_length})"),
        ]

    def features(self, data: list[SelfDistilled]) -> list[Sequence]:
        """The target's last hidden states of every sequence, with its recorded top-k laws."""
        return extract_features(self.lm.model.base_model, data, self.cfg.train.max_length, self.cfg.progress)

    def build(self, train: list[Sequence]) -> str:
        """A fresh head, and the frozen LM head in float32 (a copy when the target runs in half precision)."""
        model = self.lm.model
        self.head = build_head(model, self.cfg.head, model.device)
        lm_head = model.get_output_embeddings()
        self.lm_head = lm_head if lm_head.weight.dtype == torch.float32 else copy.deepcopy(lm_head).float()
        return f"an EAGLE head on {len(train)} sequences ({answer_rows(train)} answer positions)"

    def fit(self, train: list[Sequence]) -> dict:
        """AdamW on the regression + classification losses."""
        cfg = self.cfg
        return train_head(self.head, self.lm_head, train, cfg.train, self.lm.model.device, cfg.progress)

    def evaluate(self, held_out: list[Sequence]) -> dict:
        """Per-depth top-1 / top-k accuracy of the head's own chains on the held-out sequences."""
        train = self.cfg.train
        return evaluate(self.head, self.lm_head, held_out, train.eval_depth, train.eval_top_k, self.lm.model.device)

    def record(self, train: list[Sequence], accuracy: dict) -> dict:
        """The answer positions trained on."""
        return {"train_answer_positions": answer_rows(train)}

    def save(self, folder: Path, record: dict) -> None:
        """The head in the authors' checkpoint layout, with the record."""
        save_head(self.head, folder, self.lm.path, record)


def main(overrides: list[str]) -> Path:
    """Train (or reuse) the EAGLE head for ``model``; print and save its per-depth held-out accuracy."""
    return run_head_trainer(EagleTrainer, overrides)
