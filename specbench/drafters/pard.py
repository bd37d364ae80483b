"""PARD (An et al., ICLR 2026): a parallel draft model that drafts K tokens in one forward.

The draft is a small causal LM adapted (``python -m specbench.train pard``) so that a mask token stands for a position
whose token is not known yet. Each step it reads the committed tokens it has not seen, then K - 1 mask tokens, in one
causal forward: its logits after the last committed token and after each mask are the laws of the K drafted tokens
(one draft forward per step, whatever K). The mask rows leave its cache after the step, and the accepted tokens are fed
with the next step's masks. At T = 0 each drafted token is its row's argmax; at T > 0 it is drawn from its row warped
like the target and the row is recorded for the ``speculative`` (or ``block``) rule: every drafted token's law is fixed
before it is drawn, so verification stays exact. Paper symbols and defaults: docs/methods/pard.md.
"""

from __future__ import annotations

from typing import ClassVar

from specbench.core.drafter import DecodeContext, knob_int
from specbench.core.tree import DraftTree
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.tree_fill import chain_from_rows
from specbench.models.pard import mask_token_of


class Pard(DraftModelDrafter):
    """Drafts a chain of K tokens in one draft forward over the uncached committed tokens and K - 1 mask tokens."""

    DRAFT_PART: ClassVar[str] = "pard"

    def __init__(self, num_draft_tokens: int = 8, mask_token: int | None = None, **draft_settings):
        self.num_draft = knob_int("num_draft_tokens", num_draft_tokens, 1, "K")
        self.given_mask = None if mask_token is None else knob_int("mask_token", mask_token, 0)
        self.mask_token = -1  # the draft's mask token id, set by setup
        super().__init__(**draft_settings)

    def setup(self, target, tokenizer) -> None:
        """Load the draft; take its mask token from ``method.drafter.mask_token``, else its config (``pard_token``),
        else its node (``mask_token``: random drafts)."""
        super().setup(target, tokenizer)
        assert self.lm is not None  # loaded by super().setup
        self.mask_token = mask_token_of(
            self.lm.model.config,
            self.given_mask,
            (self.draft_cfg or {}).get("mask_token"),
            self.lm.draft_vocab,
            str(self.draft_path),
            f"Adapt one with `python -m specbench.train pard model={self.target_name}`, or set "
            f"method.drafter.mask_token=<id>",
        )

    def draft_tree(self, ctx: DecodeContext) -> DraftTree:
        """K drafted tokens (fewer near the budget's end) from one forward over the new tokens and K - 1 masks."""
        budget = min(self.num_draft, ctx.remaining - 1)
        if budget < 1:
            return DraftTree.root_only(ctx.root)
        assert self.lm is not None  # loaded by setup
        rows = self.lm.sync_with_tail(ctx.tokens, [self.mask_token] * (budget - 1))  # [budget, vocab]
        return chain_from_rows(ctx.root, rows, ctx.draft_law(True), ctx.generator)

    def update(self, ctx: DecodeContext, tree: DraftTree, accepted) -> None:
        """Nothing to roll back: the cache holds committed tokens only (the masks left it), and the next step's
        ``sync_with_tail`` feeds the accepted ones."""

    def stats(self) -> dict:
        """The draft model's stats, with K and the mask token."""
        return {**super().stats(), "num_draft_tokens": self.num_draft, "mask_token": self.mask_token}
