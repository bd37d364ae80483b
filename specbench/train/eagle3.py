"""EAGLE-3 head training (Li et al. 2025): token prediction with training-time test, on a FROZEN target.

``python -m specbench.train eagle3 model=smollm2_135m [head.*=...] [train.*=...] [prompts.*=...]``

Data: the target's self-distilled answers (``specbench.train.selfdistill``, shared with the Medusa, EAGLE and
Hydra heads). The target runs once per sequence; the hidden states at the three fused layers are kept
(``specbench.models.eagle3_heads.fused_layers``). The draft vocabulary is the ``head.draft_vocab_size`` target
tokens most frequent in the training answers (ties by id), mapped back by ``d2t``.

Training-time test (``unroll``): step 0 feeds every pair (g_t, x_{t+1}) of a sequence causally, as decoding
feeds committed pairs; step j >= 1 feeds, at every anchor t, the head's own step j-1 output with the token
x_{t+1+j}, at position t + j, seeing the true pairs up to t and its own chain of steps 1..j at t (the rows
decoding builds for a draft j + 1 deep). Step j's output at t drafts x_{t+2+j}. Loss: sum over steps of
``step_decay ** j`` x the cross-entropy of the target's next-token law at t+1+j (its top-k log-probs recorded
during self-distillation), restricted to the draft vocabulary and renormalised, against the head's draft-vocabulary
logits; positions whose top-1 token is outside the draft vocabulary are left out (as the authors'
training does). There is no feature regression.

Held-out evaluation is the same unroll without gradients: ``accuracy.top1[k-1]`` is the share of anchors t >=
P - 1 where the depth-k draft's argmax is the target's token x_{t+1+k} (comparable with the EAGLE and Medusa
heads' per-depth top-1). A second run with the same settings is a no-op unless ``force=true``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.models.llama.modeling_llama import repeat_kv

from specbench.models.eagle3_heads import Eagle3Head, fused_layers, save_head
from specbench.models.eagle_heads import config_for_target
from specbench.models.vocab import most_frequent
from specbench.train.common import (
    TrainerSettings,
)
from specbench.train.eagle import Sequence, answer_rows, depth_accuracy, extract_features
from specbench.train.heads import HeadOptimizerSettings, HeadTrainer, run_head_trainer
from specbench.train.medusa import autocast, fit
from specbench.train.selfdistill import SelfDistilled

LM_HEAD_INITS = ("target", "random")


@dataclass
class Eagle3HeadSettings:
    """The types of ``head.*``."""

    draft_vocab_size: int | None
    layers: list[int] | None
    init_lm_head: str
    fc_norm: bool = False  # EAGLE-3.1's norms (conf/train/eagle3_1.yaml sets them; absent: EAGLE-3)
    norm_output: bool = False


@dataclass
class Eagle3Training(HeadOptimizerSettings):
    """The types of ``train.*`` of the EAGLE-3 head."""

    ttt_steps: int
    ttt_anchors: int | None
    step_decay: float
    eval_depth: int


@dataclass
class Eagle3Settings(TrainerSettings):
    """The types of every setting of ``python -m specbench.train eagle3`` (conf/train/eagle3.yaml)."""

    head: Eagle3HeadSettings
    train: Eagle3Training


def draft_vocabulary(sequences: list[Sequence], size: int | None, vocab: int) -> torch.Tensor | None:
    """The ``size`` target tokens most frequent in the training answers (ties by id), sorted; None = all."""
    counts = Counter(token for item in sequences for token in item.ids[item.prompt_len :].tolist())
    return most_frequent(counts, size, vocab)


@dataclass
class Batch:
    """Right-padded sequences for the unroll, with the teacher's law at every position u (predicting x_{u+1})."""

    fused: torch.Tensor  # [B, L, 3H] g_t inputs, t = 0 .. L-1 (L = longest T - 1)
    ids: torch.Tensor  # [B, L + 1 + steps] tokens x_0 .. (0 beyond a sequence)
    lengths: torch.Tensor  # [B] T
    prompt_lens: torch.Tensor  # [B] P
    teacher_ids: torch.Tensor  # [B, L + 1 + steps, k] the target's top-k at position u (valid: u in [P - 1, T - 2])
    teacher_logprobs: torch.Tensor  # [B, L + 1 + steps, k]


def collate(items: list[Sequence], steps: int) -> Batch:
    """Pad ``items`` into one batch; ``ids`` and the teacher carry ``steps`` more columns for the deepest step."""
    width = max(item.ids.numel() for item in items) - 1
    k = items[0].topk_ids.shape[1]
    fused = torch.zeros(len(items), width, items[0].features.shape[1])
    ids = torch.zeros(len(items), width + 1 + steps, dtype=torch.long)
    teacher_ids = torch.zeros(len(items), width + 1 + steps, k, dtype=torch.long)
    teacher_logprobs = torch.full((len(items), width + 1 + steps, k), -torch.inf)
    for b, item in enumerate(items):
        length, prompt = item.ids.numel(), item.prompt_len
        fused[b, : length - 1] = item.features[:-1]
        ids[b, :length] = item.ids
        teacher_ids[b, prompt - 1 : length - 1] = item.topk_ids
        teacher_logprobs[b, prompt - 1 : length - 1] = item.topk_logprobs
    lengths = torch.tensor([item.ids.numel() for item in items])
    prompt_lens = torch.tensor([item.prompt_len for item in items])
    return Batch(fused, ids, lengths, prompt_lens, teacher_ids, teacher_logprobs)


CHAIN_ATTENTION = "specbench_eagle3_chain"


def chain_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Attention of unroll steps >= 1 without the blocked keys: query i sees the true pairs the additive
    ``attention_mask`` [B or 1, 1, n, P] allows (P = the first keys, step 0's) and row i of every later block of n
    keys (its own chain). query [B, h, n, d], key / value [B, kv, P + j n, d] -> output [B, n, h, d]."""
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    n, prefix = query.shape[2], attention_mask.shape[-1]
    own_keys = key[:, :, prefix:].unflatten(2, (-1, n))  # [B, h, j, n, d]
    own_values = value[:, :, prefix:].unflatten(2, (-1, n))
    true_scores = query @ key[:, :, :prefix].transpose(-1, -2) * scaling + attention_mask  # [B, h, n, P]
    own_scores = (query.unsqueeze(2) * own_keys).sum(-1).transpose(2, 3) * scaling  # [B, h, n, j]
    weights = torch.softmax(torch.cat([true_scores, own_scores], dim=-1).float(), dim=-1).to(query.dtype)
    out = weights[..., :prefix] @ value[:, :, :prefix]  # [B, h, n, d]
    out = out + (weights[..., prefix:].transpose(2, 3).unsqueeze(-1) * own_values).sum(2)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(CHAIN_ATTENTION, chain_attention)


def additive(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An additive mask [B or 1, 1, q, k] from a blocked-key bool tensor [B or 1, q, k]."""
    return torch.zeros(blocked.shape, dtype=dtype).masked_fill(blocked, torch.finfo(dtype).min)[:, None]


def unroll(
    head: Eagle3Head, batch: Batch, steps: int, anchors: torch.Tensor, device: torch.device, amp_dtype
) -> list[torch.Tensor]:
    """The head's outputs at unroll steps 0 .. steps - 1 (training-time test; module docstring): step 0 over
    every pair [B, L, H]; steps >= 1 at the ``anchors`` [B, n] (indices t) only, [B, n, H]."""
    fused = batch.fused.to(device)  # [B, L, 3H]
    size, length = fused.shape[:2]
    cache = DynamicCache(config=head.config)  # plain: rows concatenate, so gradients flow through earlier steps
    causal = additive(torch.ones(1, length, length, dtype=torch.bool).triu(1), torch.float32).to(device)
    with autocast(device, amp_dtype):
        outputs = [
            head(
                fused,
                batch.ids[:, 1 : 1 + length].to(device),
                torch.arange(length, device=device)[None].expand(size, -1),
                causal,
                cache,
            )
        ]
    anchors = anchors.to(device)
    sees_true = additive(
        torch.arange(length, device=device)[None, None] > anchors[:, :, None], torch.float32
    )  # [B, 1, n, L]
    inputs = outputs[0].gather(1, anchors[..., None].expand(-1, -1, outputs[0].shape[-1]))  # [B, n, H]
    implementation, head.config._attn_implementation = head.config._attn_implementation, CHAIN_ATTENTION
    try:
        for step in range(1, steps):
            tokens = batch.ids.to(device).gather(1, anchors + 1 + step)  # [B, n] x_{t+1+step}
            with autocast(device, amp_dtype):
                inputs = head(inputs, tokens, anchors + step, sees_true, cache)  # [B, n, H]
            outputs.append(inputs)
    finally:
        head.config._attn_implementation = implementation
    return outputs


def all_anchors(batch: Batch) -> torch.Tensor:
    """Every position t of every sequence as an anchor [B, L] (step 0's rows; the evaluation's every step)."""
    size, length = batch.fused.shape[:2]
    return torch.arange(length)[None].expand(size, -1)


def sample_anchors(batch: Batch, count: int | None, generator: torch.Generator) -> torch.Tensor:
    """``count`` anchors per sequence [B, n] drawn without replacement from those whose step-1 draft has a teacher
    law (all anchors when ``count`` is None); short sequences are padded with L - 1, which no step trains."""
    if count is None:
        return all_anchors(batch)
    length = batch.fused.shape[1]
    rows = []
    for prompt, total in zip(batch.prompt_lens.tolist(), batch.lengths.tolist()):
        valid = torch.arange(max(prompt - 3, 0), total - 3)  # u = t + 2 in [P - 1, T - 2]
        chosen = valid[torch.randperm(valid.numel(), generator=generator)[:count]]
        rows.append(torch.cat([chosen, torch.full((count - chosen.numel(),), length - 1)]))
    return torch.stack(rows)


def step_rows(batch: Batch, step: int, anchors: torch.Tensor) -> torch.Tensor:
    """[B, n] bool: anchors t whose step-``step`` draft has a teacher law (u = t + 1 + step in [P - 1, T - 2])."""
    u = anchors + 1 + step
    return (u >= batch.prompt_lens[:, None] - 1) & (u <= batch.lengths[:, None] - 2)


def step_loss(
    head: Eagle3Head,
    out: torch.Tensor,
    batch: Batch,
    step: int,
    anchors: torch.Tensor,
    to_draft: torch.Tensor,
    amp_dtype,
) -> torch.Tensor | None:
    """Soft cross-entropy of step ``step`` (outputs [B, n, H] at ``anchors`` [B, n]): the teacher's top-k law
    restricted to the draft vocabulary; None when no row of the batch has one."""
    device = out.device
    rows = step_rows(batch, step, anchors)  # [B, n]
    u = (anchors + 1 + step).clamp(max=batch.teacher_ids.shape[1] - 1)  # [B, n]
    teacher_ids = batch.teacher_ids[torch.arange(u.shape[0])[:, None], u][rows]  # [m, k] target ids
    teacher_lp = batch.teacher_logprobs[torch.arange(u.shape[0])[:, None], u][rows]  # [m, k]
    draft_ids = to_draft[teacher_ids]  # [m, k] draft index, -1 outside the draft vocabulary
    keep = draft_ids[:, 0] >= 0  # the target's top-1 must be draftable
    if not keep.any():
        return None
    law = torch.softmax(teacher_lp[keep].masked_fill(draft_ids[keep] < 0, -torch.inf), dim=-1).to(device)  # [m, k]
    with autocast(device, amp_dtype):
        logits = head.draft_logits(out[rows.to(device)][keep.to(device)])  # [m, draft_vocab]
    logq = torch.log_softmax(logits.float(), dim=-1).gather(1, draft_ids[keep].clamp(min=0).to(device))  # [m, k]
    return -(law * logq).sum(dim=-1).mean()


def target_to_draft(head: Eagle3Head, vocab: int) -> torch.Tensor:
    """[vocab] long: each target token's draft index, -1 where the draft vocabulary lacks it (CPU)."""
    to_draft = torch.full((vocab,), -1, dtype=torch.long)
    to_draft[head.draft_tokens().cpu()] = torch.arange(head.draft_vocab_size)
    return to_draft


def build_head(target, head_cfg, draft_tokens: torch.Tensor | None, device: torch.device) -> Eagle3Head:
    """A fresh float32 head sharing the target's (frozen) embeddings; its LM head optionally starts from the
    target's rows of the draft tokens (and its norm from the target's final norm); EAGLE-3.1's norms where
    ``head_cfg`` asks for them."""
    config = config_for_target(target)
    config.fc_norm, config.norm_output = bool(head_cfg.get("fc_norm")), bool(head_cfg.get("norm_output"))
    head = Eagle3Head(config, draft_tokens, target.get_input_embeddings())
    if head_cfg.init_lm_head == "target":
        rows = head.draft_tokens()
        with torch.no_grad():
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[rows].float())
            head.norm.weight.copy_(target.get_decoder().norm.weight.float())
    return head.to(device=device, dtype=torch.float32)


def train_head(head: Eagle3Head, train: list[Sequence], cfg, to_draft: torch.Tensor, device, progress: bool) -> dict:
    """AdamW on the decayed sum of unroll-step losses until train.max_steps or train.max_minutes; returns a record
    whose loss curve holds [step, loss of unroll step 0, 1, ...]."""

    def losses_of(index: list[int], generator: torch.Generator) -> tuple[torch.Tensor | None, list[float]]:
        batch = collate([train[i] for i in index], cfg.ttt_steps)
        anchors = sample_anchors(batch, cfg.ttt_anchors, generator)
        outputs = unroll(head, batch, cfg.ttt_steps, anchors, device, cfg.amp_dtype)
        losses = [
            step_loss(head, out, batch, j, anchors if j else all_anchors(batch), to_draft, cfg.amp_dtype)
            for j, out in enumerate(outputs)
        ]
        weighted = [cfg.step_decay**j * loss for j, loss in enumerate(losses) if loss is not None]
        objective = torch.stack(weighted).sum() if weighted else None
        return objective, [loss.item() if loss is not None else float("nan") for loss in losses]

    return fit(head, len(train), cfg, "eagle-3 head", progress, losses_of)


@torch.no_grad()
def evaluate(head: Eagle3Head, sequences: list[Sequence], depth: int, top_k: int, device: torch.device) -> dict:
    """Held-out top-1 / top-k accuracy of the depth-k draft (k = 1..depth) from anchors t >= P - 1, drafting from
    the head's own outputs with the target's tokens teacher-forced (the unroll)."""
    hits1, hitsk, seen = torch.zeros(depth), torch.zeros(depth), torch.zeros(depth)
    draft_tokens = head.draft_tokens()
    for item in sequences:
        batch = collate([item], depth)
        length = batch.fused.shape[1]
        for k, out in enumerate(unroll(head, batch, depth, all_anchors(batch), device, None), start=1):
            anchors = torch.arange(length)
            rows = (anchors >= item.prompt_len - 1) & (anchors + 1 + k <= item.ids.numel() - 1)  # [L]
            if not rows.any():
                break
            logits = head.draft_logits(out[0, rows.to(device)]).float()  # [r, draft_vocab]
            best = draft_tokens[logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices].cpu()  # [r, top_k]
            truth = item.ids[anchors[rows] + 1 + k]  # [r]
            hits1[k - 1] += (best[:, 0] == truth).sum()
            hitsk[k - 1] += (best == truth[:, None]).any(dim=-1).sum()
            seen[k - 1] += int(rows.sum())
    return depth_accuracy(hits1, hitsk, seen, top_k)


def vocabulary_coverage(sequences: list[Sequence], head: Eagle3Head) -> float:
    """The share of answer tokens the draft vocabulary holds (1.0 for a full vocabulary)."""
    inside = set(head.draft_tokens().tolist())
    answers = [token for item in sequences for token in item.ids[item.prompt_len :].tolist()]
    return round(sum(token in inside for token in answers) / max(len(answers), 1), 4)


class Eagle3Trainer(
    HeadTrainer[list[Sequence]],
    command="eagle3",
    name="EAGLE-3",
    head_key="head",
    schema=Eagle3Settings,
    soft_labels=True,
):
    """The EAGLE-3 part of the shared head-training flow: fused low/mid/high features, training-time test."""

    table_rows = "depth"
    head: Eagle3Head

    def __init__(self, lm, cfg) -> None:
        super().__init__(lm, cfg)
        self.layers = fused_layers(lm.model.config.num_hidden_layers, cfg.head.layers)
        self.vocab = lm.model.get_output_embeddings().weight.shape[0]

    @classmethod
    def range_checks(cls, head, train) -> list[tuple[bool, str]]:
        """(holds, message) for ``head.*`` and EAGLE-3's own ``train.*`` keys."""
        return [
            (
                head.draft_vocab_size is None or head.draft_vocab_size >= 2,
                f"head.draft_vocab_size must be >= 2 or null (got {head.draft_vocab_size})",
            ),
            (
                head.init_lm_head in LM_HEAD_INITS,
                f"head.init_lm_head must be one of {LM_HEAD_INITS} (got {head.init_lm_head!r})",
            ),
            (train.ttt_steps >= 1, f"train.ttt_steps must be >= 1 (got {train.ttt_steps})"),
            (
                train.ttt_anchors is None or train.ttt_anchors >= 1,
                f"train.ttt_anchors must be >= 1 or null (got {train.ttt_anchors})",
            ),
            (0 < train.step_decay <= 1, f"train.step_decay must be in (0, 1] (got {train.step_decay})"),
            (train.eval_depth >= 1, f"train.eval_depth must be >= 1 (got {train.eval_depth})"),
            (train.max_length >= 4, f"train.max_length must be >= 4 (got {train.max_length})"),
        ]

    def features(self, data: list[SelfDistilled]) -> list[Sequence]:
        """The target's hidden states at the fused layers, concatenated, with its recorded top-k laws."""
        cfg = self.cfg
        return extract_features(self.lm.model.base_model, data, cfg.train.max_length, cfg.progress, self.layers)

    def build(self, train: list[Sequence]) -> str:
        """A fresh head over the draft vocabulary the training answers use most."""
        head_cfg = self.cfg.head
        draft_tokens = draft_vocabulary(train, head_cfg.draft_vocab_size, self.vocab)
        self.head = build_head(self.lm.model, head_cfg, draft_tokens, self.lm.model.device)
        self.coverage = vocabulary_coverage(train, self.head)
        return (
            f"an EAGLE-3 head (fused layers {list(self.layers)}, draft vocabulary {self.head.draft_vocab_size} of "
            f"{self.vocab} tokens, {self.coverage:.1%} of answer tokens) on {len(train)} sequences "
            f"({answer_rows(train)} answer positions), {self.cfg.train.ttt_steps} unroll steps"
        )

    def fit(self, train: list[Sequence]) -> dict:
        """AdamW on the unrolled training-time-test losses."""
        to_draft = target_to_draft(self.head, self.vocab)
        return train_head(self.head, train, self.cfg.train, to_draft, self.lm.model.device, self.cfg.progress)

    def evaluate(self, held_out: list[Sequence]) -> dict:
        """Per-depth top-1 / top-k accuracy of the head's own chains on the held-out sequences."""
        train = self.cfg.train
        return evaluate(self.head, held_out, train.eval_depth, train.eval_top_k, self.lm.model.device)

    def record(self, train: list[Sequence], accuracy: dict) -> dict:
        """The fused layers, the draft vocabulary's coverage and the answer positions trained on."""
        return {
            "fused_layers": list(self.layers),
            "draft_vocab_coverage": self.coverage,
            "train_answer_positions": answer_rows(train),
        }

    def save(self, folder: Path, record: dict) -> None:
        """The head in the authors' checkpoint layout (config.json names the fused layers), with the record."""
        save_head(self.head, folder, self.lm.path, self.layers, record)


def main(overrides: list[str]) -> Path:
    """Train (or reuse) the EAGLE-3 head for ``model``; print and save its per-depth held-out accuracy."""
    return run_head_trainer(Eagle3Trainer, overrides)
