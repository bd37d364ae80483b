"""Every method passes the conformance suite (``specbench.conformance``) on tiny random models.

The methods are read from the method configs, so a new method is covered by adding its drafter and
config; ``pytest tests/test_conformance.py --method NAME [--config-dir DIR]`` runs only the named ones
(a user's own method included). A check that does not apply to a method (greedy equality for a lossy
method, the step breakdown for HF generate) is not generated.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from specbench import conformance

SLOW_CHECKS = {"sampling", "resume", "compiled"}


@pytest.fixture(autouse=True)
def traced_graphs_only(monkeypatch):
    """The compiled check runs torch.compile's aot_eager backend: the graphs runs compile, traced the same way, without
    inductor's code generation (minutes per bucket on 2 cores); tests/test_compiled.py runs inductor itself."""
    monkeypatch.setattr(conformance, "COMPILE_BACKEND", "aot_eager")


def family(name: str) -> tuple:
    """What a method config runs: its engine, drafter class and acceptance rule (configs that differ only in knob
    values, e.g. lade_13b beside lade, share one); a method on HF generate is its own."""
    cfg = conformance.method_config(name)
    if cfg.engine != "loop":
        return (name,)
    return (cfg.engine, cfg.drafter.get("_target_"), str(cfg.get("acceptance")), bool(cfg.get("lossless")))


def first_of_each_family(names: list[str]) -> set[str]:
    """The first config (in name order) of each family: the slow checks' subjects in the default suite."""
    first: dict[tuple, str] = {}
    for name in sorted(names):
        first.setdefault(family(name), name)
    return set(first.values())


def pytest_generate_tests(metafunc):
    """One test per (method, applicable check). The slow checks (sampling, resume, compiled) test what a drafter class
    does with the loop, so the default suite runs them on one config of each family (family()); configs named with
    --method, and ``python -m specbench.conformance``, run every check on every config."""
    if "method" not in metafunc.fixturenames:
        return
    named = metafunc.config.getoption("--method")
    names = named or conformance.methods()
    slow_subjects = set(names) if named else first_of_each_family(names)
    cases = [
        pytest.param(name, check, id=f"{name}-{check}", marks=[pytest.mark.slow] if check in SLOW_CHECKS else [])
        for name in names
        for check in conformance.CHECKS
        if conformance.not_applicable(name, check) is None and (check not in SLOW_CHECKS or name in slow_subjects)
    ]
    metafunc.parametrize(("method", "check"), cases)


def test_conformance(method, check, request):
    """The check passes (its detail says what was measured)."""
    result = conformance.run_check(method, check, request.config.getoption("--thorough"))
    assert result.passed, result.detail


def test_every_method_is_covered():
    """Each method config gets the checks that apply to it; every method at least builds, bounds and stops."""
    for name in conformance.methods():
        applicable = [check for check in conformance.CHECKS if conformance.not_applicable(name, check) is None]
        assert {"builds", "budget", "eos", "forget", "resume"} <= set(applicable), name


@pytest.mark.parametrize("name", ["token_recycling", "suffix_decoding"])
def test_a_drafter_that_keeps_its_memory_through_forget_fails_the_forget_check(monkeypatch, name):
    """Negative control: a drafter whose ``forget`` leaves what it learned across requests (Token Recycling's matrix,
    SuffixDecoding's global tree) starts the next generation from it, and the check names what changed."""
    from specbench.drafters.suffix_decoding import SuffixDecoding
    from specbench.drafters.token_recycling import TokenRecycling

    drafter = {"token_recycling": TokenRecycling, "suffix_decoding": SuffixDecoding}[name]
    monkeypatch.setattr(drafter, "forget", lambda self: None)
    if name == "suffix_decoding":  # setup builds its trees through forget: keep that, skip only the runner's call
        monkeypatch.setattr(drafter, "setup", lambda self, target, tokenizer: self._new_run())
    result = conformance.run_check(name, "forget")
    assert result.passed is False and "after forget" in result.detail, result.detail


def accept_first_branch(tree, logits, sampling, generator=None):
    """A lossy rule: accepts every drafted token of the first branch, right or wrong."""
    from specbench.core.acceptance import accept_match

    path = [0]
    while (child := next((i for i, p in enumerate(tree.parents) if p == path[-1]), None)) is not None:
        path.append(child)
    return dataclasses.replace(accept_match(tree, logits, sampling, generator), path=path)


@pytest.mark.parametrize("check", ["greedy", "sampling"])
def test_a_lossy_acceptance_rule_fails_the_exactness_checks(monkeypatch, check):
    """Negative controls: with a rule that accepts drafts blindly, greedy output and the sampled law both fail."""
    from specbench.core import rules

    conformance.ar_output(conformance.prompts()[0], conformance.GREEDY_TOKENS)  # the truth, from the real rule
    monkeypatch.setitem(rules.ACCEPTANCE_RULES, "match", accept_first_branch)
    result = conformance.run_check("pld", check)
    assert result.passed is False and ("differs from AR" in result.detail or "differs from the target" in result.detail)


@pytest.mark.slow
def test_a_drafter_that_misreports_its_draft_law_fails_the_sampling_check(monkeypatch):
    """Negative control: prompt lookup's deterministic drafts reported to the speculative rule as drawn from a law
    that gives them 0.9 (tests/broken_drafters.py): a total-variation bias of 3 % on the first three tokens, which
    the chi-square misses and the drafted-token statistic catches."""
    misreported = ("method.acceptance=speculative", "method.drafter._target_=tests.broken_drafters.MisreportedQ")
    monkeypatch.setitem(conformance.STAND_IN_OVERRIDES, "pld", misreported)
    result = conformance.run_check("pld", "sampling")
    assert result.passed is False and "differs from the target" in result.detail, result.detail
    chi_square_p, drafted_z = (float(value) for value in re.findall(r"(?:, p|z) ([-+.\de]+)", result.detail)[:2])
    assert chi_square_p > conformance.SAMPLING_MIN_P and drafted_z > 3.5, result.detail


def test_a_drafter_that_crashes_on_a_bad_knob_fails_the_knob_check(monkeypatch):
    """Negative control: a knob that reaches the code unchecked (a TypeError) is reported as a failure."""
    from specbench.drafters.pld import PromptLookup

    real_init = PromptLookup.__init__

    def unchecked(self, max_ngram_size=3, num_pred_tokens=10, min_ngram_size=1, occurrence="latest"):
        num_pred_tokens + 1  # a bad type fails here, before the knob check
        real_init(self, max_ngram_size, num_pred_tokens, min_ngram_size, occurrence)

    monkeypatch.setattr(PromptLookup, "__init__", unchecked)
    result = conformance.run_check("pld", "knobs")
    assert result.passed is False and "crashed" in result.detail


BROKEN = {
    "out_of_vocabulary": ("OutOfVocabulary", "token id 49152 is outside the target's vocabulary (0..49151)"),
    "forward_parent": ("ForwardParent", "node 1 has parent 2: parents must be earlier nodes"),
    "leftover_rows": ("LeftoverRows", "left 1 rows of its own in the target's KV cache"),
    "crashing": ("Crashing", "IndexError: list index out of range"),
}
"""Broken drafters (tests/broken_drafters.py) as methods, with what their FAIL lines must say."""


def broken_methods(folder, names) -> None:
    """Method configs for the named broken drafters in ``folder/method``."""
    (folder / "method").mkdir(parents=True)
    for name in names:
        drafter = BROKEN[name][0] if name in BROKEN else name
        (folder / "method" / f"{name}.yaml").write_text(
            f"name: {name}\nengine: loop\nlossless: true\nacceptance: match\n"
            f"drafter:\n  _target_: tests.broken_drafters.{drafter}\n"
        )


def test_the_suite_judges_drafters_that_crash_or_hand_over_bad_trees(tmp_path, monkeypatch, capsys):
    """Negative controls: every broken drafter gets a FAIL line per check with its one-line cause (the loop's
    boundary check names the drafter and what is wrong, before any forward), and the suite goes on to the end."""
    broken_methods(tmp_path, BROKEN)
    monkeypatch.delenv("SPECBENCH_CONFIG_PATH", raising=False)
    code = conformance.main([*BROKEN, "-cd", str(tmp_path), "--checks", "builds", "greedy", "budget"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1 and lines[-1] == f"{2 * len(BROKEN)} check(s) failed"
    for name, (drafter, cause) in BROKEN.items():
        verdicts = [line for line in lines if line.split()[1:2] == [name]]
        assert [line.split()[0] for line in verdicts] == ["pass", "FAIL", "FAIL"], verdicts
        for line in verdicts[1:]:
            assert cause in line and "Traceback" not in line, line
            assert name == "crashing" or drafter in line, line
