"""The per-step and per-request metrics of docs/metrics.md on hand-built records with known answers."""

from __future__ import annotations

import pytest

from specbench.metrics import acceptance_by_depth, aggregate, energy_per_token, latency_percentiles, side_branch_share


def record(**fields) -> dict:
    """A samples.jsonl record with neutral defaults for the fields a test does not set."""
    base = {
        "sample_id": "s",
        "turn": 0,
        "new_tokens": 5,
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
    assert rows[0] == {"depth": 0, "steps": 4, "exactly": 0.5, "joint": None, "conditional": None}
    assert rows[1] == pytest.approx({"depth": 1, "steps": 3, "exactly": 1 / 3, "joint": 2 / 3, "conditional": 2 / 3})
    assert rows[2] == pytest.approx({"depth": 2, "steps": 3, "exactly": 1 / 3, "joint": 1 / 3, "conditional": 1 / 2})
    assert rows[3] == pytest.approx({"depth": 3, "steps": 1, "exactly": 0.0, "joint": 0.0, "conditional": 0.0})


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
    metered = [record(energy_j=2.0, new_tokens=4), record(energy_j=None, new_tokens=100), record(energy_j=6.0)]
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
