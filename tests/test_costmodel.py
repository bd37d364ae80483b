"""The cost model (specbench.costmodel): interpolation of T(k), per-step pricing, ideal and predicted speedups,
and the budget choice as a pure function of a latency curve and calibration costs."""

from __future__ import annotations

import pytest

from specbench.costmodel import (
    LatencyCurve,
    StepCosts,
    choose_budget,
    curve_from_rows,
    ideal_speedup,
    modelled_ms_per_token,
    nearest_curve,
    predicted_speedup,
    repriced,
    step_costs,
)

NUM_TOKENS = (1, 2, 4, 8, 16, 32, 64)


def curve(latency, context: int = 256) -> LatencyCurve:
    """A curve with T(n) = latency(n) for both masks."""
    ms = tuple(float(latency(n)) for n in NUM_TOKENS)
    return LatencyCurve(context, NUM_TOKENS, ms, ms)


FLAT = curve(lambda n: 10.0)
LINEAR = curve(lambda n: 10.0 * n)


def diminishing(budget: int) -> float:
    """Tokens per step that grow with the budget but ever more slowly (as acceptance per depth decays)."""
    return 1.0 + sum(0.7**depth for depth in range(1, budget + 1))


def candidates_on(latency: LatencyCurve, overhead_ms: float = 0.0) -> dict[int, StepCosts]:
    """Calibration costs of chain budgets 1..32 priced on ``latency`` (k = budget + 1 tokens per forward)."""
    return {
        budget: StepCosts(100, diminishing(budget), latency.at(budget + 1, chain=True), overhead_ms)
        for budget in (1, 2, 4, 8, 16, 32)
    }


AR_FLAT = StepCosts(100, 1.0, 10.0, 0.0)


def test_interpolation_is_linear_between_points_and_extends_the_last_segment():
    c = LatencyCurve(128, (1, 2, 4), (10.0, 12.0, 20.0), (10.0, 14.0, 30.0))
    assert c.at(3, chain=True) == pytest.approx(16.0)
    assert c.at(3) == pytest.approx(22.0)  # the tree mask's own points
    assert c.at(6, chain=True) == pytest.approx(28.0)  # slope 4/token beyond 4
    assert c.step_ms == 10.0


def test_a_curve_must_start_at_one_token_and_ascend():
    with pytest.raises(ValueError, match="from 1"):
        LatencyCurve(128, (2, 4), (1.0, 2.0), (1.0, 2.0))
    with pytest.raises(ValueError, match="one chain and one tree"):
        LatencyCurve(128, (1, 2), (1.0, 2.0), (1.0,))


def test_curves_round_trip_and_digest_by_their_numbers():
    c = curve(lambda n: 5.0 + n)
    assert LatencyCurve.from_dict(c.to_dict()) == c
    assert c.digest() == LatencyCurve.from_dict(c.to_dict()).digest() != curve(lambda n: 6.0 + n).digest()


def test_curve_from_profile_rows_and_the_nearest_context():
    rows = [
        {"context_length": c, "num_tokens": n, "mask": mask, "median_ms": c / 100 + n + (mask == "tree")}
        for c in (128, 1024)
        for n in (1, 2)
        for mask in ("chain", "tree")
    ]
    c128 = curve_from_rows(rows, 128)
    assert c128.chain_ms == pytest.approx((2.28, 3.28)) and c128.tree_ms == pytest.approx((3.28, 4.28))
    both = [c128, curve_from_rows(rows, 1024)]
    assert nearest_curve(both, 300).context_length == 128  # 300/128 < 1024/300
    assert nearest_curve(both, 400).context_length == 1024


def test_steps_are_priced_with_the_mask_their_tree_takes():
    c = LatencyCurve(128, (1, 2, 4), (10.0, 12.0, 20.0), (10.0, 14.0, 30.0))
    # a chain of 3 drafted (depth 3) takes the causal path: T_chain(4); a star of 3 (depth 1): T_tree(4)
    costs = step_costs([4, 2], [3, 3], [3, 1], [None, None], [0.001, 0.003], c)
    assert costs == StepCosts(2, 3.0, (20.0 + 30.0) / 2, pytest.approx(2.0))
    with pytest.raises(ValueError, match="no decoding steps"):
        step_costs([], [], [], [], [], c)


def test_steps_keep_their_forward_shapes_and_reprice_on_another_curve():
    here = LatencyCurve(128, (1, 2, 4), (10.0, 12.0, 20.0), (10.0, 14.0, 30.0))
    flat = LatencyCurve(128, (1, 2, 4), (5.0, 5.0, 5.0), (5.0, 5.0, 6.0))
    costs = step_costs([4, 2, 1], [3, 3, 0], [3, 1, 0], [None, None, None], [0.001, 0.003, 0.002], here)
    assert costs.forwards == {"1": 1, "4": 1, "4t": 1}
    there = repriced(costs, flat, overhead_ms=0.5)
    assert there.verify_ms == pytest.approx((5.0 + 5.0 + 6.0) / 3) and there.overhead_ms == 0.5
    assert there.tokens_per_step == costs.tokens_per_step and there.steps == costs.steps
    assert repriced(costs, here, costs.overhead_ms).verify_ms == pytest.approx(costs.verify_ms)
    with pytest.raises(ValueError, match="no forward shapes"):
        repriced(StepCosts(3, 2.0, 10.0, 0.0), flat, 0.0)


def test_steps_are_priced_at_the_rows_their_forward_held():
    """Aux rows (LADE's window) widen the forward and take the tree mask even under a chain of nodes."""
    c = LatencyCurve(128, (1, 2, 4), (10.0, 12.0, 20.0), (10.0, 14.0, 30.0))
    # a 1-node chain with 2 aux rows: 4 rows, tree mask; a 3-node chain with no aux rows: chain mask
    costs = step_costs([2, 4], [1, 3], [1, 3], [4, 4], [0.0, 0.0], c)
    assert costs.verify_ms == pytest.approx((30.0 + 20.0) / 2)


def test_ideal_and_predicted_speedups_follow_their_definitions():
    costs = StepCosts(10, 3.0, 15.0, 5.0)
    ar = StepCosts(10, 1.0, 10.0, 1.0)
    assert ideal_speedup(costs, FLAT) == pytest.approx(3.0 * 10.0 / 15.0)
    assert predicted_speedup(costs, ar) == pytest.approx(3.0 * 11.0 / 20.0)
    assert predicted_speedup(ar, ar) == pytest.approx(1.0)
    assert modelled_ms_per_token(costs) == pytest.approx(20.0 / 3.0)
    assert predicted_speedup(costs, ar) == pytest.approx(modelled_ms_per_token(ar) / modelled_ms_per_token(costs))


def test_a_flat_latency_curve_picks_the_largest_budget():
    assert choose_budget(candidates_on(FLAT), AR_FLAT) == 32


def test_the_default_stays_unless_another_budget_beats_it_by_more_than_the_margin():
    candidates = candidates_on(FLAT)  # the largest budget is best on a flat curve
    best, default = predicted_speedup(candidates[32], AR_FLAT), predicted_speedup(candidates[16], AR_FLAT)
    gain = best / default - 1
    assert gain > 0
    assert choose_budget(candidates, AR_FLAT, default=16, margin=gain * 1.01) == 16
    assert choose_budget(candidates, AR_FLAT, default=16, margin=gain * 0.99) == 32
    assert choose_budget(candidates, AR_FLAT, default=16) == 32  # no margin: the best predicted
    assert choose_budget(candidates, AR_FLAT, default=999, margin=10.0) == 32  # a default outside the grid


def test_a_linear_latency_curve_picks_a_small_budget():
    assert choose_budget(candidates_on(LINEAR), AR_FLAT) == 1


def test_a_curve_flat_up_to_a_knee_picks_a_budget_near_the_knee():
    knee = curve(lambda n: 10.0 if n <= 8 else 10.0 * n / 8)
    assert choose_budget(candidates_on(knee), AR_FLAT) == 8  # 9 tokens per forward: just past the knee


def test_drafting_overhead_moves_the_choice_and_ties_go_to_the_smaller_budget():
    costly = {budget: StepCosts(100, diminishing(budget), 10.0, 2.0 * budget) for budget in (1, 2, 4, 8, 16, 32)}
    assert choose_budget(costly, AR_FLAT) in (1, 2, 4)
    tied = {4: StepCosts(10, 2.0, 10.0, 0.0), 8: StepCosts(10, 2.0, 10.0, 0.0)}
    assert choose_budget(tied, AR_FLAT) == 4
    with pytest.raises(ValueError):
        choose_budget({}, AR_FLAT)
