"""DFlash drafter training (Chen, Liang and Liu 2026): denoise mask-token blocks at random anchors of the target's
self-distilled answers, conditioned on the FROZEN target's hidden states.

``python -m specbench.train dflash model=smollm2_135m [head.*=...] [train.*=...] [prompts.*=...]``

Data: the target's self-distilled answers (``specbench.train.selfdistill``, shared with the Medusa, EAGLE, EAGLE-3 and
Hydra heads). The target runs once per sequence; its hidden states after ``head.layers`` (the authors' spread of
one layer per drafter layer over 1 .. L - 3 by default) are kept.

Each optimizer step draws ``train.anchors`` anchors a per sequence among the answer positions (a in [P, T - 2]) and
builds one block per anchor: x_a then B - 1 mask tokens at positions a .. a + B - 1. All blocks of a sequence run in
one drafter forward over the whole sequence's context rows: block a's rows see the context rows of positions < a
(what decoding has cached when x_a is the root) and the rows of their own block, nothing else. Row k (k = 1 ..
B - 1) of block a drafts x_{a+k}; its loss is the cross-entropy against the target's recorded top-k law at position
a + k - 1 (renormalised), weighted by exp(-(k - 1) / gamma) (``train.loss_decay``), so early rows, which decide how
far a chain is accepted, count most. Rows past the sequence end are left out. The embeddings and LM head are the
target's, frozen; ``fc``, ``hidden_norm``, the layers and ``norm`` are trained.

Held-out evaluation: ``accuracy.top1[k-1]`` is the share of anchors a >= P (with a + k <= T - 1) whose block row k's
argmax is the target's token x_{a+k}: the acceptance of a k-deep chain needs rows 1 .. k all right.
A second run with the same settings is a no-op unless ``force=true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.models.dflash import DFlashDraft, build_draft, checked_target_layers, default_target_layers, save_draft
from specbench.train.common import TrainerSettings
from specbench.train.eagle import Sequence, answer_rows, depth_accuracy, extract_features
from specbench.train.heads import HeadOptimizerSettings, HeadTrainer, run_head_trainer
from specbench.train.medusa import autocast, fit
from specbench.train.selfdistill import SelfDistilled


@dataclass
class DFlashDraftSettings:
    """The types of ``head.*``."""

    num_layers: int
    layers: list[int] | None
    block_size: int
    mask_token: int | None


@dataclass
class DFlashTraining(HeadOptimizerSettings):
    """The types of ``train.*`` of the DFlash drafter."""

    anchors: int
    loss_decay: float | None


@dataclass
class DFlashSettings(TrainerSettings):
    """The types of every setting of ``python -m specbench.train dflash`` (conf/train/dflash.yaml)."""

    head: DFlashDraftSettings
    train: DFlashTraining


def block_inputs(
    item: Sequence, anchors: torch.Tensor, block_size: int, mask_token: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The blocks of one sequence at ``anchors`` [n]: token ids [1, n B], positions [1, n B] and the bool mask
    [1, 1, n B, T + n B] (True = attend) of block rows over the sequence's T context rows then the block rows."""
    length, n = item.ids.numel(), anchors.numel()
    offsets = torch.arange(block_size)
    ids = torch.full((n, block_size), mask_token, dtype=torch.long)
    ids[:, 0] = item.ids[anchors]
    positions = (anchors[:, None] + offsets[None]).reshape(1, -1)  # [1, n B]
    block_of = torch.arange(n).repeat_interleave(block_size)  # [n B]
    sees_context = torch.arange(length)[None] < anchors[block_of][:, None]  # [n B, T]: positions < a
    sees_block = block_of[:, None] == block_of[None]  # [n B, n B]: its own block
    mask = torch.cat([sees_context, sees_block], dim=1)[None, None]
    return ids.reshape(1, -1), positions, mask


def block_labels(item: Sequence, anchors: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every block row (n B, row-major): the index into ``item.topk_*`` of the target's law of its token x_{a+k}
    (position a + k - 1) and whether it has one (k >= 1 and a + k <= T - 1)."""
    k = torch.arange(block_size)[None]
    target = anchors[:, None] + k  # [n, B] a + k
    valid = (k >= 1) & (target <= item.ids.numel() - 1)
    index = (target - 1 - (item.prompt_len - 1)).clamp(min=0, max=item.topk_ids.shape[0] - 1)
    return index.reshape(-1), valid.reshape(-1)


def blocks_forward(draft: DFlashDraft, item: Sequence, anchors: torch.Tensor, device) -> torch.Tensor:
    """One drafter forward over a sequence's context rows and one block per anchor: the output rows [1, n x B, H]."""
    ids, positions, mask = block_inputs(item, anchors, draft.block_size, draft.mask_token)
    out, _ = draft(
        item.features[None].to(device),
        torch.arange(item.ids.numel(), device=device)[None],
        ids.to(device),
        positions.to(device),
        mask.to(device),
    )
    return out


def sequence_loss(
    draft: DFlashDraft, item: Sequence, anchors: torch.Tensor, decay: float | None, device, amp_dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted sum of the rows' soft cross-entropies, sum of their weights) for one sequence's blocks."""
    size = draft.block_size
    index, valid = block_labels(item, anchors, size)
    with autocast(device, amp_dtype):
        out = blocks_forward(draft, item, anchors, device)
        logits = draft.logits(out[0, valid.to(device)])  # [m, vocab]
    teacher_ids = item.topk_ids[index[valid]].to(device)  # [m, k]
    law = torch.softmax(item.topk_logprobs[index[valid]].float(), dim=-1).to(device)  # [m, k]
    logq = torch.log_softmax(logits.float(), dim=-1).gather(1, teacher_ids)  # [m, k]
    k = torch.arange(size).repeat(anchors.numel())[valid]  # [m] row in block
    weight = torch.ones(k.shape) if not decay else torch.exp(-(k - 1).float() / decay)
    weight = weight.to(device)
    return (weight * -(law * logq).sum(-1)).sum(), weight.sum()


def draw_anchors(item: Sequence, count: int, generator: torch.Generator) -> torch.Tensor:
    """Up to ``count`` distinct anchors a in [P, T - 2], drawn afresh (sorted)."""
    valid = torch.arange(item.prompt_len, item.ids.numel() - 1)
    return valid[torch.randperm(valid.numel(), generator=generator)[:count]].sort().values


def train_draft(draft: DFlashDraft, train: list[Sequence], cfg, device, progress: bool) -> dict:
    """AdamW on the decayed block losses until train.max_steps or train.max_minutes; the optimiser's record."""
    usable = [item for item in train if item.ids.numel() - 1 > item.prompt_len]

    def losses_of(index: list[int], generator: torch.Generator) -> tuple[torch.Tensor | None, list[float]]:
        total, weights = [], []
        for i in index:
            item = usable[i]
            anchors = draw_anchors(item, cfg.anchors, generator)
            loss, weight = sequence_loss(draft, item, anchors, cfg.loss_decay, device, cfg.amp_dtype)
            total.append(loss)
            weights.append(weight)
        if not total:
            return None, [float("nan")]
        objective = torch.stack(total).sum() / torch.stack(weights).sum().clamp(min=1e-6)
        return objective, [objective.item()]

    return fit(draft, len(usable), cfg, "dflash drafter", progress, losses_of)


@torch.no_grad()
def evaluate(draft: DFlashDraft, sequences: list[Sequence], top_k: int, device, chunk: int = 64) -> dict:
    """Held-out top-1 / top-k accuracy of block rows k = 1 .. B - 1 at every anchor a >= P (argmax vs x_{a+k})."""
    size = draft.block_size
    hits1, hitsk, seen = torch.zeros(size - 1), torch.zeros(size - 1), torch.zeros(size - 1)
    for item in sequences:
        every = torch.arange(item.prompt_len, item.ids.numel() - 1)
        for start in range(0, every.numel(), chunk):
            anchors = every[start : start + chunk]
            out = blocks_forward(draft, item, anchors, device)
            logits = draft.logits(out[0]).float().view(anchors.numel(), size, -1)[:, 1:]  # [n, B - 1, vocab]
            best = logits.topk(top_k, dim=-1).indices.cpu()  # [n, B - 1, top_k]
            target = anchors[:, None] + torch.arange(1, size)[None]  # [n, B - 1]
            valid = target <= item.ids.numel() - 1
            truth = item.ids[target.clamp(max=item.ids.numel() - 1)]
            hits1 += ((best[..., 0] == truth) & valid).sum(0)
            hitsk += ((best == truth[..., None]).any(-1) & valid).sum(0)
            seen += valid.sum(0)
    return depth_accuracy(hits1, hitsk, seen, top_k)


def mask_token_for(given: int | None, tokenizer, vocab: int) -> int:
    """The mask token: ``head.mask_token``, else the tokenizer's mask token, else the vocabulary's last id."""
    if given is not None:
        return int(given)
    mask = getattr(tokenizer, "mask_token_id", None) if tokenizer is not None else None
    return int(mask) if mask is not None and 0 <= mask < vocab else vocab - 1


class DFlashTrainer(
    HeadTrainer[list[Sequence]],
    command="dflash",
    name="DFlash",
    head_key="head",
    schema=DFlashSettings,
    soft_labels=True,
):
    """The DFlash part of the shared head-training flow: the target's layers as context, mask-token blocks."""

    table_rows = "row"
    draft: DFlashDraft

    def __init__(self, lm, cfg) -> None:
        super().__init__(lm, cfg)
        head, depth = cfg.head, lm.model.config.num_hidden_layers
        self.num_target = depth
        chosen = head.layers
        self.target_layers = (
            checked_target_layers(chosen, depth)
            if chosen is not None
            else default_target_layers(depth, head.num_layers)
        )
        self.vocab = lm.model.get_output_embeddings().weight.shape[0]

    @classmethod
    def range_checks(cls, head, train) -> list[tuple[bool, str]]:
        """(holds, message) for ``head.*`` and DFlash's own ``train.*`` keys."""
        return [
            (head.num_layers >= 1, f"head.num_layers must be >= 1 (got {head.num_layers})"),
            (head.block_size >= 2, f"head.block_size must be >= 2 (got {head.block_size})"),
            (head.mask_token is None or head.mask_token >= 0, f"head.mask_token must be >= 0 (got {head.mask_token})"),
            (train.anchors >= 1, f"train.anchors must be >= 1 (got {train.anchors})"),
            (
                train.loss_decay is None or train.loss_decay > 0,
                f"train.loss_decay must be > 0 or null (got {train.loss_decay})",
            ),
            (train.max_length >= 4, f"train.max_length must be >= 4 (got {train.max_length})"),
        ]

    def features(self, data: list[SelfDistilled]) -> list[Sequence]:
        """The target's hidden states after the chosen layers, concatenated, with its recorded top-k laws."""
        layers = tuple(layer + 1 for layer in self.target_layers)
        return extract_features(self.lm.model.base_model, data, self.cfg.train.max_length, self.cfg.progress, layers)

    def build(self, train: list[Sequence]) -> str:
        """A fresh float32 drafter shaped like the target, sharing its (frozen) embeddings and LM head."""
        head = self.cfg.head
        mask = mask_token_for(head.mask_token, self.lm.tokenizer, self.vocab)
        model = self.lm.model
        self.draft = build_draft(model, head.num_layers, self.target_layers, head.block_size, mask)
        with torch.no_grad():  # the final norm starts as the target's (its LM head reads that scale)
            self.draft.norm.weight.copy_(model.get_decoder().norm.weight.float())
        self.draft.to(device=model.device, dtype=torch.float32)
        return (
            f"a {head.num_layers}-layer DFlash drafter (block {head.block_size}, mask token {mask}, target layers "
            f"{self.target_layers}) on {len(train)} sequences ({answer_rows(train)} answer positions), "
            f"{self.cfg.train.anchors} anchors per sequence and step"
        )

    def fit(self, train: list[Sequence]) -> dict:
        """AdamW on the decayed block losses (the target's embeddings and LM head stay frozen)."""
        model = self.lm.model
        frozen = [model.get_input_embeddings(), model.get_output_embeddings()]
        dtypes = [module.weight.dtype for module in frozen]
        for module in frozen:  # the shared modules compute in float32 with the drafter, and get no gradient
            module.to(torch.float32).requires_grad_(False)
        try:
            return train_draft(self.draft, train, self.cfg.train, model.device, self.cfg.progress)
        finally:
            for module, dtype in zip(frozen, dtypes):
                module.to(dtype)

    def evaluate(self, held_out: list[Sequence]) -> dict:
        """Per-row top-1 / top-k accuracy of the block drafts on the held-out sequences."""
        model = self.lm.model
        frozen = [model.get_input_embeddings(), model.get_output_embeddings()]
        dtypes = [module.weight.dtype for module in frozen]
        for module in frozen:
            module.to(torch.float32)
        try:
            return evaluate(self.draft, held_out, self.cfg.train.eval_top_k, model.device)
        finally:
            for module, dtype in zip(frozen, dtypes):
                module.to(dtype)

    def record(self, train: list[Sequence], accuracy: dict) -> dict:
        """The target layers read, the block size, the mask token and the answer positions trained on."""
        return {
            "target_layer_ids": self.target_layers,
            "block_size": self.draft.block_size,
            "mask_token_id": self.draft.mask_token,
            "train_answer_positions": answer_rows(train),
        }

    def save(self, folder: Path, record: dict) -> None:
        """The drafter in the authors' checkpoint layout (config.json's dflash_config), with the record."""
        save_draft(self.draft, folder, self.lm.path, self.num_target, record)


def main(overrides: list[str]) -> Path:
    """Train (or reuse) the DFlash drafter for ``model``; print and save its per-row held-out accuracy."""
    return run_head_trainer(DFlashTrainer, overrides)
