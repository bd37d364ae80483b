"""Traversal verification (Weng et al., NeurIPS 2025) for draft trees of any shape: lossless at any temperature, and
block verification itself on a chain.

Rule ``"traversal"`` (``method.acceptance: traversal``). Token-wise rules walk down from the root and drop a whole
subtree when its top token is rejected; traversal verification walks the tree from the leaves up and weighs each
node by the whole drafted sequence from the root to it. Paper symbols: ``M_b(.|alpha)`` is the target law at node
``alpha`` (here ``P``: the warped target row, later its residual), ``M_s(.|alpha)`` the draft law its children were
drawn from (here ``Q``: ``tree.draft_probs`` row ``alpha``; one-hot at each child's own token when ``draft_probs``
is None), ``p_alpha`` the node's sequence-level acceptance chance, ``alpha^-`` its parent. Step by step:

1. ``p_root = 1``; a child ``alpha`` of ``beta`` gets ``p_alpha = min(1, p_beta P_beta(x_alpha) / Q_beta(x_alpha))``
   (the chain's prefix weight of block verification, computed along every path).
2. Test the first leaf in depth-first order (first children first): accept it with chance ``p_alpha``. On accept,
   the path from the root to it is accepted and the emitted token is a sample of its ``P``.
3. On reject, delete it and update its parent ``beta`` (the paper's residual step), with ``S = sum(R)``:
   ``R = max(0, p_beta P_beta - Q_beta)``, ``P_beta <- R / S``, ``p_beta <- S / (S + 1 - p_beta)``; then, because
   OUR children are drawn WITHOUT replacement (contract in ``specbench.core.speculative``), ``Q_beta <- Q_beta`` with
   ``x_alpha`` zeroed and renormalised: the law the next sibling was drawn from. The remaining children's ``p`` (and
   their subtrees') follow from the new ``p_beta``, ``P_beta`` and ``Q_beta`` by step 1.
4. Go to step 2 with the next leaf: the next sibling's subtree, or ``beta`` itself once all its children are gone.
   The root's ``p`` stays 1, so it is accepted when everything else was rejected (emitting a sample of its ``P``).

On a chain this is block verification (Sun et al.; ``specbench.core.block``): the leaf is tested with ``w_g``, a
node ``i`` after the rejection of its child with ``|r_i| / (|r_i| + 1 - w_i)``, and the residual ``r_i`` is
``block``'s; the emitted law is the same, so it is optimal on chains as block is.

Why it is exact. Claim, for a node reached with weight ``p`` and target law ``P`` whose children are drawn from
``Q`` (one after another): the traversal of its subtree ends by accepting a node in it with total chance ``p``, the
emitted continuation after the node being a target sample (first token ``~ P``), and deletes the node with chance
``1 - p``. A node without children: by step 2. A child drawn from ``Q`` with token ``x``, itself obeying the claim
with ``p_x = min(1, p P(x) / Q(x))``, emits through ``x`` with chance ``Q(x) p_x = min(Q, p P)(x)`` and is deleted
with chance ``sum(Q - min(Q, p P)) = 1 - p + S``; after that the node, with ``p' P' = R / (1 - p + S)`` and one
child fewer, obeys the claim (induction on the children left), so it emits ``R`` in all. Summed, the first token is
``x`` with chance ``min(Q, p P)(x) + R(x) = p P(x)``, and the node is deleted with ``(1 - p + S)(1 - p') = 1 - p``.
The induction needs ``Q`` at the next child to be the law that child was drawn from given the earlier ones, so the
``Q`` update is where the way children are drawn enters: for children drawn independently (with replacement) ``Q``
stays as it is; for draws without replacement, the contract here, it is ``Q`` with the rejected token zeroed and
renormalised (the same change ``speculative`` makes to SpecInfer's update). Keeping ``Q`` on draws without
replacement is biased (tests/test_traversal_verification.py shows it). A one-hot ``Q`` per child (deterministic
drafts) fits the claim too: each child is then a draw from the one-hot law at its own token. At the root ``p = 1``,
so the step emits a target sample, the accepted path being its first tokens.

With one-hot drafts no exact rule can accept more in expectation than the chance that a target sample follows a
drafted path, which sample-and-match (``match``) and one-hot ``speculative`` already reach: on deterministic trees
(Medusa, EAGLE-2) this rule accepts as many tokens in expectation as those, no more. Its gains need drafts with a
draft law (SpeDe's chains, sampled trees).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from specbench.core.acceptance import Acceptance, Sampling, accept_match, target_probs
from specbench.core.tree import DraftTree


class Law:
    """A law over the vocabulary as weights [vocab] (float64, owned: updates change them in place) and their total,
    so that removing one token costs O(1)."""

    def __init__(self, weights: torch.Tensor, mass: float | None = None):
        self.weights = weights  # [vocab]
        self.mass = float(weights.sum()) if mass is None else mass

    def chance(self, token: int) -> float:
        return float(self.weights[token]) / self.mass

    def probs(self) -> torch.Tensor:
        """The law as probabilities [vocab]."""
        return self.weights / self.mass


class NodeLaws:
    """The target law ``P`` of each node: warped on first use, replaced by the node's residual once a child of it is
    rejected."""

    def __init__(self, warp: Callable[[int], torch.Tensor]):
        self.warp = warp  # node -> its warped target law [vocab]
        self.laws: dict[int, Law] = {}

    def __getitem__(self, node: int) -> Law:
        if node not in self.laws:
            self.laws[node] = Law(self.warp(node).to(torch.float64, copy=True))
        return self.laws[node]

    def __setitem__(self, node: int, law: Law) -> None:
        self.laws[node] = law


def accept_traversal(
    tree: DraftTree, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None
) -> Acceptance:
    """Lossless traversal verification of ``tree`` (see the module docstring); greedy (T=0) is ``accept_match``'s
    walk."""
    if sampling.greedy:
        return accept_match(tree, logits, sampling, generator)
    rows = logits.cpu()  # [num_nodes, vocab]; the run's generator lives on the CPU
    laws = NodeLaws(lambda node: target_probs(rows[node], sampling))
    coins = torch.rand(len(tree), generator=generator, dtype=torch.float64).tolist()  # one per node: each tested once
    for node, chance in traversal_tests(tree, laws):
        if node == 0 or coins[node] < chance:  # the root's chance is 1: it takes what is left
            token = int(torch.multinomial(laws[node].weights, 1, generator=generator))
            return Acceptance(tree.path_to(node), token)
    raise AssertionError("the traversal ends with the root")  # traversal_tests always tests the root last


def traversal_law(tree: DraftTree, targets: torch.Tensor) -> dict[int, torch.Tensor]:
    """The exact outcome law of traversal verification of ``tree`` given the target laws ``targets`` [num_nodes,
    vocab] at its nodes: per node, the chance [vocab] of accepting the path to it and emitting each token (float64;
    the chances of all nodes sum to 1)."""
    laws = NodeLaws(lambda node: targets[node])
    outcomes, untested = {}, 1.0  # untested: the chance that every test so far was a rejection
    for node, chance in traversal_tests(tree, laws):
        outcomes[node] = untested * chance * laws[node].probs()
        untested *= 1.0 - chance
    return outcomes


def traversal_tests(tree: DraftTree, laws: NodeLaws) -> Iterator[tuple[int, float]]:
    """The traversal's tests in order: (node, ``p_alpha``), the chance to accept the node given that every earlier
    test was a rejection; each is computed only once those rejections happened. After a test is yielded,
    ``laws[node]`` is the law of the token emitted if it is accepted. The root is tested last, with chance 1."""
    drafts = tree.draft_probs.cpu() if tree.draft_probs is not None else None  # [num_nodes, vocab]
    yield from subtree_tests(0, 1.0, tree.children(), tree.tokens, drafts, laws)


def subtree_tests(
    node: int,
    weight: float,
    children: list[list[int]],
    tokens: list[int],
    drafts: torch.Tensor | None,
    laws: NodeLaws,
) -> Iterator[tuple[int, float]]:
    """The tests of ``node``'s subtree, reached with ``p_alpha = weight``: each child's subtree in child order (the
    order they were drawn in), with ``node``'s residual update after each rejected one, then ``node`` itself.
    ``drafts`` None: one-hot drafts."""
    draft = normalised(drafts[node]) if drafts is not None and children[node] else None  # [vocab] Q
    for child in children[node]:
        token = tokens[child]
        q_token = float(draft[token]) if draft is not None else 1.0
        if not q_token > 0:
            continue  # a token Q gives no mass (a repeat of a rejected one) cannot have been drawn: skipped
        child_weight = min(1.0, weight * laws[node].chance(token) / q_token)
        yield from subtree_tests(child, child_weight, children, tokens, drafts, laws)
        if draft is None:
            weight = after_one_hot_rejection(laws[node], weight, token)
        else:
            laws[node], weight = after_rejection(laws[node], weight, draft)
            draft = without_token(draft, token)
    yield node, weight


def after_rejection(target: Law, weight: float, draft: torch.Tensor) -> tuple[Law, float]:
    """A node's ``P`` and ``p_alpha`` once the subtree of a child drawn from ``draft`` [vocab] is rejected:
    ``R = max(0, p P - Q)``, ``P <- R / S`` and ``p <- S / (S + 1 - p)`` with ``S = |R|``.

    ``S + 1 - p`` is the chance of that rejection; when it is 0 (``p = 1`` and ``P = Q``, only float round-off gets
    here) nothing changes; when only ``S`` is 0 nothing is left to emit here (``p`` becomes 0).
    """
    residual = (weight * target.probs() - draft).clamp_(min=0.0)  # [vocab] R
    mass = float(residual.sum())
    rejected = mass + 1.0 - weight
    if not rejected > 0:
        return target, weight
    if not mass > 0:
        return target, 0.0
    return Law(residual, mass), min(1.0, mass / rejected)  # min: float round-off only


def after_one_hot_rejection(target: Law, weight: float, token: int) -> float:
    """``after_rejection`` for a one-hot ``Q`` at ``token``, in O(1): ``R`` is ``p P`` without ``token``, so ``P``
    loses ``token`` (in place) and ``p <- p (1 - P(token)) / (1 - p P(token))``; returns the new ``p``."""
    chance = target.chance(token)
    rejected = 1.0 - weight * chance
    if not rejected > 0:
        return weight
    if not chance < 1.0:
        return 0.0
    target.mass -= float(target.weights[token])
    target.weights[token] = 0.0
    return min(1.0, weight * (1.0 - chance) / rejected)  # min: float round-off only


def without_token(draft: torch.Tensor, token: int) -> torch.Tensor:
    """The law [vocab] the next child was drawn from, after a child with ``token`` was drawn from ``draft`` [vocab]
    without replacement: ``token`` zeroed, the rest renormalised (unchanged if ``token`` held all the mass: then no
    further child can have been drawn)."""
    rest = 1.0 - float(draft[token])
    if not rest > 0:
        return draft
    law = draft.clone()
    law[token] = 0.0
    return law / rest


def normalised(row: torch.Tensor) -> torch.Tensor:
    """A ``draft_probs`` row [vocab] of a node with children as a float64 law (rows may be stored unnormalised)."""
    row = row.double()
    mass = float(row.sum())
    if not mass > 0:
        raise ValueError(
            "draft_probs has an empty row at a node with children; it must hold the law the children were drawn from"
        )
    return row / mass
