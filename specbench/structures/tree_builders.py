"""Draft trees built layer by layer from a draft's distributions, with no model inside (unit-testable).

- ``OptTreeBuilder``: OPT-Tree (Wang et al., TACL 2025; docs/methods/opt_tree.md#one-step): every layer
  keeps the global top-n nodes by p̂ (the product of the draft's probabilities along the path), drafting
  stops when the gain in E (the sum of the top-n p̂ over the layers built) is <= delta, and the tree is
  the top-n nodes by p̂ over all layers. Used by ``opt_tree`` (a draft model) and ``opt_tree_eagle``.
- ``ExpandRerankBuilder``: EAGLE-2 (Li et al., EMNLP 2024; docs/methods/eagle.md#trees):
  expansion keeps, per layer, every child of the top_k most confident nodes of the layer above and feeds
  only those top_k nodes; reranking keeps the most confident nodes over all layers.

Both rank nodes by a value that never grows along a path (q <= 1, log q <= 0, also in floating point),
and break ties towards the shallower node, so the chosen nodes always form a tree that contains the root.
"""

from __future__ import annotations

import heapq
from itertools import chain

import torch

from specbench.core.tree import DraftTree


class OptTreeBuilder:
    """OPT-Tree's layer-by-layer construction over draft probabilities (model-free, unit-testable).

    ``expected[d]`` is E_d: the sum of the top-n p̂ over layers 1..d (``expected[0] = 0``), i.e. the
    best expected acceptance length of an n-node subtree of what was built (non-decreasing in d).
    """

    def __init__(self, nodes: int):
        self.nodes = nodes
        self.tokens: list[list[int]] = []  # per layer
        self.parents: list[list[int]] = []  # per layer: the parent's index in the layer above (-1 = root)
        self.values: list[list[float]] = []  # per layer: p̂ of each node
        self.expected = [0.0]
        self._newest: torch.Tensor | None = None  # [k] p̂ of the newest layer, on the probs' device

    @property
    def depth(self) -> int:
        """Layers built so far."""
        return len(self.tokens)

    def add_layer(self, probs: torch.Tensor) -> None:
        """Grow one layer from raw draft distributions [k, vocab] of the newest layer's nodes ([1, vocab]: root's)."""
        first = self._newest is None
        parent_values = probs.new_ones(1) if self._newest is None else self._newest  # [k]
        per_parent = min(self.nodes, probs.shape[-1])
        child_probs, child_tokens = probs.topk(per_parent, dim=-1)  # [k, per_parent]
        scores = (parent_values[:, None] * child_probs).flatten()  # [k * per_parent]
        values, flat = scores.topk(min(self.nodes, scores.numel()))  # [n], sorted descending
        tokens, parents = torch.stack([child_tokens.flatten()[flat], flat // per_parent]).tolist()
        self._newest = values
        self.tokens.append(tokens)
        self.parents.append([-1] * len(tokens) if first else parents)
        self.values.append(values.tolist())
        self.expected.append(sum(heapq.nlargest(self.nodes, chain.from_iterable(self.values))))

    def grows(self, threshold: float, depth_limit: int) -> bool:
        """The stopping rule: build another layer iff E_d - E_{d-1} > threshold and d < depth_limit."""
        return self.depth < depth_limit and self.expected[-1] - self.expected[-2] > threshold

    def select(self) -> tuple[list[tuple[int, int]], float]:
        """The top-n nodes over all layers as (layer, index) pairs in depth order, and E = the sum of their p̂.

        NOTE: ties go to the shallower node, and a child's p̂ never exceeds its parent's (q <= 1, also
        in float32), so every chosen node's parent is chosen too.
        """
        ranked = sorted(
            (-value, layer, i) for layer, values in enumerate(self.values) for i, value in enumerate(values)
        )[: self.nodes]
        return sorted((layer, i) for _, layer, i in ranked), -sum(value for value, _, _ in ranked)

    def tree(self, root: int) -> tuple[DraftTree, list[tuple[int, int]], float]:
        """The selected subtree as a DraftTree (root first, depth order), its (layer, index) nodes and E."""
        chosen, expected = self.select()
        index: dict[tuple[int, int], int] = {}
        tokens, parents = [root], [-1]
        for layer, i in chosen:
            index[(layer, i)] = len(tokens)
            tokens.append(self.tokens[layer][i])
            parents.append(index[(layer - 1, self.parents[layer][i])] if layer else 0)
        return DraftTree(tokens, parents), chosen, expected


class ExpandRerankBuilder:
    """EAGLE-2's dynamic tree over draft log-probabilities: expansion (top_k per layer), then reranking.

    A node's value is its path confidence: the sum of the draft's log-probabilities along the path
    (log of the product of q, the paper's V). Layer 1 holds the top_k children of the root. Each
    expansion feeds the layer's ``frontier`` (its top_k nodes by value, most valuable first); every
    frontier node proposes its top_k children, ALL of them (top_k² candidates) join the new layer, and
    the top_k of those by value are the next frontier. Reranking keeps the ``budget`` most valuable nodes
    over all layers (ties to the shallower node, then the earlier one).
    """

    def __init__(self, top_k: int):
        self.top_k = top_k
        self.tokens: list[list[int]] = []  # per layer: every candidate's token
        self.parents: list[list[int]] = []  # per layer: the parent's index in the layer above (-1 = root)
        self.values: list[list[float]] = []  # per layer: every candidate's path confidence (sum of log q)
        self.frontier: list[int] = []  # indices into the newest layer: the nodes the next expansion feeds
        self._frontier_values: torch.Tensor | None = None  # [k] their values, on the log-probs' device

    @property
    def depth(self) -> int:
        """Layers built so far."""
        return len(self.tokens)

    @property
    def frontier_tokens(self) -> list[int]:
        """Tokens of the frontier nodes, in feed order."""
        return [self.tokens[-1][i] for i in self.frontier]

    def add_layer(self, logprobs: torch.Tensor) -> None:
        """Grow one layer from draft log-probabilities [k, vocab] of the frontier nodes (in feed order;
        [1, vocab] for the root's first layer)."""
        first = self._frontier_values is None
        width = min(self.top_k, logprobs.shape[-1])
        child_logprobs, child_tokens = logprobs.topk(width, dim=-1)  # [k, width]
        parent_values = logprobs.new_zeros(1) if self._frontier_values is None else self._frontier_values  # [k]
        values = (parent_values[:, None] + child_logprobs).flatten()  # [k * width]
        rows = torch.arange(values.numel(), device=values.device) // width  # [k * width] feeding row of each
        self.tokens.append(child_tokens.flatten().tolist())
        parents = [-1] * values.numel() if first else [self.frontier[row] for row in rows.tolist()]
        self.parents.append(parents)
        self.values.append(values.tolist())
        best, index = values.topk(min(self.top_k, values.numel()))  # sorted descending
        self.frontier, self._frontier_values = index.tolist(), best

    def can_improve(self, budget: int) -> bool:
        """Whether a deeper layer could put a node among the ``budget`` most valuable (else expanding further only
        costs draft forwards: the reranked tree is final). Deeper nodes are worth at most the best frontier value
        (log q <= 0 along a path) and lose ties to shallower ones."""
        best = heapq.nlargest(budget, chain.from_iterable(self.values))
        return len(best) < budget or self.values[-1][self.frontier[0]] > best[-1]

    def select(self, budget: int) -> list[tuple[int, int]]:
        """The ``budget`` most valuable candidates as (layer, index) pairs in depth order (parents first)."""
        ranked = sorted(
            (-value, layer, i) for layer, values in enumerate(self.values) for i, value in enumerate(values)
        )
        return sorted((layer, i) for _, layer, i in ranked[:budget])

    def tree(self, root: int, budget: int) -> tuple[DraftTree, list[tuple[int, int]]]:
        """The reranked tree of ``budget`` drafted nodes (fewer if fewer were built) and its (layer, index) nodes."""
        chosen = self.select(budget)
        index: dict[tuple[int, int], int] = {}
        tokens, parents = [root], [-1]
        for layer, i in chosen:
            index[(layer, i)] = len(tokens)
            tokens.append(self.tokens[layer][i])
            parents.append(index[(layer - 1, self.parents[layer][i])] if layer else 0)
        return DraftTree(tokens, parents), chosen
