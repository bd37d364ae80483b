"""Common base of the model-free chain drafters (ANPD, prompt lookup): one table, one chain per step."""

from __future__ import annotations

from specbench.core.drafter import DecodeContext, Drafter, knob_int
from specbench.core.tree import DraftTree


class NgramChainDrafter(Drafter):
    """Drafts one chain per step from a token table that follows the committed tokens.

    Subclasses say how to build the table (``new_table``) and how to draft from it (``draft``). The
    table is filled from the prompt in ``reset`` and synced lazily at the start of each ``propose``
    from ``ctx.tokens`` (every token after the last one fed): the loop may cut a step's tokens at EOS
    or the budget after ``observe``, so ``ctx.tokens`` is the only reliable record of what was
    committed.
    """

    COUNTERS = ("steps", "hits", "drafted", "accepted_tokens")

    def __init__(self, draft_len: int, draft_len_key: str, symbol: str):
        super().__init__()
        self.draft_len = knob_int(draft_len_key, draft_len, 1, symbol)
        self.table = self.new_table()  # built now so bad n-gram settings fail before the first request

    def new_table(self):
        """An empty table (``MultiLevelNgram`` or ``PromptLookupIndex``)."""
        raise NotImplementedError

    def draft(self, k: int) -> list[int]:
        """Up to ``k`` draft tokens continuing the table's history."""
        raise NotImplementedError

    def reset(self, prompt_ids: list[int]) -> None:
        """A fresh table filled from the prompt; nothing is carried across requests."""
        self.table = self.new_table()
        self.table.extend(prompt_ids)

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Sync the table with the committed tokens, then draft a chain of at most K (or remaining - 1)."""
        fed = len(self.table)
        if fed > len(ctx.tokens):
            raise RuntimeError(f"{type(self).__name__}: the context shrank below the {fed} tokens already fed")
        self.table.extend(ctx.tokens[fed:])
        draft = self.draft(min(self.draft_len, ctx.remaining - 1))
        self.books.add(steps=1, hits=bool(draft), drafted=len(draft))
        return DraftTree.chain(ctx.root, draft)

    def observe(self, ctx, tree, verified, accepted) -> None:
        """Count the drafted tokens the target accepted (the table learns them at the next propose)."""
        self.books.add(accepted_tokens=len(accepted.path) - 1)  # on the verified path, before EOS/budget cuts

    def stats(self) -> dict:
        """Table sizes, lookup hit rate and drafted/accepted tokens of the latest generation."""
        books = self.books
        return {
            **books.report(),
            "table_sizes": self.table.sizes(),
            "lookup_hit_rate": books.per("hits", "steps"),  # steps whose lookup produced a non-empty draft
            "drafted_per_step": books.per("drafted", "steps"),
            "accepted_per_step": books.per("accepted_tokens", "steps"),
            "draft_hit_ratio": books.per("accepted_tokens", "drafted"),  # ANPD's alpha: accepted / drafted
        }
