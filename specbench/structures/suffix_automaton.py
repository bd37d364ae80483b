"""Suffix automata over token sequences (SAM-Decoding's retrieval structure), built online in pure Python.

A suffix automaton of a text is the smallest automaton that accepts every substring of it. Each state is
a class of substrings that end at the same set of positions; its ``length`` is the longest of them, its
suffix ``link`` points to the state of the longest suffix that ends at more positions, and
``first_end`` is the end position of its first occurrence. Appending one token creates at most two
states and, summed over a text of n tokens, O(n) transitions and link walks (Blumer et al. 1985), so
``append`` is amortised O(1) per token.

Two questions are answered from it:

- **Dynamic** (the text is the prompt plus the committed output): after ``append(x)`` the suffix link of
  the newest state is the longest suffix of the text that also ended at an earlier position, so
  ``repeat()`` reads the longest earlier match of the current context in O(1), with no matcher to
  maintain.
- **Static** (the text is a fixed corpus): a ``SuffixMatcher`` is fed the generation's tokens one by one
  and keeps the longest suffix of that stream that occurs anywhere in the corpus (the matching-statistics
  walk: at most one link per token fed, amortised, since the match length grows by at most 1 per token).

The draft is the text that followed the match's first occurrence (``continuation``). Documents of a corpus
are separated by ``SEPARATOR`` (-1, never a token id), so no match spans two documents and a static
continuation stops at the end of its document.
"""

from __future__ import annotations

from collections.abc import Iterable

SEPARATOR = -1
"""Placed between the documents of a static corpus; no query token equals it, so no match crosses it."""


class SuffixAutomaton:
    """The suffix automaton of a token text that grows one token at a time.

    States are parallel lists indexed by state id (state 0 is the empty string): ``next`` (token ->
    state), ``link``, ``length`` and ``first_end``. Plain lists and dicts keep the per-token cost at a
    few dict operations.
    """

    __slots__ = ("first_end", "last", "length", "link", "next", "text")

    def __init__(self, tokens: Iterable[int] = ()):
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [-1]
        self.text: list[int] = []
        self.last = 0  # the state of the whole text
        self.extend(tokens)

    def __len__(self) -> int:
        """Tokens appended so far."""
        return len(self.text)

    @property
    def num_states(self) -> int:
        """States in the automaton (at most 2n - 1 for n >= 2 tokens)."""
        return len(self.length)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append several tokens in order."""
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Append one token: the standard online construction (new state, link walk, clone on a split)."""
        nxt, link, length, first_end = self.next, self.link, self.length, self.first_end
        end = len(self.text)
        self.text.append(token)
        cur = len(length)
        nxt.append({})
        length.append(length[self.last] + 1)
        link.append(0)
        first_end.append(end)
        p = self.last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # split q: the clone keeps the shorter strings (and q's transitions and first end)
                clone = len(length)
                nxt.append(dict(nxt[q]))
                length.append(length[p] + 1)
                link.append(link[q])
                first_end.append(first_end[q])
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur

    def add_document(self, tokens: Iterable[int]) -> None:
        """Append one corpus document followed by ``SEPARATOR``."""
        self.extend(tokens)
        self.append(SEPARATOR)

    def repeat(self) -> tuple[int, int]:
        """(state, length) of the longest suffix of the text that also ends at an earlier position.

        Length 0 (state 0) when the last token never occurred before. O(1): it is the newest state's link.
        """
        if not self.text:
            return 0, 0
        state = self.link[self.last]
        return state, self.length[state]

    def continuation(self, state: int, k: int, wrap: bool) -> list[int]:
        """Up to ``k`` tokens that followed the first occurrence of ``state``'s strings.

        The copy stops at a ``SEPARATOR``. At the end of the text it stops, or with ``wrap`` repeats the
        span from the occurrence to the end (an LZ77-style overlapping copy: a suffix that recurs at
        distance d makes the text locally periodic with period d, and the copy extends that period).
        """
        if state <= 0 or k <= 0:
            return []
        text = self.text
        start = self.first_end[state] + 1
        copied = text[start : start + k]
        if SEPARATOR in copied:
            copied = copied[: copied.index(SEPARATOR)]
        elif wrap and copied and len(copied) < k and start + len(copied) == len(text):
            copied = (copied * (k // len(copied) + 1))[:k]
        return copied


class SuffixMatcher:
    """The longest suffix of a token stream that occurs in a fixed automaton's text (its matching statistics).

    ``feed`` costs amortised O(1): the match grows by at most one token per call, and every suffix-link
    step shortens it. The automaton must not grow while matchers are in use.
    """

    __slots__ = ("automaton", "length", "state")

    def __init__(self, automaton: SuffixAutomaton):
        self.automaton = automaton
        self.state = 0
        self.length = 0

    def reset(self) -> None:
        """Forget the stream (a new generation)."""
        self.state = self.length = 0

    def extend(self, tokens: Iterable[int]) -> None:
        """Feed several tokens in order."""
        for token in tokens:
            self.feed(token)

    def feed(self, token: int) -> None:
        """Extend the stream by one token and update the match."""
        nxt, link, lengths = self.automaton.next, self.automaton.link, self.automaton.length
        state, length = self.state, self.length
        while state and token not in nxt[state]:
            state = link[state]
            length = lengths[state]
        target = nxt[state].get(token)
        if target is None:  # only at the root: the token never occurs in the text
            self.state = self.length = 0
        else:
            self.state, self.length = target, length + 1
