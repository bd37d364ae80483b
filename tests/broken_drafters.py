"""Drafters with one bug each: the negative controls of the conformance suite and of the loop's boundary checks.

Each wraps prompt lookup (``specbench.drafters.pld``), so it drafts on the conformance prompts, and breaks the
contract in one way: a token id outside the vocabulary, a parent list changed after the tree was built, rows left in
the target's KV cache, a crash of its own, or draft probabilities that misreport a deterministic draft. A method
config naming one (``_target_: tests.broken_drafters.<Class>``) makes it a method like any other.
"""

from __future__ import annotations

import torch

from specbench.core.drafter import DecodeContext
from specbench.core.tree import DraftTree
from specbench.drafters.pld import PromptLookup

MISREPORTED_Q = 0.9
"""The probability the misreporting drafter claims for the token it drafts with certainty."""


class OutOfVocabulary(PromptLookup):
    """Drafts its lookup, then one token id past the end of the target's vocabulary."""

    def setup(self, target, tokenizer) -> None:
        super().setup(target, tokenizer)
        self.vocab = target.get_input_embeddings().num_embeddings

    def propose(self, ctx: DecodeContext) -> DraftTree:
        tree = super().propose(ctx)
        return DraftTree.chain(ctx.root, [*tree.tokens[1:], self.vocab])


class ForwardParent(PromptLookup):
    """Drafts a chain of two, then points the first node's parent at the second (after construction)."""

    def propose(self, ctx: DecodeContext) -> DraftTree:
        tree = DraftTree.chain(ctx.root, [ctx.root, ctx.root])
        tree.parents[1] = 2
        return tree


class LeftoverRows(PromptLookup):
    """Runs the target on the decode context's KV cache (as a self-speculative drafter does) and never crops it."""

    def setup(self, target, tokenizer) -> None:
        super().setup(target, tokenizer)
        self.target = target

    def propose(self, ctx: DecodeContext) -> DraftTree:
        self.target(input_ids=torch.tensor([[ctx.root]]), past_key_values=ctx.cache, use_cache=True)
        return super().propose(ctx)


class Crashing(PromptLookup):
    """Fails inside its own code at the first step."""

    def propose(self, ctx: DecodeContext) -> DraftTree:
        return DraftTree.chain(ctx.root, [[1, 2][ctx.step + 5]])


class MisreportedQ(PromptLookup):
    """Proposes its lookup deterministically but tells the ``speculative`` rule it drew each drafted token from a law
    giving it only ``reported_q`` (the rest spread evenly): the rule then accepts drafts too often (lossy)."""

    def __init__(self, reported_q: float = MISREPORTED_Q, **lookup):
        super().__init__(**lookup)
        self.reported_q = reported_q

    def setup(self, target, tokenizer) -> None:
        super().setup(target, tokenizer)
        self.vocab = target.get_output_embeddings().out_features

    def propose(self, ctx: DecodeContext) -> DraftTree:
        tree = super().propose(ctx)
        if tree.num_drafted:
            rows = torch.full((len(tree), self.vocab), (1 - self.reported_q) / (self.vocab - 1))  # [nodes, vocab]
            for node in range(1, len(tree)):
                rows[tree.parents[node], tree.tokens[node]] = self.reported_q
            tree.draft_probs = rows
        return tree
