"""Self-distilled sequences as padded training batches with the teacher's soft labels at answer rows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.errors import ConfigError
from specbench.train.selfdistill import SelfDistilled


@dataclass
class Batch:
    """Right-padded sequences and, for every answer row, where it is and what the teacher predicted there.

    Row ``(b, t)`` is the position whose next-token prediction is answer token ``t - prompt_len + 1``
    of sequence ``b``: the last prompt position predicts the first answer token.
    """

    ids: torch.Tensor  # [batch, width] prompt + answer tokens, right-padded
    mask: torch.Tensor  # [batch, width] 1 = real token
    row_batch: torch.Tensor  # [rows] sequence index of each answer row
    row_pos: torch.Tensor  # [rows] position of each answer row
    topk_ids: torch.Tensor  # [rows, k] the teacher's top-k tokens there, best first
    topk_logprobs: torch.Tensor  # [rows, k] their log-probabilities under the teacher

    @property
    def teacher_argmax(self) -> torch.Tensor:
        """[rows] the target's greedy token at each answer row."""
        return self.topk_ids[:, 0]

    def lengths(self) -> list[int]:
        """Number of answer rows of each sequence, in order."""
        return torch.bincount(self.row_batch, minlength=self.ids.shape[0]).tolist()

    def to(self, device: torch.device) -> Batch:
        """The same batch on ``device``."""
        return Batch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def check_soft_labels(data: list[SelfDistilled]) -> None:
    """Distillation needs the teacher's top-k records (prompts.teacher_topk >= 1)."""
    if any(item.topk_ids is None for item in data):
        raise ConfigError(
            "draft distillation needs the target's top-k log-probs in the self-distilled data: "
            "set prompts.teacher_topk >= 1"
        )


def collate(items: list[SelfDistilled], pad_id: int) -> Batch:
    """Pad ``items`` to one batch and gather their answer rows' soft labels."""
    sequences = [item.prompt_ids + item.output_ids for item in items]
    width = max(map(len, sequences))
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)  # [batch, width]
    mask = torch.zeros_like(ids)
    row_batch: list[int] = []
    row_pos: list[int] = []
    topk_ids: list[list[int]] = []
    topk_logprobs: list[list[float]] = []
    for b, (item, seq) in enumerate(zip(items, sequences)):
        assert item.topk_ids is not None and item.topk_logprobs is not None  # soft labels (check_soft_labels)
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
        first = len(item.prompt_ids) - 1
        row_batch += [b] * len(item.output_ids)
        row_pos += range(first, first + len(item.output_ids))
        topk_ids += item.topk_ids
        topk_logprobs += item.topk_logprobs
    return Batch(
        ids,
        mask,
        torch.tensor(row_batch),
        torch.tensor(row_pos),
        torch.tensor(topk_ids),  # [rows, k]
        torch.tensor(topk_logprobs),  # [rows, k]
    )


def answer_logits(model, batch: Batch) -> torch.Tensor:
    """[rows, vocab] the model's next-token logits at the answer rows (the LM head only runs there).

    NOTE: the LM head (hidden x vocab) dominates a small draft's cost; skipping prompt rows saves
    about half of it.
    """
    hidden = model.get_decoder()(input_ids=batch.ids, attention_mask=batch.mask).last_hidden_state  # [b, w, h]
    rows = hidden[batch.row_batch, batch.row_pos]  # [rows, hidden]
    return model.get_output_embeddings()(rows).float()  # [rows, vocab]
