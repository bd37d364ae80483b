"""The per-step and per-request metrics of docs/metrics.md on hand-built records with known answers."""

from __future__ import annotations

import pytest

from specbench.metrics import (
    acceptance_by_depth,
    aggregate,
    check_acceptance,
    drafting_metrics,
    energy_per_token,
    latency_percentiles,
    marginal_rates,
    side_branch_share,
)
from specbench.schema import acceptance_problems


def record(**fields) -> dict:
    """A samples.jsonl record with neutral defaults for the fields a test does not set."""
    base = {
        "sample_id": "s",
        "turn": 0,
        "new_tokens": 8,  # the prefill's token and the steps' 1 + 2 + 3 + 1
        "wall_s": 1.0,
        "prefill_s": 0.2,
        "target_forwards": 4,
        "accept_lengths": [1, 2, 3, 1],
        "draft_tokens": [2, 4, 3, 0],
        "draft_depth": [2, 2, 3, 0],
        "side_branch": [False, True, False, False],
        "step_s": [0.1, 0.2, 0.3, 0.2],
        "energy_j": None,
    }
    return {**base, **fields}


def test_acceptance_by_depth_counts_reached_steps_joint_and_conditional_rates():
    # steps as (accepted drafted tokens, depth): (0, 2), (1, 2), (2, 3), (0, 0)
    rows = {row["depth"]: row for row in acceptance_by_depth([record()])}
    assert sorted(rows) == [0, 1, 2, 3]
    first = {"depth": 0, "steps": 4, "exactly": 0.5, "joint": None, "conditional": None, "marginal": None}
    assert rows[0] == {**first, "share": 0.5}
    assert rows[1] == pytest.approx(
        {"depth": 1, "steps": 3, "exactly": 1 / 3, "joint": 2 / 3, "conditional": 2 / 3, "marginal": 0.5, "share": 0.25}
    )
    assert rows[2] == pytest.approx(
        {
            "depth": 2,
            "steps": 3,
            "exactly": 1 / 3,
            "joint": 1 / 3,
            "conditional": 1 / 2,
            "marginal": 0.25,
            "share": 0.25,
        }
    )
    assert rows[3] == pytest.approx(
        {"depth": 3, "steps": 1, "exactly": 0.0, "joint": 0.0, "conditional": 0.0, "marginal": 0.0, "share": 0.0}
    )


def test_joint_is_the_product_of_conditionals_for_fixed_depth_chains():
    """A chain of depth 3 every step: joint(d) = prod of conditional(1..d), vLLM's per-position rate."""
    lengths = [1, 2, 4, 3, 2, 4, 1, 4]
    chain = record(
        new_tokens=1 + sum(lengths),
        target_forwards=len(lengths),
        accept_lengths=lengths,
        draft_tokens=[3] * 8,
        draft_depth=[3] * 8,
        side_branch=[False] * 8,
        step_s=[0.1] * 8,
    )
    rows = acceptance_by_depth([chain])
    product = 1.0
    for row in rows[1:]:
        product *= row["conditional"]
        assert row["joint"] == pytest.approx(product)
    assert [row["joint"] for row in rows[1:]] == pytest.approx([6 / 8, 4 / 8, 3 / 8])  # accepted 0,1,3,2,1,3,0,3
    assert sum(row["exactly"] for row in rows) == pytest.approx(1.0)  # the tokens-per-step histogram


def test_untraced_records_count_every_drafting_step_at_every_depth():
    old = record(draft_depth=None, side_branch=None)  # a specbench.samples/3 record
    rows = acceptance_by_depth([old])
    assert [row["steps"] for row in rows] == [4, 3, 3]  # deepest depth seen: 2 accepted
    assert side_branch_share([old]) is None


def test_runs_without_drafts_have_no_acceptance_profile():
    ar = record(accept_lengths=[1, 1], draft_tokens=[0, 0], draft_depth=[0, 0], side_branch=[False, False])
    assert acceptance_by_depth([ar]) == []
    hf = record(accept_lengths=None, draft_tokens=None, draft_depth=None, side_branch=None, step_s=None)
    assert acceptance_by_depth([hf]) == []


def test_side_branch_share_counts_branching_steps_that_accepted_a_draft():
    # step 2 branched (4 nodes, depth 2), accepted 1 token on a side branch; step 3 is a chain (3 nodes, depth 3)
    assert side_branch_share([record()]) == 1.0
    first_branch = record(side_branch=[False] * 4)
    assert side_branch_share([record(), first_branch]) == 0.5
    chains = record(draft_tokens=[2, 2, 3, 0])
    assert side_branch_share([chains]) is None


def test_latency_percentiles_of_ttft_tpot_and_steps():
    records = [record(prefill_s=p, wall_s=p + 4 * t, new_tokens=5) for p, t in [(0.1, 0.1), (0.2, 0.2), (0.3, 0.3)]]
    latency = latency_percentiles(records)
    assert latency["ttft_p50_s"] == pytest.approx(0.2)
    assert latency["ttft_p90_s"] == pytest.approx(0.28)  # linear between the order statistics 0.2 and 0.3
    assert latency["tpot_s"] == pytest.approx((0.4 + 0.8 + 1.2) / 12)
    assert latency["tpot_p50_s"] == pytest.approx(0.2)
    assert latency["step_p50_s"] == pytest.approx(0.2)  # steps 0.1, 0.2, 0.3, 0.2 three times
    single = latency_percentiles([record(new_tokens=1, step_s=[])])
    assert single["tpot_s"] is None and single["tpot_p99_s"] is None and single["step_p50_s"] is None


def test_energy_per_token_uses_only_metered_records():
    assert energy_per_token([record()]) == {"energy_j": None, "joules_per_token": None}
    metered = [record(energy_j=2.0, new_tokens=4), record(energy_j=None, new_tokens=100)]
    metered.append(record(energy_j=6.0, new_tokens=5))
    assert energy_per_token(metered) == {"energy_j": 8.0, "joules_per_token": pytest.approx(8.0 / 9)}


def test_aggregate_carries_the_new_columns():
    columns = aggregate([record()])
    for name in ("side_branch_share", "ttft_p99_s", "tpot_s", "step_p90_s", "joules_per_token"):
        assert name in columns


def test_bandwidth_share_prices_each_step_at_the_weights_plus_its_context():
    """A step at context c reads W + K c bytes: with W = 100, K = 10, peak 1000 B/s, two records of known steps."""
    from specbench.metrics import TRAFFIC_METRICS, traffic_metrics

    traffic = {"weight_bytes": 100, "kv_bytes_per_token": 10, "peak_bytes_per_s": 1000.0}
    first = record(prompt_tokens=4, accept_lengths=[1, 2, 3, 1], step_s=[0.1, 0.2, 0.3, 0.2])  # contexts 4, 5, 7, 10
    second = record(prompt_tokens=2, accept_lengths=[1], step_s=[0.2])  # context 2
    total = 5 * 100 + 10 * (4 + 5 + 7 + 10 + 2)  # 780 bytes over 1.0 s of steps, 8 tokens emitted
    assert traffic_metrics([first, second], traffic) == pytest.approx(
        {
            "step_bytes": total / 5,
            "achieved_bandwidth": total,
            "bandwidth_share": total / 1000,
            "floor_ms_per_token": 1e3 * total / 1000 / 8,
        }
    )
    untimed = record(prompt_tokens=4, step_s=None)  # HF generate: no steps
    assert traffic_metrics([untimed], traffic) == traffic_metrics([first], None) == dict.fromkeys(TRAFFIC_METRICS)


def test_tokens_per_step_is_one_plus_the_sum_of_the_marginal_rates():
    """Steps accepting 0, 1, 2, 0 drafted tokens: P(accepted >= 1) = 1/2, P(>= 2) = 1/4, and 1 + 3/4 = 7 tokens over 4
    steps."""
    assert marginal_rates([record()]).tolist() == pytest.approx([0.5, 0.25])
    assert aggregate([record()])["tokens_per_step"] == pytest.approx(1 + 0.5 + 0.25)
    check_acceptance([record(), record(accept_lengths=[1, 1, 1, 1], new_tokens=5)])  # consistent: no error


def test_records_that_break_the_acceptance_identity_are_refused():
    """accept_lengths that emit more than the record did (one token too many), or count other steps than its
    forwards: the aggregate refuses the set, and the reader's record check names the fault."""
    broken = record(accept_lengths=[1, 3, 3, 1])  # 8 tokens after the prefill, the record has 7
    with pytest.raises(ValueError, match="not 1 \\+ the sum of the marginal acceptance rates"):
        aggregate([record(), broken])
    assert acceptance_problems(broken) == ["accept lengths emit 8 tokens, the record 8 - 1"]
    assert "3 accept lengths for 4 target forwards" in acceptance_problems(record(accept_lengths=[1, 3, 3]))
    greedy = record(accept_lengths=[4, 1, 1, 1], new_tokens=8)  # 3 drafted tokens accepted of 2 drafted
    assert "a step accepted more drafted tokens than its draft_tokens" in acceptance_problems(greedy)
    assert acceptance_problems(record()) == [] and acceptance_problems(record(accept_lengths=None)) == []


def test_drafting_metrics_per_drafting_step_per_request_and_against_perfect_drafting():
    """Two requests: the fixture (steps 1, 2, 3, 1; drafted 2, 4, 3, 0 nodes of depth 2, 2, 3, 0) and a chain request
    (steps 3, 1; 2 drafted each, depth 2)."""
    chain = record(
        new_tokens=5,
        target_forwards=2,
        accept_lengths=[3, 1],
        draft_tokens=[2, 2],
        draft_depth=[2, 2],
        side_branch=None,
    )
    metrics = drafting_metrics([record(), chain])
    assert metrics["acceptance_length"] == pytest.approx((1 + 2 + 3 + 3 + 1) / 5)  # the 5 steps that drafted
    assert metrics["acceptance_length_per_request"] == pytest.approx((7 / 4 + 4 / 2) / 2)
    assert metrics["drafting_share"] == pytest.approx(5 / 6)
    assert metrics["oracle_tokens_per_step"] == pytest.approx((3 + 3 + 4 + 1 + 3 + 3) / 6)
    assert metrics["oracle_share"] == pytest.approx((11 / 6) / (17 / 6))
    # the deepest draft is 3: at best 4 tokens a step, so 7 tokens take 2 steps and 4 tokens 1 step
    assert metrics["draft_length_bound"] == pytest.approx((7 + 4) / (2 + 1))
    ar = record(accept_lengths=[1] * 4, new_tokens=5, draft_tokens=[0] * 4, draft_depth=[0] * 4)
    assert metrics["acceptance_length_request_p50"] == pytest.approx((7 / 4 + 4 / 2) / 2)  # two requests: the middle
    assert metrics["acceptance_length_request_p10"] == pytest.approx(7 / 4 + 0.1 * (2 - 7 / 4))
    assert drafting_metrics([ar]) == {
        "acceptance_length": None,
        "acceptance_length_per_request": 1.0,
        "acceptance_length_request_p10": 1.0,
        "acceptance_length_request_p50": 1.0,
        "acceptance_length_request_p90": 1.0,
        "drafting_share": 0.0,
        "oracle_tokens_per_step": 1.0,
        "oracle_share": 1.0,
        "draft_length_bound": 1.0,
    }
    untraced = drafting_metrics([record(draft_depth=None)])  # depth unknown: the drafted nodes stand in (chains)
    assert untraced["oracle_tokens_per_step"] == pytest.approx((3 + 5 + 4 + 1) / 4)
    assert set(drafting_metrics([record(accept_lengths=None, draft_tokens=None)]).values()) == {None}


def test_accepted_per_draft_forward_counts_a_draft_models_and_a_heads_forwards():
    """The fixture accepts 0 + 1 + 2 + 0 = 3 drafted tokens; with 6 draft forwards that is 0.5 a forward (SpeDe: one
    forward per drafted token), with 3 head forwards 1.0; a record whose drafter counts no forwards (or no drafter
    stats at all) leaves the run's value empty rather than counting it as zero forwards."""
    spede = record(drafter_stats={"draft_forwards": 6, "drafted": 9})
    eagle = record(drafter_stats={"head_forwards": 3})
    assert aggregate([spede])["accepted_per_draft_forward"] == pytest.approx(0.5)
    assert aggregate([spede, eagle])["accepted_per_draft_forward"] == pytest.approx(6 / 9)
    assert aggregate([spede, record(drafter_stats={"pool": 4})])["accepted_per_draft_forward"] is None
    assert aggregate([record()])["accepted_per_draft_forward"] is None
    assert aggregate([record(drafter_stats={"draft_forwards": 0})])["accepted_per_draft_forward"] is None
