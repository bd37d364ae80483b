"""SWIFT (Xia et al., ICLR 2025): self-speculative decoding whose skipped layers are searched on the fly.

The draft is the target with some attention and MLP sub-layers skipped (``specbench.models.layer_skip``), drafting on
the target's own KV cache as Draft&Verify's does. No set is given or trained: decoding starts from every second
layer skipped, and while the optimization phase lasts each decoding step begins with one optimization step. A
candidate set (``skip_ratio`` of the searchable sub-layers; a random draw, every ``bayes_interval``-th one a Bayesian
proposal, ``specbench.structures.bayes_opt``) is scored in one parallel draft forward over the first
``context_window`` + 1 tokens of the current output, already verified by the target: the share of them whose
predecessor's draft argmax names them (the match rate). A candidate better than the best so far replaces the set.
The phase ends for good (the acceleration phase) once a match rate exceeds ``max_score``, after
``max_tolerance_iter`` steps without a better set, or after ``max_opt_iter`` steps. The set, the search and its
counters carry over from one generation to the next (the input stream), until ``forget``.

Drafting is confidence-aware: the chain of the draft's top-1 tokens stops after the first whose draft probability
is below ``threshold`` (epsilon), and each depth also proposes the next-ranked tokens as sibling leaves, more of them
the less confident its top-1 was (``tree_widths`` above each of ``confidence_levels``). At T > 0 the candidates are
ordered draws without replacement from the warped draft law, recorded in ``draft_probs`` for the exact
``speculative`` rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, Drafter, knob_int, knob_number
from specbench.core.tree import DraftTree
from specbench.core.verify import compact_cache
from specbench.drafters.tree_fill import pick_children
from specbench.errors import ConfigError
from specbench.models.layer_skip import LayerSkip, SkipSet, decoder_layers
from specbench.models.loading import eos_token_ids
from specbench.structures.bayes_opt import BinarySearch

BAYES_KAPPA = 2.5
"""The upper confidence bound's exploration weight in the authors' Bayesian proposals (bayes_opt's UCB kappa)."""


def match_rate(draft_logits: torch.Tensor, tokens: torch.Tensor) -> float:
    """Share of ``tokens[1:]`` that the draft's argmax at the position before names (draft_logits [n, vocab], tokens
    [n]): SWIFT's objective, the verified tokens standing as ground truth."""
    hits = draft_logits[:-1].argmax(-1) == tokens[1:]  # [n - 1]
    return float(hits.float().mean())


def knob_list(key: str, values: object) -> list[object]:
    """``values`` as a list when it is one (a config list), else a ConfigError naming ``method.drafter.<key>``."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ConfigError(f"method.drafter.{key} must be a list, got {values!r}")
    return list(values)


def knob_levels(key: str, values: object) -> tuple[float, ...]:
    """A strictly decreasing list of probabilities, or a ConfigError naming ``method.drafter.<key>``."""
    levels = tuple(knob_number(f"{key}[{i}]", v, 0.0, 1.0) for i, v in enumerate(knob_list(key, values)))
    if not levels or any(a <= b for a, b in zip(levels, levels[1:], strict=False)):
        raise ConfigError(f"method.drafter.{key} must be a non-empty decreasing list of probabilities, got {values!r}")
    return levels


def knob_widths(key: str, values: object, count: int) -> tuple[int, ...]:
    """``count`` candidate counts (each >= 1), or a ConfigError naming ``method.drafter.<key>``."""
    widths = tuple(knob_int(f"{key}[{i}]", v, 1) for i, v in enumerate(knob_list(key, values)))
    if len(widths) != count:
        raise ConfigError(f"method.drafter.{key} must list {count} counts (one per confidence band), got {values!r}")
    return widths


@dataclass
class LayerSearch:
    """The optimization phase's state: the best match rate so far, its steps, and whether it still runs."""

    space: tuple[int, ...]  # the searchable layers; bit i names attention space[i], bit S + i MLP space[i]
    proposals: BinarySearch  # every candidate scored so far, and the Bayesian proposals drawn from them
    best_score: float = 0.0  # the authors start from 0: the first candidate that matches anything is taken
    iterations: int = 0  # optimization steps done
    tolerance: int = 0  # optimization steps in a row without a better set
    running: bool = True  # False in the acceleration phase

    def skip_set(self, bits: tuple[int, ...]) -> SkipSet:
        """The sub-layers a candidate's bits name."""
        size = len(self.space)
        return SkipSet(
            tuple(layer for layer, bit in zip(self.space, bits[:size], strict=True) if bit),
            tuple(layer for layer, bit in zip(self.space, bits[size:], strict=True) if bit),
        )


class Swift(Drafter):
    """Drafts a confidence-pruned tree with the target's skipped-layer forward, searching the skipped set online."""

    COUNTERS = (
        "steps",
        "drafted",
        "accepted_tokens",
        "draft_forwards",
        "optimization_steps",
        "bayes_steps",
        "set_changes",
    )
    reads_sampling = True
    needs_dynamic_cache = True  # the skipped-layer draft and the candidates' scoring run on the target's own cache

    def __init__(
        self,
        skip_ratio: float = 0.45,
        keep_ends: bool = True,
        context_window: int = 50,
        opt_interval: int = 1,
        bayes_interval: int = 25,
        max_opt_iter: int = 1000,
        max_tolerance_iter: int = 300,
        max_score: float = 0.93,
        threshold: float = 0.8,
        max_draft: int = 25,
        confidence_levels=(0.95, 0.8, 0.5),
        tree_widths=(3, 5, 8, 10),
        tree_widths_sampled=(1, 3, 5, 10),
        seed: int = 0,
    ):
        super().__init__()
        self.skip_ratio = knob_number("skip_ratio", skip_ratio, 0.0, 1.0, "r")
        if not isinstance(keep_ends, bool):
            raise ConfigError(f"method.drafter.keep_ends must be true or false, got {keep_ends!r}")
        self.keep_ends = keep_ends
        self.context_window = knob_int("context_window", context_window, 1)
        self.opt_interval = knob_int("opt_interval", opt_interval, 1)
        self.bayes_interval = knob_int("bayes_interval", bayes_interval, 1)
        self.max_opt_iter = knob_int("max_opt_iter", max_opt_iter, 0)
        self.max_tolerance_iter = knob_int("max_tolerance_iter", max_tolerance_iter, 0)
        self.max_score = knob_number("max_score", max_score, 0.0, 1.0)
        self.threshold = knob_number("threshold", threshold, 0.0, 1.0, "epsilon")
        self.max_draft = knob_int("max_draft", max_draft, 1)
        self.confidence_levels = knob_levels("confidence_levels", confidence_levels)
        bands = len(self.confidence_levels) + 1
        self.tree_widths = knob_widths("tree_widths", tree_widths, bands)
        self.tree_widths_sampled = knob_widths("tree_widths_sampled", tree_widths_sampled, bands)
        self.seed = knob_int("seed", seed, 0)
        self.most_candidates = max(*self.tree_widths, *self.tree_widths_sampled)
        self.target: Any = None  # the target model (bound by setup)
        self.skipper: LayerSkip | None = None
        self.eos_ids: frozenset[int] = frozenset()
        self.search: LayerSearch | None = None

    # -- the layer set and its search ---------------------------------------------------------------------

    def setup(self, target, tokenizer) -> None:
        """Bind to the target and start the search from the initial set."""
        self.target = target
        self.eos_ids = eos_token_ids(target, tokenizer)
        self.skipper = LayerSkip(target, SkipSet())
        self.forget()

    def searchable_layers(self) -> tuple[int, ...]:
        """The layers whose sub-layers a set may skip: all but the first and the last with ``keep_ends``."""
        layers = len(decoder_layers(self.target))
        space = tuple(range(1, layers - 1)) if self.keep_ends else tuple(range(layers))
        if not space:
            raise ConfigError(
                f"the target has {layers} layers and method.drafter.keep_ends keeps the first and the last: no layer "
                f"is left to skip (set keep_ends=false)"
            )
        return space

    def forget(self) -> None:
        """Back to the initial set (every second searchable layer's attention and MLP skipped) and a fresh search."""
        assert self.skipper is not None  # bound by setup
        space = self.searchable_layers()
        bits = 2 * len(space)
        proposals = BinarySearch(bits, self.seed, ones=int(bits * self.skip_ratio), kappa=BAYES_KAPPA)
        self.search = LayerSearch(space, proposals)
        self.skipper.use(SkipSet(space[::2], space[::2]))

    def recall(self, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """The searched set depends on the target's verified tokens and on every score: the generation runs again."""
        return False

    def optimization_due(self, ctx: DecodeContext) -> bool:
        """Whether this step begins with an optimization step: the phase runs, the output already holds the window
        and one more token, and the step is on the ``opt_interval`` grid."""
        assert self.search is not None  # set by setup
        output = len(ctx.tokens) - ctx.prompt_len
        return self.search.running and output > self.context_window + 1 and ctx.step % self.opt_interval == 0

    def optimize(self, ctx: DecodeContext) -> None:
        """One optimization step: propose a candidate set, score it on the window, keep it when it is the best so
        far, and end the phase at the best score, the tolerance or the step limit."""
        search = self.search
        assert search is not None  # set by setup
        bayes = (search.iterations + 1) % self.bayes_interval == 0
        bits = search.proposals.propose() if bayes else search.proposals.random_point()
        score = self.score(ctx, search.skip_set(bits))
        search.proposals.observe(bits, score)
        search.iterations += 1
        better = score > search.best_score
        if better:
            assert self.skipper is not None  # bound by setup
            self.skipper.use(search.skip_set(bits))
            search.best_score, search.tolerance = score, 0
        else:
            search.tolerance += 1
        search.running = not (
            (better and score > self.max_score)
            or search.tolerance > self.max_tolerance_iter
            or search.iterations > self.max_opt_iter
        )
        self.books.add(optimization_steps=1, bayes_steps=bayes, set_changes=better)

    def score(self, ctx: DecodeContext, skip: SkipSet) -> float:
        """The match rate of the draft skipping ``skip`` over the first ``context_window`` + 1 output tokens, drafted
        in one forward on the target's cache of the prompt (the committed rows after it are masked, then cropped)."""
        assert self.skipper is not None and ctx.cache is not None  # bound by setup; the eager path's cache
        start, past = ctx.prompt_len, ctx.position
        window = torch.tensor(ctx.tokens[start : start + self.context_window + 1], device=self.target.device)  # [w]
        previous = self.skipper.skip
        self.skipper.use(skip)
        try:
            with self.skipper.drafting():
                out = self.target(
                    input_ids=window[None],
                    position_ids=torch.arange(start, start + len(window), device=window.device)[None],
                    attention_mask=self.window_mask(start, past, len(window)),
                    past_key_values=ctx.cache,
                    use_cache=True,
                )
        finally:
            self.skipper.use(previous)
            compact_cache(ctx.cache, past, [])  # the window's draft rows go
        return match_rate(out.logits[0].float(), window)

    def window_mask(self, start: int, past: int, rows: int) -> torch.Tensor:
        """The additive mask [1, 1, rows, past + rows] of the window's forward: the prompt's cached rows and the
        window's earlier rows are seen; the cached output rows (the window's own tokens, by the full model) are not."""
        dtype, device = self.target.dtype, self.target.device
        seen = torch.ones(rows, past + rows, dtype=torch.bool, device=device)  # [rows, past + rows]
        seen[:, start:past] = False
        seen[:, past:] = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
        mask = torch.zeros(rows, past + rows, dtype=dtype, device=device).masked_fill_(~seen, torch.finfo(dtype).min)
        return mask[None, None]

    # -- confidence-aware drafting ------------------------------------------------------------------------

    def width(self, confidence: float, sampled: bool) -> int:
        """Candidates proposed at a depth whose top-1 draft probability is ``confidence``."""
        widths = self.tree_widths_sampled if sampled else self.tree_widths
        band = next((i for i, level in enumerate(self.confidence_levels) if confidence > level), len(widths) - 1)
        return widths[band]

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """An optimization step when due, then the confidence-aware tree drafted on the target's cache."""
        self.books.add(steps=1)
        if ctx.cache is None:
            raise RuntimeError("SWIFT drafts on the target's KV cache; the decode context carries none")
        if self.optimization_due(ctx):
            with self.books.timed("optimize"):
                self.optimize(ctx)
        budget = min(self.max_draft, ctx.remaining - 1)
        if budget < 1:
            return DraftTree.root_only(ctx.root)
        tree = self.draft(ctx, budget)
        self.books.add(drafted=tree.num_drafted)
        return tree

    def draft(self, ctx: DecodeContext, budget: int) -> DraftTree:
        """Up to ``budget`` chain tokens with their siblings, drafted with the current set; the draft rows cropped.

        NOTE: at T > 0 a depth's candidates are the first ``width`` of ordered draws without replacement, and the
        width depends on the first draw only, so they are draws of that law as the ``speculative`` rule needs.
        """
        assert self.skipper is not None and ctx.cache is not None  # bound by setup; checked by propose
        law = ctx.draft_law(True)
        tokens, parents = [ctx.root], [-1]
        chain: list[int] = []  # the nodes whose children were drafted: the root, then the chain's top-1 nodes
        rows: list[torch.Tensor] = []  # [vocab] per node of ``chain`` at T > 0: the law its children came from
        token, parent = ctx.root, 0
        with self.skipper.drafting():
            for _ in range(budget):
                logits = self.skipper.next_logits(token, ctx.cache)  # [vocab] the draft's logits after the chain
                ranked, q = pick_children(logits, min(self.most_candidates, logits.numel()), law, ctx.generator)
                token, confidence = ranked[0], float(logits.softmax(-1)[ranked[0]])
                candidates = ranked[: self.width(confidence, law is not None)]
                chain.append(parent)
                parent = len(tokens)  # the top-1 candidate continues the chain
                parents += [chain[-1]] * len(candidates)
                tokens += candidates
                if q is not None:
                    rows.append(q)
                self.books.add(draft_forwards=1)
                if confidence < self.threshold or token in self.eos_ids:
                    break
        compact_cache(ctx.cache, ctx.position, [])  # the draft's rows go; the verify pass writes the real ones
        tree = DraftTree(tokens, parents)
        if rows:
            tree.draft_probs = torch.zeros(len(tokens), rows[0].numel())  # [nodes, vocab]; leaves' rows unused
            tree.draft_probs[chain] = torch.stack(rows)
        return tree

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified, accepted: Acceptance) -> None:
        """Count the accepted drafts."""
        self.books.add(accepted_tokens=len(accepted.path) - 1)

    def stats(self) -> dict:
        """Books, the current set, and the search's state (phase, steps, best match rate)."""
        books, search = self.books, self.search
        skip = self.skipper.skip if self.skipper else SkipSet()
        return {
            **books.report(),
            "drafted_per_step": books.per("drafted", "steps"),
            "draft_hit_ratio": books.per("accepted_tokens", "drafted"),
            "skipped_attention": list(skip.attention),
            "skipped_mlp": list(skip.mlp),
            "skipped_fraction": self.skipper.skipped_fraction if self.skipper else 0.0,
            "phase": "optimization" if search is None or search.running else "acceleration",
            "search_iterations": search.iterations if search else 0,
            "best_match_rate": search.best_score if search else 0.0,
        }
