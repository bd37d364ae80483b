"""ANPD (Ou et al.): drafts from an adaptive multi-level n-gram model of the current context."""

from __future__ import annotations

from specbench.core.drafter import knob_choice, knob_int
from specbench.drafters.ngram_chain import NgramChainDrafter
from specbench.structures.ngram import MultiLevelNgram

ON_MISS = ("stop", "pad")


class ANPD(NgramChainDrafter):
    """Adaptive N-gram Parallel Decoding: K iterated MLN queries form one chain, verified in one forward.

    The MLN (n = 2..N) starts from the prompt and learns every committed token. When no level knows
    the context, ``on_miss="stop"`` ends the draft there (the paper returns NULL); ``"pad"`` fills the
    slot with ``pad_id`` and keeps drafting, as the official class does with its dummy id "1".
    """

    def __init__(
        self,
        max_ngram_size: int = 5,
        draft_len: int = 7,
        multi_level: bool = True,
        on_miss: str = "stop",
        pad_id: int = 1,
    ):
        self.max_ngram_size = max_ngram_size
        self.multi_level = bool(multi_level)
        pad = knob_int("pad_id", pad_id, 0)  # checked whatever on_miss is: a bad value never waits unseen
        self.pad = pad if knob_choice("on_miss", on_miss, ON_MISS) == "pad" else None
        super().__init__(draft_len, "draft_len", "K")

    def new_table(self) -> MultiLevelNgram:
        """An empty MLN with levels N..2 (or N alone)."""
        return MultiLevelNgram(self.max_ngram_size, self.multi_level)

    def draft(self, k: int) -> list[int]:
        """K iterated queries on the committed tokens + the draft so far."""
        return self.table.chain(k, self.pad)
