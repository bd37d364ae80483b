"""The one decode loop: prefill -> [propose -> verify -> accept -> compact -> observe] until EOS/budget."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from specbench.core.acceptance import Acceptance, Sampling, accept_match, draw
from specbench.core.tree import DraftTree
from specbench.core.verify import compact_cache, forward_tree, new_cache, prefill
from specbench.drafters.base import DecodeContext, Drafter
from specbench.errors import ConfigError

AcceptFn = Callable[[DraftTree, torch.Tensor, Sampling, "torch.Generator | None"], Acceptance]


@dataclass
class Generation:
    """One generated continuation with its per-step trace (see ``specbench.schema``)."""

    output_ids: list[int]
    prefill_s: float
    target_forwards: int  # verify forwards after the prefill
    stop_reason: str  # "eos" | "max_new_tokens"
    accept_lengths: list[int] | None = field(default_factory=list)  # tokens emitted per step
    draft_tokens: list[int] | None = field(default_factory=list)  # drafted nodes verified per step
    step_s: list[float] | None = field(default_factory=list)  # wall time per step
    verify_s: list[float] | None = field(default_factory=list)  # target verify forward per step


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so wall-clock timings are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clip_emitted(tokens: list[int], eos_ids: frozenset[int], budget: int) -> tuple[list[int], str | None]:
    """Cut a step's tokens at the first EOS (kept) and at the remaining budget; say why it stopped."""
    for i, token in enumerate(tokens[:budget]):
        if token in eos_ids:
            return tokens[: i + 1], "eos"
    if len(tokens) >= budget:
        return tokens[:budget], "max_new_tokens"
    return tokens, None


class Decoder:
    """Runs the shared loop for one target model and one drafter."""

    def __init__(self, model, drafter: Drafter, eos_ids: frozenset[int], sampling: Sampling,
                 accept_fn: AcceptFn = accept_match):
        self.model = model
        self.drafter = drafter
        self.eos_ids = eos_ids
        self.sampling = sampling
        self.accept_fn = accept_fn

    def generate(self, prompt_ids: list[int], max_new_tokens: int,
                 generator: torch.Generator | None = None) -> Generation:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``."""
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not prompt_ids:
            raise ConfigError("cannot generate from an empty prompt (0 tokens)")
        device = self.model.device
        self.drafter.reset(list(prompt_ids))
        cache = new_cache(self.model)
        synchronize(device)
        start = time.perf_counter()
        first = draw(prefill(self.model, cache, torch.tensor(prompt_ids)), self.sampling, generator)
        synchronize(device)
        gen = Generation([first], time.perf_counter() - start, 0, "eos")
        tokens = [*prompt_ids, first]
        _, stop = clip_emitted([first], self.eos_ids, max_new_tokens)
        while stop is None:
            remaining = max_new_tokens - len(gen.output_ids)
            step_start = time.perf_counter()
            ctx = DecodeContext(tokens, len(prompt_ids), remaining, gen.target_forwards, generator)
            emitted, drafted, verify_s = self._step(ctx, cache)
            emitted, stop = clip_emitted(emitted, self.eos_ids, remaining)
            tokens.extend(emitted)
            gen.output_ids.extend(emitted)
            gen.target_forwards += 1
            gen.accept_lengths.append(len(emitted))
            gen.draft_tokens.append(drafted)
            gen.verify_s.append(verify_s)
            synchronize(device)
            gen.step_s.append(time.perf_counter() - step_start)
        gen.stop_reason = stop
        return gen

    def stats(self) -> dict:
        """The drafter's internals after the latest generation."""
        return self.drafter.stats()

    def _step(self, ctx: DecodeContext, cache) -> tuple[list[int], int, float]:
        """One propose -> verify -> accept -> compact -> observe.

        Returns (emitted tokens, drafted nodes, seconds in the target verify forward); the rest of
        the step's time is the method's overhead (drafting, acceptance, bookkeeping).
        """
        tree = self.drafter.propose(ctx)
        if tree.tokens[0] != ctx.root:
            raise RuntimeError(f"{type(self.drafter).__name__} proposed a tree whose root is not the last token")
        tree = tree.pruned(ctx.remaining - 1)  # deeper nodes could never be emitted
        past_len = ctx.position
        device = self.model.device
        synchronize(device)
        verify_start = time.perf_counter()
        verified = forward_tree(self.model, cache, tree, self.drafter.wants_hidden)
        synchronize(device)
        verify_s = time.perf_counter() - verify_start
        accepted = self.accept_fn(tree, verified.logits, self.sampling, ctx.generator)
        compact_cache(cache, past_len, accepted.path)
        self.drafter.observe(ctx, tree, verified, accepted)
        return accepted.emitted(tree), tree.num_drafted, verify_s
