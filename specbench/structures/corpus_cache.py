"""Self-Draft's corpus cache: static n-gram continuations mined once from a text corpus.

A key is a suffix of 1..``max_key_len`` tokens; its value is the ``top_k`` most frequent
``continuation_len``-token continuations seen right after it in the corpus more than ``min_count``
times (the official "clean-5" cache: count > 5). Lookup prefers longer keys, then higher counts
(paper: "longer prefixes and higher frequencies receive higher priority").

Counting runs in numpy: every (key, continuation) window is packed into a few uint64 words and the
windows are sorted once per key length, so a million-token corpus counts in seconds. The table is a
plain dict of tuples (no tensors in the drafting hot path) and is stored as a compressed ``.npz``
with a JSON header (no pickle), checked against the expected tokenizer/settings when loaded.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from specbench.errors import ConfigError

FORMAT = "specbench-corpus-cache"
FORMAT_VERSION = 1
SETTINGS = ("max_key_len", "continuation_len", "top_k", "min_count")

Key = tuple[int, ...]
Continuation = tuple[int, ...]


class CorpusCacheMismatch(ConfigError):
    """A stored corpus cache was built for another tokenizer, source or settings (or is not one)."""


def check_settings(max_key_len: int, continuation_len: int, top_k: int, min_count: int) -> dict:
    """The build settings as a dict, or a ConfigError naming the first out-of-range key."""
    settings = dict(max_key_len=max_key_len, continuation_len=continuation_len, top_k=top_k, min_count=min_count)
    lowest = dict(max_key_len=1, continuation_len=1, top_k=1, min_count=0)
    for name, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lowest[name]:
            raise ConfigError(f"corpus cache setting {name} must be an integer >= {lowest[name]}; got {value!r}")
    return {name: int(value) for name, value in settings.items()}


class CorpusCache:
    """Static n-gram continuations mined from a text corpus with the target's tokenizer."""

    def __init__(
        self,
        continuations: dict[Key, tuple[Continuation, ...]],
        counts: dict[Key, tuple[int, ...]],
        settings: Mapping,
        info: Mapping | None = None,
    ):
        """Per key its continuations (best first) and their counts; ``info``: provenance and stats."""
        self.settings = check_settings(**{name: settings[name] for name in SETTINGS})
        self.max_key_len: int = self.settings["max_key_len"]  # suffix keys of 1..max_key_len tokens
        self.continuation_len: int = self.settings["continuation_len"]  # tokens per continuation (G)
        self.info = dict(info or {})
        self.part = ""  # how runs name this cache (set by the loader: its file's identity digest)
        self._continuations = continuations
        self._counts = counts

    # --- building ----------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        token_streams: Iterable[Sequence[int]],
        max_key_len: int = 4,
        continuation_len: int = 4,
        top_k: int = 20,
        min_count: int = 5,
        *,
        provenance: Mapping | None = None,
    ) -> CorpusCache:
        """Count every (key, continuation) window inside each stream; keep top_k per key with count > min_count.

        ``provenance`` (e.g. ``{"tokenizer": {...}, "source": {...}}``) is stored in the header as is.
        """
        settings = check_settings(max_key_len, continuation_len, top_k, min_count)
        start = time.perf_counter()
        tokens, separator, streams = _concatenate(token_streams)
        continuations: dict[Key, tuple[Continuation, ...]] = {}
        counts_by_key: dict[Key, tuple[int, ...]] = {}
        if streams:
            for key_len in range(1, max_key_len + 1):
                rows, counts = _frequent_windows(tokens, separator, key_len + continuation_len, min_count)
                rows, counts = _top_continuations(rows, counts, key_len, top_k)
                _add_entries(continuations, counts_by_key, rows, counts, key_len)
        corpus = {"tokens": int(tokens.size) - streams, "documents": streams}  # non-empty streams
        # build_s: from the first stream to the finished table (includes tokenizing when streams are lazy)
        info = {**(provenance or {}), "corpus": corpus, "build_s": round(time.perf_counter() - start, 3)}
        return cls(continuations, counts_by_key, settings, info)

    # --- lookup ------------------------------------------------------------------------------

    def lookup(
        self, context: Sequence[int], limit: int, exclude: Collection[tuple[int, ...]] = (), refill: bool = True
    ) -> list[Continuation]:
        """Longest-suffix match: continuations of the last max_key_len tokens of ``context``, then shorter
        suffixes down to 1; within a key by descending count; skip those in ``exclude`` and duplicates;
        at most ``limit`` continuation tuples (each continuation_len tokens).

        ``refill=False`` is the official rule: of each key only the first (``limit`` - found so far)
        continuations are looked at, so a skipped one is not replaced from the same key.
        """
        found: list[Continuation] = []
        if limit <= 0:
            return found
        seen = {tuple(candidate) for candidate in exclude}
        end = len(context)
        for key_len in range(min(self.max_key_len, end), 0, -1):
            continuations = self._continuations.get(tuple(context[end - key_len :]), ())
            for continuation in continuations if refill else continuations[: limit - len(found)]:
                if continuation not in seen:
                    seen.add(continuation)
                    found.append(continuation)
                    if len(found) == limit:
                        return found
        return found

    def continuations(self, key: Sequence[int]) -> list[tuple[Continuation, int]]:
        """The stored (continuation, count) pairs of one key, best first (empty when absent)."""
        key = tuple(key)
        return list(zip(self._continuations.get(key, ()), self._counts.get(key, ())))

    def __iter__(self) -> Iterator[Key]:
        """The stored keys, in stored order."""
        return iter(self._continuations)

    def __len__(self) -> int:
        """Number of keys."""
        return len(self._continuations)

    def num_continuations(self) -> int:
        """Number of (key, continuation) entries."""
        return sum(len(conts) for conts in self._continuations.values())

    def describe(self) -> dict:
        """Keys, continuations, sizes, build settings, source, tokenizer (what a CLI or a run record shows)."""
        by_length = [0] * self.max_key_len
        for key in self._continuations:
            by_length[len(key) - 1] += 1
        entries = self.num_continuations()
        return {
            "keys": len(self),
            "keys_by_length": {str(n + 1): count for n, count in enumerate(by_length)},
            "continuations": entries,
            "continuations_per_key": round(entries / max(1, len(self)), 2),
            "settings": dict(self.settings),
            **self.info,
        }

    # --- storage -----------------------------------------------------------------------------

    def header(self) -> dict:
        """The JSON header stored with the arrays (format, settings, provenance, stats)."""
        info = {name: value for name, value in self.info.items() if name not in ("path", "file_bytes")}
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "settings": dict(self.settings),
            **info,
            "keys": len(self),
            "continuations": self.num_continuations(),
        }

    def save(self, path) -> None:
        """Write a compressed ``.npz`` (header + flat arrays) atomically: a temp file, then a rename."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = self._arrays()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                # allow_pickle (the default) spelt out: **arrays cannot then be mistaken for it
                np.savez_compressed(f, allow_pickle=True, header=np.array(json.dumps(self.header())), **arrays)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        self.info.update(path=str(path), file_bytes=path.stat().st_size)

    def _arrays(self) -> dict[str, np.ndarray]:
        """The table as flat arrays: key lengths/tokens, continuations per key, continuations, counts."""
        keys = list(self._continuations)
        conts = [cont for key in keys for cont in self._continuations[key]]
        counts = [count for key in keys for count in self._counts[key]]
        return {
            "key_lengths": np.array([len(key) for key in keys], dtype=np.uint8),
            "key_tokens": np.array([token for key in keys for token in key], dtype=np.uint32),
            "per_key": np.array([len(self._continuations[key]) for key in keys], dtype=np.uint32),
            "continuations": np.array(conts, dtype=np.uint32).reshape(len(conts), self.continuation_len),
            "counts": np.array(counts, dtype=np.int64),
        }

    @classmethod
    def load(cls, path, expect: Mapping[str, Mapping] | None = None) -> CorpusCache:
        """Read a cache written by ``save``; ``expect`` (section -> fields, e.g. ``{"tokenizer": {...},
        "settings": {...}}``) must match the header, else ``CorpusCacheMismatch`` says what differs."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as npz:
                header = _checked_header(npz, path)
                _check_expected(header, expect, path)
                arrays = {
                    name: npz[name] for name in ("key_lengths", "key_tokens", "per_key", "continuations", "counts")
                }
        except CorpusCacheMismatch:
            raise
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:  # not an npz, or not ours
            raise CorpusCacheMismatch(
                f"{path} is not a readable corpus cache ({error}); delete it and rebuild "
                f"(python -m specbench.corpus build ...)"
            ) from None
        info = {
            name: value
            for name, value in header.items()
            if name not in ("format", "format_version", "settings", "keys", "continuations")
        }
        cache = cls(*_entries_from_arrays(**arrays), header["settings"], info)
        cache.info.update(path=str(path), file_bytes=path.stat().st_size)
        return cache


def read_header(path) -> dict:
    """The JSON header of a stored cache without loading its table (for listings)."""
    with np.load(Path(path), allow_pickle=False) as npz:
        return _checked_header(npz, Path(path))


def _checked_header(npz, path: Path) -> dict:
    """The parsed header of an open ``.npz``, rejecting other formats and versions."""
    header = json.loads(str(npz["header"]))
    if header.get("format") != FORMAT or header.get("format_version") != FORMAT_VERSION:
        raise CorpusCacheMismatch(
            f"{path} is not a {FORMAT} v{FORMAT_VERSION} file (format {header.get('format')!r}, version "
            f"{header.get('format_version')!r}); delete it and rebuild (python -m specbench.corpus build ...)"
        )
    return header


def header_differences(header: Mapping, expect: Mapping[str, Mapping] | None) -> list[str]:
    """Every ``section.field`` of ``expect`` whose value in a cached file's JSON header differs, worded for an error."""
    expected = json.loads(json.dumps(expect or {}))  # tuples -> lists, as in the stored JSON
    return [
        f"{section}.{field}: file has {header.get(section, {}).get(field)!r}, expected {value!r}"
        for section, fields in expected.items()
        for field, value in fields.items()
        if header.get(section, {}).get(field) != value
    ]


def _check_expected(header: dict, expect: Mapping[str, Mapping] | None, path: Path) -> None:
    """Raise CorpusCacheMismatch listing every expected field whose stored value differs."""
    differences = header_differences(header, expect)
    if differences:
        raise CorpusCacheMismatch(
            f"corpus cache {path} was built for something else ({'; '.join(differences)}); "
            f"delete it or rebuild with: python -m specbench.corpus build ... force=true"
        )


def _entries_from_arrays(key_lengths, key_tokens, per_key, continuations, counts) -> tuple[dict, dict]:
    """Inverse of ``CorpusCache._arrays``: (key -> continuations, key -> counts) in stored order."""
    key_tokens, counts = key_tokens.tolist(), counts.tolist()
    conts = list(map(tuple, continuations.tolist()))
    conts_by_key, counts_by_key, token_at, cont_at = {}, {}, 0, 0
    for length, n in zip(key_lengths.tolist(), per_key.tolist()):
        key = tuple(key_tokens[token_at : token_at + length])
        conts_by_key[key] = tuple(conts[cont_at : cont_at + n])
        counts_by_key[key] = tuple(counts[cont_at : cont_at + n])
        token_at, cont_at = token_at + length, cont_at + n
    return conts_by_key, counts_by_key


# --- counting (numpy) ----------------------------------------------------------------------------


def _concatenate(token_streams: Iterable[Sequence[int]]) -> tuple[np.ndarray, int, int]:
    """All non-empty streams end to end, each followed by a separator id no stream uses.

    Returns the tokens (uint64 [N + streams]), the separator id and the number of streams; a window
    holding the separator crosses a stream end and is dropped after counting.
    """
    arrays = [np.asarray(stream, dtype=np.int64) for stream in token_streams]
    arrays = [array for array in arrays if array.size]
    if not arrays:
        return np.zeros(0, dtype=np.uint64), 0, 0
    lowest = min(int(array.min()) for array in arrays)
    if lowest < 0:
        raise ValueError(f"token ids must be >= 0; got {lowest}")
    separator = max(int(array.max()) for array in arrays) + 1
    tail = np.array([separator], dtype=np.int64)
    parts = [part for array in arrays for part in (array, tail)]
    tokens = np.concatenate(parts, dtype=np.uint64, casting="unsafe")  # [N + streams]; ids checked >= 0
    return tokens, separator, len(arrays)


def _packed_windows(tokens: np.ndarray, width: int, bits: int) -> list[np.ndarray]:
    """Every window ``tokens[i:i+width]`` packed into uint64 words of ``64 // bits`` tokens each ([n] per word)."""
    n = tokens.size - width + 1
    per_word = 64 // bits
    words = []
    for first in range(0, width, per_word):
        word: np.ndarray = np.zeros(n, dtype=np.uint64)  # [n]
        for offset in range(first, min(first + per_word, width)):
            word <<= np.uint64(bits)
            word |= tokens[offset : offset + n]
        words.append(word)
    return words


def _frequent_windows(tokens: np.ndarray, separator: int, width: int, min_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct windows of ``width`` tokens inside one stream seen more than ``min_count`` times.

    Returns their tokens [m, width] (int64) and counts [m].
    """
    n = tokens.size - width + 1
    if n <= 0:
        return np.zeros((0, width), dtype=np.int64), np.zeros(0, dtype=np.int64)
    words = _packed_windows(tokens, width, separator.bit_length())
    order = np.lexsort(words[::-1])  # [n] first word is the primary key
    new: np.ndarray = np.zeros(n, dtype=bool)  # [n] first window of each run of equal windows
    new[0] = True
    while words:  # sort one word at a time and free it (peak memory: one sorted word)
        word = words.pop()[order]
        new[1:] |= word[1:] != word[:-1]
    firsts = np.flatnonzero(new)
    counts: np.ndarray = np.diff(np.append(firsts, n))  # [distinct]
    keep = counts > min_count
    windows = np.lib.stride_tricks.sliding_window_view(tokens, width)  # [n, width] view, no copy
    rows, counts = windows[order[firsts[keep]]].astype(np.int64), counts[keep]
    inside = ~(rows == separator).any(axis=1)
    return rows[inside], counts[inside]


def _top_continuations(rows: np.ndarray, counts: np.ndarray, key_len: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by key, then count descending, then continuation tokens; at most top_k per key."""
    if not len(rows):
        return rows, counts
    columns = [rows[:, j] for j in range(rows.shape[1])]
    order = np.lexsort((*columns[key_len:][::-1], -counts, *columns[:key_len][::-1]))
    rows, counts = rows[order], counts[order]
    index = np.arange(len(rows))
    new_key: np.ndarray = np.ones(len(rows), dtype=bool)
    new_key[1:] = (rows[1:, :key_len] != rows[:-1, :key_len]).any(axis=1)
    rank = index - np.maximum.accumulate(np.where(new_key, index, 0))  # position within its key
    keep = rank < top_k
    return rows[keep], counts[keep]


def _add_entries(continuations: dict, counts_by_key: dict, rows: np.ndarray, counts: np.ndarray, key_len: int) -> None:
    """Store rows sorted by key (``_top_continuations``) as key -> continuations and key -> counts."""
    rows, counts = rows.tolist(), counts.tolist()
    first = 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or rows[end][:key_len] != rows[first][:key_len]:
            key = tuple(rows[first][:key_len])
            continuations[key] = tuple(tuple(row[key_len:]) for row in rows[first:end])
            counts_by_key[key] = tuple(counts[first:end])
            first = end
