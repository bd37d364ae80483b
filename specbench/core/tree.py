"""Draft trees: the one structure every method proposes, and its flattening into one forward pass.

A ``DraftTree`` is a parent-index tree in topological order. Node 0 is the root: the last committed
token ``x`` (at position ``p``), whose KV is not cached yet. A node at depth ``d`` sits at position
``p + d`` and attends to the cache and to its ancestors (itself included). Chains, tries, Medusa
"choices", OPT-Tree trees and parallel candidate lists are all DraftTrees.

An optional ``AuxBlock`` adds query rows to the same forward whose logits go only to the drafter
(LADE's lookahead window, Self-Draft's drafting branches). Aux rows see the cache, the root and the
aux rows their own mask allows; tree rows never see aux rows; aux KV is always discarded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import torch


def child_lists(parents) -> list[list[int]]:
    """Per node of a parent-index tree (node 0 = root, parents precede children): its children in order."""
    kids: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents[1:], start=1):
        kids[parent].append(node)
    return kids


def id_range_problem(what: str, low: int, high: int, vocab: int) -> str | None:
    """Why ids from ``low`` to ``high`` are not all token ids of a ``vocab``-token model (None when they are)."""
    if low < 0 or high >= vocab:
        return f"{what} id {low if low < 0 else high} is outside the target's vocabulary (0..{vocab - 1})"
    return None


@dataclass
class AuxBlock:
    """Extra query rows in the verify forward whose logits only the drafter reads."""

    tokens: torch.Tensor  # [m] long
    pos_offsets: torch.Tensor  # [m] long, position = p + offset
    mask: torch.Tensor  # [m, m] bool, row i may attend aux row j (diagonal must be True)

    def __post_init__(self) -> None:
        problem = self.shape_problem()
        if problem is not None:
            raise ValueError(problem)

    def __len__(self) -> int:
        return self.tokens.numel()

    def shape_problem(self) -> str | None:
        """Why the rows cannot be laid out (tokens not one row of ids, offsets or mask of other sizes), or None."""
        m = self.tokens.numel()
        if self.tokens.dim() != 1 or self.tokens.dtype != torch.long:
            return f"aux tokens must be a 1-D long tensor, got {self.tokens.dtype} of shape {tuple(self.tokens.shape)}"
        if self.pos_offsets.shape != (m,) or self.mask.shape != (m, m) or self.mask.dtype != torch.bool:
            return (
                f"AuxBlock shapes disagree: tokens {m}, offsets {tuple(self.pos_offsets.shape)}, "
                f"mask {tuple(self.mask.shape)} {self.mask.dtype} (want ({m},) and bool ({m}, {m}))"
            )
        return None


@dataclass
class DraftTree:
    """Parent-index token tree rooted at the last committed token (node 0)."""

    tokens: list[int]
    parents: list[int]  # parents[0] == -1; parents[i] < i (topological order)
    draft_probs: torch.Tensor | None = None  # [num_nodes, vocab] q(.|node), for stochastic drafts
    aux: AuxBlock | None = None

    def __post_init__(self) -> None:
        problem = self.structure_problem()
        if problem is not None:
            raise ValueError(problem)

    def structure_problem(self) -> str | None:
        """Why this is not a parent-index tree in topological order rooted at node 0 (None when it is).

        O(nodes) in Python; the loop runs it on every proposed tree, since ``tokens`` and ``parents`` are plain
        lists a drafter may change after construction.
        """
        tokens, parents = self.tokens, self.parents
        if len(tokens) != len(parents) or not tokens:
            return (
                f"a DraftTree needs one parent per token and at least the root "
                f"({len(tokens)} tokens, {len(parents)} parents)"
            )
        if parents[0] != -1:
            return f"node 0 must be the root (parent -1), got parent {parents[0]!r}"
        for node, parent in enumerate(parents):
            if node and not (type(parent) is int and 0 <= parent < node):
                return f"node {node} has parent {parent!r}: parents must be earlier nodes (0 <= parent < node)"
        return None

    def problem(self, vocab: int) -> str | None:
        """Why a model reading token ids ``0..vocab-1`` cannot verify this tree (None when it can): its structure,
        token ids that are not integers in range (aux rows' included), aux shapes, draft-probability rows."""
        problem = self.structure_problem()
        if problem is None and not all(type(token) is int for token in self.tokens):
            bad = next(token for token in self.tokens if type(token) is not int)
            problem = f"token {bad!r} is a {type(bad).__name__}, not an int"
        if problem is None:
            problem = id_range_problem("token", min(self.tokens), max(self.tokens), vocab)
        if problem is None and self.aux is not None:
            problem = self.aux.shape_problem()
            if problem is None and len(self.aux):
                low, high = torch.aminmax(self.aux.tokens)
                problem = id_range_problem("aux token", int(low), int(high), vocab)
        probs = self.draft_probs
        if problem is None and probs is not None and (probs.dim() != 2 or probs.shape[0] != len(self.tokens)):
            problem = f"draft_probs has shape {tuple(probs.shape)}; it needs one row per node: ({len(self)}, vocab)"
        return problem

    @cached_property
    def depths(self) -> list[int]:
        """Each node's depth (root 0); computed on first use, since the verify pass does not need it."""
        depths = [0]
        for parent in self.parents[1:]:
            depths.append(depths[parent] + 1)
        return depths

    @classmethod
    def root_only(cls, root: int) -> DraftTree:
        """The empty draft: verify just the root (one autoregressive step)."""
        return cls([root], [-1])

    @classmethod
    def chain(cls, root: int, draft: list[int]) -> DraftTree:
        """A single candidate continuation ``root -> draft[0] -> draft[1] ...``."""
        return cls([root, *draft], list(range(-1, len(draft))))

    @classmethod
    def from_paths(cls, root: int, paths: Sequence[Sequence[int]]) -> DraftTree:
        """Merge candidate continuations into a trie (shared prefixes become shared nodes)."""
        tokens, parents = [root], [-1]
        children: dict[tuple[int, int], int] = {}
        for path in paths:
            node = 0
            for token in path:
                key = (node, token)
                if key not in children:
                    children[key] = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                node = children[key]
        return cls(tokens, parents)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_drafted(self) -> int:
        """Drafted nodes verified this step (the root is the committed token, not a draft)."""
        return len(self.tokens) - 1

    @property
    def is_chain(self) -> bool:
        """True when every node's parent is the node before it (a causal mask suffices)."""
        return self.parents == list(range(-1, len(self.parents) - 1))

    def children(self) -> list[list[int]]:
        """Child lists per node, in node order."""
        return child_lists(self.parents)

    @property
    def depth(self) -> int:
        """Depth of the deepest node (0: nothing drafted)."""
        return max(self.depths)

    def leaves_first_branch(self, path: Sequence[int]) -> bool:
        """Whether a root-first node path uses a child other than its parent's first-listed one.

        Tree builders list siblings best first (by rank or score), so this says whether the accepted path
        needed a branch beside the drafter's top-1 continuation.
        """
        first_child = self.parents.index  # the first node whose parent is the given one
        return any(first_child(parent) != node for parent, node in pairwise(path))

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive."""
        path = []
        while node != -1:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def pruned(self, max_depth: int) -> DraftTree:
        """The subtree of nodes at depth <= max_depth (keeps order and aux; drops draft_probs rows)."""
        if len(self.tokens) <= max_depth + 1:  # no node can be that deep
            return self
        keep = [i for i, d in enumerate(self.depths) if d <= max_depth]
        if len(keep) == len(self.tokens):
            return self
        new_index = {old: new for new, old in enumerate(keep)}
        parents = [new_index[self.parents[i]] if i else -1 for i in keep]
        probs = self.draft_probs[keep] if self.draft_probs is not None else None
        return DraftTree([self.tokens[i] for i in keep], parents, probs, self.aux)


@dataclass
class FlatPass:
    """Inputs of one verify forward: tree rows first, then aux rows."""

    input_ids: torch.Tensor  # [1, q] long
    position_ids: torch.Tensor  # [1, q] long
    attention_mask: torch.Tensor | None  # [1, 1, q, past + q] additive float, None = plain causal
    # (with a fixed ``shape``: [1, 1, rows, columns])


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """[n, n] bool from parents [n] (root's -1): (i, j) is True when node j is node i or its ancestor.

    Pointer doubling on the device that holds ``parents``: after round k every row holds the ancestors
    closer than 2^k, so ceil(log2 n) rounds of one row gather each suffice, with no loop over nodes
    and no host sync. Hops past the root stay at the root, an ancestor of every node.
    """
    n = parents.numel()
    allowed = torch.eye(n, dtype=torch.bool, device=parents.device)  # [n, n]
    hop = parents.clamp(min=0)  # [n] the 2^k-th ancestor (clamped at the root)
    for _ in range((n - 1).bit_length()):
        allowed |= allowed[hop]  # add the ancestors of the 2^k-th ancestor
        hop = hop[hop]
    return allowed


def flatten(
    tree: DraftTree, past_len: int, dtype: torch.dtype, device: torch.device, shape: tuple[int, int] | None = None
) -> FlatPass:
    """Lay a tree (+ aux block) out as one forward: tokens, positions and the 4-D additive mask.

    The host sends the tokens and parents (one small copy); the mask and the positions (past length
    + depth = number of ancestors) are built on ``device``. ``shape`` = (rows, columns) pads the pass to a
    fixed size (the compiled path's bucket and static cache, ``specbench.core.compiled``): padding rows hold
    token 0 at position ``past_len`` and see only themselves; every row is blocked from the columns after its
    pass's rows (padding rows, and cache rows past the valid length).

    NOTE: chains without aux rows and without ``shape`` get no mask at all, so the attention kernel takes its
    causal fast path (this is what makes AR and SpeDe steps cost what HF ``generate`` steps cost).
    """
    n, aux = len(tree), tree.aux
    if aux is None and tree.is_chain and shape is None:
        tokens = torch.tensor(tree.tokens, dtype=torch.long, device=device)  # [n]
        positions = torch.arange(past_len, past_len + n, device=device)  # [n]
        return FlatPass(tokens[None], positions[None], None)
    tokens, parents = torch.tensor([tree.tokens, tree.parents], dtype=torch.long, device=device)  # [n] each
    m = len(aux) if aux is not None else 0
    rows, columns = shape or (n + m, past_len + n + m)
    if rows < n + m or columns < past_len + rows:
        raise ValueError(f"a pass of {n + m} rows after {past_len} cached ones does not fit the shape {shape}")
    seen = torch.eye(rows, columns - past_len, dtype=torch.bool, device=device)  # [rows, columns - past]
    seen[:n, :n] = ancestor_mask(parents)
    positions = past_len - 1 + seen[:n, :n].sum(dim=-1)  # [n] past_len + depth
    if aux is not None:
        tokens = torch.cat([tokens, aux.tokens.to(device)])
        positions = torch.cat([positions, past_len + aux.pos_offsets.to(device)])
        seen[n : n + m, 0] = True  # every aux row sees the root
        seen[n : n + m, n : n + m] = aux.mask.to(device)
    if rows > n + m:  # padding rows: token 0 at the root's position
        tokens = torch.nn.functional.pad(tokens, (0, rows - n - m))  # [rows]
        positions = torch.nn.functional.pad(positions, (0, rows - n - m), value=past_len)  # [rows]
    mask = torch.zeros(rows, columns, dtype=dtype, device=device)  # [rows, columns]
    mask[:, past_len:].masked_fill_(~seen, torch.finfo(dtype).min)
    return FlatPass(tokens[None], positions[None], mask[None, None])
