"""Acceptance rules: pure functions from (tree, target logits) to the accepted path and the next token.

Every rule returns an ``Acceptance``: the accepted node path (root first) and the token the target
emits after it (its correction or bonus). Emitted tokens this step = drafted nodes on the path + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.core.tree import DraftTree


def sampling_problems(temperature: float, top_p: float, prefix: str = "") -> list[str]:
    """What is wrong with a config's sampling settings (``prefix`` names their config node), if anything."""
    problems = []
    if temperature < 0:
        problems.append(f"{prefix}temperature must be >= 0 (got {temperature})")
    if not 0 < top_p <= 1:
        problems.append(f"{prefix}top_p must be in (0, 1] (got {top_p})")
    return problems


@dataclass(frozen=True)
class Sampling:
    """Target sampling settings; temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Acceptance:
    """Result of verifying one tree."""

    path: list[int]  # accepted node indices, root (0) first
    next_token: int  # correction or bonus token, emitted after the path

    def emitted(self, tree: DraftTree) -> list[int]:
        """Tokens committed this step: the accepted drafted tokens, then ``next_token``."""
        return [tree.tokens[i] for i in self.path[1:]] + [self.next_token]


def target_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Warp logits [..., vocab] into the sampling distribution (temperature, then nucleus top-p)."""
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., vocab]
    sorted_probs = sorted_probs.masked_fill(mass_before >= sampling.top_p, 0.0)
    warped = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return warped / warped.sum(dim=-1, keepdim=True)


def draw(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """One token from a logits row [vocab]: argmax when greedy, else a sample of the warped target."""
    if sampling.greedy:
        return int(logits.argmax())
    probs = target_probs(logits.cpu(), sampling)  # [vocab]; the run's generator lives on the CPU
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_match(
    tree: DraftTree, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None
) -> Acceptance:
    """Walk from the root, at each node pick the target's token and follow the child that holds it.

    Greedy (T=0): the pick is the argmax, giving the deepest path that matches the target's greedy
    choices (lossless). Sampling (T>0): the pick is a fresh target sample (sample-and-match), exact
    for any deterministic draft because every emitted token is a target sample.
    """
    if sampling.greedy:
        picks = logits.argmax(dim=-1).tolist()  # [num_nodes]; one device sync for the whole tree

        def pick(node: int) -> int:
            return picks[node]

    else:
        rows = logits.cpu()  # [num_nodes, vocab]

        def pick(node: int) -> int:
            return draw(rows[node], sampling, generator)

    children = tree.children()
    node, path = 0, [0]
    while True:
        token = pick(node)
        match = next((c for c in children[node] if tree.tokens[c] == token), None)
        if match is None:
            return Acceptance(path, token)
        node = match
        path.append(node)
