"""Bayesian optimisation of a noisy black-box score over 0/1 vectors (Gaussian process + upper confidence bound).

Draft&Verify searches the set of skipped sub-layers this way: each point is a 0/1 vector (one bit per
sub-layer), its score a measured decoding speed. The surrogate is a Gaussian process with a squared-exponential
kernel on Hamming distance and a noise term; the next point maximises the upper confidence bound
``mean + kappa * std`` over candidates drawn at random and one move away from the best points so far. SWIFT
searches its skipped set online the same way, over vectors with a fixed number of ones (its skip ratio): there a
move swaps a one and a zero, and ``random_point`` gives its random-search proposals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

UCB_KAPPA = 2.576
"""Exploration weight of the upper confidence bound (the common default of BO libraries)."""

NOISE = 1e-2
"""Observation noise added to the kernel's diagonal, on scores scaled to zero mean and unit variance."""


@dataclass
class Observation:
    """One evaluated point and its score."""

    bits: tuple[int, ...]
    score: float


@dataclass
class BinarySearch:
    """Scores observed so far and the choice of the next point to try."""

    dims: int
    seed: int = 0
    candidates: int = 512  # random candidates scored by the acquisition per proposal
    ones: int | None = None  # every point holds exactly this many ones (None: any number)
    kappa: float = UCB_KAPPA  # exploration weight of the upper confidence bound
    observations: list[Observation] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.ones is not None and not 0 <= self.ones <= self.dims:
            raise ValueError(f"a point of {self.dims} bits cannot hold {self.ones} ones")
        self.generator = torch.Generator().manual_seed(self.seed)
        self.length_sq = max(self.dims / 4, 1.0)  # squared length scale in Hamming units: one flip keeps most of k

    def observe(self, bits: tuple[int, ...], score: float) -> None:
        """Record a point's measured score."""
        self.observations.append(Observation(tuple(bits), float(score)))

    @property
    def best(self) -> Observation:
        """The highest-scoring point so far."""
        return max(self.observations, key=lambda seen: seen.score)

    def propose(self) -> tuple[int, ...]:
        """The untried point with the highest upper confidence bound (a random one before any observation)."""
        pool = self.candidate_pool()
        if not self.observations:
            return tuple(pool[0].tolist())
        mean, std = self.posterior(pool)
        ucb = mean + self.kappa * std  # [candidates]
        return tuple(pool[int(ucb.argmax())].tolist())

    def random_point(self) -> tuple[int, ...]:
        """One point drawn at random (with ``ones`` ones when the count is fixed)."""
        return tuple(self.random_points(1)[0].tolist())

    def random_points(self, n: int) -> torch.Tensor:
        """``n`` random 0/1 vectors [n, dims]: uniform bits, or ``ones`` ones at uniformly random places."""
        if self.ones is None:
            return torch.randint(0, 2, (n, self.dims), generator=self.generator)
        ranks = torch.rand(n, self.dims, generator=self.generator).argsort(-1).argsort(-1)  # [n, dims] permutations
        return (ranks < self.ones).long()

    def neighbours(self, bits: tuple[int, ...]) -> torch.Tensor:
        """The points one move from ``bits`` [n, dims]: one bit flipped, or a one and a zero swapped (fixed count)."""
        base = torch.tensor(bits)  # [dims]
        if self.ones is None:
            flips = base.repeat(self.dims, 1)  # [dims, dims]
            flips[torch.arange(self.dims), torch.arange(self.dims)] ^= 1
            return flips
        pairs = torch.cartesian_prod(base.nonzero()[:, 0], (base == 0).nonzero()[:, 0]).reshape(-1, 2)  # [n, 2]
        swaps = base.repeat(len(pairs), 1)  # [n, dims]
        rows = torch.arange(len(pairs))
        swaps[rows, pairs[:, 0]], swaps[rows, pairs[:, 1]] = 0, 1
        return swaps

    def candidate_pool(self) -> torch.Tensor:
        """Untried candidates [n, dims]: random vectors plus every neighbour of the three best points."""
        rows = [self.random_points(self.candidates)]
        rows += [self.neighbours(seen.bits) for seen in sorted(self.observations, key=lambda s: -s.score)[:3]]
        pool = torch.unique(torch.cat(rows), dim=0)  # [n, dims]
        tried = {seen.bits for seen in self.observations}
        untried = [i for i, row in enumerate(pool.tolist()) if tuple(row) not in tried]
        return pool[untried] if untried else pool

    def posterior(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GP mean and standard deviation [n] at ``points`` [n, dims], from the standardised observations."""
        seen = torch.tensor([s.bits for s in self.observations], dtype=torch.float64)  # [m, dims]
        scores = torch.tensor([s.score for s in self.observations], dtype=torch.float64)  # [m]
        spread = scores.std() if len(scores) > 1 and scores.std() > 0 else torch.tensor(1.0, dtype=torch.float64)
        y = (scores - scores.mean()) / spread  # [m]
        gram = self.kernel(seen, seen) + NOISE * torch.eye(len(seen), dtype=torch.float64)  # [m, m]
        factor = torch.linalg.cholesky(gram)
        cross = self.kernel(points.double(), seen)  # [n, m]
        alpha = torch.cholesky_solve(y[:, None], factor)[:, 0]  # [m]
        mean = cross @ alpha  # [n]
        solved = torch.cholesky_solve(cross.T, factor)  # [m, n]
        variance = (1.0 - (cross.T * solved).sum(0)).clamp_min(1e-12)  # [n]
        return mean, variance.sqrt()

    def kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """exp(-hamming(a_i, b_j) / (2 l^2)) for 0/1 rows a [n, dims], b [m, dims] -> [n, m]."""
        hamming = torch.cdist(a, b, p=1)
        return torch.exp(-hamming / (2 * self.length_sq))


def maximise(
    score: Callable[[tuple[int, ...]], float],
    search: BinarySearch,
    iterations: int,
    keep_going: Callable[[], bool] = lambda: True,
    starts: list[tuple[int, ...]] | None = None,
) -> Observation:
    """Evaluate ``starts``, then ``iterations`` proposals (fewer once ``keep_going`` says stop); the best seen."""
    for bits in starts or []:
        if not keep_going():
            break
        search.observe(bits, score(bits))
    for _ in range(iterations):
        if not keep_going():
            break
        bits = search.propose()
        search.observe(bits, score(bits))
    if not search.observations:
        raise ValueError("the search evaluated no point (no iterations, or no time)")
    return search.best
