"""SpeDe: classic speculative decoding (Leviathan et al. 2023; Chen et al. 2023) with a draft model.

Each step the draft model, on its own KV cache, extends the committed tokens by a chain of ``gamma``
tokens (argmax at T=0; at T>0 draws from its warped distribution q, recorded in ``draft_probs`` for
the ``speculative`` acceptance rule). ``gamma`` follows HF assisted generation: ``constant``, or the
"heuristic" schedule (+2 after a fully accepted chain, -1 otherwise, floor 1) that HF keeps across
generations (``heuristic``) or restarts per generation (``heuristic_transient``).
"""

from __future__ import annotations

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, knob_choice, knob_int
from specbench.core.tree import DraftTree
from specbench.drafters.draft_model import DraftModelDrafter

SCHEDULES = ("constant", "heuristic", "heuristic_transient")


class SpeDe(DraftModelDrafter):
    """Drafts one chain of ``gamma`` draft-model tokens per step."""

    COUNTERS = (*DraftModelDrafter.COUNTERS, "gamma_sum")

    def __init__(self, num_assistant_tokens: int = 5, schedule: str = "heuristic", **draft_settings):
        self.schedule = knob_choice("schedule", schedule, SCHEDULES)
        self.initial_gamma = self.gamma = knob_int("num_assistant_tokens", num_assistant_tokens, 1, "gamma")
        super().__init__(**draft_settings)

    def reset(self, prompt_ids: list[int]) -> None:
        """Per generation: a fresh draft cache; gamma restarts unless the schedule is HF's persistent one."""
        super().reset(prompt_ids)
        if self.schedule != "heuristic":
            self.forget()

    def forget(self) -> None:
        """Gamma back to its start (HF's persistent ``heuristic`` schedule carries it across generations)."""
        self.gamma = self.initial_gamma

    def recall(self, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """HF's persistent ``heuristic`` schedule carries gamma, moved by every step's acceptance, across generations:
        then the generation runs again (False); the other schedules restart per generation."""
        return self.schedule != "heuristic"

    def draft_tree(self, ctx: DecodeContext) -> DraftTree:
        """Sync the draft cache, then draft up to gamma tokens (fewer at an EOS or the budget's end)."""
        budget = min(self.gamma, ctx.remaining - 1)
        self.books.add(gamma_sum=self.gamma)
        if budget < 1:
            return DraftTree.root_only(ctx.root)
        assert self.lm is not None  # loaded by setup
        logits = self.lm.sync(ctx.tokens)  # [vocab] q(.|root)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []  # q per drafted token when drafts are sampled (none for top-k drafts)
        while True:
            (token,), q = self.pick(logits, 1, ctx)
            tokens.append(token)
            if q is not None:
                rows.append(q)
            if len(tokens) == budget or token in self.eos_ids:
                break
            logits = self.lm.extend([token])
        tree = DraftTree.chain(ctx.root, tokens)
        if rows:
            tree.draft_probs = torch.stack([*rows, torch.zeros_like(rows[0])])  # [gamma + 1, vocab]; leaf row unused
        return tree

    def update(self, ctx: DecodeContext, tree: DraftTree, accepted: Acceptance) -> None:
        """Drop the rejected draft rows; adapt gamma (HF: +2 when every drafted token was accepted, else -1)."""
        assert self.lm is not None  # loaded by setup
        self.lm.rollback(ctx.tokens + accepted.emitted(tree))
        if self.schedule != "constant":
            all_accepted = len(accepted.path) - 1 == tree.num_drafted
            self.gamma = self.gamma + 2 if all_accepted else max(1, self.gamma - 1)

    def stats(self) -> dict:
        """Base stats plus the schedule's gamma (mean over steps and the value it ended at)."""
        return {**super().stats(), "gamma_mean": self.books.per("gamma_sum", "steps"), "gamma_final": self.gamma}
