"""Reduced draft vocabularies (FR-Spec, Zhao et al. 2025): a drafter scores only the most frequent tokens.

A drafter's output layer costs hidden x vocab multiply-adds per row. On a 49,152-token vocabulary that is most
of a small draft's cost: 28M of the 35M per row of the two-layer distilled draft, and eight times an EAGLE
head's decoder layer. Restricting the DRAFT's output layer to the N most frequent target tokens costs N / vocab
of it and keeps decoding lossless, because the target still verifies every drafted token with its full
vocabulary; the only loss is that a token outside the set is never drafted.

The frequencies are counted once per target by ``python -m specbench.train vocab`` over the target's own
self-distilled answers (the data the drafts here are trained on, never evaluation prompts) and saved to
``$SPECBENCH_CACHE/vocab/<model>/ranking.json``. Tokens the answers never used rank after them, by id.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from specbench.core.drafter import knob_int
from specbench.errors import ModelUnavailable
from specbench.models.parts import part_kind

RANKING_FILE = "ranking.json"


def most_frequent(counts: Mapping[int, int], size: int | None, vocab: int) -> torch.Tensor | None:
    """The ``size`` tokens most frequent in ``counts`` (ties and unseen tokens by id), sorted; None = all."""
    if size is None or size >= vocab:
        return None
    seen = sorted((token for token in counts if 0 <= token < vocab), key=lambda token: (-counts[token], token))
    chosen = seen[:size]
    if len(chosen) < size:
        taken = set(chosen)
        chosen += [token for token in range(vocab) if token not in taken][: size - len(chosen)]
    return torch.tensor(sorted(chosen))


def size_knob(value: object) -> int | None:
    """``method.drafter.draft_vocab`` checked: a token count >= 1, or None for the whole vocabulary."""
    return None if value is None else knob_int("draft_vocab", value, 1, "N")


@dataclass(frozen=True)
class Ranking:
    """Token counts of a target's self-distilled answers, and the digest that names them in run artefacts."""

    counts: dict[int, int]
    digest: str


def load_ranking(target_name: str) -> Ranking:
    """The saved ranking of ``target_name``; a clear error, saying how to count it, when it is absent."""
    file = part_kind("vocab").folder(target_name) / RANKING_FILE
    if not file.is_file():
        raise ModelUnavailable(
            f"no token ranking for a reduced draft vocabulary at {file}; count it once with "
            f"`{part_kind('vocab').command_line(target_name)}` (it reads the target's self-distilled answers), "
            f"or drop method.drafter.draft_vocab to draft over the whole vocabulary"
        )
    record = json.loads(file.read_text())
    return Ranking({int(token): int(n) for token, n in record["counts"]}, record["digest"])


@dataclass(frozen=True)
class DraftVocabulary:
    """The target ids a drafter scores (sorted, [N]) and the artefact name runs record for them."""

    tokens: torch.Tensor
    part: str


def draft_vocabulary(size: int | None, target_name: str, vocab: int) -> DraftVocabulary | None:
    """The ``size`` most frequent tokens of the target's ranking; None for the whole vocabulary."""
    if size is None:
        return None
    ranking = load_ranking(target_name)
    tokens = most_frequent(ranking.counts, size, vocab)
    if tokens is None:
        return None
    return DraftVocabulary(tokens, f"vocab:{ranking.digest}:{size}")


def place_in_vocab(logits: torch.Tensor, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits over draft tokens [..., N] placed in the target vocabulary [..., vocab] (-inf elsewhere, float32)."""
    full = logits.new_full((*logits.shape[:-1], vocab), -math.inf, dtype=torch.float32)
    return full.index_copy_(-1, tokens.to(logits.device), logits.float())


class ReducedHead:
    """An output layer restricted to draft tokens: hidden [..., H] -> logits [..., vocab] (float32, -inf outside)."""

    def __init__(self, weight: torch.Tensor, tokens: torch.Tensor):
        self.vocab = weight.shape[0]
        self.tokens = tokens.to(weight.device)  # [N] target ids, sorted
        self.weight = weight.detach()[self.tokens].contiguous()  # [N, H] the kept rows, one contiguous block

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.nn.functional.linear(hidden.to(self.weight.dtype), self.weight)  # [..., N]
        return place_in_vocab(logits, self.tokens, self.vocab)
