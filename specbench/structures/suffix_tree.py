"""SuffixDecoding's suffix trees (Oliaro et al., 2024; docs/methods/suffix_decoding.md).

A depth-bounded suffix trie over one or more token sequences. The node of a string ``s`` with
``|s| <= d_max`` (``max_depth``) holds ``count(s)``: the number of positions where ``s`` occurs in the
stored sequences. A sequence grows one token at a time (the per-request tree follows the prompt and
every committed token; the global tree follows the responses), so a new token adds one occurrence to
each of the strings that end with it and start at most ``d_max - 1`` tokens earlier.

Leaf compression: a string that occurs once is not stored node by node. Its first node (a *leaf
head*, count 1) records the one occurrence (sequence, start) and every deeper string on that path is
read from the sequence itself; a live sequence's leaves therefore grow with it for free. When a second
occurrence reaches a leaf head, the head becomes an ordinary node and the first occurrence's
continuation becomes a leaf head one level deeper (a *split*). A sequence that is still growing keeps,
per suffix start that is not inside its own leaf, the ordinary node where that suffix ends, so an
appended token costs one child step per such suffix.

Speculation (``speculate``): for every match length ``m = 1, 2, ...`` (at most ``d_max - 1``) the last
``m`` tokens of the context are looked up; from their node a draft is grown by estimated probability
``count(node) / count(match)`` (the empirical continuation probability, the product of the
count ratios along the path), keeping nodes with probability >= ``min_token_prob`` and at most
``floor(max_spec_factor * m)`` of them (``MAX_SPEC = alpha * p``). ``tree`` speculation adds, best
first, the most probable node whose parent is already in the draft (SuffixDecoding's greedy
speculation tree); ``linear`` speculation follows the most frequent child only. A draft's score is
the sum of its node probabilities; the highest score over the match lengths wins (ties: the longer
match), as in the paper's speculation tree scoring and the official code.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import count as counter

SPECULATION = ("tree", "linear")
SELECTION = ("score", "longest")


class SuffixNode:
    """A stored string: its occurrence count, its children and, for a leaf head, its one occurrence."""

    __slots__ = ("children", "order", "token", "count", "depth", "owner", "start")

    def __init__(self, token: int, depth: int, count: int, owner: int | None = None, start: int = 0) -> None:
        self.children: dict[int, SuffixNode] = {}
        self.order: list[SuffixNode] = []  # the children by decreasing count (ties: see _grew / _shrank)
        self.token = token  # the string's last token
        self.count = count
        self.depth = depth  # length of the string
        self.owner = owner  # leaf head: the sequence holding the string's one occurrence (else None)
        self.start = start  # leaf head: where that occurrence starts in its sequence

    def adopt(self, child: SuffixNode) -> None:
        """Store a new child (count 1) after its siblings."""
        self.children[child.token] = child
        self.order.append(child)


Cursor = SuffixNode | tuple[list[int], int, int]
"""A position in the trie: a stored node, or (sequence, index of the next token, depth) inside a leaf."""


@dataclass
class SuffixDraft:
    """A speculation: tokens with their parents (-1: child of the root), probabilities and score.

    Every probability is a node's count over the match's count (``total``), so the score, their sum, is
    kept exactly as ``weight / total`` (``weight``: the sum of the counts) and compared without rounding.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    weight: int = 0
    total: int = 1
    match_len: int = 0  # context tokens matched (0: no match)

    @property
    def score(self) -> float:
        """The sum of the drafted nodes' estimated probabilities."""
        return self.weight / self.total

    def at_least(self, other: SuffixDraft) -> bool:
        """Whether this draft scores at least as high as ``other`` (exactly)."""
        return self.weight * other.total >= other.weight * self.total

    def depths(self) -> list[int]:
        """Each drafted token's depth below the root (1 = the root's child)."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(depths[parent] + 1 if parent >= 0 else 1)
        return depths


class SuffixTree:
    """Occurrence counts of every string of at most ``max_depth`` tokens in a set of sequences."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = SuffixNode(-1, 0, 0)
        self.seqs: dict[int, list[int]] = {}
        self.live: dict[int, dict[int, SuffixNode]] = {}  # open sequence -> {suffix start: node it ends at}
        self.nodes = 0  # stored nodes below the root

    # --- updates -------------------------------------------------------------------------------

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (a new sequence is opened on first use)."""
        for token in tokens:
            self.append(seq_id, token)

    def append(self, seq_id: int, token: int) -> None:
        """Append one token: each string ending with it (at most ``max_depth`` long) gains an occurrence."""
        seq = self.seqs.get(seq_id)
        if seq is None:
            seq = self.seqs[seq_id] = []
            self.live[seq_id] = {}
        elif seq_id not in self.live:
            raise ValueError(f"sequence {seq_id} is closed")
        live = self.live[seq_id]
        live[len(seq)] = self.root  # the empty suffix starting at the new token
        seq.append(token)
        self.root.count += 1
        for start, node in list(live.items()):  # splits below may add (never step) other starts
            child = node.children.get(token)
            if child is None:  # first occurrence of this string: a leaf head that grows with the sequence
                node.adopt(SuffixNode(token, node.depth + 1, 1, seq_id, start))
                self.nodes += 1
                del live[start]
                continue
            if child.owner is not None:
                self._split(child)
            child.count += 1
            if node is not self.root:  # the root's children are never ranked (a match is >= 1 token)
                _grew(node.order, child)
            if child.depth >= self.max_depth:
                del live[start]
            else:
                live[start] = child

    def _split(self, head: SuffixNode) -> None:
        """A second occurrence reaches a leaf head: store it as a node, its old occurrence one level deeper."""
        owner, start, depth = head.owner, head.start, head.depth
        assert owner is not None
        head.owner = None
        seq = self.seqs[owner]
        if depth < self.max_depth and start + depth < len(seq):
            head.adopt(SuffixNode(seq[start + depth], depth + 1, 1, owner, start))
            self.nodes += 1
        elif owner in self.live and depth < self.max_depth:  # the occurrence ends at its sequence's end
            self.live[owner][start] = head

    def close(self, seq_id: int) -> None:
        """The sequence is complete: stop tracking its growing suffixes (it can still be removed)."""
        self.live.pop(seq_id, None)

    def remove(self, seq_id: int) -> None:
        """Take every occurrence in sequence ``seq_id`` out of the counts (nodes left at zero are deleted)."""
        seq = self.seqs.pop(seq_id)
        self.live.pop(seq_id, None)
        for start in range(len(seq)):
            node = self.root
            node.count -= 1
            for index in range(start, min(start + self.max_depth, len(seq))):
                child = node.children[seq[index]]
                child.count -= 1
                if child.count == 0:  # only this occurrence passed here: drop the whole branch
                    del node.children[seq[index]]
                    if node is not self.root:
                        node.order.remove(child)
                    self.nodes -= _subtree_size(child)
                    break
                if node is not self.root:
                    _shrank(node.order, child)
                node = child

    # --- queries -------------------------------------------------------------------------------

    def _step(self, cursor: Cursor, token: int) -> Cursor | None:
        """The position after ``token``, or None where no stored string continues with it."""
        if isinstance(cursor, SuffixNode):
            if cursor.owner is None:
                return cursor.children.get(token)
            cursor = (self.seqs[cursor.owner], cursor.start + cursor.depth, cursor.depth)
        seq, index, depth = cursor
        if depth < self.max_depth and index < len(seq) and seq[index] == token:
            return (seq, index + 1, depth + 1)
        return None

    def match(self, pattern: Sequence[int]) -> Cursor | None:
        """The position of ``pattern`` (None if it never occurs or is longer than ``max_depth``)."""
        cursor: Cursor | None = self.root
        for token in pattern:
            cursor = self._step(cursor, token)  # type: ignore[arg-type]
            if cursor is None:
                return None
        return cursor

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` in the stored sequences (0 past ``max_depth`` tokens)."""
        cursor = self.match(pattern)
        if cursor is None:
            return 0
        return cursor.count if isinstance(cursor, SuffixNode) else 1

    def continuations(self, cursor: Cursor) -> list[tuple[int, int, Cursor]]:
        """(count, token, position) of each string one token longer, most frequent first (ties: see ``_grew``)."""
        if isinstance(cursor, SuffixNode):
            if cursor.owner is None:
                return [(child.count, child.token, child) for child in cursor.order]
            cursor = (self.seqs[cursor.owner], cursor.start + cursor.depth, cursor.depth)
        seq, index, depth = cursor
        if depth < self.max_depth and index < len(seq):
            return [(1, seq[index], (seq, index + 1, depth + 1))]
        return []

    def grow(
        self, start: Cursor, max_tokens: int, min_token_prob: float, max_draft_depth: int, tree: bool = True
    ) -> SuffixDraft:
        """The draft below ``start``: nodes by probability count / count(start), best first, at most ``max_tokens``.

        ``tree`` adds the most probable node whose parent is already drafted; otherwise only the most
        frequent child of the last drafted node is followed. Nodes below ``min_token_prob`` or deeper
        than ``max_draft_depth`` are never drafted.
        """
        total = start.count if isinstance(start, SuffixNode) else 1
        draft = SuffixDraft(total=total)
        if max_tokens < 1 or max_draft_depth < 1:
            return draft
        tie = counter()
        heap: list[tuple[int, int, int, int, int, Cursor]] = []  # probability = count / total: rank by count

        def offer(cursor: Cursor, parent: int, depth: int) -> None:
            for kid_count, token, kid in self.continuations(cursor):
                if kid_count / total < min_token_prob:
                    break  # most frequent first: the rest are rarer still
                heapq.heappush(heap, (-kid_count, next(tie), token, parent, depth, kid))
                if not tree:
                    break

        offer(start, -1, 1)
        while heap and len(draft.tokens) < max_tokens:
            neg, _, token, parent, depth, cursor = heapq.heappop(heap)
            draft.tokens.append(token)
            draft.parents.append(parent)
            draft.probs.append(-neg / total)
            draft.weight -= neg
            if depth < max_draft_depth:
                offer(cursor, len(draft.tokens) - 1, depth + 1)
        return draft

    def speculate(
        self,
        context: Sequence[int],
        max_spec_tokens: int,
        max_spec_factor: float,
        min_token_prob: float,
        max_draft_depth: int,
        tree: bool = True,
        selection: str = "score",
    ) -> SuffixDraft:
        """The best draft continuing ``context`` over match lengths 1 .. min(len(context), max_depth) - 1.

        Match length ``m`` allows ``min(max_spec_tokens, floor(max_spec_factor * m))`` nodes. ``score``
        keeps the highest-scoring draft (ties: the longer match), ``longest`` the draft of the longest
        match that has a continuation (the context's own occurrence, at the end of a live sequence, has none).
        """
        context = context[-self.max_depth :]
        best = SuffixDraft()
        for length in range(1, len(context)):
            cursor = self.match(context[len(context) - length :])
            if cursor is None:
                break  # a longer suffix cannot occur either
            single = not isinstance(cursor, SuffixNode) or cursor.count == 1
            if single and not self.continuations(cursor):
                break  # one occurrence with nothing after it (the context itself): so are longer suffixes'
            budget = min(max_spec_tokens, int(length * max_spec_factor + 1e-6))
            draft = self.grow(cursor, budget, min_token_prob, max_draft_depth, tree)
            draft.match_len = length
            keep = bool(draft.tokens) if selection == "longest" else draft.at_least(best)
            if keep:
                best = draft
        return best

    def sizes(self) -> dict[str, int]:
        """Stored nodes (leaf chains count once, at their head), sequences and their tokens."""
        return {
            "nodes": self.nodes,
            "sequences": len(self.seqs),
            "tokens": sum(len(seq) for seq in self.seqs.values()),
        }


def _grew(order: list[SuffixNode], child: SuffixNode) -> None:
    """Re-rank ``child`` among its siblings after its count grew from c to c + 1.

    The official code's sibling list: the first node of the count-c group becomes the first of the
    c + 1 group, any other one its last (so equal counts are ordered by history, not by token).
    """
    index = order.index(child)
    count = child.count - 1
    first = index == 0 or order[index - 1].count != count
    del order[index]
    skip = count + 1 if first else count  # walk back over the c + 1 group, or over the rest of the c group
    while index > 0 and order[index - 1].count == skip:
        index -= 1
    order.insert(index, child)


def _shrank(order: list[SuffixNode], child: SuffixNode) -> None:
    """Re-rank ``child`` after its count shrank from c to c - 1: the first of the c - 1 group (official order)."""
    index = order.index(child)
    del order[index]
    while index < len(order) and order[index].count == child.count + 1:
        index += 1
    order.insert(index, child)


def _subtree_size(node: SuffixNode) -> int:
    """Stored nodes in the subtree of ``node``, itself included."""
    size, stack = 0, [node]
    while stack:
        top = stack.pop()
        size += 1
        stack.extend(top.children.values())
    return size
