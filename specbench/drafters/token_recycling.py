"""Token Recycling (Luo et al., 2024; ACL 2025): draft from the candidates the target already ranked.

Every verify pass computes a full next-token distribution at every tree row and keeps one token; Token Recycling
stores the top-k of each row in an adjacency matrix ``M`` (``specbench.structures.successors.SuccessorTable``,
``[vocab, k]`` token ids) under the row's own token, and drafts each step by expanding a static tree over ``M``
from the last committed token. The matrix starts at zeros once per run and is kept across requests (the paper's
"inherit from the previous query"); ``hot_start=false`` resets it before every generation. Drafts are
deterministic given the history, so the ``match`` rule keeps decoding lossless at any temperature.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, Drafter, knob_choice, knob_int, knob_name
from specbench.core.tree import DraftTree
from specbench.core.verify import VerifyOutput
from specbench.errors import ConfigError
from specbench.structures.successors import SuccessorTable, recycling_tree
from specbench.structures.tree_shapes import TreeShape

TREES = ("paper", "paths")


class TokenRecycling(Drafter):
    """Static-tree drafts expanded over the top-k successor matrix, refreshed from every verified row."""

    COUNTERS = ("steps", "drafted", "accepted_tokens")

    def __init__(
        self, topk: int = 8, tree: str = "paper", paths: Sequence[Sequence[int]] | None = None, hot_start: bool = True
    ):
        super().__init__()
        self.topk = knob_int("topk", topk, 1, "k")
        knob_choice("tree", tree, TREES)
        if not isinstance(hot_start, bool):
            raise ConfigError(f"{knob_name('hot_start', None)} must be true or false, got {hot_start!r}")
        if (tree == "paths") != (paths is not None):
            raise ConfigError(
                "method.drafter.paths gives the tree's rank paths exactly when method.drafter.tree=paths "
                f"(got tree={tree!r}, paths={paths!r})"
            )
        self.tree_name = tree
        self.shape: TreeShape = recycling_tree() if paths is None else TreeShape.from_paths(paths)
        if max(self.shape.ranks) >= self.topk:
            raise ConfigError(
                f"{knob_name('topk', 'k')} = {self.topk} is too small for the draft tree, whose nodes use "
                f"candidate rank {max(self.shape.ranks)} (ranks count from 0)"
            )
        self.hot_start = hot_start
        self.table: SuccessorTable | None = None
        self.generations = 0  # generations since setup: the requests M has learnt from

    def setup(self, target, tokenizer) -> None:
        """A zeroed ``M`` with a row for every token id the target reads or writes, on the target's device."""
        vocab = target.config.vocab_size
        if self.topk > vocab:
            raise ConfigError(f"{knob_name('topk', 'k')} = {self.topk} exceeds the target's vocabulary ({vocab})")
        rows = max(vocab, target.get_input_embeddings().num_embeddings)
        self.table = SuccessorTable(rows, self.topk, target.device)

    def forget(self) -> None:
        """``M`` back to zeros, no generation counted."""
        self._table().reset()
        self.generations = 0

    def reset(self, prompt_ids: list[int]) -> None:
        """Cold start (``hot_start=false``): zero ``M``; hot start keeps what earlier requests taught it."""
        if not self.hot_start:
            self._table().reset()
        self.generations += 1

    def recall(self, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """Hot start: ``M`` holds the top-k of every row the target verified, which the output alone does not tell,
        so the generation runs again (False). Cold start: ``M`` is zeroed per generation; only the count moves."""
        if self.hot_start:
            return False
        self.generations += 1
        return True

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """The static tree (cut to the budget) filled from the root over ``M``."""
        shape = self.shape.pruned(ctx.remaining - 1)
        tree = self._table().tree(ctx.root, shape)
        self.books.add(steps=1, drafted=tree.num_drafted)
        return tree

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified: VerifyOutput, accepted: Acceptance) -> None:
        """Recycle: every verified row's top-k replaces its token's row of ``M``."""
        self._table().update(tree.tokens, verified.logits)
        self.books.add(accepted_tokens=len(accepted.path) - 1)

    def stats(self) -> dict[str, Any]:
        """This generation's draft counters, and ``M`` (its size is the method's extra memory)."""
        books, table = self.books, self._table()
        return {
            **books.report(),
            "accepted_per_step": books.per("accepted_tokens", "steps"),
            "drafted_per_step": books.per("drafted", "steps"),
            "draft_hit_ratio": books.per("accepted_tokens", "drafted"),
            "matrix_rows": table.vocab_size,
            "matrix_k": table.k,
            "matrix_bytes": table.nbytes,
            "matrix_rows_filled": table.rows_filled,
            "matrix_generations": self.generations,
        }

    def _table(self) -> SuccessorTable:
        if self.table is None:
            raise RuntimeError("TokenRecycling.setup(target, tokenizer) must run before decoding (it sizes M)")
        return self.table
