"""Every method passes the conformance suite (``specbench.conformance``) on tiny random models.

The methods are read from the method configs, so a new method is covered by adding its drafter and
config; ``pytest tests/test_conformance.py --method NAME [--config-dir DIR]`` runs only the named ones
(a user's own method included). A check that does not apply to a method (greedy equality for a lossy
method, the step breakdown for HF generate) is not generated.
"""

from __future__ import annotations

import dataclasses

import pytest

from specbench import conformance

SLOW_CHECKS = {"sampling", "resume", "compiled"}


@pytest.fixture(autouse=True)
def traced_graphs_only(monkeypatch):
    """The compiled check runs torch.compile's aot_eager backend: the graphs runs compile, traced the same way, without
    inductor's code generation (minutes per bucket on 2 cores); tests/test_compiled.py runs inductor itself."""
    monkeypatch.setattr(conformance, "COMPILE_BACKEND", "aot_eager")


def pytest_generate_tests(metafunc):
    """One test per (method, applicable check)."""
    if "method" not in metafunc.fixturenames:
        return
    named = metafunc.config.getoption("--method")
    names = named or conformance.methods()
    cases = [
        pytest.param(name, check, id=f"{name}-{check}", marks=[pytest.mark.slow] if check in SLOW_CHECKS else [])
        for name in names
        for check in conformance.CHECKS
        if conformance.not_applicable(name, check) is None
    ]
    metafunc.parametrize(("method", "check"), cases)


def test_conformance(method, check):
    """The check passes (its detail says what was measured)."""
    result = conformance.run_check(method, check)
    assert result.passed, result.detail


def test_every_method_is_covered():
    """Each method config gets the checks that apply to it; every method at least builds, bounds and stops."""
    for name in conformance.methods():
        applicable = [check for check in conformance.CHECKS if conformance.not_applicable(name, check) is None]
        assert {"builds", "budget", "eos", "resume"} <= set(applicable), name


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
