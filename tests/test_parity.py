"""specbench.parity: the official-vs-specbench table, its verdict and the official draws (no model, no side env)."""

import random

import pytest

from specbench.parity import lade as parity


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
