"""Draft&Verify (Zhang et al., ACL 2024): self-speculative decoding, the target drafting with sub-layers skipped.

Each step the target, with a chosen set of attention and MLP sub-layers skipped (``specbench.models.layer_skip``),
drafts a chain on the target's own KV cache (the committed rows were written by the full model; the draft's
rows are cropped away before the target verifies). Drafting stops after ``max_draft`` (K) tokens, at an EOS, or
as soon as a drafted token's draft probability falls below the threshold gamma ("adaptive draft-exiting").
gamma follows the paper's update after every verify pass: the acceptance rate smoothed with beta1 is compared
with the target rate alpha; gamma moves by epsilon towards it, smoothed with beta2. gamma persists across
generations (the authors' evaluation passes it from one sample to the next); the smoothed rate restarts.

The skipped set is the model config's ``layer_skip`` node when it has one (the authors' published sets), else the
part ``python -m specbench.train layer_skip`` searched for this target and these settings (Bayesian optimisation of
the measured decoding speed on a few calibration prompts: ``specbench.train.layer_skip``), read from
``$SPECBENCH_CACHE/layer_skip/<model>/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, Drafter, knob_choice, knob_int, knob_number
from specbench.core.tree import DraftTree
from specbench.core.verify import compact_cache
from specbench.drafters.tree_fill import pick_children
from specbench.errors import ConfigError, ModelUnavailable
from specbench.manifest import digest, model_identity
from specbench.models.layer_skip import LayerSkip, SkipSet
from specbench.models.loading import eos_token_ids
from specbench.models.parts import part_kind

SEARCH_KEYS = ("source", "prompts", "max_new_tokens", "iterations", "max_minutes", "seed", "data_dir")
"""The keys of ``method.drafter.search``."""
SEARCH_SOURCES = ("mbpp_train", "dolly_dev")
"""Where the search's calibration prompts may come from (``specbench.train.sources``): no evaluation split."""


@dataclass(frozen=True)
class SearchSettings:
    """How the skipped set is searched when the model config gives none (``method.drafter.search``)."""

    source: str  # calibration prompt source (specbench.train.sources: mbpp_train | dolly_dev | sharegpt)
    prompts: int  # calibration prompts (the authors: 8)
    max_new_tokens: int  # tokens generated per prompt and point (the authors: 32)
    iterations: int  # proposals after the starting points (the authors: 1000)
    max_minutes: float | None  # stop proposing after this long (null = no cap)
    seed: int
    data_dir: str | None  # offline copies of the prompt source

    @classmethod
    def from_node(cls, node) -> SearchSettings:
        """Checked settings from the config node (a mapping with exactly ``SEARCH_KEYS``)."""
        given = dict(node or {})
        if set(given) != set(SEARCH_KEYS):
            raise ConfigError(f"method.drafter.search must have the keys {list(SEARCH_KEYS)}; got {sorted(given)}")
        minutes = given["max_minutes"]
        return cls(
            source=knob_choice("search.source", given["source"], SEARCH_SOURCES),
            prompts=knob_int("search.prompts", given["prompts"], 1),
            max_new_tokens=knob_int("search.max_new_tokens", given["max_new_tokens"], 1),
            iterations=knob_int("search.iterations", given["iterations"], 0),
            max_minutes=None if minutes is None else knob_number("search.max_minutes", minutes, 0.0),
            seed=knob_int("search.seed", given["seed"], 0),
            data_dir=given["data_dir"],
        )

    def identity(self) -> dict:
        """What decides the search's outcome (not where the prompts were read from)."""
        return {k: v for k, v in vars(self).items() if k != "data_dir"}


def skip_set_from(node) -> SkipSet | None:
    """The skipped set a ``layer_skip`` node gives ({attention: [...], mlp: [...]}), or None (= search one)."""
    if node is None:
        return None
    given = dict(node)
    if set(given) != {"attention", "mlp"}:
        raise ConfigError(
            f"layer_skip must have exactly the keys attention and mlp (layer indices); got {sorted(given)}"
        )
    parts = {}
    for part, indices in given.items():
        values = list(indices or [])
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in values):
            raise ConfigError(f"layer_skip.{part} must be a list of layer indices; got {values!r}")
        parts[part] = tuple(sorted(values))
    return SkipSet(**parts)


class DraftVerify(Drafter):
    """Drafts a chain with the target's skipped-layer forward; exits early below the adaptive threshold."""

    COUNTERS = ("steps", "drafted", "accepted_tokens", "draft_forwards", "threshold_sum")
    reads_sampling = True
    needs_dynamic_cache = True  # the skipped-layer draft runs on the target's own cache (ctx.cache)

    def __init__(
        self,
        layers=None,
        max_draft: int = 12,
        threshold: float = 0.6,
        adaptive_threshold: bool = True,
        target_acceptance: float = 0.9,
        threshold_step: float = 0.01,
        acceptance_momentum: float = 0.5,
        threshold_momentum: float = 0.9,
        search=None,
        target_name: str = "target",
        exit_layer: int | None = None,
    ):
        super().__init__()
        self.given = skip_set_from(layers)
        self.exit_layer = None if exit_layer is None else knob_int("exit_layer", exit_layer, 1, "E")
        if self.exit_layer is not None and self.given is not None:
            raise ConfigError(
                "method.drafter.exit_layer (an early exit) and method.drafter.layers (a skipped set) both say what the "
                "draft skips: set one"
            )
        self.max_draft = knob_int("max_draft", max_draft, 1, "K")
        self.initial_threshold = self.threshold = knob_number("threshold", threshold, 0.0, 1.0, "gamma")
        if not isinstance(adaptive_threshold, bool):
            raise ConfigError(f"method.drafter.adaptive_threshold must be true or false, got {adaptive_threshold!r}")
        self.adaptive = adaptive_threshold
        self.target_acceptance = knob_number("target_acceptance", target_acceptance, 0.0, 1.0, "alpha")
        self.threshold_step = knob_number("threshold_step", threshold_step, 0.0, 1.0, "epsilon")
        self.acceptance_momentum = knob_number("acceptance_momentum", acceptance_momentum, 0.0, 1.0, "beta1")
        self.threshold_momentum = knob_number("threshold_momentum", threshold_momentum, 0.0, 1.0, "beta2")
        searched = self.given is None and self.exit_layer is None
        self.search_settings = SearchSettings.from_node(search) if searched else None
        self.target_name = target_name
        self.target: Any = None  # the target model (bound by setup)
        self.skipper: LayerSkip | None = None
        self.eos_ids: frozenset[int] = frozenset()
        self.smoothed_acceptance = 0.0
        self.search_record: dict | None = None  # where a searched set came from (cache file, points, speed)

    def setup(self, target, tokenizer) -> None:
        """Bind to the target; take the given skipped set, the early exit's, or the one the ``layer_skip`` trainer
        searched."""
        self.target = target
        self.eos_ids = eos_token_ids(target, tokenizer)
        skip = self.early_exit_set(target) if self.exit_layer is not None else self.given or self.searched_set(target)
        self.skipper = LayerSkip(target, skip)

    def early_exit_set(self, target) -> SkipSet:
        """LayerSkip's early exit as a skipped set: every sub-layer from ``exit_layer`` on, so the draft is the first
        E layers, then the final norm and the LM head (transformers' ``assistant_early_exit=E``)."""
        assert self.exit_layer is not None  # the early exit is set
        layers = target.config.num_hidden_layers
        if self.exit_layer >= layers:
            raise ConfigError(
                f"method.drafter.exit_layer (E) = {self.exit_layer} must be below the target's {layers} layers"
            )
        later = tuple(range(self.exit_layer, layers))
        return SkipSet(later, later)

    def reset(self, prompt_ids: list[int]) -> None:
        """Per generation the smoothed acceptance rate restarts; gamma carries over."""
        self.smoothed_acceptance = 0.0

    def forget(self) -> None:
        """The adaptive threshold back to gamma_0."""
        self.threshold = self.initial_threshold

    def recall(self, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """The adaptive threshold gamma, moved by every step's acceptance, carries across generations: then the
        generation runs again (False); a fixed threshold carries nothing."""
        return not self.adaptive

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Draft up to K tokens with the skipped-layer forward on the target's cache, then crop its rows."""
        budget = min(self.max_draft, ctx.remaining - 1)
        self.books.add(steps=1, threshold_sum=self.threshold)
        if budget < 1:
            return DraftTree.root_only(ctx.root)
        if ctx.cache is None:
            raise RuntimeError("Draft&Verify drafts on the target's KV cache; the decode context carries none")
        assert self.skipper is not None  # bound by setup
        tokens: list[int] = []
        rows: list[torch.Tensor] = []  # q per drafted token when drafts are sampled
        token = ctx.root
        with self.skipper.drafting():
            while len(tokens) < budget:
                logits = self.skipper.next_logits(token, ctx.cache)  # [vocab] the draft's next-token logits
                (token,), q = pick_children(logits, 1, ctx.draft_law(True), ctx.generator)
                tokens.append(token)
                if q is not None:
                    rows.append(q)
                self.books.add(draft_forwards=1)
                if float(logits.softmax(-1)[token]) < self.threshold or token in self.eos_ids:
                    break
        compact_cache(ctx.cache, ctx.position, [])  # the draft's rows go; the verify pass writes the real ones
        tree = DraftTree.chain(ctx.root, tokens)
        if rows:
            tree.draft_probs = torch.stack([*rows, torch.zeros_like(rows[0])])  # [K + 1, vocab]; leaf row unused
        self.books.add(drafted=len(tokens))
        return tree

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified, accepted: Acceptance) -> None:
        """Count accepted drafts; move gamma by the paper's rule when anything was drafted."""
        drafted, hits = tree.num_drafted, len(accepted.path) - 1
        self.books.add(accepted_tokens=hits)
        if self.adaptive and drafted:
            self.adapt_threshold(hits / drafted, full=drafted == self.max_draft)

    def adapt_threshold(self, acceptance: float, full: bool) -> None:
        """gamma <- beta2 gamma + (1 - beta2) gamma~, with gamma~ = gamma + eps while the smoothed acceptance rate is
        below alpha, else gamma - eps (kept when the chain already reached K, as the authors' code does)."""
        beta1, beta2, step = self.acceptance_momentum, self.threshold_momentum, self.threshold_step
        self.smoothed_acceptance = beta1 * self.smoothed_acceptance + (1 - beta1) * acceptance
        if self.smoothed_acceptance < self.target_acceptance:
            proposal = self.threshold + step
        else:
            proposal = self.threshold if full else self.threshold - step
        self.threshold = beta2 * self.threshold + (1 - beta2) * proposal

    # -- the skipped set --------------------------------------------------------------------------------

    def search_key(self, target) -> dict:
        """What decides a searched set: the target, its device, the search settings and the drafting knobs the search
        measures with (a change searches anew)."""
        assert self.search_settings is not None  # set whenever no set is given
        return {
            "model": model_identity(target),
            "device": target.device.type,
            "search": self.search_settings.identity(),
            "drafting": self.drafting_identity(),
        }

    def searched_file(self, target) -> Path:
        """Where the ``layer_skip`` trainer stores the set searched for this target and these settings."""
        return part_kind("layer_skip").keyed_file(self.target_name, self.search_key(target))

    def searched_set(self, target) -> SkipSet:
        """The set the ``layer_skip`` trainer searched for this target and these settings, or a ModelUnavailable
        naming the command that searches it."""
        path = self.searched_file(target)
        if not path.is_file():
            command = part_kind("layer_skip").command_line(self.target_name)
            raise ModelUnavailable(
                f"No searched Draft&Verify skipped set for model '{self.target_name}' at these settings (looked for "
                f"{path}). Search it with: {command}, adding this run's method overrides (method.drafter.*), or give "
                f"one in the model config's layer_skip node"
            )
        record = json.loads(path.read_text(encoding="utf-8"))
        self.search_record = {"file": str(path), "points": len(record["history"]), "tokens_per_s": record["best_score"]}
        return SkipSet(tuple(record["best"]["attention"]), tuple(record["best"]["mlp"]))

    def drafting_identity(self) -> dict:
        """The drafting knobs the search measures with (a change searches anew)."""
        return {
            "max_draft": self.max_draft,
            "threshold": self.initial_threshold,
            "adaptive": self.adaptive,
            "target_acceptance": self.target_acceptance,
            "threshold_step": self.threshold_step,
            "momenta": [self.acceptance_momentum, self.threshold_momentum],
        }

    def artefacts(self) -> list[str]:
        """The skipped set, by a digest of its layer lists (runs with different sets never count as one setting)."""
        assert self.skipper is not None  # bound by setup
        return [f"layer_skip:{digest(self.skipper.skip.as_dict())}"]

    def stats(self) -> dict:
        """Books, the threshold's course, the skipped set and, when searched, where it came from."""
        books = self.books
        skip = self.skipper.skip if self.skipper else SkipSet()
        return {
            **books.report(),
            "drafted_per_step": books.per("drafted", "steps"),
            "draft_hit_ratio": books.per("accepted_tokens", "drafted"),
            "threshold_mean": books.per("threshold_sum", "steps"),
            "threshold_final": self.threshold,
            "skipped_attention": list(skip.attention),
            "skipped_mlp": list(skip.mlp),
            "skipped_fraction": self.skipper.skipped_fraction if self.skipper else 0.0,
            "layer_search": self.search_record,
        }
