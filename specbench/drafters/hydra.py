"""Hydra (Ankner et al. 2024; docs/methods/hydra.md): Medusa's static tree, drafted by sequentially dependent heads.

Every verified hidden state of the committed tokens reaches the heads (``observe_prompt`` for the prompt rows,
``observe`` for each step's accepted path); with the ``prefix-mlp`` architecture they pass through the heads'
prefix layer, whose own KV cache grows by exactly those rows. The heads' base state is that of the last
verified position t. Each step the static tree under the root ``x_{t+1}`` (the target's own token) is filled
depth by depth: head d - 1 runs once on every depth-(d - 1) node that has children, on the base state and the
embeddings of the tokens along that node's path, and its top-ranked tokens become the node's children in the
tree's rank order. So, unlike Medusa, siblings' subtrees hold different tokens.
"""

from __future__ import annotations

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, Drafter
from specbench.core.tree import DraftTree
from specbench.core.verify import VerifyOutput, new_cache
from specbench.models.hydra_heads import HydraHeads, load_hydra
from specbench.structures.medusa_tree import TreeLayout, tree_paths


class Hydra(Drafter):
    """Drafts a static tree whose children come from grounded heads run on each parent's path."""

    hidden_layers: tuple[int, ...] = (-1,)  # the last hidden states (after the final norm)
    COUNTERS = ("steps", "tree_steps", "accepted_draft_tokens", "head_rows")

    def __init__(self, heads=None, target_name: str = "", tree=None):
        super().__init__()
        self.heads_cfg = heads
        self.target_name = target_name
        self.tree_cfg = tree or {}
        self.heads: HydraHeads | None = None
        self.layout: TreeLayout | None = None
        self.origin = self.part = self.tree_source = ""

    def setup(self, target, tokenizer) -> None:
        """Load the heads and lay the static tree out (sparse on the heads' calibration table or a published
        tree, dense, or explicit paths: Medusa's tree settings)."""
        loaded = load_hydra(self.heads_cfg, target, self.target_name)
        self.heads, self.origin, self.part = loaded.heads, loaded.origin, loaded.part
        self.embed = target.get_input_embeddings()
        paths, self.tree_source = tree_paths(
            self.tree_cfg, loaded.rank_accuracy, loaded.heads.num_heads, (self.heads_cfg or {}).get("tree")
        )
        self.layout = layout = TreeLayout.from_paths(paths)
        self.depth_nodes = [  # per depth d >= 1: (its nodes, their distinct parents in node order)
            (nodes, sorted({layout.parents[node] for node in nodes}))
            for nodes in (
                [n for n in range(1, layout.num_nodes + 1) if layout.depths[n - 1] == d]
                for d in range(1, layout.max_depth + 1)
            )
        ]
        self.expanded = {parent for _, parents in self.depth_nodes for parent in parents}
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        """No base state yet; an empty prefix cache; zero the per-depth tallies."""
        prefix = self.heads.prefix_embeding_layer if self.heads is not None else None
        self.cache = new_cache(prefix) if prefix is not None else None
        self.base: torch.Tensor | None = None  # [H] the heads' view of the last verified position
        self.reached = [0] * (self.layout.max_depth if self.layout else 0)

    def observe_prompt(self, hidden: torch.Tensor) -> None:
        """The prompt rows' hidden states [P, H] (positions 0..P-1) seed the heads."""
        self._feed(hidden, 0)

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified: VerifyOutput, accepted: Acceptance) -> None:
        """The accepted path's hidden states (positions p .. p + len(path) - 1) move the base state on."""
        self.books.add(steps=1, tree_steps=len(tree) > 1, accepted_draft_tokens=len(accepted.path) - 1)
        if len(tree) > 1:
            for depth in range(len(accepted.path) - 1):
                self.reached[depth] += 1
        assert verified.hidden is not None  # hidden_layers: the loop asks the verify pass for hidden states
        self._feed(verified.hidden[accepted.path], ctx.position)

    def _feed(self, hidden: torch.Tensor, start: int) -> None:
        """Run the rows [n, H] at positions start.. through the prefix layer (if any); keep the last as base."""
        assert self.heads is not None  # loaded by setup
        with self.books.timed("heads"):
            positions = torch.arange(start, start + hidden.shape[0], device=hidden.device)[None]  # [1, n]
            self.base = self.heads.prefix(hidden[None], positions, self.cache)[0, -1]

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """The static tree under the root, each depth's tokens from one batched head call."""
        if self.base is None:
            return DraftTree.root_only(ctx.root)
        assert self.heads is not None and self.layout is not None  # loaded by setup
        layout = self.layout
        tokens = [ctx.root] + [0] * layout.num_nodes
        with self.books.timed("heads"):
            root = self.embed(torch.tensor([ctx.root], device=self.base.device))[0]
            inputs = {0: torch.cat([self.base, root])}  # node -> [(depth + 2) H]: base state, path embeddings
            for depth, (nodes, parents) in enumerate(self.depth_nodes, start=1):
                logits = self.heads.head_logits(depth - 1, torch.stack([inputs[p] for p in parents]))  # [n, V]
                ranked = logits.topk(1 + max(layout.ranks[node - 1] for node in nodes), dim=-1).indices.tolist()
                self.books.add(head_rows=len(parents))
                row = {parent: i for i, parent in enumerate(parents)}
                for node in nodes:
                    tokens[node] = ranked[row[layout.parents[node]]][layout.ranks[node - 1]]
                    if node in self.expanded:
                        inputs[node] = torch.cat([inputs[layout.parents[node]], self.embedded(tokens[node])])
        return DraftTree(tokens, list(layout.parents))

    def embedded(self, token: int) -> torch.Tensor:
        """The target's input embedding [H] of ``token``."""
        assert self.base is not None  # only called while drafting
        return self.embed(torch.tensor([token], device=self.base.device))[0]

    def artefacts(self) -> list[str]:
        """The Hydra heads (their weights digest when trained here)."""
        return [self.part] if self.heads is not None else []

    def stats(self) -> dict:
        """Tree shape, acceptance by depth, the heads' time (heads_s)."""
        books = self.books
        tree_steps = books.counts["tree_steps"]
        return {
            **books.report(),
            "heads": self.origin,
            "num_heads": self.heads.num_heads if self.heads is not None else None,
            "arch": self.heads.arch if self.heads is not None else None,
            "tree": self.tree_source,
            "tree_nodes": self.layout.num_nodes if self.layout else None,
            "accepted_per_step": books.per("accepted_draft_tokens", "steps"),
            "depth_accept_rate": [round(n / tree_steps, 4) if tree_steps else None for n in self.reached],
        }
