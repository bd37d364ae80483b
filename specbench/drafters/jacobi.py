"""Helpers of the drafters that run Jacobi iterations in aux rows (LADE's window, Self-Draft's branches)."""

from __future__ import annotations

import torch


def random_prompt_tokens(prompt: list[int], n: int, generator: torch.Generator | None) -> list[int]:
    """``n`` tokens drawn uniformly (with replacement) from ``prompt`` with the run's RNG (window / branch pads)."""
    if n <= 0:
        return []
    picks = torch.randint(len(prompt), (n,), generator=generator).tolist()
    return [prompt[i] for i in picks]


def row_argmax(logits: torch.Tensor, start: int, stop: int) -> list[int]:
    """Greedy tokens of rows ``start..stop-1`` of a logits block [m, vocab] (one device sync)."""
    return logits[start:stop].argmax(dim=-1).tolist()
