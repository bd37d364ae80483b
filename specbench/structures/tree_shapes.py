"""Fixed draft-tree shapes given as rank paths (static trees, binary trees, Medusa "choices").

A shape is a list of paths of child ranks: ``[0]`` is the best child of the root, ``[0, 1]`` the
second-best child of that node, and so on. A drafter fills a shape with tokens each step (rank ``r``
= the draft's ``r``-th most likely token, or its ``r``-th draw without replacement). Shapes are
validated once: every path's prefix must be in the shape (the tree is closed under parents) and the
children of each node must use ranks ``0..k-1`` (so "the first k children" is well defined).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specbench.core.drafter import knob_int
from specbench.core.tree import child_lists
from specbench.errors import ConfigError
from specbench.structures.medusa_tree import sparse_paths


def static_paths(rank_hits: Sequence[float], nodes: int, max_depth: int) -> list[tuple[int, ...]]:
    """The ``nodes``-node tree with the highest expected acceptance when rank r is right with probability a^(r).

    A static heuristic tree in the spirit of EAGLE's 25-node one (the OPT-Tree paper's "EAGLE tree"
    baseline), built from the draft's measured rank profile ``rank_hits`` (the same at every depth,
    see ``specbench.train.agreement``) by Medusa's greedy sparse-tree builder.
    """
    knob_int("nodes", nodes, 1)
    knob_int("max_depth", max_depth, 1)
    if not rank_hits:
        raise ConfigError(
            "a static tree needs the draft's rank hit rates a^(r): set model.draft.rank_hits "
            "(python -m specbench.train draft reports them as rank_hits) or "
            "method.drafter.rank_hits=[0.5,0.1,...], or give a tree with shape=paths"
        )
    return sparse_paths([list(rank_hits)] * max_depth, nodes)


def binary_paths(nodes: int) -> list[tuple[int, ...]]:
    """The first ``nodes`` nodes of the complete binary tree (two best children per node), breadth first.

    ``nodes = 2 + 4 + ... + 2^d`` gives the complete tree of depth ``d`` (30 nodes = depth 4).
    """
    knob_int("nodes", nodes, 1)
    paths: list[tuple[int, ...]] = []
    layer: list[tuple[int, ...]] = [()]
    while len(paths) < nodes:
        layer = [(*parent, rank) for parent in layer for rank in (0, 1)]
        paths.extend(layer[: nodes - len(paths)])
    return paths


@dataclass(frozen=True)
class TreeShape:
    """A fixed tree of child ranks in depth order: node 0 is the root, node i is child ``ranks[i]`` of
    ``parents[i]``."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    depths: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        depths = [0]
        for parent in self.parents[1:]:
            depths.append(depths[parent] + 1)
        object.__setattr__(self, "depths", tuple(depths))

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> TreeShape:
        """Validate rank paths and lay them out depth by depth (ranks ascending within a parent)."""
        unique = sorted({tuple(int(r) for r in path) for path in paths}, key=lambda p: (len(p), p))
        if not unique or any(len(p) == 0 or min(p) < 0 for p in unique):
            raise ConfigError(f"a tree shape needs non-empty rank paths of ranks >= 0, got {list(paths)!r}")
        index: dict[tuple[int, ...], int] = {(): 0}
        parents, ranks = [-1], [0]
        for path in unique:
            if path[:-1] not in index:
                raise ConfigError(f"tree path {list(path)} has no parent path {list(path[:-1])} in the shape")
            index[path] = len(parents)
            parents.append(index[path[:-1]])
            ranks.append(path[-1])
        shape = cls(tuple(parents), tuple(ranks))
        for node, kids in enumerate(shape.children()):
            if sorted(shape.ranks[k] for k in kids) != list(range(len(kids))):
                raise ConfigError(
                    f"the children of tree node {node} use ranks "
                    f"{sorted(shape.ranks[k] for k in kids)}; they must be 0..k-1"
                )
        return shape

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return self.depths[-1]

    def children(self) -> list[list[int]]:
        """Child lists per node, ranks ascending."""
        return child_lists(self.parents)

    def layer(self, depth: int) -> list[int]:
        """Node indices at ``depth``, in order."""
        return [node for node, d in enumerate(self.depths) if d == depth]

    def pruned(self, max_depth: int) -> TreeShape:
        """The nodes at depth <= ``max_depth`` (a prefix, since nodes are in depth order)."""
        keep = sum(1 for d in self.depths if d <= max_depth)
        return self if keep == len(self) else TreeShape(self.parents[:keep], self.ranks[:keep])
