"""AR: the drafter that proposes nothing, so every step is one ordinary autoregressive forward."""

from __future__ import annotations

from specbench.core.drafter import DecodeContext, Drafter
from specbench.core.tree import DraftTree


class NoDraft(Drafter):
    """Autoregressive baseline on the shared loop: verify the root alone."""

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """The root alone: one ordinary autoregressive step."""
        return DraftTree.root_only(ctx.root)
