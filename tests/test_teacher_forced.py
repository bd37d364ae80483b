"""specbench.quality.teacher: the teacher-forced exactness check, on hand-built logits and on tiny runs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specbench.config import compose_config
from specbench.errors import ConfigError, DataError
from specbench.quality.teacher import (
    DEFAULT_ULPS,
    TokenCheck,
    check_run,
    check_tokens,
    default_tolerance,
    main,
)
from specbench.runner import Runner
from tests.helpers import exit_code

# --- the pure check ------------------------------------------------------------------------------------


def logits_with_argmax(tops: list[int], vocab: int = 6) -> torch.Tensor:
    """[len(tops), vocab] logits whose row i peaks at tops[i] (10.0, the others 0.0 .. 5.0)."""
    rows = torch.arange(vocab, dtype=torch.float32).repeat(len(tops), 1)  # [n, vocab]
    rows[torch.arange(len(tops)), torch.tensor(tops)] = 10.0
    return rows


def test_argmax_tokens_are_exact():
    """Emitting every row's argmax: no violation, no near tie, gap 0."""
    logits = logits_with_argmax([1, 4, 0, 2])
    assert check_tokens(logits, [1, 4, 0, 2], 1e-3) == TokenCheck(4, 0, 0, -1, 0.0)


def test_a_swap_within_the_tolerance_is_a_near_tie():
    """A runner-up 1e-4 below the max (relative 1e-5 of 10) is a near tie at 1e-3, not a violation."""
    logits = logits_with_argmax([1, 4, 0])
    logits[1, 3] = 10.0 - 1e-4
    check = check_tokens(logits, [1, 3, 0], 1e-3)
    assert (check.violations, check.near_ties, check.first_violation) == (0, 1, -1)
    assert check.max_gap == pytest.approx(1e-4, rel=1e-2)


def test_a_swap_beyond_the_tolerance_is_a_violation_at_its_position():
    """Gaps of 0.5 and 5 exceed 1e-3 x 10: violations, the first at index 2; a near tie before it counts too."""
    logits = logits_with_argmax([1, 4, 0, 2, 5])
    logits[1, 3] = 10.0 - 1e-4
    logits[2, 1] = 9.5
    check = check_tokens(logits, [1, 3, 1, 2, 0], 1e-3)
    assert check == TokenCheck(positions=5, violations=2, near_ties=1, first_violation=2, max_gap=10.0)


def test_the_tolerance_scales_with_the_max_logit():
    """The same gap of 0.05 is a near tie under a max logit of 100 and a violation under one of 10 (at 1e-3)."""
    big, small = logits_with_argmax([0]) * 10.0, logits_with_argmax([0])
    big[0, 1], small[0, 1] = 100.0 - 0.05, 10.0 - 0.05
    assert check_tokens(big, [1], 1e-3).near_ties == 1
    assert check_tokens(small, [1], 1e-3).violations == 1
    assert check_tokens(logits_with_argmax([0]) * 0.01, [5], 1e-3).violations == 1  # |max| < 1: floor at 1


def test_exact_ties_agree_and_nan_is_a_violation():
    """A token tied with the max is an argmax; a NaN row cannot vouch for any token."""
    logits = logits_with_argmax([2, 2])
    logits[0, 3] = 10.0
    logits[1] = float("nan")
    check = check_tokens(logits, [3, 2], 1e-3)
    assert (check.near_ties, check.violations, check.first_violation) == (0, 1, 1)


def test_half_precision_logits_and_empty_outputs():
    """fp16 / bf16 logits are compared exactly (upcast); no tokens, nothing to check."""
    for dtype in (torch.float16, torch.bfloat16):
        logits = logits_with_argmax([1, 2]).to(dtype)
        logits[1, 0] = 10.0 - 0.0625  # one bf16 step below 10, eight fp16 steps: within bf16's tolerance only
        check = check_tokens(logits, [1, 0], default_tolerance(dtype))
        assert check.violations == int(dtype == torch.float16) and check.near_ties == int(dtype == torch.bfloat16)
    assert check_tokens(torch.empty(0, 6), [], 1e-3) == TokenCheck(0, 0, 0, -1, 0.0)


def test_default_tolerance_is_some_epsilons_of_the_dtype():
    """fp32 about 5e-7, fp16 about 4e-3, bf16 about 3e-2 (relative)."""
    assert default_tolerance(torch.float16) == DEFAULT_ULPS * 2.0**-10
    assert default_tolerance(torch.bfloat16) == DEFAULT_ULPS * 2.0**-7
    assert default_tolerance(torch.float32) == DEFAULT_ULPS * 2.0**-23


def test_bad_inputs_are_refused():
    """A row count that differs from the tokens, an id outside the vocabulary, a negative tolerance."""
    logits = logits_with_argmax([1, 2])
    with pytest.raises(ValueError, match="one row per emitted token"):
        check_tokens(logits, [1], 1e-3)
    with pytest.raises(ValueError, match="outside the target's 6 logits"):
        check_tokens(logits, [1, 6], 1e-3)
    with pytest.raises(ValueError, match=">= 0"):
        check_tokens(logits, [1, 2], -1.0)


# --- tiny runs end to end --------------------------------------------------------------------------------

TOKENS = 12


def tiny_run(out, *overrides: str):
    """Two HumanEval samples of TOKENS tokens on the tiny random model (what python -m specbench runs)."""
    cfg = compose_config(
        "model=tiny_llama",
        "limit=2",
        f"max_new_tokens={TOKENS}",
        "warmup=0",
        "progress=false",
        "data_dir=null",
        f"output_dir={out}",
        *overrides,
    )
    return Runner(cfg).run()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Greedy AR and PLD runs on the same prompts."""
    root = tmp_path_factory.mktemp("teacher")
    return {method: tiny_run(root / method, f"method={method}") for method in ("ar", "pld")}


def rewrite_records(run_dir, change) -> None:
    """Apply ``change(records)`` to a run's samples.jsonl in place."""
    path = run_dir / "samples.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    change(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def copied(run_dir, tmp_path):
    """A copy of a run folder to tamper with."""
    return shutil.copytree(run_dir, tmp_path / run_dir.name)


def test_greedy_runs_have_no_violation(runs):
    """AR and a speculative method in fp32 emit the teacher-forced argmax at every position."""
    for method, run_dir in runs.items():
        result = check_run(run_dir)
        totals = result.totals()
        assert (result.method, result.dtype) == (method, "float32")
        assert totals["records"] == 2 and totals["positions"] == 2 * TOKENS
        assert totals["violations"] == 0 and totals["teacher_forced_exact"] == 1.0
        assert result.tolerance == default_tolerance(torch.float32)


def test_a_corrupted_token_is_found_at_its_position(runs, tmp_path, capsys):
    """One changed output token of the second record: a violation there, exit 1; a huge tolerance calls it a
    near tie instead; --limit 1 checks only the untouched first sample."""
    run_dir = copied(runs["pld"], tmp_path)

    def corrupt(records):
        records[1]["output_ids"][5] = (records[1]["output_ids"][5] + 1) % 97

    rewrite_records(run_dir, corrupt)
    result = check_run(run_dir)
    first, second = (r.check for r in result.records)
    assert first.violations == 0 and second.first_violation == 5 and second.violations >= 1
    assert result.exact_rate == 0.5
    assert exit_code(main, [str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "HumanEval/1" in out and "teacher-forced exact 0.500" in out
    lenient = check_run(run_dir, tolerance=1e9).records[1].check
    assert lenient.violations == 0 and lenient.near_ties >= 1
    assert exit_code(main, [str(run_dir), "--limit", "1"]) == 0
    assert "records 1," in capsys.readouterr().out


def test_a_sampled_run_is_refused(tmp_path, capsys):
    """T>0: one error line, exit 2, before any model loads."""
    run_dir = tiny_run(tmp_path / "sampled", "method=ar", "temperature=0.7", "limit=1", "max_new_tokens=4")
    with pytest.raises(ConfigError, match="temperature 0.7"):
        check_run(run_dir)
    assert exit_code(main, [str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "greedy" in err[0]


def test_a_prompt_that_differs_from_the_run_is_refused(runs, tmp_path):
    """A record whose prompt digest does not match the rebuilt prompt is an error, not a check."""
    run_dir = copied(runs["ar"], tmp_path)

    def change_digest(records):
        records[0]["prompt_sha"] = "0" * 16

    rewrite_records(run_dir, change_digest)
    with pytest.raises(DataError, match="rebuilt prompt"):
        check_run(run_dir)


def test_bad_input_is_one_error_line(tmp_path, capsys):
    """Not a run folder, a negative tolerance, a zero limit: exit 2 with one ``error:`` line each."""
    for argv in ([str(tmp_path)], [str(tmp_path), "--tolerance", "-1"], [str(tmp_path), "--limit", "0"]):
        assert exit_code(main, argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:")


def test_later_turns_rebuild_their_prompt_from_the_runs_answers(tmp_path, shared_data):
    """MT-Bench's second turn sees the run's first answer; its prompt digest matches and nothing violates."""
    run_dir = tiny_run(tmp_path / "mt", "method=ar", "dataset=mt_bench", "limit=1", f"data_dir={shared_data}")
    result = check_run(run_dir)
    assert [r.turn for r in result.records] == [0, 1] and result.totals()["violations"] == 0
