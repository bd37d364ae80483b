"""Block verification (Sun et al., ICLR 2025) for chains: lossless at any temperature, and never fewer tokens per
step in expectation than token-wise speculative sampling of the same drafts.

Rule ``"block"`` (``method.acceptance: block``). A chain root -> x_1 -> .. -> x_g is drafted autoregressively: node
``i`` (0 = the root) holds the draft law ``q_i`` its child was drawn from (``tree.draft_probs`` row ``i``; a
deterministic draft is a one-hot ``q_i`` at its own token), and the verify forward gives the warped target law
``p_i`` at every node. Token-wise verification accepts x_{i+1} with ``min(1, p_i(x_{i+1}) / q_i(x_{i+1}))`` on its
own; block verification weighs the whole prefix:

- ``w_0 = 1`` and ``w_{i+1} = min(1, w_i p_i(x_{i+1}) / q_i(x_{i+1}))``: how much of the target's mass on the prefix
  x^{i+1} the draft did not already over-cover;
- the residual after node ``i < g``: ``r_i = max(0, w_i p_i - q_i)`` (unnormalised; at the root the token-wise one);
- the chance to stop at node ``i``: ``h_i = |r_i| / (|r_i| + 1 - w_i)`` for ``i < g`` (0 when both are 0: then
  ``p_i = q_i`` with nothing rejected) and ``h_g = w_g``;
- with independent uniforms ``u_0..u_g``, accept the first ``tau = max{i : u_i <= h_i}`` drafts (``h_0 = 1``
  whenever ``p_0 != q_0``), then emit a sample of ``r_tau`` (``tau < g``) or of ``p_g`` (all accepted: the bonus).

For ``g = 1`` this is token-wise speculative sampling. Exactness is the paper's theorem; ``block_plan`` is checked
against it by exact enumeration of every draft block on small vocabularies (tests/test_block_verification.py), and
the conformance suite's sampling check holds the rule, sampled, to the target's law. A tree with a branch is refused:
the weights follow one drafted prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.core.acceptance import Acceptance, Sampling, accept_match, target_probs
from specbench.core.tree import DraftTree
from specbench.errors import ConfigError


@dataclass
class BlockPlan:
    """The stop probabilities of one chain and what to emit after each stop."""

    stop: list[float]  # h_0 .. h_g: the chance to stop at each node
    emit: list[torch.Tensor]  # per node, the law [vocab] of the token emitted after stopping there (r_i or p_g)


def block_plan(targets: torch.Tensor, drafts: torch.Tensor, tokens: list[int]) -> BlockPlan:
    """Block verification's stop probabilities and emission laws for a chain: ``targets`` [g + 1, vocab] the target
    laws at its nodes, ``drafts`` [g, vocab] the draft laws its drafted tokens were drawn from, ``tokens`` the g
    drafted tokens (float64 throughout)."""
    weight, stop, emit = 1.0, [], []
    for i, token in enumerate(tokens):
        residual = (weight * targets[i] - drafts[i]).clamp_(min=0.0)  # [vocab] r_i
        mass, rejected = float(residual.sum()), 1.0 - weight
        stop.append(mass / (mass + rejected) if mass + rejected > 0 else 0.0)
        emit.append(residual / mass if mass > 0 else targets[i])
        q_token = float(drafts[i, token])
        if not q_token > 0:
            raise ValueError(f"drafted token {token} at depth {i + 1} has no mass in the draft law it was drawn from")
        weight = min(1.0, weight * float(targets[i, token]) / q_token)
    stop.append(weight)
    emit.append(targets[len(tokens)])
    return BlockPlan(stop, emit)


def chain_of(tree: DraftTree) -> list[int]:
    """The nodes of a chain tree, root first; ConfigError for a tree with a branch."""
    children = tree.children()
    wide = [node for node, kids in enumerate(children) if len(kids) > 1]
    if wide:
        raise ConfigError(
            f"method.acceptance=block verifies chains (one child per node); the drafter proposed a tree whose node "
            f"{wide[0]} has {len(children[wide[0]])} children: use acceptance=speculative for trees"
        )
    nodes = [0]
    while children[nodes[-1]]:
        nodes.append(children[nodes[-1]][0])
    return nodes


def accept_block(
    tree: DraftTree, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None
) -> Acceptance:
    """Lossless block verification of a chain (see the module docstring); greedy (T=0) is ``accept_match``'s walk."""
    if sampling.greedy:
        return accept_match(tree, logits, sampling, generator)
    nodes = chain_of(tree)
    tokens = [tree.tokens[node] for node in nodes[1:]]
    targets = target_probs(logits.cpu()[nodes], sampling).double()  # [g + 1, vocab]; the generator lives on the CPU
    drafts = draft_laws(tree, nodes[:-1], tokens, targets.shape[1])  # [g, vocab]
    plan = block_plan(targets, drafts, tokens)
    coins = torch.rand(len(nodes), generator=generator, dtype=torch.float64).tolist()  # u_0 .. u_g
    tau = max((i for i, (coin, chance) in enumerate(zip(coins, plan.stop)) if coin <= chance), default=0)
    return Acceptance(nodes[: tau + 1], int(torch.multinomial(plan.emit[tau], 1, generator=generator)))


def draft_laws(tree: DraftTree, nodes: list[int], tokens: list[int], vocab: int) -> torch.Tensor:
    """The draft laws [len(nodes), vocab] the chain's drafted ``tokens`` were drawn from at ``nodes``: their
    ``draft_probs`` rows (normalised), or one-hot at the drafted token for deterministic drafts."""
    if tree.draft_probs is not None:
        rows = tree.draft_probs.cpu()[nodes].double()  # [g, vocab]
        return rows / rows.sum(dim=-1, keepdim=True)
    laws = torch.zeros(len(nodes), vocab, dtype=torch.float64)
    laws[torch.arange(len(nodes)), torch.tensor(tokens, dtype=torch.long)] = 1.0
    return laws
