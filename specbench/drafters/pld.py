"""Prompt lookup decoding (Saxena 2023; HF ``prompt_lookup_num_tokens``, Spec-Bench's PLD)."""

from __future__ import annotations

from specbench.drafters.ngram_chain import NgramChainDrafter
from specbench.structures.ngram import PromptLookupIndex


class PromptLookup(NgramChainDrafter):
    """Drafts the tokens that followed an earlier occurrence of the context's last n-gram.

    n runs from ``max_ngram_size`` down to ``min_ngram_size``; the draft is ``num_pred_tokens`` long
    on a hit (shorter with ``continuation="truncate"`` near the context's end) and empty on a miss (a plain
    autoregressive step). See ``PromptLookupIndex`` for which occurrence is used and how this compares with HF,
    Spec-Bench and vLLM.
    """

    def __init__(
        self,
        max_ngram_size: int = 3,
        num_pred_tokens: int = 10,
        min_ngram_size: int = 1,
        occurrence: str = "latest",
        continuation: str = "repeat",
    ):
        self.max_ngram_size = max_ngram_size
        self.min_ngram_size = min_ngram_size
        self.occurrence = occurrence
        self.continuation = continuation
        super().__init__(num_pred_tokens, "num_pred_tokens", "k")

    def new_table(self) -> PromptLookupIndex:
        """An empty n-gram -> position index."""
        return PromptLookupIndex(self.max_ngram_size, self.min_ngram_size, self.occurrence, self.continuation)

    def draft(self, k: int) -> list[int]:
        """The continuation after the matched n-gram."""
        return self.table.lookup(k)
