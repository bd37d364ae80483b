"""Filling a fixed tree shape with a draft, depth by depth (shared by the fixed-tree baselines over a draft
model and EAGLE-1's tree over its head).

A node's rank-r child is the draft's r-th most likely token after it; at T > 0 (when the drafter samples its
children) the children are ordered draws without replacement from the warped draft distribution q, and
q is recorded in ``draft_probs`` for the ``speculative`` acceptance rule (docs/acceptance.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specbench.core.acceptance import Sampling, target_probs
from specbench.core.tree import DraftTree
from specbench.structures.tree_shapes import TreeShape

LayerFeed = Callable[[int, list[int], list[int]], torch.Tensor]
"""``feed(depth, nodes, tokens)``: run the draft on ``nodes`` of layer ``depth`` (``tokens`` holds every node's
token so far); the draft logits [len(nodes), vocab] for their children."""


def sample_without_replacement(probs: torch.Tensor, k: int, generator: torch.Generator | None) -> list[int]:
    """``k`` ordered draws without replacement from ``probs`` [vocab] (Gumbel-top-k: draw i ~ probs without draws < i).

    NOTE: keys ``p / E`` with ``E ~ Exp(1)`` sorted descending are distributed as sequential draws
    without replacement; one exponential per token, no Python loop.
    """
    keys = probs / torch.empty_like(probs).exponential_(generator=generator)  # [vocab]
    return keys.topk(k).indices.tolist()


def pick_children(
    logits: torch.Tensor, k: int, sampling: Sampling | None, generator: torch.Generator | None
) -> tuple[list[int], torch.Tensor | None]:
    """``k`` children from draft logits [vocab]: the top-k (``sampling`` None), or k ordered draws without
    replacement from q warped by ``sampling``, returned with q [vocab] (None for the top-k)."""
    if sampling is None:
        return logits.topk(k).indices.tolist(), None
    probs = target_probs(logits.cpu(), sampling)  # [vocab]; the run's generator lives on the CPU
    return sample_without_replacement(probs, k, generator), probs


def fill_shape(
    shape: TreeShape,
    root: int,
    root_logits: torch.Tensor,
    feed: LayerFeed,
    sampling: Sampling | None,
    generator: torch.Generator | None,
) -> DraftTree:
    """The tree of ``shape`` under ``root``: children from each fed node's logits ([vocab] rows; the root's
    are ``root_logits``), then ``feed`` runs the draft on the nodes of that depth that have children.

    With ``sampling`` the children are sampled and the tree carries ``draft_probs`` [nodes, vocab] (zeros
    for nodes without children).
    """
    kids = shape.children()
    tokens = [root] + [0] * (len(shape) - 1)
    q_rows: list[torch.Tensor | None] = [None] * len(shape)  # [vocab] law each node's children were drawn from
    logits = {0: root_logits}  # node -> draft logits [vocab] for its children
    for depth in range(1, shape.max_depth + 1):
        for parent, row in logits.items():
            children, q_rows[parent] = pick_children(row, len(kids[parent]), sampling, generator)
            for node, token in zip(kids[parent], children):
                tokens[node] = token
        feeding = [node for node in shape.layer(depth) if kids[node]]
        if not feeding:
            break
        logits = dict(zip(feeding, feed(depth, feeding, tokens)))  # rows [vocab] of the [k, vocab] output
    tree = DraftTree(tokens, list(shape.parents))
    if sampling is not None:
        leaf = torch.zeros(root_logits.shape[-1])
        tree.draft_probs = torch.stack([q if q is not None else leaf for q in q_rows])  # [nodes, vocab]
    return tree


def chain_from_rows(
    root: int, rows: torch.Tensor, sampling: Sampling | None, generator: torch.Generator | None
) -> DraftTree:
    """A chain of one token per row of draft logits ``rows`` [length, vocab], each row fixed before any token is drawn
    (a block drafted in one forward: PARD, DFlash): the argmax (``sampling`` None), or a draw from the row warped by
    ``sampling``, whose law is then recorded in ``draft_probs`` for exact speculative sampling."""
    tokens, laws = [], []
    for row in rows:
        (token,), q = pick_children(row, 1, sampling, generator)
        tokens.append(token)
        if q is not None:
            laws.append(q)
    tree = DraftTree.chain(root, tokens)
    if laws:
        tree.draft_probs = torch.stack([*laws, torch.zeros_like(laws[0])])  # [length + 1, vocab]; the leaf's unused
    return tree
