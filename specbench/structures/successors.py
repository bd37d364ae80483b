"""A successor table: for every token, the target's k most likely next tokens (Token Recycling's adjacency matrix).

``SuccessorTable(vocab_size, k)`` holds ``M`` (``[vocab_size, k]`` token ids, on one device). Row ``x`` lists the
k candidates the target ranked highest after ``x`` the last time ``x`` was a verified tree row, best first:

- ``update(tokens, logits)`` after a verify pass: every row's token gets the top-k of that row's logits (the whole
  tree, not only the accepted path; Luo et al. 2024, section 3). A row is *replaced*, not merged. When a token
  sits on several rows of one pass, the last row in tree order wins. One batched ``topk`` and one indexed write,
  on the logits' device, with no host synchronisation.
- ``tree(root, shape)`` expands a static tree shape (``TreeShape``: child ranks) over ``M`` from ``root``, layer by
  layer: a node of rank r under a node holding token t holds ``M[t, r]`` (the paper's BFS-like retrieval, one
  gather per depth). The result is a ``DraftTree`` with the shape's parents.
- ``reset()`` zeroes ``M`` (its initial state: every row holds token 0 until it is first updated, as the
  official code initialises it); ``filled`` marks the rows written since.

Token Recycling drafts from it (``specbench.drafters.token_recycling``); other drafters may use it as a
model-free fallback (SAM-Decoding). ``recycling_tree()`` is the paper's 80-node static tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch

from specbench.core.tree import DraftTree
from specbench.structures.tree_shapes import TreeShape

RECYCLING_TREE_CHILDREN: tuple[tuple[int, ...], ...] = (
    (8,),
    (8, 4, 3, 2, 1, 1, 1, 1),
    (8, 3, 2, 1, 1, 1, 1, 1, 2, 1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0),
    (5, 2, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0),
    (3, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0),
    (2, 0, 0, 1, 0, 0, 0, 0),
)
"""The Token Recycling tree (the official code's default template "2.2.2"), as the number of children of each node,
depth by depth, nodes in breadth-first order (children take ranks 0, 1, ... of their parent's row): 80 drafted
nodes, 8 / 21 / 25 / 15 / 8 / 3 at depths 1 to 6, every child rank below k = 8."""


def paths_from_children(children: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Rank paths of a tree given as child counts per depth (breadth-first order, the root's layer first)."""
    layer: list[tuple[int, ...]] = [()]
    paths: list[tuple[int, ...]] = []
    for counts in children:
        if len(counts) != len(layer):
            raise ValueError(f"a layer of {len(layer)} nodes needs {len(layer)} child counts, got {len(counts)}")
        layer = [(*parent, rank) for parent, count in zip(layer, counts) for rank in range(count)]
        paths.extend(layer)
    return paths


@cache
def recycling_tree() -> TreeShape:
    """The paper's static draft tree (``RECYCLING_TREE_CHILDREN``) as a ``TreeShape``."""
    return TreeShape.from_paths(paths_from_children(RECYCLING_TREE_CHILDREN))


class SuccessorTable:
    """``M``: the top-k successor candidates of every token, refreshed from verify logits and expanded into trees."""

    def __init__(self, vocab_size: int, k: int, device: torch.device | str | None = None):
        if vocab_size < 1 or k < 1:
            raise ValueError(f"a successor table needs vocab_size >= 1 and k >= 1, got {vocab_size} and {k}")
        self.k = k
        self.matrix = torch.zeros(vocab_size, k, dtype=torch.long, device=device)  # [V, k] M
        self.filled = torch.zeros(vocab_size, dtype=torch.bool, device=device)  # [V] rows written since reset
        self._layouts: dict[TreeShape, tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]] = {}

    @property
    def vocab_size(self) -> int:
        return self.matrix.shape[0]

    @property
    def device(self) -> torch.device:
        return self.matrix.device

    @property
    def nbytes(self) -> int:
        """Bytes held by ``M`` (the method's extra memory; the ``filled`` flags are bookkeeping)."""
        return self.matrix.element_size() * self.matrix.numel()

    @property
    def rows_filled(self) -> int:
        """Rows written since the last reset (one host sync)."""
        return int(self.filled.sum())

    def reset(self) -> None:
        """Back to the initial state: every row holds token 0, none is filled."""
        self.matrix.zero_()
        self.filled.zero_()

    def update(self, tokens: torch.Tensor | Sequence[int], logits: torch.Tensor) -> None:
        """Replace row ``tokens[i]`` by the top-k of ``logits[i]`` for every row i of a verify pass.

        ``tokens`` [n] are the tokens the pass ran on (tree rows), ``logits`` [n, vocab] the target's logits at
        them. A token on several rows gets the top-k of its last row.
        """
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.device)  # [n]
        if tokens.numel() == 0:
            return
        top = logits.topk(self.k, dim=-1).indices.to(self.device)  # [n, k]
        order = torch.arange(tokens.numel(), device=self.device)  # [n]
        same = tokens[:, None] == tokens[None, :]  # [n, n]
        last = torch.where(same, order, -1).amax(dim=1)  # [n] the last row holding row i's token
        self.matrix[tokens] = top[last]  # duplicates write identical rows, so the write order does not matter
        self.filled[tokens] = True

    def expand(self, root: int, shape: TreeShape) -> torch.Tensor:
        """The tokens [len(shape)] of ``shape`` expanded over ``M`` from ``root`` (on the table's device)."""
        parents, ranks, layers = self._layout(shape)
        tokens = torch.empty(len(shape), dtype=torch.long, device=self.device)  # [n]
        tokens[0] = root
        for start, end in layers:  # one gather per depth: M[token of parent, rank]
            tokens[start:end] = self.matrix[tokens[parents[start:end]], ranks[start:end]]
        return tokens

    def tree(self, root: int, shape: TreeShape) -> DraftTree:
        """``shape`` filled from ``root`` over ``M``, as a DraftTree (one device-to-host copy)."""
        return DraftTree(self.expand(root, shape).tolist(), list(shape.parents))

    def _layout(self, shape: TreeShape) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
        """The shape's parents and ranks on the device, and its depth layers as node ranges (cached per shape)."""
        if shape not in self._layouts:
            if max(shape.ranks) >= self.k:
                raise ValueError(f"the tree uses child rank {max(shape.ranks)}, but rows hold k = {self.k} candidates")
            parents = torch.tensor([max(p, 0) for p in shape.parents], dtype=torch.long, device=self.device)
            ranks = torch.tensor(shape.ranks, dtype=torch.long, device=self.device)
            bounds = [shape.depths.index(d) for d in range(1, shape.max_depth + 1)] + [len(shape)]
            self._layouts[shape] = (parents, ranks, list(zip(bounds[:-1], bounds[1:])))
        return self._layouts[shape]
