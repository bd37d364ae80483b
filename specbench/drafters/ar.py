"""AR: the drafter that proposes nothing, so every step is one ordinary autoregressive forward."""

from __future__ import annotations

from specbench.core.tree import DraftTree
from specbench.drafters.base import DecodeContext, Drafter


class NoDraft(Drafter):
    """Autoregressive baseline on the shared loop: verify the root alone."""

    def propose(self, ctx: DecodeContext) -> DraftTree:
        return DraftTree.root_only(ctx.root)
