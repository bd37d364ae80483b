"""specbench.parity: official-vs-specbench tables, verdicts, trace cuts, official draws (no model, no side env)."""

import random

import pytest

from specbench.parity import lade as parity
from specbench.parity import stepwise
from specbench.parity.common import OfficialSource, SideEnv


def test_setting_and_variant_parse():
    setting = parity.Setting.parse("7,5,7")
    assert (setting.window, setting.ngram, setting.guess) == (7, 5, 7)
    assert setting.overrides()[0] == "method.drafter.window_size=7"
    with pytest.raises(SystemExit):
        parity.Setting.parse("7,5")
    variant = parity.Variant.parse("old=method.drafter.official_step_cap=false;method.drafter.prefill_window=false")
    assert variant.label == "old" and len(variant.overrides) == 2 and not variant.official_start
    assert parity.Variant.parse("specbench=").overrides == []


def test_official_draws_are_python_random_after_random_seed():
    prompt = [11, 22, 33, 44, 55]
    random.seed(3)  # what the patched official generate does for seed 3
    expected = [random.choice(prompt) for _ in range(9)]
    assert parity.official_draws(prompt, 9, 3) == expected


def test_verdict_uses_the_larger_of_two_percent_and_the_seed_noise():
    diff, noise, ok = parity.verdict([100, 100, 100], [101, 101, 101])
    assert diff == pytest.approx(0.01) and noise == 0 and ok
    diff, noise, ok = parity.verdict([100, 100, 100], [105, 105, 105])
    assert not ok
    diff, noise, ok = parity.verdict([90, 100, 110], [95, 105, 115])  # +5 %, but the seeds spread 20 %
    assert diff == pytest.approx(0.05) and noise > 0.05 and ok


def record(sid, seed, steps, out):
    return {"id": sid, "seed": seed, "steps": steps, "accept_lengths": [], "output_ids": out}


def test_table_lists_every_prompt_and_flags_outputs_unequal_to_ar(tmp_path):
    ar = {"p0": [1, 2, 3], "p1": [4, 5]}
    official = [
        {"id": "p0", "seed": None, "ar_output_ids": [1, 2, 3]},
        {"id": "p1", "seed": None, "ar_output_ids": [4, 5]},
        record("p0", 0, 10, [1, 2, 3]),
        record("p0", 1, 12, [1, 2, 3]),
        record("p1", 0, 5, [4, 5]),
        record("p1", 1, 6, [4, 5]),
    ]
    ours = [
        record("p0", 0, 11, [1, 2, 3]),
        record("p0", 1, 11, [1, 2, 3]),
        record("p1", 0, 5, [4, 5]),
        record("p1", 1, 7, [4, 9]),
    ]  # one output differs from AR
    payload = {
        "command": "python -m specbench.parity lade --seeds 0 1",
        "finished_at": "now",
        "wall_min": 1.0,
        "max_new_tokens": 3,
        "model_dir": "/m",
        "seeds": {"official": [0, 1], "ours": [0, 1]},
        "variants": [{"label": "specbench", "overrides": []}],
        "patches": ["a patch"],
        "environment": {
            "cpu": "cpu",
            "official": {"lade": "0.0.2", "transformers": "4.34.0", "torch": "t", "python": "3"},
            "specbench": {"git_commit": "abc", "git_dirty": False, "transformers": "5", "torch": "t"},
        },
        "blocks": [
            {
                "setting": "W=7 N=5 G=7",
                "dataset": "humaneval",
                "prompts": [["p0", [9]], ["p1", [8, 9]]],
                "seeds": {"official": [0, 1], "ours": [0, 1]},
                "ar": ar,
                "official": {"records": official},
                "ours": {"specbench": ours},
            }
        ],
    }
    out = tmp_path / "lade.md"
    parity.write_table(out, payload)
    text = out.read_text()
    assert "python -m specbench.parity lade --seeds 0 1" in text and "1. a patch" in text
    assert "| W=7 N=5 G=7 | humaneval | 2 | specbench | 16.5 ± 2.1 (15–18) | 17.0 ± 1.4 (16–18) | +3.0% |" in text
    assert "| p0 | 1 | 3 | 10 12 | 11.0 | 11 11 | 11.0 | +0% |" in text
    p1_row = next(line for line in text.splitlines() if "| p1 |" in line)
    assert "| yes | NO | yes |" in p1_row  # official = AR, ours != AR, the two ARs agree


# ------------------------------------------------------------------------------ step-for-step drivers


def test_cut_trace_applies_the_loops_stop_rule():
    # prefill token 5, then steps of 3, 2, 4 tokens; budget 6 cuts the third step to 1 token
    out = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert stepwise.cut_trace([3, 2, 4], out, 6, [99]) == ([3, 2], True)
    assert stepwise.cut_trace([3, 2, 4], out, 7, [99]) == ([3, 2, 1], True)
    # EOS (4) inside step 2 is kept and stops; an EOS held as the next token stops one step earlier
    assert stepwise.cut_trace([3, 2, 4], out, 100, [4]) == ([3, 1], True)
    assert stepwise.cut_trace([3, 2, 4], out, 100, [3]) == ([3], True)
    assert stepwise.cut_trace([3, 2, 4], out, 100, [5]) == ([], True)  # the prefill's token is EOS
    # the official loop stopped by its own rule first: specbench's rule never fired
    assert stepwise.cut_trace([3, 2, 4], out, 100, [99]) == ([3, 2, 4], False)


def test_first_difference_counts_length_differences():
    assert stepwise.first_difference([3, 2, 1], [3, 2, 1]) is None
    assert stepwise.first_difference([3, 2, 1], [3, 1, 2]) == 2
    assert stepwise.first_difference([3, 2], [3, 2, 1]) == 3


def stepwise_payload(ours_emitted, official_emitted, official_out):
    return {
        "command": "python -m specbench.parity medusa",
        "finished_at": "now",
        "wall_min": 1.0,
        "max_new_tokens": 6,
        "model_dir": "/m",
        "eos_ids": [99],
        "cases": [{"label": "tree", "overrides": [], "official": {"choices": "mc_sim_7b_63"}}],
        "patches": ["a patch"],
        "environment": {
            "cpu": "cpu",
            "official": {"transformers": "4.36.2"},
            "specbench": {"git_commit": "abc", "git_dirty": False, "transformers": "5", "torch": "t"},
        },
        "blocks": [
            {
                "dataset": "humaneval",
                "prompts": [["p0", [7, 8]]],
                "ar": {"p0": [5, 1, 2, 3, 4, 6]},
                "official_ar": {"p0": [5, 1, 2, 3, 4, 6]},
                "official": [
                    {
                        "case": "tree",
                        "id": "p0",
                        "steps": len(official_emitted),
                        "emitted": official_emitted,
                        "output_ids": official_out,
                    }
                ],
                "ours": [{"case": "tree", "id": "p0", "emitted": ours_emitted, "output_ids": [5, 1, 2, 3, 4, 6]}],
            }
        ],
    }


def test_stepwise_table_matches_step_for_step_and_shows_the_first_difference(tmp_path):
    side = SideEnv(".v", (), OfficialSource("medusa", "https://x", "0" * 40))
    driver = stepwise.Driver("medusa", side, "s.py", "counted", "none")
    # the official loop ran one step past the budget (its own rule): cut, it equals ours step for step
    payload = stepwise_payload([3, 2], [3, 2, 4], [5, 1, 2, 3, 4, 6, 7, 8, 9, 10])
    (row,) = stepwise.compare(payload)
    assert row.official == [3, 2] and row.official_steps == 3 and row.first_difference is None
    assert row.official_equals_ar and row.ours_equals_ar and row.ars_agree
    stepwise.write_table(tmp_path / "m.md", payload, driver)
    text = (tmp_path / "m.md").read_text()
    assert "| tree | all | 1 | 2 | 2 | +0.0% | 1/1 |" in text and "1. a patch" in text
    # one step less on the official side: the first differing step is 1 and the totals differ
    (row,) = stepwise.compare(stepwise_payload([3, 2], [5], [5, 1, 2, 3, 4, 6]))
    assert row.first_difference == 1 and row.official == [5]


def test_official_source_says_how_to_get_a_missing_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr("specbench.parity.common.SOURCES", tmp_path)
    source = OfficialSource("medusa", "https://github.com/FasterDecoding/Medusa", "e2a5d20c" + "0" * 32)
    with pytest.raises(SystemExit, match="make parity METHOD=medusa"):
        source.check()
