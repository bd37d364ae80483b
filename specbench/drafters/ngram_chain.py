"""Common base of the model-free chain drafters (ANPD, prompt lookup): one table, one chain per step."""

from __future__ import annotations

import time

from specbench.core.tree import DraftTree
from specbench.drafters.base import DecodeContext, Drafter
from specbench.errors import ConfigError


class NgramChainDrafter(Drafter):
    """Drafts one chain per step from a token table that follows the committed tokens.

    Subclasses say how to build the table (``new_table``) and how to draft from it (``draft``). The
    table is filled from the prompt in ``reset`` and synced lazily at the start of each ``propose``
    from ``ctx.tokens`` (every token after the last one fed): the loop may cut a step's tokens at EOS
    or the budget after ``observe``, so ``ctx.tokens`` is the only reliable record of what was
    committed.
    """

    def __init__(self, draft_len: int, draft_len_key: str):
        if not isinstance(draft_len, int) or draft_len < 1:
            raise ConfigError(f"method.drafter.{draft_len_key} must be an integer >= 1, got {draft_len!r}")
        self.draft_len = draft_len
        self.table = self.new_table()  # built now so bad n-gram settings fail before the first request
        self._zero_counters()

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
        self._zero_counters()

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Sync the table with the committed tokens, then draft a chain of at most K (or remaining - 1)."""
        start = time.perf_counter()
        fed = len(self.table)
        if fed > len(ctx.tokens):
            raise RuntimeError(f"{type(self).__name__}: the context shrank below the {fed} tokens already fed")
        self.table.extend(ctx.tokens[fed:])
        draft = self.draft(min(self.draft_len, ctx.remaining - 1))
        self.steps += 1
        self.hits += bool(draft)
        self.drafted += len(draft)
        self.draft_s += time.perf_counter() - start
        return DraftTree.chain(ctx.root, draft)

    def observe(self, ctx, tree, verified, accepted) -> None:
        """Count the drafted tokens the target accepted (the table learns them at the next propose)."""
        self.accepted += len(accepted.path) - 1

    def stats(self) -> dict:
        """Table sizes, lookup hit rate, drafted/accepted tokens and drafting time of the latest generation."""
        steps = max(self.steps, 1)
        return {
            "table_sizes": self.table.sizes(),
            "steps": self.steps,
            "lookup_hit_rate": self.hits / steps,  # steps whose lookup produced a non-empty draft
            "drafted_per_step": self.drafted / steps,
            "accepted_tokens": self.accepted,  # drafted tokens on the verified path (before EOS/budget cuts)
            "accepted_per_step": self.accepted / steps,
            "draft_hit_ratio": self.accepted / max(self.drafted, 1),  # ANPD's alpha: accepted / drafted
            "draft_s": self.draft_s,
        }

    def _zero_counters(self) -> None:
        """Reset the per-generation counters."""
        self.steps = self.hits = self.drafted = self.accepted = 0
        self.draft_s = 0.0
