"""Medusa (Cai et al. 2024; docs/methods/medusa.md): extra heads on the target's last hidden state draft a tree.

Each step verifies ``[root] + static tree``: the root is the token the target committed last
(``ctx.root``), and a node at depth d with rank i holds the i-th top token of head d. The heads run
on the hidden state of the LAST ACCEPTED node of the previous verify (``verified.hidden[path[-1]]``,
position t): the target's own pick there is the next root (t + 1), and head k predicts t + k + 1,
i.e. the token at depth k under that root. So no separate draft forward is needed.

First step: the prefill returns logits only, so the first step verifies the root alone (an ordinary
AR step) and its hidden state seeds the heads. This costs one speculative step per generation
(FasterDecoding runs the heads on the prefill's last row instead); it keeps the shared loop and
prefill free of method-specific branches.
"""

from __future__ import annotations

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, Drafter, knob_choice
from specbench.core.tree import DraftTree
from specbench.core.verify import VerifyOutput
from specbench.errors import ConfigError
from specbench.models.medusa_heads import MedusaHeads, load_heads
from specbench.structures.medusa_tree import (
    TreeLayout,
    checked_paths,
    dense_paths,
    expected_accepted,
    published_tree,
    published_trees,
    sparse_paths,
)

TREE_KINDS = ("sparse", "dense", "choices")


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
    if kind == "dense":
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


class Medusa(Drafter):
    """Drafts a static Medusa tree from the heads' top-k tokens at the last accepted position."""

    wants_hidden = True
    COUNTERS = ("steps", "tree_steps", "accepted_draft_tokens")

    def __init__(self, heads=None, target_name: str = "", tree=None):
        super().__init__()
        self.heads_cfg = heads
        self.target_name = target_name
        self.tree_cfg = tree or {}
        self.heads: MedusaHeads | None = None
        self.layout: TreeLayout | None = None
        self.origin = self.tree_source = ""
        self.expected: float | None = None
        self.reset([])

    def setup(self, target, tokenizer) -> None:
        """Load the heads for this target and fix the tree (calibration table -> sparse tree)."""
        loaded = load_heads(self.heads_cfg, target, self.target_name)
        self.heads, self.origin, self.part = loaded.heads, loaded.origin, loaded.part
        paths, self.tree_source = tree_paths(
            self.tree_cfg, loaded.rank_accuracy, loaded.heads.num_heads, (self.heads_cfg or {}).get("tree")
        )
        self.layout = TreeLayout.from_paths(paths)
        if loaded.rank_accuracy is not None and self.layout.top_k <= min(map(len, loaded.rank_accuracy)):
            self.expected = expected_accepted(list(self.layout.paths), loaded.rank_accuracy)

    def reset(self, prompt_ids: list[int]) -> None:
        """Forget the previous generation's head predictions; zero the per-depth tallies."""
        depth = self.layout.max_depth if self.layout else 0
        self.top: list[list[int]] | None = None  # [depth][top_k] token ids for the next tree
        self.pending: list[tuple[int, int, int]] = []  # (position, head, predicted top-1 token)
        self.reached = [0] * depth  # tree steps whose accepted path reached depth d+1
        self.top1_hits = [0] * depth
        self.top1_seen = [0] * depth

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Root-only until the heads have seen a hidden state, then the static tree filled with their tokens."""
        self._score_predictions(ctx.tokens)
        if self.top is None:
            return DraftTree.root_only(ctx.root)
        assert self.layout is not None  # laid out by setup, before the heads could fill self.top
        return DraftTree(self.layout.tokens(ctx.root, self.top), list(self.layout.parents))

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified: VerifyOutput, accepted: Acceptance) -> None:
        """Run the heads on the last accepted node's hidden state: tokens for the next step's tree."""
        self._count(tree, accepted)
        assert self.heads is not None and self.layout is not None  # loaded by setup
        assert verified.hidden is not None  # wants_hidden: the loop asks the verify pass for hidden states
        last = accepted.path[-1]
        with self.books.timed("heads"):
            logits = self.heads(verified.hidden[last], self.layout.max_depth)  # [depth, vocab]
            self.top = logits.topk(self.layout.top_k, dim=-1).indices.tolist()  # [depth][top_k]
        next_root = ctx.position + len(accepted.path)  # position of the token the target emits now
        self.pending.extend((next_root + k, k, self.top[k - 1][0]) for k in range(1, len(self.top) + 1))

    def _count(self, tree: DraftTree, accepted: Acceptance) -> None:
        """Per-step counters: accepted drafted tokens and the depth the accepted path reached."""
        self.books.add(steps=1, tree_steps=len(tree) > 1, accepted_draft_tokens=len(accepted.path) - 1)
        if len(tree) > 1:
            for depth in range(len(accepted.path) - 1):
                self.reached[depth] += 1

    def _score_predictions(self, tokens: list[int]) -> None:
        """Compare each head's top-1 guess with the token committed at its position, once known."""
        waiting = []
        for position, head, token in self.pending:
            if position < len(tokens):
                self.top1_seen[head - 1] += 1
                self.top1_hits[head - 1] += tokens[position] == token
            else:
                waiting.append((position, head, token))
        self.pending = waiting

    def artefacts(self) -> list[str]:
        """The Medusa heads (their weights digest when trained here)."""
        return [self.part] if self.heads is not None else []

    def stats(self) -> dict:
        """Tree shape, acceptance by depth, each head's online top-1 accuracy, the heads' time (heads_s)."""

        def rate(hits, total):
            return round(hits / total, 4) if total else None

        books = self.books
        return {
            **books.report(),
            "heads": self.origin,
            "num_heads": self.heads.num_heads if self.heads is not None else None,
            "tree": self.tree_source,
            "tree_nodes": self.layout.num_nodes if self.layout else None,
            "tree_depth": self.layout.max_depth if self.layout else None,
            "expected_accepted": None if self.expected is None else round(self.expected, 4),
            "accepted_per_step": rate(books.counts["accepted_draft_tokens"], books.counts["steps"]),
            "depth_accept_rate": [rate(n, books.counts["tree_steps"]) for n in self.reached],
            "head_top1_acc": [rate(h, n) for h, n in zip(self.top1_hits, self.top1_seen)],
        }
