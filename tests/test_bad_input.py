"""The bad-input table of docs/usage.md, checked against the tests that feed each case.

BAD_INPUT holds one case per row of the table: the row's input cell as written, a fragment of the error line it
documents, and how a test feeds it: here, through the command in this process (tests/commands.py: one ``error:``
line, exit 2, nothing written in the command's folder), or by the named test elsewhere (it must exist and expect
the fragment). Every row of the table is a case and every case is a row, so the table cannot drift from the code.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from specbench import bench
from specbench.data.__main__ import main as data_main
from specbench.report import __main__ as report_cli
from specbench.reproduce.__main__ import main as reproduce_main
from specbench.train.__main__ import main as train_main
from tests.commands import Full, in_workspace, run_in_process, snapshot, specbench_main
from tests.conftest import ROOT

pytestmark = pytest.mark.usefixtures("no_model_loads")

COMMANDS: dict[str, Callable[[list[str]], object]] = {
    "specbench": specbench_main,
    "bench": bench.main,
    "reproduce": reproduce_main,
    "train": train_main,
    "data": data_main,
    "report": report_cli.main,
}
RUN = ("model=tiny_llama", "limit=1", "max_new_tokens=2", "warmup=0", "progress=false", "output_dir=out")
"""What every ``python -m specbench`` case adds: a quick run of the tiny model into the case's folder."""
HUMANEVAL = '{"task_id": "HumanEval/0", "prompt": "def f():", "test": "", "entry_point": "f", "canonical_solution": ""}'
GSM8K = '{"question": "1 + 1?", "answer": "#### 2"}'


@dataclass(frozen=True)
class Case:
    """One row of the table: its input cell, a fragment of the error line, and how it is fed: ``argv`` of
    ``command`` here (after writing ``files`` in its folder; ``full``: the tiny model loads), or ``test``."""

    given: str
    says: str
    command: str = "specbench"
    argv: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    full: bool = False
    test: str = ""


BAD_INPUT = [
    Case("`python -m specbench foo=1`", "error: unknown setting 'foo': no such key in the config", argv=("foo=1",)),
    Case(
        "`python -m specbench method=nope` (also inside a sweep, `method=ar,nope --multirun`)",
        "error: unknown method 'nope'; choose one of ['anpd', 'ar',",
        argv=("method=ar,nope", "--multirun"),
    ),
    Case(
        "`python -m specbench 'limit=[1'`",
        "error: cannot parse the override: no viable alternative at input '[1'",
        argv=("limit=[1",),
    ),
    *(
        Case(
            f"`method={method} method.drafter.{knob}=0`",
            f"error: method.drafter.{knob} ({symbol}) must be an integer >= 1, got 0",
            argv=(f"method={method}", f"method.drafter.{knob}=0"),
        )
        for method, knob, symbol in (
            ("lade", "window_size", "W"),
            ("opt_tree", "nodes", "n"),
            ("pld", "num_pred_tokens", "k"),
            ("lookahead", "decoding_length", "L_d"),
            ("spede", "num_assistant_tokens", "gamma"),
        )
    ),
    Case(
        "`max_new_tokens=0`, `top_p=0`",
        "error: invalid run settings: max_new_tokens must be >= 1 (got 0)",
        argv=("max_new_tokens=0", "top_p=0"),
    ),
    Case(
        "`temperature=abc` (any run setting of another type, a quoted `'0.5'` too)",
        "error: invalid run settings: temperature must be a number (got 'abc')",
        argv=("temperature=abc",),
    ),
    Case("`device=gpu`", "error: device must be auto, cpu, cuda or cuda:N (got 'gpu')", argv=("device=gpu",)),
    Case(
        "`compile=sometimes`",
        "error: invalid run settings: compile must be true, false or auto (got 'sometimes')",
        argv=("compile=sometimes",),
    ),
    Case(
        "`calibration.prompts=${nope}`",
        "error: invalid run settings: cannot resolve calibration.prompts: Interpolation key 'nope' not found",
        argv=("calibration.prompts=${nope}",),
    ),
    Case(
        "a malformed line in `$SPECBENCH_DATA_DIR/humaneval.jsonl`",
        "humaneval.jsonl:3: not a JSON record (Invalid control character",
        argv=("dataset=humaneval", "data_dir=data"),
        files=(("data/humaneval.jsonl", f"{HUMANEVAL}\n{HUMANEVAL}\n" + '{"task_id": "a\tb"}\n'),),
    ),
    Case(
        "a record without a needed field / an empty data file",
        "gsm8k_test.jsonl:3: the record lacks the field(s) ['answer'] this dataset needs",
        argv=("dataset=gsm8k", "data_dir=data"),
        files=(("data/gsm8k_test.jsonl", f'{GSM8K}\n{GSM8K}\n{{"question": "2 + 2?"}}\n'),),
    ),
    Case(
        'a record\'s field of another type (`"task_id": 7`)',
        "humaneval.jsonl:1: the record's field task_id must be a string (got 7); fix or remove the record",
        argv=("dataset=humaneval", "data_dir=data"),
        files=(("data/humaneval.jsonl", HUMANEVAL.replace('"HumanEval/0"', "7") + "\n"),),
    ),
    Case(
        "two records with one id",
        "record 2 repeats the id 'HumanEval/0'; ids must be unique",
        argv=("dataset=humaneval", "data_dir=data"),
        files=(("data/humaneval.jsonl", f"{HUMANEVAL}\n{HUMANEVAL}\n"),),
    ),
    Case(
        "`model=llama2_7b` offline, weights not cached",
        "model.path=",
        test="tests/test_models.py::test_paper_models_fail_fast_offline_with_advice",
    ),
    Case(
        "a second process into a running `output_dir`",
        "in use by process",
        test="tests/test_hardening.py::test_a_second_writer_is_refused_with_the_holders_pid",
    ),
    Case(
        "a trained draft without a finished manifest",
        "has no manifest.json",
        test="tests/test_hardening.py::test_a_part_without_a_finished_manifest_is_not_used",
    ),
    Case(
        "a full disk during a run",
        "No space left on device; samples finished before this are kept",
        test="tests/test_hardening.py::test_a_full_disk_stops_with_a_clear_error_and_keeps_finished_samples",
    ),
    Case(
        "`method=ar budget=4`",
        "error: invalid run settings: method ar has no size knob for budget=4; methods with one: anpd, binary_tree,",
        argv=("method=ar", "budget=4"),
    ),
    Case(
        "`method=pld budget=0`",
        "error: invalid run settings: budget must be null (the method's default), auto or an integer >= 1 (got 0)",
        argv=("method=pld", "budget=0"),
    ),
    Case(
        "`python -m specbench.bench nope`",
        "error: unknown benchmark suite 'nope'; choose one of ['all_methods',",
        command="bench",
        argv=("nope",),
    ),
    Case(
        "`python -m specbench.bench smoke --limit abc` (an option of another type, in any command)",
        "error: python -m specbench.bench: argument --limit: invalid int value: 'abc' (see python -m specbench.bench "
        "--help)",
        command="bench",
        argv=("smoke", "--limit", "abc"),
    ),
    Case(
        "`python -m specbench.reproduce list --scale huge`",
        "error: unknown scale 'huge'; choose one of ['paper', 'smoke']",
        command="reproduce",
        argv=("list", "--scale", "huge"),
    ),
    Case(
        "`python -m specbench.train draft train.steps=0`",
        "error: invalid draft training settings: train.steps must be >= 1 (got 0)",
        command="train",
        argv=("draft", "train.steps=0"),
    ),
    Case(
        "`python -m specbench.train medusa heads.num_heads=abc`",
        "error: invalid Medusa training settings: heads.num_heads must be an integer (got 'abc')",
        command="train",
        argv=("medusa", "heads.num_heads=abc"),
    ),
    Case(
        "`python -m specbench.data show imaginary`",
        "error: unknown dataset 'imaginary'; choose one of cnndm, dolly,",
        command="data",
        argv=("show", "imaginary"),
    ),
    Case(
        "`python -m specbench.report /nonexistent`",
        "error: /nonexistent: no runs found (no summary.json at or below it)",
        command="report",
        argv=("/nonexistent",),
    ),
    Case(
        "`python -m specbench.report DIR --reprice missing.csv`",
        "error: --reprice missing.csv: no such file (give a profile CSV, a cached curve or a budget.json)",
        command="report",
        argv=("runs", "--reprice", "missing.csv"),
    ),
    Case(
        "`python -m specbench.report DIR`, a torn `summary.json` in DIR",
        "summary.json is not valid JSON",
        command="report",
        argv=("runs",),
        files=(("runs/ar/summary.json", '{"model": "tiny'), ("runs/ar/samples.jsonl", "")),
    ),
    Case(
        "`python -m specbench.report DIR`, a record's field of another type in DIR",
        "samples.jsonl:2",
        test="tests/test_report.py::test_a_wrongly_typed_field_is_one_error_naming_file_line_and_field",
    ),
    Case(
        "a prompt longer than the model's context",
        "exceeds the model's context length",
        argv=("model.context_length=64", "max_new_tokens=4"),
        full=True,
    ),
]
"""Every row of docs/usage.md's bad-input table."""


def plain(text: str) -> str:
    """Text without Markdown's code marks (a table cell shows a message in backticks)."""
    return text.replace("`", "")


def table_rows() -> list[list[str]]:
    """The cells of every row of docs/usage.md's bad-input table (header and rule left out)."""
    text = (ROOT / "docs" / "usage.md").read_text()
    table = text.split("**Bad input.**", 1)[1].split("\n\n")[1]
    rows = [re.split(r"(?<!\\)\|", line.strip())[1:-1] for line in table.splitlines()]
    return [[cell.strip() for cell in row] for row in rows[2:]]


def test_the_table_rows_are_the_tested_cases():
    """Every row of the table is one case of BAD_INPUT and every case a row; its message holds the case's fragment."""
    rows = {given: (says, exit_code) for given, says, exit_code in table_rows()}
    assert sorted(rows) == sorted(case.given for case in BAD_INPUT)
    for case in BAD_INPUT:
        assert plain(case.says) in plain(rows[case.given][0]) and rows[case.given][1] == "2", case.given


@pytest.mark.parametrize("case", [case for case in BAD_INPUT if not case.test], ids=lambda case: case.given)
def test_each_case_is_one_error_line_and_nothing_written(case):
    """The case through its command in this process: exit 2, one ``error:`` line holding the fragment, no file."""
    with in_workspace() as workspace:
        for name, content in case.files:
            (workspace / name).parent.mkdir(parents=True, exist_ok=True)
            (workspace / name).write_text(content)
        before = snapshot(workspace)
        Full.runs = case.full
        argv = [*(RUN if case.command == "specbench" else ()), *case.argv]
        outcome = run_in_process(COMMANDS[case.command], argv)
        assert outcome.code == 2 and len(outcome.error_lines()) == 1, outcome.stderr
        assert plain(case.says) in plain(outcome.error_lines()[0]), outcome.stderr
        assert snapshot(workspace) == before


@pytest.mark.parametrize("case", [case for case in BAD_INPUT if case.test], ids=lambda case: case.given)
def test_each_other_case_is_fed_by_the_test_it_names(case):
    """A case fed elsewhere (a lock held by another process, a full disk, no network): that test exists and
    expects the fragment."""
    path, name = case.test.split("::")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    assert case.says in inspect.getsource(getattr(module, name))
