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
from specbench.structures.sequoia_tree import sequoia_paths


def static_paths(rank_hits: Sequence[float] | None, nodes: int | None, max_depth: int | None) -> list[tuple[int, ...]]:
    """The ``nodes``-node tree with the highest expected acceptance when rank r is right with probability a^(r).

    A static heuristic tree in the spirit of EAGLE's 25-node one (the OPT-Tree paper's "EAGLE tree"
    baseline), built from the draft's measured rank profile ``rank_hits`` (the same at every depth,
    see ``specbench.train.agreement``) by Medusa's greedy sparse-tree builder.
    """
    nodes, max_depth = knob_int("nodes", nodes, 1, "n"), knob_int("max_depth", max_depth, 1)
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


EAGLE1_TREE = (
    (0,),
    (1,),
    (2,),
    (3,),
    (0, 0),
    (0, 1),
    (0, 2),
    (1, 0),
    (1, 1),
    (2, 0),
    (2, 1),
    (3, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 0, 2),
    (0, 1, 0),
    (0, 1, 1),
    (0, 2, 0),
    (0, 2, 1),
    (1, 0, 0),
    (0, 0, 0, 0),
    (0, 0, 0, 1),
    (0, 0, 0, 2),
    (0, 0, 0, 0, 0),
    (0, 0, 0, 0, 1),
)
"""EAGLE-1's published static tree (``mc_sim_7b_63`` in the official ``choices.py``): 25 nodes, 5 deep."""
PUBLISHED_TREES = {"eagle1": EAGLE1_TREE}
"""The published static trees a ``shape`` knob can name."""


def fixed_shape(
    shape: str,
    nodes: int | None,
    paths,
    rank_hits: Sequence[float] | None = None,
    max_depth: int | None = None,
    acceptance: Sequence[float] | None = None,
) -> TreeShape:
    """The fixed tree a drafter's ``shape`` knob names: ``static`` (from the rank profile ``rank_hits``), a
    published tree (its first ``nodes`` nodes, all when None), ``binary`` (the first ``nodes`` nodes of the
    complete binary tree), ``sequoia`` (Sequoia's ``nodes``-node tree for the acceptance vector ``acceptance``, at
    most ``max_depth`` deep when that is set: ``specbench.structures.sequoia_tree``) or ``paths`` (the rank paths
    given)."""
    for key, value, symbol in (("nodes", nodes, "n"), ("max_depth", max_depth, None)):
        if value is not None:  # checked whatever the shape is: a bad value never waits unseen
            knob_int(key, value, 1, symbol)
    if shape == "sequoia":
        if acceptance is None:
            raise ConfigError(
                "a Sequoia tree needs the acceptance vector p: set method.drafter.acceptance_vector=[0.5,0.1,...] "
                "or measure it with method.drafter.calibration"
            )
        return TreeShape.from_paths(sequoia_paths(acceptance, knob_int("nodes", nodes, 1, "n"), max_depth))
    if shape == "static":
        return TreeShape.from_paths(static_paths(rank_hits, nodes, max_depth))
    if shape in PUBLISHED_TREES:
        return TreeShape.from_paths(PUBLISHED_TREES[shape][:nodes])
    if shape == "binary":
        return TreeShape.from_paths(binary_paths(knob_int("nodes", nodes, 1, "n")))
    if not paths:
        raise ConfigError("method.drafter.paths must list rank paths (e.g. [[0],[1],[0,0]]) when shape=paths")
    return TreeShape.from_paths(paths)


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

    def rank_paths(self) -> list[tuple[int, ...]]:
        """The drafted nodes as rank paths, in node order (the inverse of ``from_paths``)."""
        paths: list[tuple[int, ...]] = [()]
        for parent, rank in zip(self.parents[1:], self.ranks[1:]):
            paths.append((*paths[parent], rank))
        return paths[1:]

    def layer(self, depth: int) -> list[int]:
        """Node indices at ``depth``, in order."""
        return [node for node, d in enumerate(self.depths) if d == depth]

    def pruned(self, max_depth: int) -> TreeShape:
        """The nodes at depth <= ``max_depth`` (a prefix, since nodes are in depth order)."""
        keep = sum(1 for d in self.depths if d <= max_depth)
        return self if keep == len(self) else TreeShape(self.parents[:keep], self.ranks[:keep])
