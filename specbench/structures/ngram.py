"""Token n-gram tables for model-free drafting: ANPD's multi-level n-gram model and a prompt-lookup index.

Both are filled from the prompt once and then fed each committed token with ``append`` (O(levels)
dict updates per token, never a re-scan of the history), so a drafting step costs the same at token
10 and at token 10,000. Keys are tuples of token ids; plain dicts keep tensors out of the hot path.
"""

from __future__ import annotations

from collections.abc import Iterable

from specbench.core.drafter import knob_choice, knob_int


class _Successors:
    """Next-token counts after one context, with the current favourite kept up to date."""

    __slots__ = ("best", "best_count", "counts")

    def __init__(self, token: int):
        self.best = token
        self.best_count = 1
        self.counts = {token: 1}  # insertion order = first-seen order

    def add(self, token: int) -> None:
        """Count one more ``token``; the favourite is the most frequent, ties going to the first seen."""
        count = self.counts.get(token, 0) + 1
        self.counts[token] = count
        if count > self.best_count:
            self.best, self.best_count = token, count
        elif count == self.best_count and token != self.best and self._seen_first(token):
            self.best = token

    def _seen_first(self, token: int) -> bool:
        """True when ``token`` entered the counts before the favourite.

        NOTE: a scan, but only on an exact tie at count >= 2 (a new token ties at 1 and loses to the
        older favourite without it), so the amortized update stays O(1).
        """
        for seen in self.counts:
            if seen == token or seen == self.best:
                return seen == token
        return False


class _TokenStream:
    """A token history fed one token at a time; subclasses index each token in ``append``."""

    history: list[int]

    def __len__(self) -> int:
        """Tokens fed so far."""
        return len(self.history)

    def extend(self, tokens: Iterable[int]) -> None:
        """Feed several tokens in order."""
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Feed one token."""
        raise NotImplementedError


class MultiLevelNgram(_TokenStream):
    """ANPD's Multi-Level N-gram (MLN): next-token counts per (n-1)-token context for n = 2..N.

    ``append`` counts the new token after the n-1 tokens before it at every level. ``predict`` tries
    n = N, N-1, ..., 2 and returns the most frequent successor at the first level whose context has
    been seen (ties: the successor seen first). With ``multi_level=False`` only the N-gram table
    exists, the paper's appendix ablation (Fig 10). The prompt is fed exactly once (the official
    wrapper feeds it twice; docs/methods/anpd.md#deliberate-differences-from-the-paper-and-the-official-code).
    """

    def __init__(self, max_ngram_size: int, multi_level: bool = True):
        self.max_ngram_size = knob_int("max_ngram_size", max_ngram_size, 2, "N")
        self.levels = tuple(range(max_ngram_size, 1, -1)) if multi_level else (max_ngram_size,)  # query order
        self.tables: dict[int, dict[tuple[int, ...], _Successors]] = {n: {} for n in self.levels}
        self.history: list[int] = []

    def append(self, token: int) -> None:
        """Count ``token`` after its (n-1)-token context at every level."""
        history = self.history
        end = len(history)  # the new token's position
        for n in self.levels:
            if end >= n - 1:
                context = tuple(history[end - n + 1 :])
                successors = self.tables[n].get(context)
                if successors is None:
                    self.tables[n][context] = _Successors(token)
                else:
                    successors.add(token)
        history.append(token)

    def predict(self, tokens: list[int]) -> int | None:
        """The favourite successor of ``tokens``' tail at the highest matching level (None: no level matches)."""
        length = len(tokens)
        for n in self.levels:
            if length >= n - 1:
                successors = self.tables[n].get(tuple(tokens[length - n + 1 :]))
                if successors is not None:
                    return successors.best
        return None

    def chain(self, k: int, pad: int | None = None) -> list[int]:
        """Up to ``k`` tokens by iterated prediction on history + draft so far (ANPD's drafting phase).

        A miss ends the draft; with ``pad`` set the miss is filled with ``pad`` and drafting goes on
        (the official class's behaviour, which fills the rest of the draft with a dummy id).
        """
        tail = self.history[max(0, len(self.history) - self.max_ngram_size + 1) :]  # last N-1 tokens
        draft: list[int] = []
        for _ in range(k):
            token = self.predict(tail)
            if token is None:
                if pad is None:
                    break
                token = pad
            draft.append(token)
            tail.append(token)
        return draft

    def sizes(self) -> dict[str, int]:
        """Distinct contexts per level, keyed ``"n=<n>"``."""
        return {f"n={n}": len(self.tables[n]) for n in sorted(self.tables)}


class PromptLookupIndex(_TokenStream):
    """Prompt lookup: the continuation after an earlier occurrence of the context's last n tokens.

    For every n-gram size n (``max_ngram_size`` down to ``min_ngram_size``) a dict maps each n-gram
    to the position of its last token. The n-grams ending at the final token are held back until the
    next token arrives, so a lookup only finds *earlier* occurrences and every continuation starts
    with at least one real token. ``lookup(k)`` tries the largest n first; the first n with a match
    wins. Among several occurrences of that n-gram:

    - ``occurrence="latest"`` (default) takes the most recent one (the dict entry is overwritten);
    - ``occurrence="first"`` takes the earliest one (the entry is kept), as HF and Spec-Bench do.

    The draft is the ``k`` tokens after the occurrence. When the occurrence is less than ``k`` tokens
    from the end of the context, ``continuation="repeat"`` (default) continues the copy into itself
    (LZ77-style overlapping copy: the tokens between the occurrence and the end repeat), so a lookup that
    hits always yields ``k`` tokens; ``continuation="truncate"`` stops at the end of the context (fewer
    tokens), as HF and vLLM's ``ngram`` proposer do.

    Compared with transformers 5.x ``PromptLookupCandidateGenerator`` (``prompt_lookup_num_tokens``):
    HF rescans the whole sequence with tensor ops every step, tries n = ``max_matching_ngram_size``
    (default 2) down to 1, takes the earliest occurrence whose continuation is non-empty, truncates
    the continuation at the end of the context and at the first EOS, and returns no draft on a miss.
    Spec-Bench's ``find_candidate_pred_tokens`` (max n 3, 10 tokens) also takes the earliest
    occurrence but only accepts one with a full 10-token continuation, and pads a miss with the dummy
    token 100. Both leave the output unchanged under exact verification; only tokens/step differs.
    """

    OCCURRENCES = ("latest", "first")
    CONTINUATIONS = ("repeat", "truncate")

    def __init__(
        self, max_ngram_size: int, min_ngram_size: int = 1, occurrence: str = "latest", continuation: str = "repeat"
    ):
        knob_int("max_ngram_size", max_ngram_size, knob_int("min_ngram_size", min_ngram_size, 1))
        knob_choice("occurrence", occurrence, self.OCCURRENCES)
        self.repeat = knob_choice("continuation", continuation, self.CONTINUATIONS) == "repeat"
        self.ngram_sizes = tuple(range(max_ngram_size, min_ngram_size - 1, -1))  # lookup order
        self.keep_first = occurrence == "first"
        self.tables: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ngram_sizes}
        self.history: list[int] = []

    def append(self, token: int) -> None:
        """Index the n-grams ending at the previous last token, then make ``token`` the last one."""
        history = self.history
        end = len(history) - 1  # the previous last token, now an earlier occurrence
        for n in self.ngram_sizes:
            if end >= n - 1:
                key = tuple(history[end - n + 1 :])
                if self.keep_first:
                    self.tables[n].setdefault(key, end)
                else:
                    self.tables[n][key] = end
        history.append(token)

    def lookup(self, k: int) -> list[int]:
        """``k`` tokens following an earlier occurrence of the longest matching suffix ([] on a miss)."""
        history = self.history
        length = len(history)
        for n in self.ngram_sizes:
            if length > n:
                end = self.tables[n].get(tuple(history[length - n :]))
                if end is not None:
                    return self._continuation(end, k)
        return []

    def _continuation(self, end: int, k: int) -> list[int]:
        """The ``k`` tokens after position ``end``; if the context ends first, the span repeated or cut there."""
        copied = self.history[end + 1 : end + 1 + k]  # non-empty: end < len(history) - 1
        if len(copied) < k and self.repeat:
            copied = (copied * (k // len(copied) + 1))[:k]
        return copied

    def sizes(self) -> dict[str, int]:
        """Distinct indexed n-grams per size, keyed ``"n=<n>"``."""
        return {f"n={n}": len(self.tables[n]) for n in sorted(self.tables)}
