"""Medusa's typical acceptance (Cai et al. 2024, Sec. 3.3.1): LOSSY, so method configs using it set
``lossless: false``.

Rule ``"typical"`` (``method.acceptance: typical``) with ``method.acceptance_kwargs``:
``posterior_threshold`` (epsilon, default 0.09), ``posterior_alpha`` (delta; None = sqrt(eps), the
paper's pairing, 0.3 at the default eps)
and ``mode`` (``fast`` | ``sampled``). A drafted token ``t`` under node ``u`` is *typical* when
``P_T(t|u) > min(eps, delta * exp(-H(P_T(.|u))))``, with ``P_T`` the run's warped target (temperature,
then top-p; with ``top_p: 1`` exactly Medusa's ``softmax(logits / T)``) and Medusa's entropy
``H = -sum P_T log(P_T + 1e-5)``.

- ``fast`` (Medusa's default, deterministic): accept the deepest node whose whole path is typical
  (ties: the highest summed log ``P_T`` along the path, then the lowest node index) and emit the
  target's ARGMAX at that node, as the official code does (its next root is ``argmax`` in fast mode).
  No random draw at all: outputs do not follow ``P_T``.
- ``sampled`` (the non-fast path): an exact sample of the typical-truncated law ``P_T`` restricted to
  ``{P_T >= threshold}`` (Medusa's filter), through multi-candidate rejection
  (docs/acceptance.md#multi-candidate-rejection; with the tree's ``draft_probs`` when it has them).
  The official code instead samples every candidate path independently (shared prefixes are re-drawn
  per path, which accepts more and is not exact even for the truncated law) and then draws a fresh
  truncated sample at the end node; both are replaced here by the exact per-node rule.

Lossy in both modes: ``fast`` is a deterministic function of the logits; ``sampled`` never emits
tokens below the threshold. At T = 0 (``sampling.greedy``) both are ``accept_match``'s greedy walk,
and as T -> 0 ``P_T`` becomes one-hot on the argmax, so the rules converge to it.
"""

from __future__ import annotations

import math

import torch

from specbench.core.acceptance import Acceptance, Sampling, accept_match, target_probs
from specbench.core.speculative import speculative_walk
from specbench.core.tree import DraftTree
from specbench.errors import ConfigError

MODES = ("fast", "sampled")
ENTROPY_EPS = 1e-5  # Medusa computes H with log(p + 1e-5)


def accept_typical(
    tree: DraftTree,
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None = None,
    posterior_threshold: float = 0.09,
    posterior_alpha: float | None = None,
    mode: str = "fast",
) -> Acceptance:
    """Medusa typical acceptance (LOSSY; see the module docstring); greedy ``match`` at T = 0."""
    if posterior_alpha is None:
        posterior_alpha = math.sqrt(posterior_threshold)
    check_typical_kwargs(posterior_threshold, posterior_alpha, mode)
    if sampling.greedy:
        return accept_match(tree, logits, sampling, generator)
    if mode == "sampled":

        def warp(row: torch.Tensor) -> torch.Tensor:
            return typical_probs(row, sampling, posterior_threshold, posterior_alpha)

        return speculative_walk(tree, logits, warp, generator)
    end = deepest_typical_node(tree, logits, sampling, posterior_threshold, posterior_alpha)
    return Acceptance(tree.path_to(end), int(logits[end].argmax()))


def check_typical_kwargs(posterior_threshold: float, posterior_alpha: float | None, mode: str) -> None:
    """A one-line ConfigError for out-of-range typical-acceptance settings."""
    key = "method.acceptance_kwargs"
    if not 0.0 <= posterior_threshold <= 1.0:
        raise ConfigError(f"{key}.posterior_threshold (epsilon) must be in [0, 1]; got {posterior_threshold}")
    if posterior_alpha is not None and not 0.0 <= posterior_alpha <= 1.0:
        raise ConfigError(f"{key}.posterior_alpha (delta) must be in [0, 1]; got {posterior_alpha}")
    if mode not in MODES:
        raise ConfigError(f"{key}.mode must be one of {MODES}; got {mode!r}")


def typical_threshold(probs: torch.Tensor, posterior_threshold: float, posterior_alpha: float) -> torch.Tensor:
    """Per-row threshold ``min(eps, delta * exp(-H(p)))`` [...] for probabilities [..., vocab]."""
    entropy = -(probs * torch.log(probs + ENTROPY_EPS)).sum(dim=-1)  # [...]
    return (posterior_alpha * torch.exp(-entropy)).clamp(max=posterior_threshold)


def typical_probs(
    logits: torch.Tensor, sampling: Sampling, posterior_threshold: float, posterior_alpha: float
) -> torch.Tensor:
    """The typical-truncated target [..., vocab]: ``P_T`` without tokens below the threshold, renormalised.

    The argmax is always kept (the threshold is capped at the row's maximum), so no row is empty.
    """
    probs = target_probs(logits, sampling)  # [..., vocab]
    threshold = typical_threshold(probs, posterior_threshold, posterior_alpha)
    threshold = torch.minimum(threshold, probs.amax(dim=-1))[..., None]  # [..., 1]
    kept = probs.masked_fill(probs < threshold, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def deepest_typical_node(
    tree: DraftTree, logits: torch.Tensor, sampling: Sampling, posterior_threshold: float, posterior_alpha: float
) -> int:
    """The end of the longest all-typical path (ties: highest summed log-probability, lowest index).

    NOTE: breadth-first, one batched evaluation per depth over the accepted nodes that have children,
    so only the rows that can matter are warped (warping every row of a 64-node tree costs ~60 ms
    on CPU) and the device syncs once per depth.
    """
    children = tree.children()
    score = {0: 0.0}  # accepted node -> summed log P_T of its path
    frontier = [0]
    while True:
        parents = [u for u in frontier if children[u]]
        if not parents:
            break
        kids = [c for u in parents for c in children[u]]
        rows = torch.tensor([i for i, u in enumerate(parents) for _ in children[u]], device=logits.device)
        tokens = torch.tensor([tree.tokens[c] for c in kids], device=logits.device)
        probs = target_probs(logits[parents], sampling)  # [len(parents), vocab]
        thresholds = typical_threshold(probs, posterior_threshold, posterior_alpha)  # [len(parents)]
        kid_probs, kid_thresholds = torch.stack([probs[rows, tokens], thresholds[rows]]).tolist()
        passed = [(c, p) for c, p, t in zip(kids, kid_probs, kid_thresholds) if p > t]
        if not passed:
            break
        frontier = [c for c, _ in passed]
        score.update((c, score[tree.parents[c]] + math.log(p)) for c, p in passed)
    return max(frontier, key=lambda c: (score[c], -c))
