"""DFlash (Chen, Liang and Liu 2026): a block of B - 1 tokens drafted in ONE drafter forward (docs/methods/dflash.md).

The drafter (``specbench.models.dflash``) reads the target's hidden states at a few layers as context: the loop hands
them over through ``hidden_layers`` (the prompt's from the prefill, then the accepted path's from each verify pass).
Each step runs one drafter forward whose rows are the root x_p and B - 1 mask tokens at positions p .. p + B - 1; it
first turns the context rows committed since the last step (positions c .. p - 1) into every layer's keys/values,
which stay cached, and the block attends to all cached context and to itself (no causal mask). Row k's logits are
the draft law of the token at p + k, k = 1 .. B - 1. At T = 0 each drafted token is its row's argmax; at T > 0 it is
drawn from its row warped like the target, and the row is recorded in ``draft_probs`` for the ``speculative`` rule:
every row is fixed before any token is drawn (the rows do not depend on the drafted tokens), so verification stays
exact. The block's own keys/values leave the cache after the step.
"""

from __future__ import annotations

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, Drafter, knob_int
from specbench.core.tree import DraftTree
from specbench.core.verify import VerifyOutput
from specbench.drafters.tree_fill import chain_from_rows
from specbench.models.dflash import DFlashDraft, load_dflash


class DFlash(Drafter):
    """Drafts a chain of up to B - 1 tokens per step from one forward of a DFlash drafter."""

    COUNTERS = ("steps", "drafted", "accepted_tokens", "draft_forwards", "context_rows")
    reads_sampling = True

    def __init__(self, block_size: int | None = None, draft=None, target_name: str = "target"):
        super().__init__()
        self.given_block = None if block_size is None else knob_int("block_size", block_size, 2, "B")
        self.draft_cfg = draft
        self.target_name = target_name
        self.loaded: DFlashDraft | None = None
        self.block_size = 0  # B, set by setup (the knob, else the drafter's trained block size)
        self.origin = ""
        self.trained_top1: list[float] | None = None
        self.reset([])

    def setup(self, target, tokenizer) -> None:
        """Load the drafter (the model config's ``dflash:`` node) and ask the loop for the target layers it reads."""
        loaded = load_dflash(self.draft_cfg, target, self.target_name)
        self.loaded, self.origin, self.trained_top1 = loaded.draft, loaded.origin, loaded.top1_by_position
        self.hidden_layers = loaded.draft.hidden_layers
        self.block_size = self.given_block or loaded.draft.block_size

    @property
    def draft(self) -> DFlashDraft:
        """The drafter, loaded by ``setup``."""
        if self.loaded is None:
            raise RuntimeError("DFlash.setup(target, tokenizer) must load the drafter first")
        return self.loaded

    def artefacts(self) -> list[str]:
        """The drafter (``dflash:<weights digest>`` when trained here, else its Hub id or seed)."""
        return [self.origin] if self.origin else []

    def reset(self, prompt_ids: list[int]) -> None:
        """No cached context; the prompt's features arrive with ``observe_prompt``."""
        self.past: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: context keys / values of 0 .. c - 1
        self.committed = 0  # c: context positions cached
        self.pending: torch.Tensor | None = None  # [m, n_layers x H] target features of positions c .. c + m - 1
        self.reached: list[int] = []

    def observe_prompt(self, hidden: torch.Tensor) -> None:
        """The prefill's features of positions 0 .. P - 1."""
        self.pending = hidden

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """One drafter forward over the new context rows and the block [x_p, mask x (B - 1)]; a chain of its rows'
        drafts, cut to the budget."""
        budget = min(self.block_size - 1, ctx.remaining - 1)
        if budget < 1:
            self.books.add(steps=1)
            return DraftTree.root_only(ctx.root)
        logits = self._block_logits(ctx)[:budget]  # [budget, vocab]
        tree = chain_from_rows(ctx.root, logits, ctx.draft_law(True), ctx.generator)
        self.books.add(steps=1, drafted=len(tree) - 1)
        return tree

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified: VerifyOutput, accepted: Acceptance) -> None:
        """Keep the target's features of the accepted path (positions p .. p + a) as the next step's context rows."""
        assert verified.hidden is not None  # the verify pass returns it to drafters with hidden_layers
        rows = verified.hidden[accepted.path]  # [a + 1, n_layers x H]
        self.pending = rows if self.pending is None else torch.cat([self.pending, rows.to(self.pending.device)])
        accepted_tokens = len(accepted.path) - 1
        self.books.add(accepted_tokens=accepted_tokens)
        self.reached.extend([0] * (accepted_tokens - len(self.reached)))
        for depth in range(accepted_tokens):
            self.reached[depth] += 1

    def _block_logits(self, ctx: DecodeContext) -> torch.Tensor:
        """The draft logits [B - 1, vocab] (float32) of the block's mask rows, from one drafter forward that also
        caches the context rows of positions c .. p - 1."""
        draft, position = self.draft, ctx.position
        if self.pending is None or self.pending.shape[0] != position - self.committed:
            given = None if self.pending is None else self.pending.shape[0]
            raise RuntimeError(
                f"DFlash context out of step: {given} new feature rows for positions {self.committed}..{position - 1}"
            )
        device = draft.fc.weight.device
        features = self.pending.to(device)[None]  # [1, m, F]
        context_positions = torch.arange(self.committed, position, device=device)[None]  # [1, m]
        block = torch.tensor([[ctx.root] + [draft.mask_token] * (self.block_size - 1)], device=device)  # [1, B]
        block_positions = torch.arange(position, position + self.block_size, device=device)[None]  # [1, B]
        out, new = draft(features, context_positions, block, block_positions, None, self.past or None)
        if self.past:
            new = [(torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(self.past, new)]
        self.past = new
        self.books.add(draft_forwards=1, context_rows=features.shape[1])
        self.committed, self.pending = position, None
        return draft.logits(out[0, 1:]).float()  # [B - 1, vocab]

    def stats(self) -> dict:
        """Drafter origin, block size, drafted / accepted tokens per step and per drafter forward, acceptance by
        depth."""
        books = self.books
        steps = books.counts["steps"]
        return {
            **books.report(),
            "drafter": self.origin,
            "block_size": self.block_size,
            "drafted_per_step": books.per("drafted", "steps"),
            "accepted_per_step": books.per("accepted_tokens", "steps"),
            "accepted_per_draft_forward": books.per("accepted_tokens", "draft_forwards"),
            "draft_hit_ratio": books.per("accepted_tokens", "drafted"),
            "depth_accept_rate": [round(n / steps, 4) for n in self.reached] if steps else [],
            "trained_top1_by_position": self.trained_top1,
        }
