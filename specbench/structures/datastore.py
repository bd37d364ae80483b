"""REST's datastore: a suffix array over a tokenised corpus, its exact-match retrieval and the trie's top nodes.

The corpus (documents of token ids) is laid end to end as ``data``: every token is stored as ``id + 1``
and each document is followed by a separator ``0``, so no match and no continuation crosses a document
boundary. ``suffix_array`` lists the positions of ``data`` in the lexicographic order of the suffixes
starting there (built once, by prefix doubling in numpy: O(N log^2 N), a few seconds per million tokens).

Retrieval (He et al., 2024, "REST"): the query is a suffix of the context of ``n`` tokens, ``n`` tried from
``n_max`` down to ``n_min``; the first ``n`` whose suffix occurs in the corpus followed by at least one
token wins. Its occurrences are one contiguous block of the suffix array, found by two binary searches;
the first ``k`` of them (suffix-array order, as the official retriever takes them) give the retrieved
continuations: the ``m`` tokens after each occurrence, cut at the end of its document.

Because the occurrences come in suffix-array order, the retrieved continuations are sorted
lexicographically: the block *is* the trie of the continuations in depth-first order, and a trie node
(a prefix shared by a run of consecutive rows) is weighted by the length of that run, its frequency among
the retrieved continuations. ``draft_nodes`` keeps the ``c`` heaviest nodes without building node objects.

The table is stored as an uncompressed ``.npz`` (two uint32 arrays and a JSON header; no pickle), written
atomically and checked against the expected tokenizer and source when loaded.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specbench.errors import ConfigError
from specbench.structures.corpus_cache import header_differences

FORMAT = "specbench-rest-datastore"
FORMAT_VERSION = 1
SEPARATOR = 0  # ends every document in ``data`` (token ids are stored shifted by one)


class DatastoreMismatch(ConfigError):
    """A stored datastore was built for another tokenizer or corpus (or is not a datastore file)."""


@dataclass
class Retrieved:
    """What one retrieval found: the matched suffix length and the retrieved continuations.

    ``rows`` [r, m] holds the continuations in suffix-array (lexicographic) order as stored ids
    (token id + 1), zero-padded after a document's end; ``occurrences`` counts every match of the suffix
    followed by a token, of which ``r = min(occurrences, k)`` were taken.
    """

    suffix_len: int  # n of the matched context suffix (0: no suffix of n_min..n_max tokens occurs)
    occurrences: int
    rows: np.ndarray  # [r, m] uint32

    def continuations(self) -> list[list[int]]:
        """The retrieved continuations as token-id lists (for tests and inspection)."""
        return [[int(token) - 1 for token in row if token != SEPARATOR] for row in self.rows]


class SuffixDatastore:
    """A tokenised corpus with its suffix array: exact longest-suffix retrieval of continuations."""

    def __init__(self, data: np.ndarray, suffix_array: np.ndarray, info: Mapping | None = None):
        """``data``: stored ids (token + 1, documents ended by 0, ending with 0); ``suffix_array`` over it."""
        if data.ndim != 1 or suffix_array.shape != data.shape or (data.size and data[-1] != SEPARATOR):
            raise ValueError("a datastore needs 1-D data ending with a separator and a suffix array of equal length")
        self.data = np.ascontiguousarray(data, dtype=np.uint32)  # [N]
        self.suffix_array = np.ascontiguousarray(suffix_array, dtype=np.uint32)  # [N]
        self.info = dict(info or {})
        self.part = ""  # how runs name this datastore (set by the loader: its file's identity digest)
        # binary searches compare byte strings: big-endian unsigned ids order exactly as the ids do
        self._bytes = self.data.astype(">u4").tobytes()
        self._positions = memoryview(self.suffix_array)  # Python ints on indexing, for bisect

    # --- building ----------------------------------------------------------------------------

    @classmethod
    def build(cls, token_streams: Iterable[Sequence[int]], *, provenance: Mapping | None = None) -> SuffixDatastore:
        """Lay the non-empty streams end to end (each closed by a separator) and sort their suffixes.

        ``provenance`` (e.g. ``{"tokenizer": {...}, "source": {...}}``) is kept in the header as is.
        """
        start = time.perf_counter()
        arrays = [np.asarray(stream, dtype=np.int64) for stream in token_streams]
        arrays = [array for array in arrays if array.size]
        if arrays and min(int(array.min()) for array in arrays) < 0:
            raise ValueError("token ids must be >= 0")
        if arrays and max(int(array.max()) for array in arrays) >= np.iinfo(np.uint32).max:
            raise ValueError("token ids must fit in uint32 (below 2**32 - 1)")
        closing = np.array([-1], dtype=np.int64)
        parts = [part for array in arrays for part in (array, closing)]
        data = (np.concatenate(parts) + 1).astype(np.uint32) if parts else np.zeros(0, dtype=np.uint32)  # [N]
        info = {
            **(provenance or {}),
            "corpus": {"tokens": int(data.size) - len(arrays), "documents": len(arrays)},
            "max_token_id": int(data.max()) - 1 if data.size else -1,
        }
        suffix_array = build_suffix_array(data)
        info["build_s"] = round(time.perf_counter() - start, 3)  # from the first stream (tokenizing if lazy)
        return cls(data, suffix_array, info)

    # --- retrieval ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Stored positions (corpus tokens + one separator per document)."""
        return int(self.data.size)

    def block(self, query: Sequence[int]) -> tuple[int, int]:
        """The suffix-array block [lo, hi) of the occurrences of ``query`` followed by at least one token."""
        stored = np.asarray(query, dtype=np.int64) + 1
        key = stored.astype(">u4").tobytes()
        width = len(key)
        data, positions = self._bytes, self._positions
        # suffixes equal to ``query + separator`` sort below ``query + (token 0)``: they are skipped
        lo = bisect_left(positions, key + b"\0\0\0\1", key=lambda p: data[4 * p : 4 * p + width + 4])
        hi = bisect_right(positions, key, lo=lo, key=lambda p: data[4 * p : 4 * p + width])
        return lo, hi

    def longest_match(self, context: Sequence[int], n_max: int, n_min: int) -> tuple[int, int, int]:
        """(n, lo, hi) for the longest suffix of ``context`` of ``n_min..n_max`` tokens that occurs followed
        by a token; n = 0 (empty block) when none does.

        Same answer as trying n = n_max, n_max - 1, ... in turn: if the last n tokens occur followed by a
        token, so do the last n - 1 (at the same place), so a binary search over n finds the longest.
        """
        low, high = n_min, min(n_max, len(context))
        best = (0, 0, 0)
        while low <= high:
            n = (low + high) // 2
            lo, hi = self.block(context[len(context) - n :])
            if lo < hi:
                best = (n, lo, hi)
                low = n + 1
            else:
                high = n - 1
        return best

    def search(self, context: Sequence[int], n_max: int, n_min: int, k: int, m: int) -> Retrieved:
        """REST's retrieval: the longest matching suffix (``n_max`` .. ``n_min`` tokens) and the ``m``-token
        continuations of its first ``k`` occurrences in suffix-array order."""
        n, lo, hi = self.longest_match(context, n_max, n_min)
        if n == 0 or m < 1:
            return Retrieved(n, hi - lo, np.zeros((0, max(m, 0)), dtype=np.uint32))
        starts = self.suffix_array[lo : min(hi, lo + k)].astype(np.int64) + n  # [r] first continuation token
        index = np.minimum(starts[:, None] + np.arange(m), self.data.size - 1)  # [r, m]; the last slot is a separator
        rows = self.data[index]  # [r, m]
        rows[np.cumprod(rows != SEPARATOR, axis=1) == 0] = SEPARATOR  # cut each row at its document's end
        return Retrieved(n, hi - lo, rows)

    def describe(self) -> dict:
        """Sizes and provenance (what a run record or a listing shows)."""
        return {
            "positions": len(self),
            "file_bytes": self.info.get("file_bytes"),
            **{name: value for name, value in self.info.items() if name != "file_bytes"},
        }

    # --- storage -----------------------------------------------------------------------------

    def header(self) -> dict:
        """The JSON header stored with the arrays (format, provenance, sizes)."""
        info = {name: value for name, value in self.info.items() if name not in ("path", "file_bytes")}
        return {"format": FORMAT, "format_version": FORMAT_VERSION, **info}

    def save(self, path) -> None:
        """Write an uncompressed ``.npz`` (header + the two arrays) atomically: a temp file, then a rename."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                header = np.array(json.dumps(self.header()))
                np.savez(f, allow_pickle=True, header=header, data=self.data, suffix_array=self.suffix_array)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        self.info.update(path=str(path), file_bytes=path.stat().st_size)

    @classmethod
    def load(cls, path, expect: Mapping[str, Mapping] | None = None) -> SuffixDatastore:
        """Read a datastore written by ``save``; ``expect`` (section -> fields, e.g. ``{"tokenizer": {...}}``)
        must match the header, else ``DatastoreMismatch`` names what differs."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as npz:
                header = json.loads(str(npz["header"]))
                if header.get("format") != FORMAT or header.get("format_version") != FORMAT_VERSION:
                    raise DatastoreMismatch(
                        f"{path} is not a {FORMAT} v{FORMAT_VERSION} file (format {header.get('format')!r}, "
                        f"version {header.get('format_version')!r}); delete it and it is rebuilt on the next run"
                    )
                check_expected(header, expect, path)
                data, suffix_array = npz["data"], npz["suffix_array"]
        except DatastoreMismatch:
            raise
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:  # not an npz, or not ours
            raise DatastoreMismatch(
                f"{path} is not a readable REST datastore ({error}); delete it and it is rebuilt on the next run"
            ) from None
        info = {name: value for name, value in header.items() if name not in ("format", "format_version")}
        store = cls(data, suffix_array, info)
        store.info.update(path=str(path), file_bytes=path.stat().st_size)
        return store


def check_expected(header: Mapping, expect: Mapping[str, Mapping] | None, path: Path) -> None:
    """Raise DatastoreMismatch listing every expected header field whose stored value differs."""
    differences = header_differences(header, expect)
    if differences:
        raise DatastoreMismatch(
            f"REST datastore {path} was built for something else ({'; '.join(differences)}); delete it and it "
            f"is rebuilt on the next run"
        )


def build_suffix_array(data: np.ndarray) -> np.ndarray:
    """Positions of ``data`` sorted by the suffix starting there (a suffix that ends sorts first).

    Prefix doubling: after round ``j`` every position is ranked by its first ``2**j`` symbols; a round
    sorts the pairs (rank here, rank ``2**j`` further) as one int64 key, until all ranks differ.
    """
    n = int(data.size)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    _, rank = np.unique(data, return_inverse=True)  # dense ranks of the single symbols, [n]
    rank = rank.astype(np.int64).reshape(-1)
    order = np.argsort(rank, kind="stable")
    shift = 1
    while int(rank.max()) < n - 1:  # ranks are dense (0, 1, ...): all differ once the largest is n - 1
        second: np.ndarray = np.zeros(n, dtype=np.int64)  # rank of the position ``shift`` further (0 past the end)
        second[: n - shift] = rank[shift:] + 1
        key = rank * (n + 1) + second  # ranks < n, so the key fits in int64 for any n < 3e9
        order = np.argsort(key)
        sorted_key = key[order]
        new: np.ndarray = np.empty(n, dtype=bool)  # [n] a key differs from the previous one in sorted order
        new[0] = True
        np.not_equal(sorted_key[1:], sorted_key[:-1], out=new[1:])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(new) - 1
        shift *= 2
    return order.astype(np.uint32)


def draft_nodes(rows: np.ndarray, num_nodes: int, official_cut: bool = False) -> tuple[list[int], list[int]]:
    """The ``num_nodes`` heaviest trie nodes of lexicographically sorted continuations, as a draft tree.

    ``rows`` [r, m]: stored ids (token + 1), zero after a row's end, sorted (``Retrieved.rows``). A node is
    a prefix of depth d shared by a run of consecutive rows; its weight is the run's length. Nodes are
    ranked by weight (descending), then depth, then row order; the top ``num_nodes`` form a subtree (a
    parent weighs at least as much as its child and is shallower), returned in rank order as token ids and
    parent indices, root excluded (parent ``-1`` = the root). Siblings therefore come heaviest first.

    ``official_cut`` then drops nodes, most distinct tokens on their path first (lightest first among
    equals), until the sum over kept nodes of their path's distinct tokens is at most ``num_nodes``: the
    official retriever's "cut to choices" (docs/methods/rest.md#differences-from-the-official-code).
    """
    r, m = rows.shape
    if r == 0 or m == 0 or num_nodes < 1:
        return [], []
    same = np.cumprod(rows[1:] == rows[:-1], axis=1).sum(axis=1)  # [r-1] common prefix with the row above
    lcp = np.concatenate([[-1], same])  # [r] the first row starts every node
    depths, starts, weights = [], [], []
    for depth in range(1, m + 1):
        start = np.flatnonzero(lcp < depth)  # rows where a new depth-`depth` prefix begins
        weight: np.ndarray = np.diff(np.append(start, r))  # rows sharing that prefix
        real = rows[start, depth - 1] != SEPARATOR  # a prefix ending in padding is no node
        starts.append(start[real])
        weights.append(weight[real])
        depths.append(np.full(int(real.sum()), depth))
    start_all, weight_all, depth_all = np.concatenate(starts), np.concatenate(weights), np.concatenate(depths)
    key = (-weight_all * (m + 1) + depth_all) * (r + 1) + start_all  # [nodes] rank key, smaller is better
    top = min(num_nodes, key.size)
    chosen = np.argpartition(key, top - 1)[:top] if top < key.size else np.arange(key.size)
    chosen = chosen[np.argsort(key[chosen])]  # [top] in rank order
    node_depth, node_start = depth_all[chosen].tolist(), start_all[chosen].tolist()
    if official_cut:
        keep = official_cut_to(rows, node_depth, node_start, num_nodes)
        node_depth = [node_depth[i] for i in keep]
        node_start = [node_start[i] for i in keep]
    # a node's parent: the kept node one level up whose run contains this node's first row
    by_level: dict[int, list[tuple[int, int]]] = {}
    for index, (depth, start) in enumerate(zip(node_depth, node_start)):
        by_level.setdefault(depth, []).append((start, index))
    for level in by_level.values():
        level.sort()
    tokens, parents = [], []
    for depth, start in zip(node_depth, node_start):
        tokens.append(int(rows[start, depth - 1]) - 1)
        if depth == 1:
            parents.append(-1)
            continue
        level = by_level[depth - 1]
        above = bisect_right(level, (start, len(node_depth))) - 1  # the last node above starting at or before
        parents.append(level[above][1])
    return tokens, parents


def official_cut_to(rows: np.ndarray, depths: list[int], starts: list[int], budget: int) -> list[int]:
    """Indices (in rank order) of the nodes the official "cut to choices" keeps; see ``draft_nodes``."""
    distinct = [len(set(rows[start, :depth].tolist())) for depth, start in zip(depths, starts)]
    total = sum(distinct)
    dropped = set()
    # most distinct tokens first; among equals the worst-ranked first, so a child always goes before its parent
    for index in sorted(range(len(depths)), key=lambda i: (-distinct[i], -i)):
        if total <= budget:
            break
        total -= distinct[index]
        dropped.add(index)
    return [index for index in range(len(depths)) if index not in dropped]
