"""Property-based tests (hypothesis) of every input boundary (issue 31): generated data files, command-line values
of every run setting and drafter knob, the bench's and the trainers' options, and generated run folders for the
report. Whatever the input, the command ends in exit 0 or in exactly one ``error:`` line with exit 2, never a
traceback, and it writes nothing when it fails before the first sample. The drafter boundary (issue 48): what a
fuzzed drafter hands the shared loop (drawn trees, token ids, aux rows, rows of the KV cache) is verified exactly
(AR's greedy output) or refused with one DrafterError naming the drafter, never another exception.

No example loads a model: every ``load_model`` a command reaches raises ``ModelLoad`` (the input was accepted;
tests/commands.py); a rare full run lets the tiny random model through. Every example runs in its own empty
folder (its current folder, so relative paths land there). ``make test`` runs a few derandomized examples of each
property (the ``quick`` profile of tests/conftest.py); ``make fuzz`` runs them for minutes under the ``fuzz``
profile and prints the examples tried per boundary (tests/conftest.py's terminal summary).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import time
import unittest
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, is_hypothesis_test, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from specbench import bench
from specbench.config import CONF_DIR, group_options
from specbench.core.acceptance import Sampling
from specbench.core.drafter import Drafter, DrafterError
from specbench.core.loop import Decoder
from specbench.core.tree import AuxBlock, DraftTree
from specbench.core.verify import compact_cache
from specbench.data.base import build_dataset
from specbench.drafters.ar import NoDraft
from specbench.metrics import run_summary
from specbench.report import __main__ as report_cli
from specbench.report.read import load_runs
from specbench.report.view import VIEWS
from specbench.schema import SAMPLE_FIELDS, SCHEMA_VERSION
from specbench.train.__main__ import main as train_main
from tests.commands import Full, Outcome, in_workspace, run_in_process, snapshot, specbench_main
from tests.conftest import SHARED_DATA, tiny_model
from tests.reproduce_fixture import ENVIRONMENT
from tests.test_bench import LEGACY_ENTRY, LEGACY_PAYLOAD, LEGACY_RECORD

pytestmark = pytest.mark.usefixtures("no_model_loads")

FUZZ_SECONDS = float(os.environ.get("FUZZ_SECONDS", "0"))
"""``make fuzz``: the seconds all property tests share (0: no time budget, the profile's example counts)."""

COUNTS: Counter = Counter()
"""(boundary, outcome) -> examples; printed per boundary after the tests under ``make fuzz``."""


class BudgetSpent(unittest.SkipTest):
    """A property test used its share of FUZZ_SECONDS: hypothesis stops at once, ``budgeted`` makes it a pass."""


class Clock:
    """The time budget of the property test running now, and whether one of its examples failed."""

    deadline = float("inf")
    failed = False


def example_counts() -> list[str]:
    """The examples tried per boundary and how they ended, as lines of text."""
    lines = ["examples per boundary: total (outcome: count)"]
    for boundary in sorted({boundary for boundary, _ in COUNTS}):
        outcomes = {outcome: n for (name, outcome), n in COUNTS.items() if name == boundary}
        detail = ", ".join(f"{outcome}: {n}" for outcome, n in sorted(outcomes.items()))
        lines.append(f"  {boundary:24s} {sum(outcomes.values()):6d}  ({detail})")
    return lines


def at_least(examples: int) -> settings:
    """At least ``examples`` examples under the quick profile (a cheap property tries more than the default)."""
    return settings(max_examples=max(examples, settings().max_examples))


def budgeted(test: Callable) -> Callable:
    """A property test that, under ``make fuzz``, runs until its share of FUZZ_SECONDS is spent, then passes."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        Clock.deadline = time.monotonic() + FUZZ_SECONDS / len(PROPERTIES) if FUZZ_SECONDS else float("inf")
        Clock.failed = False
        with suppress(BudgetSpent):
            test(*args, **kwargs)

    return run


@contextmanager
def one_example() -> Iterator[Path]:
    """An example's own workspace (tests/commands.py); BudgetSpent once the test's budget is spent."""
    if time.monotonic() > Clock.deadline and not Clock.failed:
        raise BudgetSpent()
    try:
        with in_workspace() as workspace:
            yield workspace
    except BaseException:
        Clock.failed = True  # a failing example is shrunk to the end, whatever the budget
        raise


def check(boundary: str, outcome: Outcome, before: dict[str, bytes], workspace: Path) -> None:
    """The property: exit 0, the model load reached, or one ``error:`` line and exit 2; nothing written unless 0."""
    COUNTS[boundary, outcome.kind()] += 1
    if outcome.escaped is not None:
        raise AssertionError(f"a traceback: {outcome.escaped!r}\n{outcome.stderr}") from outcome.escaped
    assert outcome.code in (0, 2, None), f"exit {outcome.code}:\n{outcome.stderr}"
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.code != 2 or len(outcome.error_lines()) == 1, f"not one error line:\n{outcome.stderr}"
    if outcome.code != 0:
        assert snapshot(workspace) == before, f"written before the first sample ({outcome.kind()}):\n{outcome.stderr}"


def feed(boundary: str, main: Callable[[list[str]], object], argv: list[str], workspace: Path) -> Outcome:
    """Run one command on generated input in ``workspace`` and check the property."""
    before = snapshot(workspace)
    outcome = run_in_process(main, argv)
    check(boundary, outcome, before, workspace)
    return outcome


# -- what a user may type ----------------------------------------------------------------------------------

TYPED_WORDS = (
    "null",
    "true",
    "false",
    "auto",
    "abc",
    "0",
    "-1",
    "1e999",
    "nan",
    "-inf",
    "0x10",
    "1_000",
    "[]",
    "[1,2]",
    "{}",
    "{a: 1}",
    "''",
    "' '",
    "${nope}",
    "${oc.env:SPECBENCH_NO_SUCH_VARIABLE}",
    "cpu",
    "cuda",
    "cuda:1",
    "float16",
    "bfloat16",
    "out",
    "taken",
    "taken/sub",
    "'3'",
    "'0.5'",
    "'no'",
    "DELETE",
)
"""Words that mean something to Hydra or to a setting: types, choices, interpolations, quoted numbers, folders
of the workspace (``taken`` is a regular file); ``DELETE`` removes the key (``~key``)."""

command_words = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
"""Any text a shell can pass (no NUL, no lone surrogate)."""

values = st.one_of(
    st.sampled_from(TYPED_WORDS),
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    command_words,
)
"""The value of one ``key=value`` override or one option."""


def leaves(node: dict, prefix: str = "") -> dict[str, object]:
    """Dotted key -> value of every leaf of a mapping (lists are leaves)."""
    found: dict[str, object] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            found.update(leaves(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = value
    return found


def yaml_settings(path: Path, node: str = "", prefix: str = "") -> dict[str, str]:
    """The settings of a config file (of one node of it) with their values as override text, without Hydra's
    own entries; interpolations stay as written."""
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert isinstance(data, dict)
    data = data.get(node) or {} if node else data
    found = leaves({key: value for key, value in data.items() if key not in ("defaults", "hydra")})
    return {f"{prefix}{key}": as_override(value) for key, value in found.items() if not key.endswith("_target_")}


def as_override(value: object) -> str:
    """A YAML value as the text of an override (``null``, ``true``, ``[4, 5]``, the string itself)."""
    return value if isinstance(value, str) else json.dumps(value)


def drafter_knobs(method: str) -> dict[str, str]:
    """``method.drafter.*``: the drafter knobs of a method config."""
    return yaml_settings(CONF_DIR / "method" / f"{method}.yaml", "drafter", "method.drafter.")


GROUPS = ("model", "dataset", "method")
CHOICES = {group: group_options(group) for group in GROUPS}
"""The config groups a command line picks from, with their options."""
RUN_SETTINGS = {**yaml_settings(CONF_DIR / "config.yaml"), "model": "tiny_llama", "dataset": "humaneval"}
"""Every top-level run setting of conf/config.yaml (calibration.* included), the model and the dataset, with the
value each has in an example that does not change it."""


def some_settings(settings: dict[str, str], most: int = 4) -> st.SearchStrategy[dict[str, str]]:
    """A few of ``settings``, each at its default, at a generated value or (a group) at one of its options."""
    if not settings:
        return st.just({})
    return st.lists(st.sampled_from(sorted(settings)), unique=True, max_size=most).flatmap(
        lambda chosen: st.fixed_dictionaries(
            {key: st.sampled_from(CHOICES.get(key, [settings[key]])) | values for key in chosen}
        )
    )


def words(settings: dict[str, str]) -> list[str]:
    """``key=value`` words (``~key`` for DELETE)."""
    return [f"~{key}" if value == "DELETE" else f"{key}={value}" for key, value in settings.items()]


def taken_file(workspace: Path) -> None:
    """A regular file where a user might point a folder setting."""
    (workspace / "taken").write_text("a file, not a folder\n")


# -- (b) every run setting and every drafter knob: `python -m specbench` ----------------------------------

QUICK_RUN = {
    "model": "tiny_llama",
    "limit": "1",
    "max_new_tokens": "2",
    "warmup": "0",
    "progress": "false",
    "output_dir": "out",
    "data_dir": str(SHARED_DATA),
}
"""A quick run of the tiny model into the example's folder; generated settings go on top."""


def run_command(**given: str) -> list[str]:
    """The words of ``python -m specbench`` for a quick run with the given settings."""
    return words({**QUICK_RUN, **given})


method_settings = st.sampled_from(CHOICES["method"]).flatmap(
    lambda method: some_settings(drafter_knobs(method)).map(lambda knobs: {"method": method, **knobs})
)
"""A method and values for some of its drafter knobs."""


@budgeted
@given(some_settings(RUN_SETTINGS))
@example({"device": "abc"})  # found: torch's RuntimeError
@example({"model": "[1,2]"})  # found: Hydra's TypeError (and `model=null` its ValueError)
@example({"model": "[]"})  # found: no model node, ConfigAttributeError once the run started
@example({"calibration.prompts": "${nope}"})  # found: OmegaConf's InterpolationKeyError
@example({"temperature": "'0.5'"})  # found by reading: the quoted number passed the type check, then TypeError
def test_any_run_setting_is_run_or_one_error_line(settings):
    """Every top-level run setting of conf/config.yaml (and the model) at generated values."""
    with one_example() as workspace:
        taken_file(workspace)
        feed("run settings", specbench_main, run_command(**settings), workspace)


@budgeted
@given(method_settings)
@example({"method": "lade", "method.drafter.pool_from_prompt": "${oc.env:SPECBENCH_NO_SUCH_VARIABLE}"})  # found
def test_any_drafter_knob_is_run_or_one_error_line(settings):
    """Every method's drafter knobs (conf/method/*.yaml) at generated values."""
    with one_example() as workspace:
        feed("drafter knobs", specbench_main, run_command(**settings), workspace)


# -- (a) data files: `dataset=jsonl dataset.path=FILE` and a built-in dataset's file in data_dir -------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
"""Any JSON value (NaN and infinities included: Python's json reads them)."""


@st.composite
def mutated(draw, template: dict) -> dict:
    """A record like ``template`` with a few fields retyped (any JSON value) or dropped, maybe one added."""
    record = dict(template)
    for key in draw(st.lists(st.sampled_from(sorted(template)), unique=True, max_size=2)):
        if draw(st.booleans()):
            record[key] = draw(json_values)
        else:
            del record[key]
    if draw(st.booleans()):
        record[draw(st.text(max_size=6))] = draw(json_values)
    return record


def file_bytes(templates: list[dict]) -> st.SearchStrategy[bytes]:
    """JSON Lines of mutated records, then damaged: duplicated or blank lines, random bytes, truncation."""
    lines = st.lists(st.sampled_from(templates).flatmap(mutated), max_size=4).flatmap(
        lambda records: st.permutations([json.dumps(record).encode() for record in records])
    )
    return st.tuples(lines, st.lists(damage, max_size=3)).map(damaged)


damage = st.tuples(
    st.sampled_from(["duplicate", "blank", "bytes", "truncate"]),
    st.integers(0, 10**4),
    st.binary(min_size=1, max_size=6),
)
"""One damage to a file: (kind, where, the bytes that ``bytes`` inserts): a line repeated, a blank line added, bytes
(maybe not UTF-8) inserted, the file cut short."""


def damaged(lines_and_damage: tuple[list[bytes], list[tuple[str, int, bytes]]]) -> bytes:
    """The lines joined, with each damage applied in turn (line damages first, then byte damages)."""
    lines, damages = list(lines_and_damage[0]), lines_and_damage[1]
    for kind, where, _ in damages:
        if kind == "duplicate" and lines:
            lines.insert(where % len(lines), lines[where % len(lines)])
        elif kind == "blank":
            lines.insert(where % (len(lines) + 1), b"   ")
    content = b"".join(line + b"\n" for line in lines)
    for kind, where, inserted in damages:
        at = where % (len(content) + 1)
        if kind == "bytes":
            content = content[:at] + inserted + content[at:]
        elif kind == "truncate":
            content = content[:at]
    return content


PROMPT_RECORDS = [
    {"id": "a1", "prompt": "Write a haiku about the sea.", "category": "poem", "reference": "waves"},
    {"turns": ["Name a prime number.", "And one more?"], "category": "math"},
    {"prompt": "Say hello."},
]
"""Records of one's own prompts file (dataset=jsonl)."""

BUILT_IN = [name for name in group_options("dataset") if name != "jsonl"]
FULL_RUN = {"limit": "1", "max_new_tokens": "1"}


@functools.cache
def built_in(name: str) -> tuple[str, list[dict]]:
    """A built-in dataset's file name in data_dir and two real records it evaluates (from the shared copy)."""
    dataset = build_dataset(OmegaConf.load(CONF_DIR / "dataset" / f"{name}.yaml"), str(SHARED_DATA))
    with (SHARED_DATA / dataset.local_file).open(encoding="utf-8") as lines:
        records = [json.loads(line) for line in itertools.islice(lines, 40)]
    return dataset.local_file, [records[index] for index in dataset.pool(records)[:2]]


@functools.cache
def dataset_settings(dataset: str) -> dict[str, str]:
    """``dataset.*``: the settings of a dataset config."""
    return yaml_settings(CONF_DIR / "dataset" / f"{dataset}.yaml", prefix="dataset.")


def data_command(dataset: list[str], full: bool) -> list[str]:
    """The words of a run over a generated data file: stopped at the model load, or a full tiny run."""
    Full.runs = full
    return [*run_command(**FULL_RUN), *dataset]


@budgeted
@given(
    st.sampled_from(["prompts.jsonl", "prompts.txt", "prompts.json"]),
    file_bytes(PROMPT_RECORDS),
    some_settings(dataset_settings("jsonl"), most=2),
    st.booleans(),
)
@example("prompts.txt", "Say hello to the café.\n".encode(), {}, True)  # one full run in `make test`
def test_any_prompts_file_is_run_or_one_error_line(name, content, settings, full):
    """``dataset=jsonl dataset.path=FILE``: generated JSON Lines or text files, damaged, and the dataset's settings
    at generated values."""
    with one_example() as workspace:
        (workspace / name).write_bytes(content)
        argv = data_command(["dataset=jsonl", f"dataset.path={name}", *words(settings)], full)
        feed("data: dataset=jsonl", specbench_main, argv, workspace)


@st.composite
def built_in_files(draw) -> tuple[str, str, bytes, dict[str, str]]:
    """A built-in dataset, its file name in data_dir, generated content, and values for some of its settings."""
    name = draw(st.sampled_from(BUILT_IN))
    local_file, templates = built_in(name)
    return name, local_file, draw(file_bytes(templates)), draw(some_settings(dataset_settings(name), most=2))


HUMANEVAL_LINE = (
    b'{"task_id": "HumanEval/0", "prompt": "def f():", "test": "", "entry_point": "f", "canonical_solution": ""}\n'
)
MBPP_TRAIN_LINE = b'{"task_id": 1, "prompt": "t", "code": "c", "test_list": []}\n'


# Found: a task id that is a list (TypeError once the model had loaded), a dataset name that is a number (the report
# refused the finished run); by reading: one id twice (two samples counted as one), no record in MBPP's test range
# (a model loaded for nothing, then the report found no run).
@budgeted
@given(built_in_files(), st.booleans())
@example(("humaneval", "humaneval.jsonl", HUMANEVAL_LINE.replace(b'"HumanEval/0"', b'["x"]'), {}), False)
@example(("humaneval", "humaneval.jsonl", HUMANEVAL_LINE, {"dataset.name": "5.5"}), False)
@example(("humaneval", "humaneval.jsonl", HUMANEVAL_LINE * 2, {}), False)
@example(("mbpp100", "mbpp_sanitized.jsonl", MBPP_TRAIN_LINE, {}), False)
def test_any_built_in_data_file_is_run_or_one_error_line(dataset, full):
    """A file named like a built-in dataset's local copy in a data_dir (generated records, damaged), and its
    settings at generated values."""
    name, local_file, content, settings = dataset
    with one_example() as workspace:
        (workspace / "data").mkdir()
        (workspace / "data" / local_file).write_bytes(content)
        argv = [f"dataset={name}", "data_dir=data", "dataset.source=local", *words(settings)]
        feed("data: built-in file", specbench_main, data_command(argv, full), workspace)


# -- (c) run folders for `python -m specbench.report` ------------------------------------------------------


def valid_record(sample_id: str, turn: int) -> dict:
    """A samples.jsonl record as the runner writes one (a 3-token generation in 2 steps)."""
    record = dict.fromkeys(SAMPLE_FIELDS)
    record.update(
        schema=SCHEMA_VERSION,
        run_id="run@1",
        sample_id=sample_id,
        turn=turn,
        n_turns=1,
        prompt_tokens=5,
        prompt_sha="0" * 16,
        new_tokens=3,
        output_ids=[1, 2, 3],
        output_text="abc",
        wall_s=0.3,
        prefill_s=0.1,
        target_forwards=2,
        accept_lengths=[1, 1],
        draft_tokens=[3, 3],
        draft_depth=[2, 2],
        side_branch=[False, False],
        step_s=[0.1, 0.1],
        draft_s=[0.01, 0.01],
        verify_s=[0.08, 0.08],
        accept_s=[0.005, 0.005],
        update_s=[0.005, 0.005],
        stop_reason="max_new_tokens",
        drafter_stats={},
    )
    return record


def valid_summary(method: str, records: list[dict]) -> dict:
    """summary.json of a complete run of ``method`` as the runner writes it (specbench.metrics.run_summary)."""
    stamp = "2026-01-01T00:00:00+00:00"
    return run_summary(
        records,
        model="tiny_llama",
        method=method,
        dataset="humaneval",
        lossless=True,
        hyperparameters={"name": method},
        sampling={"temperature": 0.0, "top_p": 1.0, "seed": 0},
        repeat=0,
        experiment=None,
        max_new_tokens=3,
        limit=2,
        warmup=0,
        run_id=f"{method}@1",
        status="complete",
        model_path=None,
        dataset_info=None,
        prompt_format="chat",
        started_at=stamp,
        updated_at=stamp,
        ended_at=stamp,
        peak_memory=None,
        device_map=None,
        environment=ENVIRONMENT,
        config_digest="0" * 16,
        bench=None,
        target="t",
        artefacts=[],
        budget=None,
        engine={"name": "hf", "batch_size": 1},
        latency_curves=[],
        compile=None,
        memory_traffic=None,
    )


RECORDS = [valid_record("HumanEval/0", 0), valid_record("HumanEval/1", 0)]


def intact(method: str, first: dict = RECORDS[0], summary: dict | None = None) -> dict[str, bytes]:
    """The files of a run folder as the runner writes them, its first record and summary fields as given."""
    records = [first, *RECORDS[1:]]
    return {
        "samples.jsonl": b"".join(json.dumps(record).encode() + b"\n" for record in records),
        "summary.json": json.dumps({**valid_summary(method, RECORDS), **(summary or {})}).encode(),
    }


def distinct_records(samples: bytes) -> int:
    """The (sample, turn) pairs of the lines of a samples.jsonl that parse (what a report must count, once each)."""
    keys = set()
    for line in samples.decode("utf-8").splitlines():
        with suppress(ValueError):
            record = json.loads(line)
            keys.add((record["sample_id"], record["turn"]))
    return len(keys)


@st.composite
def run_folder(draw, method: str) -> dict[str, bytes]:
    """The files of one run folder: mutated records and summary, each file maybe damaged."""
    summary = draw(mutated(valid_summary(method, RECORDS)))
    return {
        "samples.jsonl": draw(file_bytes(RECORDS)),
        "summary.json": draw(
            st.tuples(st.just([json.dumps(summary).encode()]), st.lists(damage, max_size=1)).map(damaged)
        ),
    }


report_options = st.lists(
    st.one_of(
        st.tuples(st.just("--view"), st.sampled_from(sorted(VIEWS)) | command_words),
        st.tuples(st.just("--by"), st.sampled_from(sorted(SAMPLE_FIELDS)) | command_words),
        st.tuples(st.sampled_from(["--merge-repeats", "--divergences"])),
        st.tuples(st.just("--csv"), st.sampled_from(["table.csv", "taken/table.csv"])),
        st.tuples(
            st.just("--view"), st.just("acceptance"), st.just("--plot"), st.sampled_from(["a.png", "taken/a.png"])
        ),
    ),
    max_size=3,
).map(lambda options: [word for option in options for word in option])
"""Options of the report (its --quality runs generated code: left to tests/test_quality.py)."""


# Found: a schema that is a list (TypeError), a verify time without its step time (TypeError in the metrics), a
# max_new_tokens that is a list (TypeError in pandas), --csv below a regular file (OSError), --by over runs without
# records (KeyError).
@budgeted
@given(run_folder("ar"), run_folder("pld"), report_options)
@at_least(30)
@example(intact("ar", {**RECORDS[0], "schema": []}), intact("pld"), [])
@example(intact("ar"), intact("pld", {**RECORDS[0], "step_s": None}), [])
@example(intact("ar", summary={"max_new_tokens": []}), intact("pld"), [])
@example(intact("ar"), intact("pld"), ["--csv", "taken/table.csv"])
@example({**intact("ar"), "samples.jsonl": b""}, {**intact("pld"), "samples.jsonl": b""}, ["--by", "turn"])
def test_any_run_folder_is_reported_or_one_error_line(ar, pld, options):
    """``python -m specbench.report`` over generated run folders: never a traceback, and every record it reports
    counted once (a repeated line is not a second generation)."""
    with one_example() as workspace:
        taken_file(workspace)
        folders = {workspace / "runs" / "ar": ar, workspace / "runs" / "pld": pld}
        for folder, files in folders.items():
            folder.mkdir(parents=True)
            for name, content in files.items():
                (folder / name).write_bytes(content)
        outcome = feed("report: run folders", report_cli.main, ["runs", *options], workspace)
        if outcome.code == 0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                counted = load_runs([workspace / "runs"]).set_index("run_dir")["n_records"]
            for folder, files in folders.items():
                assert counted[str(folder)] == distinct_records(files["samples.jsonl"]), counted


# -- (d) the bench's and the trainers' options -------------------------------------------------------------

SMALL_SUITES = ("smoke", "ar_vs_hf", "medusa", "opt_tree_sweep")
"""Suites of at most four entries (each entry composes a config; every suite's entries compose: test_bench.py)."""


def option(flag: str, value: st.SearchStrategy = values) -> st.SearchStrategy[list[str]]:
    """``[flag, value]``."""
    return value.map(lambda text: [flag, text])


@st.composite
def legacy_file(draw) -> bytes:
    """A results file of the earlier format with its parts mutated, maybe damaged."""
    payload = draw(mutated(LEGACY_PAYLOAD))
    if isinstance(payload.get("records"), dict) and "ar" in payload["records"]:
        payload["records"]["ar"] = draw(st.lists(mutated(LEGACY_RECORD), max_size=2))
    if isinstance(payload.get("entries"), dict) and "ar" in payload["entries"]:
        payload["entries"]["ar"] = draw(mutated(LEGACY_ENTRY))
    return draw(st.tuples(st.just([json.dumps(payload).encode()]), st.lists(damage, max_size=1)).map(damaged))


bench_options = st.lists(
    st.one_of(
        *(option(flag) for flag in ("--limit", "--max-new-tokens", "--rounds", "--device", "--dtype", "--out", "-cd")),
        st.lists(st.sampled_from(["ar", "hf_generate", "ar seed=1", "nope"]), min_size=1, max_size=2).map(
            lambda labels: ["--entries", *labels]
        ),
        some_settings(RUN_SETTINGS, most=2).map(words),
        st.just(["--list"]),
    ),
    max_size=4,
).map(lambda options: [word for option in options for word in option])
"""Options and overrides of ``python -m specbench.bench SUITE``."""


@budgeted
@given(st.sampled_from(SMALL_SUITES) | command_words, bench_options)
@example("smoke", ["--limit", "abc"])  # found: argparse's usage and a second line
@example("smoke", ["--out", "taken"])  # found by reading: NotADirectoryError once the model had loaded
def test_any_bench_option_is_run_or_one_error_line(suite, options):
    """``python -m specbench.bench SUITE [options] [overrides]``: generated options."""
    with one_example() as workspace:
        taken_file(workspace)
        argv = [suite, "--out", "out", "model=tiny_llama", *options]
        feed("bench: options", bench.main, argv, workspace)


# Found: a file without entries (KeyError), bytes that are not UTF-8 (UnicodeDecodeError), a verify time without its
# step time (TypeError in the metrics); by reading: --out below a regular file (NotADirectoryError).
@budgeted
@given(legacy_file(), st.sampled_from(["out", "taken", "taken/sub"]))
@at_least(30)
@example(json.dumps({**LEGACY_PAYLOAD, "entries": None}).encode(), "out")
@example(b"\xff", "out")
@example(json.dumps({**LEGACY_PAYLOAD, "records": {"ar": [{**LEGACY_RECORD, "step_s": None}]}}).encode(), "out")
@example(json.dumps(LEGACY_PAYLOAD).encode(), "taken/sub")
def test_any_old_results_file_is_converted_or_one_error_line(content, out):
    """``python -m specbench.bench --convert OLD.json --out DIR``: generated files of the earlier format."""
    with one_example() as workspace:
        taken_file(workspace)
        (workspace / "old.json").write_bytes(content)
        feed("bench: --convert", bench.main, ["--convert", "old.json", "--out", out], workspace)


TRAINERS = ("draft", "medusa", "eagle", "eagle3", "hydra")


def trainer_settings_of(command: str) -> dict[str, str]:
    """The settings of ``python -m specbench.train COMMAND``: its config's, the self-distilled prompts', the model."""
    prompts = yaml_settings(CONF_DIR / "train" / "prompts.yaml", prefix="prompts.")
    return {**yaml_settings(CONF_DIR / "train" / f"{command}.yaml"), **prompts, "model": "tiny_llama"}


trainer_settings = st.sampled_from(TRAINERS).flatmap(
    lambda command: some_settings(trainer_settings_of(command)).map(lambda settings: (command, settings))
)


@budgeted
@given(trainer_settings)
@example(("draft", {"train.steps": "abc"}))  # found: TypeError
@example(("medusa", {"heads.num_heads": "[1]"}))  # found: TypeError
@example(("eagle", {"prompts.max_prompts": "abc"}))  # found by reading: prompts.* of medusa/eagle went unchecked
def test_any_trainer_setting_is_trained_or_one_error_line(command_and_settings):
    """``python -m specbench.train draft|medusa|eagle|eagle3|hydra``: every trainer setting at generated values."""
    command, settings = command_and_settings
    with one_example() as workspace:
        taken_file(workspace)
        argv = [command, *words({"model": "tiny_llama", "output_dir": "out", **settings})]
        feed(f"train {command}", train_main, argv, workspace)


# -- (e) what a drafter hands the shared loop ----------------------------------------------------------------

VOCAB = 97  # the tiny model's (tests/conftest.py)
BOUNDARY_PROMPT = [5, 9, 2, 5, 9, 2, 5, 9]
BOUNDARY_TOKENS = 6
DAMAGES = ("parent", "token", "length", "root", "aux token", "aux mask", "draft_probs", "cache row", "cache crop")
"""How the fuzzed drafter breaks a step's proposal (after building a valid one), or not at all."""

token_ids = st.integers(0, VOCAB - 1)
bad_token_ids = st.one_of(st.integers(-(10**9), -1), st.integers(VOCAB, 10**9), st.floats(), st.booleans(), st.none())
"""Token ids a model cannot read: negative, past the vocabulary, not integers."""
bad_parents = st.one_of(st.integers(-(10**6), 10**6), st.floats(), st.none(), st.text(max_size=2))
"""Values a parent entry may be changed to after the tree was built (an earlier node's index is the only valid one)."""


def valid_parent(node: int, value: object) -> bool:
    """Whether ``value`` may be node ``node``'s parent: -1 for the root, an earlier node's index for any other."""
    return type(value) is int and (value == -1 if node == 0 else 0 <= value < node)


@dataclass
class Proposal:
    """One step's proposal as drawn: a valid tree (tokens, parents, maybe aux rows), then the damage done to it."""

    tokens: list[int]
    parents: list[int]
    aux: list[int] | None
    damage: str | None
    node: int  # the node a damage changes
    value: object  # what it changes it to (a parent, a token id, a row count)


@st.composite
def proposals(draw) -> Proposal:
    """A drawn proposal: up to 10 drafted nodes in a random tree, maybe aux rows, maybe (one step in five) one damage
    of DAMAGES, so that about a third of the generations go through undamaged."""
    size = draw(st.integers(0, 10))
    tokens = draw(st.lists(token_ids, min_size=size + 1, max_size=size + 1))
    parents = [-1, *(draw(st.integers(0, node - 1)) for node in range(1, size + 1))]
    aux = draw(st.none() | st.lists(token_ids, min_size=1, max_size=4))
    damage = draw(st.sampled_from((None,) * 4 * len(DAMAGES) + DAMAGES))  # one step in five damaged
    node = draw(st.integers(0, size))
    values = {
        "parent": bad_parents.filter(lambda value: not valid_parent(node, value)),
        "token": bad_token_ids,
        "root": st.integers(1, VOCAB - 1),
        "aux token": st.integers(VOCAB, 10**9),
        "aux mask": st.sampled_from([1, 3]),
        "draft_probs": st.integers(1, 3),
    }
    return Proposal(tokens, parents, aux, damage, node, draw(values.get(damage, st.none())))


class FuzzedDrafter(Drafter):
    """Hands the loop one drawn proposal per step: a valid tree (its root replaced by the step's root) that the
    proposal may then damage, as a buggy drafter would: a parent or token changed after construction, a token
    without a parent, another root, aux rows past the vocabulary or of another shape, draft probabilities of
    another size, a row left in or removed from the target's KV cache."""

    def __init__(self, plan: list[Proposal], model):
        super().__init__()
        self.plan, self.model, self.damaged = plan, model, False

    def propose(self, ctx):
        drawn = self.plan[ctx.step]
        tree = DraftTree([ctx.root, *drawn.tokens[1:]], list(drawn.parents))
        if drawn.aux is not None:
            rows = len(drawn.aux)
            tree.aux = AuxBlock(torch.tensor(drawn.aux), torch.arange(1, rows + 1), torch.ones(rows, rows).tril() > 0)
        self.damaged |= drawn.damage is not None
        damage, node, value = drawn.damage, drawn.node, drawn.value
        if damage == "parent":
            tree.parents[node] = value
        elif damage == "token":
            tree.tokens[node] = value
        elif damage == "length":
            tree.tokens.append(0)
        elif damage == "root":
            tree.tokens[0] = (ctx.root + value) % VOCAB
        elif damage == "aux token":
            tree.aux = AuxBlock(torch.tensor([value]), torch.tensor([1]), torch.eye(1) > 0)
        elif damage == "aux mask":
            tree.aux = AuxBlock(torch.tensor([1, 2]), torch.tensor([1, 2]), torch.eye(2) > 0)
            tree.aux.mask = torch.eye(value) > 0
        elif damage == "draft_probs":
            tree.draft_probs = torch.full((len(tree) + value, VOCAB), 1.0 / VOCAB)
        elif damage == "cache row":
            self.model(input_ids=torch.tensor([[ctx.root]]), past_key_values=ctx.cache, use_cache=True)
        elif damage == "cache crop":
            compact_cache(ctx.cache, ctx.position - 1, [])
        return tree


@functools.cache
def boundary_model():
    """The tiny random model of the drafter boundary and AR's greedy output on its prompt (the truth)."""
    model = tiny_model()
    with torch.inference_mode():
        truth = Decoder(model, NoDraft(), frozenset(), Sampling()).generate(BOUNDARY_PROMPT, BOUNDARY_TOKENS)
    return model, truth.output_ids


@budgeted
@given(st.lists(proposals(), min_size=BOUNDARY_TOKENS - 1, max_size=BOUNDARY_TOKENS - 1))
@at_least(30)
def test_any_proposal_is_verified_exactly_or_refused_naming_the_drafter(plan):
    """The shared loop with a drafter handing over drawn trees, token ids, aux rows and cache rows: a valid proposal
    every step gives AR's greedy output (any tree is lossless), anything else one DrafterError naming the drafter,
    raised before any forward reads it; never another exception."""
    model, truth = boundary_model()
    with one_example():
        drafter = FuzzedDrafter(plan, model)
        try:
            with torch.inference_mode():
                output = Decoder(model, drafter, frozenset(), Sampling()).generate(BOUNDARY_PROMPT, BOUNDARY_TOKENS)
        except DrafterError as error:
            COUNTS["drafter boundary", "refused"] += 1
            assert drafter.damaged and "FuzzedDrafter" in str(error), error
            return
        COUNTS["drafter boundary", "verified"] += 1
        assert not drafter.damaged and output.output_ids == truth


PROPERTIES = [test for test in list(globals().values()) if is_hypothesis_test(test)]
"""The property tests of this module (they share FUZZ_SECONDS under ``make fuzz``)."""
