"""The Drafter interface: the only place where methods differ."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.tree import DraftTree
from specbench.core.verify import VerifyOutput


@dataclass
class DecodeContext:
    """What a drafter may read about the decode in progress."""

    tokens: list[int]  # prompt + committed output; tokens[-1] is the root x (KV not cached)
    prompt_len: int
    remaining: int  # tokens still allowed by max_new_tokens (the root's successor included)
    step: int  # verify steps done so far in this generation
    generator: torch.Generator | None  # the run's seeded RNG (random pads, sampled drafts)

    @property
    def root(self) -> int:
        return self.tokens[-1]

    @property
    def position(self) -> int:
        """Position p of the root token."""
        return len(self.tokens) - 1


class Drafter:
    """Proposes a DraftTree each step and learns from what the target accepted.

    Subclasses override ``propose`` (and usually ``observe``/``stats``). ``wants_hidden`` declares
    that ``observe`` needs the last hidden states of the tree rows (Medusa heads); aux-row logits
    arrive whenever the proposed tree carries an aux block.
    """

    wants_hidden: bool = False

    def setup(self, target, tokenizer) -> None:
        """Bind to the target model once per run (load draft models, build caches)."""

    def reset(self, prompt_ids: list[int]) -> None:
        """Start a new generation from ``prompt_ids`` (per-request state goes here)."""

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """The tree to verify this step; node 0 must be ``ctx.root``."""
        raise NotImplementedError

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified: VerifyOutput,
                accepted: Acceptance) -> None:
        """Learn from the verify pass (n-gram pools, tries, draft-cache rollback)."""

    def stats(self) -> dict:
        """Drafter internals for the per-sample record (pool sizes, hit rates, ...)."""
        return {}
