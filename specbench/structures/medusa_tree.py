"""Medusa's static token trees (Cai et al. 2024, sections 3.1.2 and 3.3.3; docs/methods/medusa.md#static-trees).

A tree is a set of rank paths ("medusa choices"): the path ``(i_1, ..., i_d)`` is the node at depth
``d`` that holds head ``d``'s ``i_d``-th top token (0-based) under the node ``(i_1, ..., i_{d-1})``;
the root (depth 0) is the committed token. Three ways to get one:
- dense: the Cartesian product of every head's top-``s_k`` (``sum_k prod_{i<=k} s_i`` nodes);
- sparse: greedy on calibration accuracies ``a_k^(i)`` (head k's i-th top token is right): a node's
  value is the product of the accuracies along its path, the tree's expected acceptance length is
  the sum of its nodes' values, and the greedy adds the best node whose parent is in the tree until
  the node budget is spent. Values never grow along a path (accuracies are <= 1), so the greedy
  always takes a largest value left anywhere, hence the sum of the ``n`` largest values: optimal;
- an explicit list of paths (e.g. a tree published with a checkpoint).

The trees the Medusa authors published (``medusa_trees/<name>.json``: ``mc_sim_7b_63`` and the
per-model ``*_stage1`` / ``*_stage2`` trees) ship as data, in their published order. That order is the
order of their greedy construction (every prefix of the list is itself a tree), so the first ``n``
paths are the authors' sparse tree of ``n`` nodes.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from itertools import product

from specbench.core.drafter import knob_choice
from specbench.errors import ConfigError

RankPath = tuple[int, ...]
TREES_FOLDER = "medusa_trees"


def published_trees() -> list[str]:
    """Names of the published trees shipped in ``medusa_trees/`` (sorted)."""
    folder = resources.files("specbench.structures") / TREES_FOLDER
    return sorted(entry.name[: -len(".json")] for entry in folder.iterdir() if entry.name.endswith(".json"))


@cache
def published_tree(name: str) -> tuple[RankPath, ...]:
    """The rank paths of a published tree, in the published (greedy construction) order."""
    if name not in published_trees():
        raise ConfigError(f"no published Medusa tree named {name!r}; choose one of {published_trees()}")
    data = json.loads((resources.files("specbench.structures") / TREES_FOLDER / f"{name}.json").read_text())
    return tuple(tuple(int(rank) for rank in path) for path in data["paths"])


def dense_paths(sizes: list[int]) -> list[RankPath]:
    """Cartesian-product tree: every node of depth d <= len(sizes) with rank i_k < s_k at each depth k."""
    if not sizes or any(int(s) < 1 for s in sizes):
        raise ConfigError(f"method.drafter.tree.sizes (s_k) must be a non-empty list of ints >= 1; got {sizes}")
    return [path for depth in range(1, len(sizes) + 1) for path in product(*(range(int(s)) for s in sizes[:depth]))]


def path_value(path: RankPath, rank_accuracy: list[list[float]]) -> float:
    """Estimated probability that the node is accepted: prod_j a_j^(i_j)."""
    value = 1.0
    for depth, rank in enumerate(path):
        value *= rank_accuracy[depth][rank]
    return value


def expected_accepted(paths: list[RankPath], rank_accuracy: list[list[float]]) -> float:
    """Expected number of accepted drafted tokens per step: the sum of every node's value (3.3.3)."""
    return sum(path_value(path, rank_accuracy) for path in paths)


def sparse_paths(
    rank_accuracy: list[list[float]], node_budget: int, max_depth: int | None = None, top_k: int | None = None
) -> list[RankPath]:
    """Greedy tree of ``node_budget`` nodes maximising the expected acceptance length (optimal, see module doc)."""
    if node_budget < 1:
        raise ConfigError(f"method.drafter.tree.node_budget must be >= 1; got {node_budget}")
    if any(not 0.0 <= a <= 1.0 for row in rank_accuracy for a in row):
        raise ConfigError("Medusa calibration accuracies a_k^(i) must lie in [0, 1]")
    depth_limit = min(len(rank_accuracy), max_depth or len(rank_accuracy))
    width = [min(len(row), top_k or len(row)) for row in rank_accuracy]
    frontier: list[tuple[float, RankPath]] = []

    def push_children(parent: RankPath) -> None:
        depth = len(parent)
        if depth < depth_limit:
            for rank in range(width[depth]):
                child = (*parent, rank)
                heapq.heappush(frontier, (-path_value(child, rank_accuracy), child))

    push_children(())
    chosen: list[RankPath] = []
    while frontier and len(chosen) < node_budget:
        _, path = heapq.heappop(frontier)  # ties: the lexicographically smaller path first
        chosen.append(path)
        push_children(path)
    return chosen


def checked_paths(paths, num_heads: int) -> list[RankPath]:
    """Rank paths from config (lists of ints), validated: non-empty, ranks >= 0, prefix-closed, depth <= heads."""
    cleaned = {tuple(int(rank) for rank in path) for path in paths}
    if not cleaned or any(not path or min(path) < 0 for path in cleaned):
        raise ConfigError("a Medusa tree needs non-empty rank paths with ranks >= 0, e.g. [[0], [0, 0], [1]]")
    missing = sorted(path[:-1] for path in cleaned if len(path) > 1 and path[:-1] not in cleaned)
    if missing:
        raise ConfigError(f"Medusa tree paths must be prefix-closed; missing parent path {list(missing[0])}")
    deepest = max(map(len, cleaned))
    if deepest > num_heads:
        raise ConfigError(f"the Medusa tree is {deepest} deep but the heads predict only {num_heads} tokens ahead")
    return sorted(cleaned, key=lambda path: (len(path), path))


@dataclass(frozen=True)
class TreeLayout:
    """A static tree in topological order (by depth, then path): parent, depth and rank per drafted node."""

    paths: tuple[RankPath, ...]
    parents: tuple[int, ...]  # node 0 = root (-1); node i >= 1 drafts ``paths[i - 1]``
    depths: tuple[int, ...]  # drafted nodes only
    ranks: tuple[int, ...]  # drafted nodes only

    @classmethod
    def from_paths(cls, paths: list[RankPath]) -> TreeLayout:
        """Lay out prefix-closed rank paths; parents precede children."""
        ordered = sorted(set(paths), key=lambda path: (len(path), path))
        index = {(): 0, **{path: i for i, path in enumerate(ordered, start=1)}}
        parents = (-1, *(index[path[:-1]] for path in ordered))
        return cls(tuple(ordered), parents, tuple(map(len, ordered)), tuple(path[-1] for path in ordered))

    @property
    def num_nodes(self) -> int:
        """Drafted nodes (root excluded)."""
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    @property
    def top_k(self) -> int:
        """Candidate ranks needed from every head."""
        return max(self.ranks, default=-1) + 1

    def tokens(self, root: int, top: list[list[int]]) -> list[int]:
        """Node tokens: the root, then head ``depth``'s ``rank``-th top token per drafted node."""
        return [root, *(top[depth - 1][rank] for depth, rank in zip(self.depths, self.ranks))]


TREE_KINDS = ("sparse", "dense", "choices", "chain")


def tree_paths(
    tree_cfg, rank_accuracy: list[list[float]] | None, num_heads: int, published: str | None = None
) -> tuple[list, str]:
    """The static tree's rank paths from the method's ``tree`` settings, and how they were chosen.

    ``sparse`` is the greedy tree on the heads' calibration table; heads without one (the published
    checkpoints) use the published tree their model config names (``model.medusa.tree``), cut to the
    node budget. Heads with neither are a ConfigError naming the ways out, never a silent fallback.
    """
    kind = knob_choice("tree.kind", tree_cfg.get("kind", "sparse"), TREE_KINDS)
    max_depth = tree_cfg.get("max_depth") or num_heads
    if not 1 <= max_depth <= num_heads:
        raise ConfigError(f"method.drafter.tree.max_depth must be in [1, {num_heads}] (the heads); got {max_depth}")
    paths: list
    if kind == "chain":  # the top-1 token of every head (vLLM's Medusa drafts this)
        paths, label = [(0,) * depth for depth in range(1, max_depth + 1)], "chain"
    elif kind == "dense":
        paths, label = dense_paths(list(tree_cfg.get("sizes") or [])), "dense"
    elif kind == "sparse":
        budget = int(tree_cfg.get("node_budget", 63))
        if rank_accuracy is not None:
            paths, label = sparse_paths(rank_accuracy, budget, max_depth, tree_cfg.get("top_k")), "sparse"
        else:
            paths, label = published_sparse(published, budget)
    else:
        choices = tree_cfg.get("choices")
        if isinstance(choices, str):  # the name of a published tree
            paths, label = list(published_tree(choices)), f"choices:{choices}"
        elif not choices:
            raise ConfigError(
                "method.drafter.tree.choices must list rank paths, e.g. [[0], [0, 0], [1]], "
                f"or name a published tree ({', '.join(published_trees())})"
            )
        else:
            paths, label = list(choices), "choices"
    return checked_paths([path for path in paths if len(path) <= max_depth], num_heads), label


def published_sparse(name: str | None, budget: int) -> tuple[list, str]:
    """The first ``budget`` paths of the published tree ``name`` (its greedy order), or the way out."""
    ways_out = (
        "method.drafter.tree.kind=dense (the Cartesian tree of tree.sizes), method.drafter.tree.kind=choices "
        "with method.drafter.tree.choices=<rank paths or a published tree name>, or heads that carry a "
        "calibration table (python -m specbench.train medusa model=<name> writes one beside its heads)"
    )
    if not name:
        raise ConfigError(
            "method.drafter.tree.kind=sparse needs the heads' calibration table a_k^(i) or a published "
            f"tree, and these heads have neither. Name a published tree with model.medusa.tree=<name> "
            f"({', '.join(published_trees())}), or use {ways_out}"
        )
    paths = published_tree(name)
    if not 1 <= budget <= len(paths):
        raise ConfigError(
            f"method.drafter.tree.node_budget={budget}: the published tree {name} has {len(paths)} "
            f"nodes, and these heads carry no calibration table to grow a larger sparse tree; use a "
            f"budget in [1, {len(paths)}] or {ways_out}"
        )
    return list(paths[:budget]), f"sparse:{name}" + (f"[:{budget}]" if budget < len(paths) else "")
