"""Medusa (Cai et al. 2024; docs/methods/medusa.md): extra heads on the target's last hidden state draft a tree.

Each step verifies ``[root] + static tree``: the root is the token the target committed last
(``ctx.root``), and a node at depth d with rank i holds the i-th top token of head d. The heads run
on the hidden state of the LAST ACCEPTED node of the previous verify (``verified.hidden[path[-1]]``,
position t): the target's own pick there is the next root (t + 1), and head k predicts t + k + 1,
i.e. the token at depth k under that root. So no separate draft forward is needed.

First step (``first_step``): ``tree`` (default, as FasterDecoding's loop) runs the heads on the prompt's
last hidden state (``observe_prompt``), so the first verify already checks a full tree under the
prefill's token; ``root`` verifies that token alone first and seeds the heads with its hidden state
(one extra, non-speculative step per generation: specbench's rule before the parity check).
"""

from __future__ import annotations

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, Drafter
from specbench.core.tree import DraftTree
from specbench.core.verify import VerifyOutput
from specbench.errors import ConfigError
from specbench.models.medusa_heads import MedusaHeads, load_heads
from specbench.models.vocab import DraftVocabulary, draft_vocabulary, size_knob
from specbench.structures.medusa_tree import TreeLayout, expected_accepted, tree_paths


class Medusa(Drafter):
    """Drafts a static Medusa tree from the heads' top-k tokens at the last accepted position."""

    hidden_layers: tuple[int, ...] = (-1,)  # the last hidden states (after the final norm)
    COUNTERS = ("steps", "tree_steps", "accepted_draft_tokens")

    FIRST_STEPS = ("tree", "root")

    def __init__(
        self, heads=None, target_name: str = "", tree=None, first_step: str = "tree", draft_vocab: int | None = None
    ):
        super().__init__()
        if first_step not in self.FIRST_STEPS:
            raise ConfigError(f"method.drafter.first_step must be one of {list(self.FIRST_STEPS)}, got {first_step!r}")
        self.first_step = first_step
        self.draft_vocab = size_knob(draft_vocab)
        self.vocabulary: DraftVocabulary | None = None
        self.heads_cfg = heads
        self.target_name = target_name
        self.tree_cfg = tree or {}
        self.heads: MedusaHeads | None = None
        self.layout: TreeLayout | None = None
        self.origin = self.tree_source = ""
        self.expected: float | None = None
        self.reset([])

    def setup(self, target, tokenizer) -> None:
        """Load the heads for this target (restricted to the ``draft_vocab`` most frequent tokens when that is set)
        and fix the tree (calibration table -> sparse tree)."""
        loaded = load_heads(self.heads_cfg, target, self.target_name)
        self.heads, self.origin, self.part = loaded.heads, loaded.origin, loaded.part
        self.vocabulary = draft_vocabulary(self.draft_vocab, self.target_name, loaded.heads.vocab_size)
        if self.vocabulary:
            loaded.heads.restrict_vocabulary(self.vocabulary.tokens)
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

    def observe_prompt(self, hidden: torch.Tensor) -> None:
        """``first_step=tree``: the heads read the prompt's last row [P, H], so step 1 verifies a full tree."""
        if self.first_step == "tree":
            self._run_heads(hidden[-1], len(hidden))

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified: VerifyOutput, accepted: Acceptance) -> None:
        """Run the heads on the last accepted node's hidden state: tokens for the next step's tree."""
        self._count(tree, accepted)
        assert verified.hidden is not None  # hidden_layers: the loop asks the verify pass for hidden states
        self._run_heads(verified.hidden[accepted.path[-1]], ctx.position + len(accepted.path))

    def _run_heads(self, hidden: torch.Tensor, next_root: int) -> None:
        """The heads' top-k tokens on one hidden state [H]; ``next_root`` is the position the target fills next."""
        assert self.heads is not None and self.layout is not None  # loaded by setup
        with self.books.timed("heads"):
            logits = self.heads(hidden, self.layout.max_depth)  # [depth, vocab]
            self.top = logits.topk(self.layout.top_k, dim=-1).indices.tolist()  # [depth][top_k]
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
        """The Medusa heads (their weights digest when trained here) and any reduced draft vocabulary."""
        return ([self.part] if self.heads is not None else []) + ([self.vocabulary.part] if self.vocabulary else [])

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
            "first_step": self.first_step,
            "tree_nodes": self.layout.num_nodes if self.layout else None,
            "tree_depth": self.layout.max_depth if self.layout else None,
            "expected_accepted": None if self.expected is None else round(self.expected, 4),
            "accepted_per_step": rate(books.counts["accepted_draft_tokens"], books.counts["steps"]),
            "depth_accept_rate": [rate(n, books.counts["tree_steps"]) for n in self.reached],
            "head_top1_acc": [rate(h, n) for h, n in zip(self.top1_hits, self.top1_seen)],
        }
