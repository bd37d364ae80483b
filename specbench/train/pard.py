"""``python -m specbench.train pard``: adapt a draft model into a PARD parallel draft (An et al., ICLR 2026).

- Start: the model config's draft (``pard.start: draft``, the distilled draft) in float32, every weight trained. Its
  mask token is a new id appended to its vocabulary (``pard.mask_token: null``; its embedding row starts at the mean
  row), or a given id; it is saved as ``config.pard_token``, where PARD checkpoints keep it.
- Objective (the paper's parallel-draft training): each sequence is laid out ``pard.copies`` (K) times. Copy 0 is the
  sequence itself; copy ``a >= 1`` holds mask tokens at the same positions. The row of copy ``a`` at position ``t``
  sees the real tokens up to ``t - a`` and the mask rows ``(a - d, t - d)`` for ``d < a``, which is what the draft
  sees at inference when it drafts the ``(a + 1)``-th token after the last known one; it is trained to predict the
  token at ``t + 1``: here the target's own top-k law there (soft labels, as the distilled draft), at answer rows.
- COD (conditional drop-token): copy 0 keeps every row; copy ``a`` keeps ``max(keep_rate^a, keep_min)`` of the rows
  whose copy ``a - 1`` parent (position ``t - 1``) was kept, drawn at random: ``1 / (1 - keep_rate)`` times the
  sequence's rows at most instead of K times.
- Held-out: the tokens per step a chain of K drafts would reach on the target's own answers, from one layout of all
  K copies (greedy, every root position), before and after training.
- Output: ``$SPECBENCH_CACHE/pard/<model>/`` (save_pretrained, tokenizer, training.json, manifest), which
  ``method=pard`` loads through the model config's ``pard:`` node (``source: trained``).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from specbench.errors import ConfigError
from specbench.files import building
from specbench.manifest import digest, trained_with
from specbench.models.draft import LoadedDraft, load_draft
from specbench.models.pard import with_mask_token
from specbench.models.parts import part_kind
from specbench.train.batches import Batch, check_soft_labels, collate
from specbench.train.common import TrainerSettings, check_types, compose_train, container, data_problems, load_target
from specbench.train.draft import (
    DistillationTraining,
    distillation_checks,
    distillation_loss,
    save_draft,
    split_heldout,
    train_loop,
)
from specbench.train.selfdistill import SelfDistilled, data_summary, self_distilled
from specbench.train.selfdistill import validate as validate_prompts

STARTS = ("draft",)
"""What ``pard.start`` may adapt: the model config's draft node."""


@dataclass
class PardSettings:
    """The types of ``pard.*``."""

    start: str
    copies: int
    mask_token: int | None
    keep_rate: float
    keep_min: float


@dataclass
class PardCommand(TrainerSettings):
    """The types of every setting of ``python -m specbench.train pard`` (conf/train/pard.yaml)."""

    pard: PardSettings
    train: DistillationTraining


def validate(cfg: DictConfig) -> None:
    """Reject impossible settings (types first, then ranges and what the data can give) before anything loads."""
    check_types(cfg, PardCommand, "PARD training")
    p, t = cfg.pard, cfg.train
    checks = [
        (p.start in STARTS, f"pard.start must be one of {STARTS} (got {p.start!r})"),
        (p.copies >= 2, f"pard.copies must be >= 2: copy 0 and at least one mask copy (got {p.copies})"),
        (p.mask_token is None or p.mask_token >= 0, f"pard.mask_token must be >= 0 or null (got {p.mask_token})"),
        (0 < p.keep_rate <= 1 and 0 <= p.keep_min <= 1, f"pard.keep_rate in (0, 1], keep_min in [0, 1] (got {p})"),
        *distillation_checks(t),
    ]
    problems = [message for ok, message in checks if not ok] + data_problems(cfg, soft_labels=True)
    if problems:
        raise ConfigError("invalid PARD training settings: " + "; ".join(problems))
    validate_prompts(cfg.prompts)


@dataclass
class Layout:
    """One sequence laid out in K copies, cut to the kept rows: what each row reads, where it sits, what it sees."""

    copy: torch.Tensor  # [rows] the copy a of each row (0: the sequence itself)
    position: torch.Tensor  # [rows] its position t
    allowed: torch.Tensor  # [rows, rows] bool: row i sees row j

    @classmethod
    def of(cls, length: int, copies: int, keep: list[float], generator: torch.Generator | None) -> Layout:
        """The rows kept of a ``length``-token sequence: copy 0 whole; copy ``a`` ``keep[a] x length`` rows (at most)
        drawn from the positions whose copy ``a - 1`` row one position before was kept (all of them without
        ``generator``), so every kept row's diagonal of masks is kept too."""
        copy_ids, positions = [torch.zeros(length, dtype=torch.long)], [torch.arange(length)]
        candidates = torch.arange(1, length)  # copy 1 may use every position after a kept copy-0 one
        for a in range(1, copies):
            count = len(candidates) if generator is None else min(len(candidates), int(length * keep[a]))
            if count == 0:
                break
            order = torch.randperm(len(candidates), generator=generator) if generator is not None else None
            chosen = candidates if order is None else candidates[order[:count]].sort().values
            copy_ids.append(torch.full((len(chosen),), a))
            positions.append(chosen)
            candidates = chosen[chosen < length - 1] + 1
        copy, position = torch.cat(copy_ids), torch.cat(positions)
        real = copy[None, :] == 0
        before = position[None, :] <= position[:, None] - copy[:, None]  # the real tokens up to t - a
        diagonal = (copy[None, :] >= 1) & (copy[:, None] - copy[None, :] == position[:, None] - position[None, :])
        diagonal &= copy[None, :] <= copy[:, None]
        return cls(copy, position, (real & before) | diagonal)


def keep_shares(settings) -> list[float]:
    """COD's share of rows kept per copy: max(keep_rate^a, keep_min), 1 for copy 0."""
    return [1.0] + [max(settings.keep_rate**a, settings.keep_min) for a in range(1, settings.copies)]


def pard_logits(
    draft, batch: Batch, layouts: list[Layout], mask_token: int
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
    """One forward over the laid-out batch: logits [n, vocab] at the n laid-out rows that predict an answer token (a
    row of any copy at an answer row's position, with at least one real token before its masks), the index of each
    one's soft label in ``batch``, and each one's (sequence, copy, position)."""
    device = batch.ids.device
    width = max(len(layout.copy) for layout in layouts)
    ids = torch.full((len(layouts), width), mask_token, dtype=torch.long, device=device)  # [b, R]
    positions = torch.zeros_like(ids)
    mask = torch.full((len(layouts), 1, width, width), torch.finfo(torch.float32).min, device=device)
    label_of = {(int(b), int(t)): i for i, (b, t) in enumerate(zip(batch.row_batch, batch.row_pos))}
    picked: list[tuple[int, int, int]] = []
    slots, labels = [], []
    for b, layout in enumerate(layouts):
        rows, real = len(layout.copy), layout.copy == 0
        ids[b, :rows][real] = batch.ids[b, layout.position[real].to(device)]
        positions[b, :rows] = layout.position
        mask[b, 0, :rows, :rows].masked_fill_(layout.allowed.to(device), 0.0)
        mask[b, 0, rows:, rows:].fill_diagonal_(0.0)  # padding rows see themselves (no empty softmax)
        for row, (a, t) in enumerate(zip(layout.copy.tolist(), layout.position.tolist())):
            label = label_of.get((b, t))
            if label is not None and t - a >= 0:
                picked.append((b, a, t))
                slots.append((b, row))
                labels.append(label)
    hidden = draft.get_decoder()(input_ids=ids, position_ids=positions, attention_mask=mask).last_hidden_state
    index = torch.tensor(slots, device=device)  # [n, 2]
    logits = draft.get_output_embeddings()(hidden[index[:, 0], index[:, 1]]).float()  # [n, vocab]
    return logits, torch.tensor(labels, device=device), picked


def soft_rows(batch: Batch, labels: torch.Tensor) -> Batch:
    """``batch`` with its answer rows' soft labels in the order ``labels`` lists them (for ``distillation_loss``)."""
    return Batch(
        batch.ids,
        batch.mask,
        batch.row_batch[labels],
        batch.row_pos[labels],
        batch.topk_ids[labels],
        batch.topk_logprobs[labels],
    )


@torch.no_grad()
def heldout_steps(draft, items: list[SelfDistilled], copies: int, mask_token: int, pad_id: int) -> dict:
    """Tokens per step of a greedy chain of ``copies`` drafts on the held-out answers from every answer root (draft
    ``j`` after root ``p`` is the row of copy ``j`` at position ``p + j``), and the share of depth-``j`` drafts equal
    to the target's token."""
    device = next(draft.parameters()).device
    accepted = roots = 0
    hits, tried = [0] * copies, [0] * copies
    for item in items:
        batch = collate([item], pad_id).to(device)
        layout = Layout.of(len(item.prompt_ids) + len(item.output_ids), copies, [1.0] * copies, None)
        logits, labels, picked = pard_logits(draft, batch, [layout], mask_token)
        truth = batch.topk_ids[labels, 0].tolist()  # the target's greedy token after each row's position
        right = {(a, t): guess == token for (_, a, t), guess, token in zip(picked, logits.argmax(-1).tolist(), truth)}
        first = len(item.prompt_ids) - 1
        for root in range(first, first + len(item.output_ids)):
            run = 0
            while run < copies and right.get((run, root + run), False):
                run += 1
            accepted, roots = accepted + run, roots + 1
            for depth in range(copies):
                if (depth, root + depth) in right:
                    tried[depth] += 1
                    hits[depth] += right[(depth, root + depth)]
    return {
        "tokens_per_step": round(1 + accepted / max(roots, 1), 4),
        "depth_accuracy": [round(h / n, 4) if n else None for h, n in zip(hits, tried)],
    }


def adapt(cfg: DictConfig, lm, start: LoadedDraft, data: list[SelfDistilled]) -> tuple[torch.nn.Module, dict]:
    """Give the starting draft a mask token and train it on the parallel-draft objective; the draft and its record."""
    check_soft_labels(data)
    train_items, heldout_items = split_heldout(data, cfg.train.eval_sequences)
    torch.manual_seed(cfg.train.seed)
    draft = copy.deepcopy(start.model) if start.model is lm.model else start.model  # never train the target itself
    draft = draft.float().train().requires_grad_(True)
    mask_token = with_mask_token(draft, cfg.pard.mask_token)
    pad_id = min(lm.eos_ids) if lm.eos_ids else 0
    copies, shares = cfg.pard.copies, keep_shares(cfg.pard)
    generator = torch.Generator().manual_seed(cfg.train.seed)
    device = next(draft.parameters()).device
    before = heldout_steps(draft, heldout_items, copies, mask_token, pad_id)

    def loss_of(chosen: list[SelfDistilled]) -> torch.Tensor:
        batch = collate(chosen, pad_id).to(device)
        layouts = [Layout.of(int(length), copies, shares, generator) for length in batch.mask.sum(dim=1)]
        logits, labels, _ = pard_logits(draft, batch, layouts, mask_token)
        return distillation_loss(logits, soft_rows(batch, labels), cfg.train.soft_weight, cfg.train.hard_weight)

    training = train_loop(draft, train_items, cfg.train, cfg.progress, "adapt PARD draft", loss_of)
    after = heldout_steps(draft, heldout_items, copies, mask_token, pad_id)
    return draft, {
        "target": {"name": lm.name, "path": lm.path},
        "start": start.part,
        "mask_token": mask_token,
        "settings": {"prompts": container(cfg.prompts), "pard": container(cfg.pard), "train": container(cfg.train)},
        "data": {
            "digest": digest([asdict(item) for item in data]),
            **data_summary(data),
            "train_sequences": len(train_items),
            "heldout_sequences": len(heldout_items),
        },
        "training": training,
        "heldout": {"before_training": before, "after_training": after},
    }


def settings_digest(cfg: DictConfig, start: str) -> str:
    """Digest of what defines the adapted draft: the target, the starting draft, the data and every setting."""
    prompts = container(cfg.prompts)
    prompts.pop("batch_size")
    return digest(
        {
            "model": cfg.model.name,
            "start": start,
            "prompts": prompts,
            "pard": container(cfg.pard),
            "train": container(cfg.train),
        }
    )


def main(overrides: list[str]) -> Path:
    """Adapt (or find) the PARD draft of ``model`` and report its held-out tokens per step before and after."""
    cfg = compose_train("pard", overrides)
    validate(cfg)
    out_dir = Path(cfg.output_dir).expanduser() if cfg.output_dir else part_kind("pard").folder(cfg.model.name)
    began = time.perf_counter()
    with building(out_dir):
        lm = load_target(cfg)
        start = load_draft(cfg.model.get("draft"), lm.name, lm.model, lm.tokenizer)
        settings = settings_digest(cfg, start.part)
        if not cfg.force and trained_with(out_dir, settings):
            print(f"[specbench] the PARD draft for {cfg.model.name} is up to date: {out_dir} (force=true retrains)")
            return out_dir
        data = self_distilled(lm, cfg.prompts, cfg.data_dir, cfg.progress, cfg.train.eval_sequences)
        draft, record = adapt(cfg, lm, start, data)
        record.update(settings_digest=settings, total_seconds=round(time.perf_counter() - began, 1))
        save_draft(draft, lm.tokenizer, out_dir, record, part_kind("pard").title, "tokens_per_step")
    before, after = record["heldout"]["before_training"], record["heldout"]["after_training"]
    print(
        f"[specbench] PARD draft for {cfg.model.name}: {out_dir}; held-out tokens per step with K = {cfg.pard.copies}: "
        f"{before['tokens_per_step']} before, {after['tokens_per_step']} after (mask token {record['mask_token']})"
    )
    return out_dir
