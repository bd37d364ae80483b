"""Speculative sampling for chains and trees (lossless at any temperature).

Rule ``"speculative"`` (``method.acceptance: speculative``). Contract with drafters:

- ``tree.draft_probs`` [num_nodes, vocab] float: row ``u`` is the draft distribution ``q(.|path to u)``
  from which the children of ``u`` were drawn WITHOUT replacement, in child order (child 1 ~ q,
  child 2 ~ q without child 1 renormalised, ...). Warp ``q`` with the run's temperature/top-p to get
  high acceptance; exactness only needs the children to really be draws from the stored rows. How
  many children a node gets may depend on the path and on the children drawn before, never on later
  draws (so "draw k, then drop some" breaks the contract). Rows of leaves are not read.
- ``tree.draft_probs is None``: deterministic drafts (n-gram, trie, Jacobi): each child is a one-hot
  ``q`` at its own token.

At a node ``u`` with target ``r_0 = p(.|u)`` (``target_probs`` of its logits row) and children
``c_1..c_k`` drawn from ``q_0, q_1, ...`` (``q_j`` = ``q_{j-1}`` with ``c_j`` zeroed, renormalised):
try ``c_j`` in order and accept it with ``min(1, r_{j-1}(c_j) / q_{j-1}(c_j))``; on reject set
``r_j = norm(max(0, r_{j-1} - q_{j-1}))``; if all are rejected emit a sample of ``r_k``; on accept
continue at ``c_j`` with ``p(.|c_j)`` and its own draft row. A chain (one child per node) is classic
speculative sampling (Leviathan/Chen); a leaf emits the bonus from ``p``. With one-hot drafts
``min(1, r/q) = r(c_j)`` and ``max(0, r - q)`` is ``r`` with ``c_j`` zeroed: LADE/Self-Draft/SpecInfer
multi-candidate rejection (docs/acceptance.md#multi-candidate-rejection).

Why it is exact (by induction from the last child): claim: once ``c_1..c_{j-1}`` are rejected, the
token emitted at ``u`` is distributed as ``r_{j-1}`` whatever ``c_1..c_{j-1}`` were. It holds after the
last child (a direct sample of ``r_k``). Step ``j``: ``c_j ~ q_{j-1}`` given the history, so it is
emitted by acceptance with probability ``min(q_{j-1}(x), r_{j-1}(x))`` at ``x``; rejection has
probability ``Z = sum max(0, r_{j-1} - q_{j-1})`` and (induction) then emits ``r_j`` for every value
of ``c_j``; the total is ``min(q, r)(x) + max(0, r - q)(x) = r_{j-1}(x)``. The argument needs ``q_j`` to be
exactly the law ``c_{j+1}`` was drawn from given ``c_1..c_j``, which for draws without replacement
is the zeroed, renormalised ``q`` above (SpecInfer's with-replacement variant keeps ``q`` unchanged
instead; using it here would be biased, see tests/test_speculative.py). A rejected ``c_j`` had
``r(c_j) < q(c_j)``, so ``r_j(c_j) = 0`` and it is never emitted afterwards. The accepted child's
subtree was drafted given its path only, so the same holds one level down: every emitted token is a
sample of ``p`` given the emitted prefix.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specbench.core.acceptance import Acceptance, Sampling, accept_match, target_probs
from specbench.core.tree import DraftTree


def accept_speculative(
    tree: DraftTree, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None
) -> Acceptance:
    """Lossless multi-candidate speculative sampling over ``tree`` (see the module docstring).

    Greedy (T=0) is ``accept_match``'s argmax walk.
    """
    if sampling.greedy:
        return accept_match(tree, logits, sampling, generator)
    return speculative_walk(tree, logits, lambda row: target_probs(row, sampling), generator)


def speculative_walk(
    tree: DraftTree,
    logits: torch.Tensor,
    warp: Callable[[torch.Tensor], torch.Tensor],
    generator: torch.Generator | None,
) -> Acceptance:
    """Recursive rejection from the root down; ``warp`` maps a logits row [vocab] to the target law.

    Exact for the law ``warp`` defines (the target's for ``accept_speculative``).
    NOTE: only the rows of visited nodes are warped (softmax over a 49k vocabulary is ~0.4 ms on CPU).
    """
    rows = logits.cpu()  # [num_nodes, vocab]; the run's generator lives on the CPU
    drafts = tree.draft_probs.cpu() if tree.draft_probs is not None else None  # [num_nodes, vocab]
    coins = torch.rand(len(tree), generator=generator, dtype=torch.float64).tolist()  # one per child node
    children = tree.children()
    node, path = 0, [0]
    while True:
        target = warp(rows[node]).double()  # [vocab]
        draft = drafts[node].double() if drafts is not None else None  # [vocab]
        child, residual = verify_children(target, draft, children[node], tree.tokens, coins)
        if child is None:
            return Acceptance(path, int(torch.multinomial(residual, 1, generator=generator)))
        node = child
        path.append(node)


def verify_children(
    target: torch.Tensor, draft: torch.Tensor | None, kids: list[int], tokens: list[int], coins: list[float]
) -> tuple[int | None, torch.Tensor]:
    """Recursive rejection at one node: (accepted child, _) or (None, residual weights [vocab] to sample).

    ``draft`` None means one-hot drafts; then a rejection only zeroes one weight (O(1), so wide n-gram
    roots stay cheap). A child ``q`` gives no mass (a repeat of a tried token) is skipped: removing a
    zero-mass token changes no later law, so skipping is exact.
    """
    residual, mass = target.clone(), float(target.sum())  # [vocab] weights of r, and their total
    if draft is not None:
        draft, draft_mass = draft.clone(), float(draft.sum())  # [vocab] weights of q, and their total
        if kids and not draft_mass > 0:
            raise ValueError(
                "draft_probs has an empty row at a node with children; "
                "it must hold the law the children were drawn from"
            )
    for child in kids:
        token = tokens[child]
        q_token = 1.0 if draft is None else float(draft[token]) / draft_mass
        if q_token <= 0.0:
            continue
        if coins[child] * q_token < float(residual[token]) / mass:  # accept w.p. min(1, r/q)
            return child, residual
        if draft is None:
            mass = drop_token(residual, mass, token)  # max(0, r - onehot) = r without the token
        else:
            residual, mass = positive_part(residual / mass, draft / draft_mass), 1.0
            draft_mass = drop_token(draft, draft_mass, token)
    return None, residual


def drop_token(weights: torch.Tensor, mass: float, token: int) -> float:
    """Zero ``token`` in ``weights`` [vocab] in place and return the new total.

    If ``token`` held all the mass, nothing changes: for a target residual only float round-off gets
    here (such a token is accepted with probability 1); for a draft, no later child can have been
    drawn from the empty rest (a repeat is then skipped or rejected).
    """
    rest = mass - float(weights[token])
    if rest <= 0.0:
        return mass
    weights[token] = 0.0
    return rest


def positive_part(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """The residual ``norm(max(0, target - draft))`` [vocab] after a rejection.

    Mathematically a rejection implies positive mass; if rounding leaves none (target == draft up to
    float error), the target itself is returned.
    """
    rest = (target - draft).clamp_(min=0.0)
    mass = rest.sum()
    return rest / mass if mass > 0 else target
