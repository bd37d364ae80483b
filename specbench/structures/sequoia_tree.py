"""Sequoia's static draft tree (Chen et al. 2024) for a node budget, from a positional acceptance vector.

The positional acceptance model: at every position the target's greedy token is the draft's rank-r token
(r = 0, 1, ..., k - 1) with probability ``p[r]``, whatever the position and the path above it. ``p`` is Sequoia's
acceptance vector (p_1 .. p_k in the paper, 1-based; ``p[0]`` here is the draft's top token). Under greedy
verification the ranks are exclusive events, so ``p[r]`` is also the probability that the rank-r child is the
accepted one after ranks < r were rejected, and ``sum(p) <= 1``.

A tree is a set of rank paths closed under parents, whose children of each node use ranks 0..j-1 (the first j
candidates of the draft: ``specbench.structures.tree_shapes.TreeShape``). A node is accepted iff every rank on
its path is the right one, with probability the product of ``p`` along the path, so the tree's expected number
of accepted drafted tokens per step is the sum of those products over its nodes (the mean acceptance length, MAL,
is one more: the target's own token). ``sequoia_paths`` returns the n-node tree that maximises it, at most
``max_depth`` deep when that is given (Sequoia's dynamic program has the same depth bound). Two exact builders:

- **p non-increasing** (the usual measured case): path products never grow from a node to its children nor from
  a rank to the next rank of a sibling, so the n largest products (ties to the earlier path) form a valid tree,
  and no tree of n nodes can do better than the n largest. Medusa's greedy sparse-tree growth
  (``specbench.structures.medusa_tree.sparse_paths``, every depth's accuracy row = ``p``) takes exactly those:
  it is reused, and its trees are nested (heap order: the tree of n nodes is a subtree of the tree of n + 1).
  A depth bound only removes the deeper nodes from the candidates, which keeps both properties.
- **p not monotone** (a noisy tail: rank 9 measured above rank 8): the n largest products may pick a rank-r
  child without its rank-(r-1) sibling, which no tree can hold; the greedy is then not optimal. The dynamic
  program over (nodes, depth, first j children), Sequoia's recursion, is exact for any ``p``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specbench.core.drafter import knob_int
from specbench.errors import ConfigError
from specbench.structures.medusa_tree import RankPath, expected_accepted, sparse_paths

SUM_TOLERANCE = 1e-6
"""How far above 1 a measured acceptance vector's sum may be (float rounding of counts / positions)."""


def checked_acceptance(acceptance: object, key: str = "acceptance_vector") -> list[float]:
    """The acceptance vector p as floats, or a ConfigError naming ``method.drafter.<key>`` (p)."""
    values = list(acceptance) if isinstance(acceptance, Sequence) and not isinstance(acceptance, str) else None
    if (
        not values
        or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0 for v in values)
        or sum(values) > 1.0 + SUM_TOLERANCE
    ):
        raise ConfigError(
            f"method.drafter.{key} (p) must be a non-empty list of probabilities p[r] in [0, 1] summing to at "
            f"most 1 (P(the target's token is the draft's rank-r token)), got {acceptance!r}"
        )
    return [float(v) for v in values]


def is_non_increasing(acceptance: Sequence[float]) -> bool:
    """Whether p[r] >= p[r + 1] for every rank (then the greedy n largest products are optimal)."""
    return all(a >= b for a, b in zip(acceptance, acceptance[1:]))


def sequoia_paths(acceptance: Sequence[float], nodes: int, max_depth: int | None = None) -> list[RankPath]:
    """The ``nodes``-node tree (root excluded) of the largest expected accepted length under the positional
    acceptance vector ``acceptance``, at most ``max_depth`` deep (None: any depth); fewer nodes only when the
    ranks (``len(acceptance)``) and the depth bound hold fewer. Exact (see the module doc): the greedy n largest
    path products when p is non-increasing, else the dynamic program. Paths in depth order."""
    p = checked_acceptance(acceptance)
    nodes = knob_int("nodes", nodes, 1, "n")
    if max_depth is not None:
        knob_int("max_depth", max_depth, 1)
    if is_non_increasing(p):
        paths = sparse_paths([p] * (max_depth or nodes), nodes)  # a tree of n nodes is at most n deep
    else:
        paths = optimal_paths(p, nodes, max_depth)
    return sorted(paths, key=lambda path: (len(path), path))


def expected_length(paths: Sequence[RankPath], acceptance: Sequence[float]) -> float:
    """Expected accepted drafted tokens per step of a tree under the positional model: the sum of its nodes' path
    products (MAL = 1 + this)."""
    deepest = max(map(len, paths), default=0)
    return expected_accepted(list(paths), [list(acceptance)] * deepest)


def optimal_paths(acceptance: Sequence[float], nodes: int, max_depth: int | None = None) -> list[RankPath]:
    """Sequoia's dynamic program, exact for any acceptance vector (used when p is not non-increasing).

    ``below[d, r]``: the largest sum of path products (relative to a node) over subtrees of exactly ``r`` nodes
    strictly below a node, at most ``d + 1`` levels deep under it (one self-referential level when there is no
    depth bound). The subtrees are built child by child in rank order: ``first[d, j, r]`` is the best with the
    first ``j`` children (ranks 0..j-1) holding ``r`` nodes between them, where rank ``j - 1``'s child heading
    ``m`` of them adds ``p[j - 1] * (1 + below[d - 1, m - 1])``. Rows of ``r`` are filled in increasing order,
    so the unbounded level can read its own smaller subtrees. Cost O(levels * k * n^2) in numpy rows.
    """
    p = np.asarray(acceptance, dtype=np.float64)
    k = len(p)
    levels = max_depth if max_depth is not None else 1
    bounded = max_depth is not None
    below = np.full((levels, nodes + 1), -np.inf)
    below[:, 0] = 0.0
    first = np.full((levels, k + 1, nodes + 1), -np.inf)
    first[:, 0, 0] = 0.0
    children: np.ndarray = np.zeros((levels, nodes + 1), dtype=np.int64)  # best j per (level, r)
    split: np.ndarray = np.zeros(
        (levels, k + 1, nodes + 1), dtype=np.int64
    )  # the last child's subtree size per (level, j, r)
    head = np.full((levels, nodes + 1), -np.inf)  # head[d, m] = 1 + (best below a child heading m nodes)
    for r in range(1, nodes + 1):
        if bounded:  # a child of level d heads a subtree of level d - 1 (level -1: the child alone)
            head[0, r] = 1.0 if r == 1 else -np.inf
            head[1:, r] = 1.0 + below[:-1, r - 1]
        else:
            head[0, r] = 1.0 + below[0, r - 1]
        sizes = np.arange(1, r + 1)  # m: nodes under the newest child, itself included
        heads = head[:, sizes]  # [levels, r]
        finite = np.isfinite(heads)
        heads = np.where(finite, heads, 0.0)  # p = 0 times an impossible subtree stays impossible, not nan
        for j in range(1, k + 1):
            total = first[:, j - 1, r - sizes] + np.where(finite, p[j - 1] * heads, -np.inf)  # [levels, r]
            best = total.argmax(axis=1)
            first[:, j, r] = total[np.arange(levels), best]
            split[:, j, r] = sizes[best]
        children[:, r] = first[:, :, r].argmax(axis=1)
        below[:, r] = first[np.arange(levels), children[:, r], r]
    top = levels - 1
    reachable = np.flatnonzero(np.isfinite(below[top]))
    stack: list[tuple[RankPath, int, int]] = [((), top, int(reachable.max()))]
    paths: list[RankPath] = []
    while stack:
        prefix, level, r = stack.pop()
        if r == 0:
            continue
        for j in range(int(children[level, r]), 0, -1):  # peel the children off from the last rank
            m = int(split[level, j, r])
            path = (*prefix, j - 1)
            paths.append(path)
            stack.append((path, level - 1 if bounded else level, m - 1))
            r -= m
    return paths


def rank_hits(target_tokens: torch.Tensor, draft_logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Per rank r < ``top_k``: at how many positions the target's token ``target_tokens`` [L] is the draft's rank-r
    token under ``draft_logits`` [L, vocab] (ranks as the drafter fills a tree: ``topk`` order); [top_k] counts.
    Positions where it is not among the top ``top_k`` count nowhere (p's missing mass)."""
    top = draft_logits.topk(min(top_k, draft_logits.shape[-1]), dim=-1).indices  # [L, k]
    counts = (top == target_tokens.to(top.device)[:, None]).sum(dim=0).cpu()  # [k]
    return torch.nn.functional.pad(counts, (0, top_k - counts.numel()))
