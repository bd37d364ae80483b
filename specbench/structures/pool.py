"""An LRU n-gram pool keyed by the first token: LADE's n-gram pool and Self-Draft's context cache.

Each key (one token id) holds at most ``capacity`` continuation tuples in recency order. Inserting a
tuple that is already there moves it to the most-recent end; inserting into a full key evicts the
oldest tuple. ``query`` returns the most recent tuples first. ``keep_recent`` is Self-Draft's
flush/keep policy (reduce every key to its ``keep`` most recent tuples).

NOTE: one plain dict per key (insertion-ordered, O(1) move-to-end and evict-oldest); no tensors,
so a drafting step's dozens of inserts cost microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from specbench.core.drafter import knob_int


class NGramPool:
    """n-gram pool: first token -> at most ``capacity`` continuation tuples, least recently used evicted."""

    def __init__(self, capacity: int, name: str = "capacity"):
        knob_int(name, capacity, 1)
        self.capacity = capacity
        self._table: dict[int, dict[tuple[int, ...], None]] = {}
        self._tuples = 0

    def __len__(self) -> int:
        """Number of keys."""
        return len(self._table)

    @property
    def num_tuples(self) -> int:
        """Continuation tuples held over all keys."""
        return self._tuples

    def insert(self, key: int, value: tuple[int, ...]) -> None:
        """Make ``value`` the most recent tuple under ``key``; evict the oldest when the key is full."""
        entries = self._table.get(key)
        if entries is None:
            self._table[key] = {value: None}
            self._tuples += 1
            return
        if value in entries:
            del entries[value]
        elif len(entries) >= self.capacity:
            del entries[next(iter(entries))]
        else:
            self._tuples += 1
        entries[value] = None

    def insert_sequence(self, tokens: Sequence[int], value_len: int, start: int = 0) -> None:
        """Insert every complete (key, next ``value_len`` tokens) n-gram of ``tokens`` keyed at ``start`` or later."""
        for i in range(start, len(tokens) - value_len):
            self.insert(tokens[i], tuple(tokens[i + 1 : i + 1 + value_len]))

    def query(self, key: int, k: int) -> list[tuple[int, ...]]:
        """Up to ``k`` tuples under ``key``, most recent first."""
        entries = self._table.get(key)
        if not entries:
            return []
        return list(islice(reversed(entries), k))

    def keep_recent(self, keep: int) -> None:
        """Reduce every key to its ``keep`` most recent tuples (``keep`` = 0 empties the pool)."""
        if keep <= 0:
            self.clear()
            return
        for key, entries in self._table.items():
            if len(entries) > keep:
                self._table[key] = dict.fromkeys(list(entries)[-keep:])
        self._tuples = sum(len(entries) for entries in self._table.values())

    def copy(self) -> NGramPool:
        """An independent pool with the same tuples in the same recency order."""
        other = NGramPool(self.capacity)
        other._table = {key: dict(entries) for key, entries in self._table.items()}
        other._tuples = self._tuples
        return other

    def clear(self) -> None:
        """Forget every tuple."""
        self._table.clear()
        self._tuples = 0
