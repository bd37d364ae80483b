"""OPT-Tree (Wang et al., TACL 2025): a per-step adaptive draft tree that maximizes E[accept length].

Each step the draft model builds the tree layer by layer (docs/methods/opt_tree.md#one-step):
layer 1 is the top-n tokens of q(.|root); every deeper layer comes from ONE draft forward over all n nodes of the layer
above (tree mask on the draft's own cache): each node's top-n children, scored p̂ = p̂(parent)·q,
then the global top-n. Drafting stops when the gain in E (sum of the top-n p̂ over the layers built)
is <= threshold or the depth limit is reached; the tree verified is the top-n nodes by p̂, which
always contains the root and is closed under parents (p̂ decreases along every path).

The paper's fixed-tree baselines run on the same drafter: ``FixedTree`` fills a fixed shape (EAGLE-1's
published tree, a static tree built from the draft's rank profile, a binary tree, or any list of rank paths)
with the draft's top-k tokens per node (or, with ``sample_children``, draws without replacement recorded for the
``speculative`` rule).
"""

from __future__ import annotations

from typing import Any

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, knob_choice, knob_int, knob_number
from specbench.core.tree import DraftTree
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.tree_fill import fill_shape
from specbench.errors import ConfigError
from specbench.structures.tree_builders import OptTreeBuilder
from specbench.structures.tree_shapes import PUBLISHED_TREES, fixed_shape


class LayeredTreeDrafter(DraftModelDrafter):
    """Tree drafters fed layer by layer: remembers each node's draft-cache row, keeps the accepted path's rows.

    NOTE: trees are proposed in depth order and no deeper than ``remaining - 1``, so the loop's
    pruning leaves node indices unchanged and ``node_rows`` indexes the verified tree.
    """

    COUNTERS = (*DraftModelDrafter.COUNTERS, "depth_sum")

    def __init__(self, **draft_settings: Any) -> None:
        super().__init__(**draft_settings)
        self.node_rows: list[int] = [-1]  # draft-cache tree row of each node of the proposed tree (-1: none)

    def update(self, ctx: DecodeContext, tree: DraftTree, accepted: Acceptance) -> None:
        """Keep the draft rows of the accepted path (those that were fed), drop the rest of the tree."""
        assert self.lm is not None  # loaded by setup
        self.lm.keep_tree_rows([self.node_rows[i] for i in accepted.path[1:] if self.node_rows[i] >= 0])
        self.books.add(depth_sum=max(tree.depths))

    def stats(self) -> dict:
        """Base stats plus the mean verified tree depth."""
        return {**super().stats(), "tree_depth_mean": self.books.per("depth_sum", "steps")}


class OptTree(LayeredTreeDrafter):
    """OPT-Tree's adaptive draft tree (node budget n, threshold delta, depth counter max_depth)."""

    def __init__(self, nodes: int = 50, threshold: float = 0.5, max_depth: int = 10, **draft_settings):
        self.nodes = knob_int("nodes", nodes, 1, "n")
        self.max_depth = knob_int("max_depth", max_depth, 2)
        self.threshold = knob_number("threshold", threshold, 0.0, symbol="delta")
        super().__init__(**draft_settings)
        self.step_expected: list[float] = []  # per step: E, the sum of p̂ over the verified tree (Fig 4)
        self.step_accepted: list[int] = []  # per step: drafted tokens accepted

    def draft_tree(self, ctx: DecodeContext) -> DraftTree:
        """Build the layers while E grows by more than delta, then verify the top-n nodes by p̂.

        NOTE: the official loop also feeds the last layer it keeps, then discards the layer that
        forward produced; the stopping test needs only p̂ values already known, so it runs first
        here and that forward is skipped (same trees, one draft forward less per step).
        """
        depth_limit = min(self.max_depth - 1, ctx.remaining - 1)
        if depth_limit < 1:
            self.node_rows = [-1]
            self.step_expected.append(0.0)
            return DraftTree.root_only(ctx.root)
        assert self.lm is not None  # loaded by setup
        builder = OptTreeBuilder(self.nodes)
        builder.add_layer(torch.softmax(self.lm.sync(ctx.tokens), dim=-1)[None])  # [1, vocab] raw q(.|root)
        offsets: list[int] = []  # first draft-cache tree row of each fed layer
        while builder.grows(self.threshold, depth_limit):
            above = offsets[-1] if offsets else 0
            parent_rows = [above + p if p >= 0 else -1 for p in builder.parents[-1]]
            offsets.append(len(self.lm.tree_tokens))
            logits = self.lm.tree_layer(builder.tokens[-1], parent_rows, depth=builder.depth)  # [n, vocab]
            builder.add_layer(torch.softmax(logits, dim=-1))
        tree, chosen, expected = builder.tree(ctx.root)
        self.node_rows = [-1] + [offsets[layer] + i if layer < len(offsets) else -1 for layer, i in chosen]
        self.step_expected.append(round(expected, 3))
        return tree

    def update(self, ctx: DecodeContext, tree: DraftTree, accepted: Acceptance) -> None:
        """Keep the accepted rows and record this step's actual acceptance next to its E."""
        super().update(ctx, tree, accepted)
        self.step_accepted.append(len(accepted.path) - 1)

    def reset(self, prompt_ids: list[int]) -> None:
        """A fresh draft cache and fresh per-step E / acceptance traces (the paper's Fig 4 data)."""
        super().reset(prompt_ids)
        self.step_expected = []
        self.step_accepted = []

    def stats(self) -> dict:
        """Base stats plus E (sum of p̂ of the verified tree) and the accepted drafted tokens, per step."""
        return {
            **super().stats(),
            "expected_accept_mean": sum(self.step_expected) / max(len(self.step_expected), 1),
            "step_expected_accept": self.step_expected,
            "step_accepted": self.step_accepted,
        }


SHAPES = ("static", *PUBLISHED_TREES, "binary", "paths")


class FixedTree(LayeredTreeDrafter):
    """A fixed tree shape filled by the draft model each step (OPT-Tree's Binary / static-tree baselines).

    The rank-r child of a node is the draft's r-th most likely token after it (T=0, or always unless
    ``sample_children``); with ``sample_children`` at T>0 the children are ordered draws without
    replacement from the warped q, recorded in ``draft_probs`` for the ``speculative`` rule. One
    draft forward per depth feeds the nodes of that depth that have children.
    """

    def __init__(
        self,
        shape: str = "eagle1",
        nodes: int | None = 25,
        paths=None,
        rank_hits=None,
        max_depth: int | None = 5,
        sample_children: bool = False,
        **draft_settings,
    ):
        self.shape = fixed_shape(knob_choice("shape", shape, SHAPES), nodes, paths, rank_hits, max_depth)
        super().__init__(**draft_settings)
        self.sample_children = bool(sample_children)

    def setup(self, target, tokenizer) -> None:
        """Load the draft; refuse shapes that want more children per node than the vocabulary has."""
        super().setup(target, tokenizer)
        assert self.lm is not None  # loaded by super().setup
        widest = max(len(kids) for kids in self.shape.children())
        if widest > self.lm.target_vocab:
            raise ConfigError(
                f"the tree shape gives a node {widest} children but the vocabulary has "
                f"only {self.lm.target_vocab} tokens"
            )

    def draft_tree(self, ctx: DecodeContext) -> DraftTree:
        """Fill the shape (pruned to the budget) depth by depth, one draft forward per depth with children."""
        assert self.lm is not None  # loaded by setup
        lm = self.lm
        shape = self.shape.pruned(ctx.remaining - 1)
        self.node_rows = [-1] * len(shape)
        if len(shape) == 1:
            return DraftTree.root_only(ctx.root)

        def feed(depth: int, nodes: list[int], tokens: list[int]) -> torch.Tensor:
            first = len(lm.tree_tokens)
            parent_rows = [self.node_rows[shape.parents[node]] for node in nodes]
            for i, node in enumerate(nodes):
                self.node_rows[node] = first + i
            return lm.tree_layer([tokens[node] for node in nodes], parent_rows, depth)  # [k, vocab]

        return fill_shape(
            shape, ctx.root, lm.sync(ctx.tokens), feed, ctx.draft_law(self.sample_children), ctx.generator
        )
