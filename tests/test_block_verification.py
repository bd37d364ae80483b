"""Block verification (``specbench.core.block``): exact by enumeration, token-wise for one draft, never fewer accepted
tokens in expectation than token-wise speculative sampling, chains only, and the sampled rule through the
conformance suite's law check (with a negative control)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch

from specbench import conformance
from specbench.core.acceptance import Sampling
from specbench.core.block import BlockPlan, accept_block, block_plan
from specbench.core.tree import DraftTree
from specbench.errors import ConfigError

VOCAB, BLOCK = 3, 3

Law = Callable[[tuple[int, ...]], torch.Tensor]


def random_law(seed: int) -> Law:
    """A context-dependent law over VOCAB tokens: a fixed random distribution per prefix (float64)."""
    generator, table = torch.Generator().manual_seed(seed), {}

    def law(prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in table:
            table[prefix] = torch.rand(VOCAB, generator=generator, dtype=torch.float64) ** 3 + 1e-3
            table[prefix] /= table[prefix].sum()
        return table[prefix]

    return law


def plan_of(target: Law, draft: Law, prefix: tuple[int, ...], block: tuple[int, ...]) -> BlockPlan:
    """``block_plan`` of one drafted block after ``prefix``."""
    targets = torch.stack([target(prefix + block[:i]) for i in range(len(block) + 1)])
    drafts = torch.stack([draft(prefix + block[:i]) for i in range(len(block))])
    return block_plan(targets, drafts, list(block))


def stop_chances(plan: BlockPlan) -> list[float]:
    """P(tau = i) for each node i: ``u_i <= h_i`` and no later ``u_j <= h_j``."""
    return [h * math.prod(1 - g for g in plan.stop[i + 1 :]) for i, h in enumerate(plan.stop)]


def step_law(target: Law, draft: Law, prefix: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    """The exact law of what one step emits after ``prefix`` (accepted drafts + the emitted token), over every block
    the draft can draw and every stop."""
    law: dict[tuple[int, ...], float] = {}
    for block in itertools.product(range(VOCAB), repeat=BLOCK):
        chance = float(torch.prod(torch.stack([draft(prefix + block[:i])[x] for i, x in enumerate(block)])))
        plan = plan_of(target, draft, prefix, block)
        for tau, stop in enumerate(stop_chances(plan)):
            for token in range(VOCAB):
                emitted = block[:tau] + (token,)
                law[emitted] = law.get(emitted, 0.0) + chance * stop * float(plan.emit[tau][token])
    return law


def decoded_law(target: Law, draft: Law, length: int) -> dict[tuple[int, ...], float]:
    """The exact law of the first ``length`` tokens of decoding with block verification, step after step."""
    law: dict[tuple[int, ...], float] = {}

    def extend(prefix: tuple[int, ...], chance: float) -> None:
        if len(prefix) >= length:
            law[prefix[:length]] = law.get(prefix[:length], 0.0) + chance
            return
        for emitted, p in step_law(target, draft, prefix).items():
            extend(prefix + emitted, chance * p)

    extend((), 1.0)
    return law


@pytest.mark.parametrize("seed", range(3))
def test_decoding_with_block_verification_has_the_targets_law(seed):
    """Lossless, computed exactly: the first four tokens of the decode follow the target's law."""
    target, draft = random_law(seed), random_law(100 + seed)
    law = decoded_law(target, draft, 4)
    for sequence, chance in law.items():
        expected = float(torch.prod(torch.stack([target(sequence[:i])[x] for i, x in enumerate(sequence)])))
        assert chance == pytest.approx(expected, abs=1e-12)
    assert sum(law.values()) == pytest.approx(1.0)


def expected_accepted(target: Law, draft: Law, accepted: Callable[[BlockPlan, tuple[int, ...]], float]) -> float:
    """Expected drafted tokens accepted in one step from the empty prefix, given a block's expected count."""
    total = 0.0
    for block in itertools.product(range(VOCAB), repeat=BLOCK):
        chance = float(torch.prod(torch.stack([draft(block[:i])[x] for i, x in enumerate(block)])))
        total += chance * accepted(plan_of(target, draft, (), block), block)
    return total


@pytest.mark.parametrize("seed", range(3))
def test_block_verification_accepts_at_least_what_token_wise_verification_accepts(seed):
    target, draft = random_law(seed), random_law(100 + seed)

    def block_count(plan: BlockPlan, block: tuple[int, ...]) -> float:
        stops = [
            h * float(torch.prod(torch.tensor([1 - g for g in plan.stop[i + 1 :]]))) for i, h in enumerate(plan.stop)
        ]
        return sum(i * p for i, p in enumerate(stops))

    def token_count(plan: BlockPlan, block: tuple[int, ...]) -> float:
        count, kept = 0.0, 1.0
        for i, x in enumerate(block):
            kept *= min(1.0, float(target(block[:i])[x] / draft(block[:i])[x]))
            count += kept
        return count

    assert expected_accepted(target, draft, block_count) >= expected_accepted(target, draft, token_count) - 1e-12


def test_one_draft_is_token_wise_speculative_sampling():
    target, draft = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]).double(), torch.tensor([[0.2, 0.6, 0.2]]).double()
    plan = block_plan(target, draft, [1])
    assert plan.stop == pytest.approx([1.0, 0.5])  # stop at the root always; accept w.p. min(1, 0.3 / 0.6)
    assert plan.emit[0].tolist() == pytest.approx([1.0, 0.0, 0.0])  # norm(max(p - q, 0)) = norm([0.3, 0, 0])
    assert torch.equal(plan.emit[1], target[1])  # the bonus: the target's law after the draft


def test_a_deterministic_chain_and_greedy_decoding():
    """Drafts without draft_probs are one-hot; at T = 0 the rule is the greedy walk."""
    tree = DraftTree.chain(5, [1, 2])
    logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0]])
    greedy = accept_block(tree, logits, Sampling())
    assert greedy.path == [0, 1, 2] and greedy.next_token == 0
    sampled = accept_block(tree, logits, Sampling(0.5), torch.Generator().manual_seed(0))
    assert sampled.path[0] == 0 and len(sampled.path) <= 3


def test_a_tree_with_a_branch_is_refused_at_t_above_zero():
    tree = DraftTree.from_paths(5, [[1], [2]])
    with pytest.raises(ConfigError, match="acceptance=block verifies chains"):
        accept_block(tree, torch.zeros(3, 3), Sampling(0.7), torch.Generator())


def test_spede_with_block_verification_samples_the_targets_law():
    """The rule as the loop runs it: SpeDe's sampled drafts, 600 draws, the conformance suite's sampling check."""
    result = conformance.run_check("spede_block", "sampling")
    assert result.passed, result.detail


BLOCK_PLD = ("method.acceptance=block",)
"""PLD's deterministic chains verified as blocks: drafts the sampling check's drafted-token statistic reads."""


def test_block_verification_of_deterministic_chains_samples_the_targets_law(monkeypatch):
    monkeypatch.setitem(conformance.STAND_IN_OVERRIDES, "pld", BLOCK_PLD)
    result = conformance.run_check("pld", "sampling")
    assert result.passed, result.detail


def test_block_verification_that_emits_the_target_after_a_stop_fails_the_law_check(monkeypatch):
    """Negative control: emitting a fresh target sample where the residual belongs over-weights drafted tokens."""
    from specbench.core import block

    def biased(targets, drafts, tokens):
        plan = block_plan(targets, drafts, tokens)
        return BlockPlan(plan.stop, [targets[i] for i in range(len(plan.emit))])

    monkeypatch.setattr(block, "block_plan", biased)
    monkeypatch.setitem(conformance.STAND_IN_OVERRIDES, "pld", BLOCK_PLD)
    result = conformance.run_check("pld", "sampling")
    assert result.passed is False and "differs from the target" in result.detail, result.detail
