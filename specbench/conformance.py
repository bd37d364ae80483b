"""The conformance suite: what every method is checked for, for free, on tiny random models.

``python -m specbench.conformance [METHOD ...] [-cd DIR]`` runs it on the named methods (default: every
method config, the user's config folders included) and prints one line per check; the test suite runs
the same checks under pytest (``tests/test_conformance.py``, ``--method NAME`` adds a user's method).
Adding a method means adding a drafter and a config: the suite picks the config up.

Checks (docs/adding-a-method.md#what-the-framework-checks-for-you):

- ``builds``: the config composes, its knobs validate and the engine builds on the tiny model.
- ``greedy``: a lossless method's greedy output equals AR's, token for token (prompts that make drafters draft).
- ``budget``: exactly ``max_new_tokens`` tokens for budgets 1, 2 and 7, however many a step could accept.
- ``eos``: generation ends at the first EOS token (equal to AR's output up to it, for lossless methods).
- ``sampling``: at T > 0 the law of the output equals the target's, on a model with a vocabulary of 16: the Pearson
  chi-square of the first 3 tokens, and the drafted-token statistic (how often the emitted token is a drafted one,
  against the target's exact law, at every position a draft covered); lossy methods are exempt. ``--thorough``
  draws ten times as often.
- ``knobs``: every numeric drafter knob given a string is refused with an error naming ``method.drafter.<key>``.
- ``breakdown``: the step breakdown's phases cover each step's time (methods on the shared loop).
- ``resume``: a run stopped after one sample and resumed holds each sample once and records the steps (outputs,
  accepted lengths, drafted tokens, drafter counters) of a run that went through.
- ``compiled``: on the compiled path (``specbench.core.compiled``: a static cache, bucketed widths) the output equals
  the eager path's, greedy (AR's, for a lossless method) and sampled at T > 0 with the same seed (the same draws, so
  the same law); a drafter that declares ``needs_dynamic_cache`` runs eager instead, which the check confirms.
  ``COMPILE_BACKEND`` (``--backend``) is torch.compile's backend: ``inductor`` as in runs; the test suite uses
  ``aot_eager`` (the same traced graphs without code generation, which would cost minutes per bucket on 2 cores).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from itertools import product
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.cli import ArgumentParser, user_errors
from specbench.config import add_user_config_dirs, compose_config, group_options
from specbench.core.acceptance import Sampling, target_probs
from specbench.core.compiled import compiled_verifier
from specbench.core.drafter import DecodeContext, Drafter
from specbench.core.loop import Engine
from specbench.core.tree import DraftTree, child_lists
from specbench.engines import build_engine, check_method, eager_because
from specbench.errors import UserError
from specbench.models.loading import LoadedModel, build_tiny_llama, load_model
from specbench.runner import Runner
from specbench.schema import PHASES

STAND_IN_OVERRIDES: dict[str, tuple[str, ...]] = {
    "self_draft": ("+self_draft_cache=no_corpus",),  # no corpus text to build a cache from
    # p is measured on C4 (the Hub) by default; tests/test_sequoia_tree.py measures one offline
    "sequoia_tree": ("method.drafter.acceptance_vector=[0.6,0.2,0.1,0.05]",),
    "layerskip": ("method.drafter.exit_layer=1",),  # tiny_llama has 2 layers
    # 2 layers: nothing between the first and the last; a short window, so the search runs within a check's tokens
    "swift": ("method.drafter.keep_ends=false", "method.drafter.context_window=8"),
}
"""What the tiny model lacks that a method's defaults expect; every other method runs at its defaults."""

GREEDY_TOKENS = 40
BUDGETS = (1, 2, 7)
SAMPLING = Sampling(temperature=0.7)
SAMPLING_VOCAB = 16  # wider than every method's top-k (Medusa's and EAGLE-2's 10)
LOGIT_SCALE = 8.0  # the small model's output layer scaled up: a law far from uniform, most mass on ~40 outputs
SAMPLING_LENGTH = 3  # the first tokens of each draw, whose joint law the chi-square compares (16^3 outcomes)
DRAW_LENGTH = 8  # tokens per draw: the drafted-token statistic reads every position a draft covered
SAMPLING_TRIALS = 600
THOROUGH_TRIALS = 6000  # --thorough: ten times the draws, about three times the z of a given bias
SAMPLING_MIN_P = 1e-3  # a lossless method fails one run in a thousand by chance (both statistics together)
LAW_BATCH = 200  # draws per teacher-forced forward that computes the target's law along their outputs
SAMPLING_SEED_PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
BREAKDOWN_TOLERANCE = 0.03
COMPILE_BACKEND = "inductor"
CHECKS = ("builds", "greedy", "budget", "eos", "sampling", "knobs", "breakdown", "forget", "resume", "compiled")


@dataclass(frozen=True)
class Result:
    """One check's outcome: ``passed`` is None for a check that does not apply (``detail`` says why)."""

    method: str
    check: str
    passed: bool | None
    detail: str


# -- the subjects and their models -----------------------------------------------------------------


def methods() -> list[str]:
    """Every method config (packaged and the user's config folders)."""
    return group_options("method")


def method_config(name: str, *extra: str) -> DictConfig:
    """The method's config composed on the tiny model, with its stand-in overrides and ``extra``."""
    return compose_config("model=tiny_llama", f"method={name}", *STAND_IN_OVERRIDES.get(name, ()), *extra).method


@cache
def tiny_lm() -> LoadedModel:
    """The ``tiny_llama`` model (random weights, the embedded tokenizer), with no EOS token."""
    lm = load_model(compose_config("model=tiny_llama").model, torch.device("cpu"), torch.float32)
    return dataclasses.replace(lm, eos_ids=frozenset())


@cache
def small_vocab_lm() -> LoadedModel:
    """A tiny random Llama with a vocabulary of SAMPLING_VOCAB tokens, so its output law can be computed exactly;
    its logits scaled by LOGIT_SCALE so that the law is peaked enough for a chi-square test of 600 draws."""
    arch = dict(OmegaConf.to_container(compose_config("model=tiny_llama").model.tiny))
    seed = arch.pop("seed")
    model = build_tiny_llama(SAMPLING_VOCAB, seed, **arch)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(LOGIT_SCALE)
    return LoadedModel(model, None, "tiny_llama", "tiny", frozenset(), arch["max_position_embeddings"])


def engine_for(
    name: str, lm: LoadedModel, sampling: Sampling | None = None, breakdown: bool = False, compiled: bool = False
) -> Engine:
    """The method's engine on ``lm`` (greedy unless ``sampling`` says otherwise; step breakdown as asked; on the
    compiled path with ``COMPILE_BACKEND`` when ``compiled``)."""
    verifier = compiled_verifier(lm.model, COMPILE_BACKEND) if compiled else None
    return build_engine(method_config(name), lm, sampling or Sampling(), breakdown, verifier)


def generate(engine: Engine, prompt: list[int], max_new_tokens: int, seed: int | None = None):
    """One generation without autograd (seeded when ``seed`` is given)."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    with torch.inference_mode():
        return engine.generate(prompt, max_new_tokens, generator)


def is_lossless(name: str) -> bool:
    """Whether the method's config declares it lossless."""
    return bool(method_config(name).get("lossless", False))


@cache
def prompts() -> tuple[tuple[int, ...], ...]:
    """Prompts drafters can draft from: repeated phrases, then AR's own continuation (which tends to loop)."""
    ar = engine_for("ar", tiny_lm())
    chosen = []
    for seed in range(2):
        rng = random.Random(seed)
        phrase = [rng.randrange(97) for _ in range(8)]
        prompt = phrase * 3 + [rng.randrange(97) for _ in range(4)] + phrase[:3]
        chosen.append(tuple(prompt + generate(ar, prompt, 24).output_ids))
    return tuple(chosen)


@cache
def ar_output(prompt: tuple[int, ...], max_new_tokens: int) -> tuple[int, ...]:
    """AR's greedy output on the tiny model (the reference every lossless method must equal)."""
    return tuple(generate(engine_for("ar", tiny_lm()), list(prompt), max_new_tokens).output_ids)


# -- the checks ------------------------------------------------------------------------------------


def check_builds(name: str) -> str:
    """The config composes, the knobs validate before any model loads, the engine builds on the tiny model."""
    check_method(method_config(name))
    engine_for(name, tiny_lm())
    return "composes, validates and builds on tiny_llama"


def check_greedy(name: str) -> str:
    """Greedy output equals AR's on every prompt (one engine reused: reset must clear per-request state)."""
    engine = engine_for(name, tiny_lm())
    steps = 0
    for index, prompt in enumerate(prompts()):
        truth = ar_output(prompt, GREEDY_TOKENS)
        gen = generate(engine, list(prompt), GREEDY_TOKENS)
        if tuple(gen.output_ids) != truth:
            first = next((i for i, (a, b) in enumerate(zip(gen.output_ids, truth)) if a != b), len(truth))
            raise AssertionError(f"prompt {index}: output differs from AR at token {first}")
        steps += gen.target_forwards
    return f"{len(prompts())} prompts x {GREEDY_TOKENS} tokens equal AR ({steps} verify steps)"


def check_budget(name: str) -> str:
    """Exactly ``max_new_tokens`` tokens, stop reason ``max_new_tokens``, for small budgets."""
    engine = engine_for(name, tiny_lm())
    prompt = list(prompts()[0])
    for budget in BUDGETS:
        gen = generate(engine, prompt, budget)
        if len(gen.output_ids) != budget or gen.stop_reason != "max_new_tokens":
            raise AssertionError(f"budget {budget}: {len(gen.output_ids)} tokens, stop reason {gen.stop_reason}")
        if is_lossless(name) and tuple(gen.output_ids) != ar_output(tuple(prompt), GREEDY_TOKENS)[:budget]:
            raise AssertionError(f"budget {budget}: the output is not AR's first {budget} tokens")
    return f"budgets {list(BUDGETS)} give exactly that many tokens"


def check_eos(name: str) -> str:
    """With an EOS token that AR emits mid-output, generation stops right after its first occurrence."""
    prompt = prompts()[1]
    truth = ar_output(prompt, GREEDY_TOKENS)
    index = next(i for i in range(5, len(truth)) if truth[i] not in truth[:i])
    eos = truth[index]
    lm = dataclasses.replace(tiny_lm(), eos_ids=frozenset({eos}))
    gen = generate(engine_for(name, lm), list(prompt), GREEDY_TOKENS)
    out = gen.output_ids
    if gen.stop_reason == "eos" and (eos in out[:-1] or out[-1] != eos):
        raise AssertionError(f"stopped for EOS but EOS {eos} is not the last token only")
    if is_lossless(name) and tuple(out) != truth[: index + 1]:
        raise AssertionError(f"output {len(out)} tokens, AR stops at EOS after {index + 1}")
    if gen.stop_reason != "eos" and eos in out:
        raise AssertionError("EOS emitted but generation went on")
    return f"stops at EOS (token {index} of AR's output)"


@cache
def sampling_prompt() -> tuple[int, ...]:
    """The small model's looping greedy continuation of a repeated phrase: its likely next tokens have
    occurred before, so n-gram drafters draft (and get drafts accepted) in most trials."""
    ar = engine_for("ar", small_vocab_lm())
    return tuple(SAMPLING_SEED_PROMPT + generate(ar, SAMPLING_SEED_PROMPT, 24).output_ids)


@cache
def exact_output_law(length: int = SAMPLING_LENGTH) -> dict[tuple[int, ...], float]:
    """The small-vocabulary model's probability of every continuation of ``length`` tokens at SAMPLING
    (one forward per prefix of ``length - 1`` tokens gives the laws of all its completions)."""
    model = small_vocab_lm().model
    law = {}
    with torch.inference_mode():
        for prefix in product(range(SAMPLING_VOCAB), repeat=length - 1):
            prompt = list(sampling_prompt())
            logits = model(torch.tensor([prompt + list(prefix)])).logits[0, len(prompt) - 1 :]
            probs = target_probs(logits.float(), SAMPLING)  # [length, vocab]
            along = float(torch.prod(probs[torch.arange(length - 1), torch.tensor(prefix, dtype=torch.long)]))
            for last in range(SAMPLING_VOCAB):
                law[prefix + (last,)] = along * float(probs[length - 1, last])
    return law


def chi_square(counts: dict, expected: dict, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson chi-square of ``counts`` against probabilities ``expected``: (statistic, dof, p-value).

    Cells expected below ``min_expected`` draws are pooled into one cell (so the chi-square law holds);
    an observed outcome of probability 0 gives an infinite statistic. The p-value uses the
    Wilson-Hilferty normal approximation (good to ~10% relative at p = 1e-3 for dof >= 3).
    """
    trials = sum(counts.values())
    if any(count and expected.get(key, 0.0) == 0.0 for key, count in counts.items()):
        return math.inf, 0, 0.0
    stat, pooled_count, pooled_expected, cells = 0.0, 0, 0.0, 0
    for key, prob in expected.items():
        mean = trials * prob
        if mean < min_expected:
            pooled_count += counts.get(key, 0)
            pooled_expected += mean
            continue
        stat += (counts.get(key, 0) - mean) ** 2 / mean
        cells += 1
    if pooled_expected > 0:
        stat += (pooled_count - pooled_expected) ** 2 / pooled_expected
        cells += 1
    dof = cells - 1
    return stat, dof, chi_square_sf(stat, dof)


def chi_square_sf(stat: float, dof: int) -> float:
    """P(X >= stat) for X ~ chi-square(dof), by the Wilson-Hilferty cube-root normal approximation."""
    scale = 2.0 / (9.0 * dof)
    z = ((stat / dof) ** (1.0 / 3.0) - (1.0 - scale)) / math.sqrt(scale)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass(frozen=True)
class Proposal:
    """One step's draft as the sampling check reads it: where it starts, its tree, and whether it counts."""

    done: int  # output tokens committed before the step (the first one it emits is output[done])
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    counts: bool  # the draft is independent of the token the step emits, given the output before it


@dataclass
class Draw:
    """One seeded generation of the sampling check: its output and the drafts of its steps."""

    output: list[int]
    proposals: list[Proposal]


@contextmanager
def recorded(engine: Engine) -> Iterator[list[Proposal]]:
    """The drafts ``engine`` proposes while the block runs (none for an engine without a drafter on the loop).

    A draft counts when the emitted token's law cannot depend on it: one-hot drafts (no ``draft_probs``: every rule
    then draws the emitted token from the target's law whatever was drafted), or drafts whose ``propose`` drew
    nothing from the run's generator (deterministic given the past: their only correct law is one-hot). A sampled
    draft with its draft law is tied to the emitted token by the speculative rule on purpose, so it does not count.
    """
    drafter = getattr(engine, "drafter", None)
    proposals: list[Proposal] = []
    if not isinstance(drafter, Drafter):
        yield proposals
        return
    propose = drafter.propose

    def recording(ctx: DecodeContext) -> DraftTree:
        generator = ctx.generator
        before = generator.get_state() if generator is not None else None
        tree = propose(ctx)
        drew = generator is not None and before is not None and not torch.equal(before, generator.get_state())
        counts = tree.draft_probs is None or not drew
        proposals.append(Proposal(len(ctx.tokens) - ctx.prompt_len, tuple(tree.tokens), tuple(tree.parents), counts))
        return tree

    drafter.propose = recording  # type: ignore[method-assign]
    try:
        yield proposals
    finally:
        del drafter.propose


def sampled_draws(engine: Engine, trials: int = SAMPLING_TRIALS) -> list[Draw]:
    """``trials`` generations of DRAW_LENGTH tokens seeded 0, 1, ..., with their drafts."""
    draws = []
    with recorded(engine) as proposals:
        for seed in range(trials):
            output = generate(engine, list(sampling_prompt()), DRAW_LENGTH, seed).output_ids
            draws.append(Draw(output, list(proposals)))
            proposals.clear()
    return draws


def output_laws(outputs: list[list[int]]) -> list[torch.Tensor]:
    """Per output, the target's law at SAMPLING of each of its tokens given the ones before ([length, vocab]), from
    teacher-forced forwards over prompt + output (batched by length)."""
    model, prompt = small_vocab_lm().model, list(sampling_prompt())
    laws: list[torch.Tensor] = [torch.empty(0)] * len(outputs)
    by_length: dict[int, list[int]] = {}
    for index, output in enumerate(outputs):
        by_length.setdefault(len(output), []).append(index)
    with torch.inference_mode():
        for indices in by_length.values():
            for start in range(0, len(indices), LAW_BATCH):
                batch = indices[start : start + LAW_BATCH]
                ids = torch.tensor([prompt + outputs[i][:-1] for i in batch])  # [batch, prompt + length - 1]
                logits = model(ids).logits[:, len(prompt) - 1 :]  # [batch, length, vocab]
                for i, probs in zip(batch, target_probs(logits.float(), SAMPLING)):
                    laws[i] = probs
    return laws


def drafted_positions(draw: Draw, laws: torch.Tensor) -> Iterator[tuple[bool, float]]:
    """At every position of the output that a counting draft covered: whether the emitted token is one of the
    tokens drafted there, and the target's probability of those tokens given the output before it.

    A step's draft covers the positions along its accepted path: at each, the drafted children of the node reached
    (accepted or rejected: the law of the token emitted next to them is what a lossy rule changes).
    """
    for proposal in draw.proposals:
        if not proposal.counts:
            continue
        children = child_lists(proposal.parents)
        node, position = 0, proposal.done
        while position < len(draw.output) and children[node]:
            drafted = {proposal.tokens[child]: child for child in children[node]}
            emitted = draw.output[position]
            yield emitted in drafted, float(laws[position][list(drafted)].sum())
            if emitted not in drafted:
                break
            node, position = drafted[emitted], position + 1


def drafted_token_statistic(draws: list[Draw]) -> tuple[float, int, float]:
    """(z, positions, two-sided p-value) of how often the emitted token is a drafted one, against the target's law.

    Under a lossless method each position adds ``hit - p`` with mean zero given the output before it (a martingale
    difference of variance ``p (1 - p)``), so the sum over n positions divided by its standard deviation is close to
    N(0, 1). A lossy rule or a draft law that misreports moves the emitted token towards (or away from) the drafts
    at every such position, which this one degree of freedom collects, where the chi-square spreads it over all
    outputs.
    """
    hits = expected = variance = 0.0
    positions = 0
    for draw, laws in zip(draws, output_laws([draw.output for draw in draws])):
        for hit, p in drafted_positions(draw, laws):
            hits += hit
            expected += p
            variance += p * (1.0 - p)
            positions += 1
    if variance <= 0.0:
        return 0.0, positions, 1.0
    z = (hits - expected) / math.sqrt(variance)
    return z, positions, math.erfc(abs(z) / math.sqrt(2.0))


def check_sampling(name: str, trials: int = SAMPLING_TRIALS) -> str:
    """At T > 0 the output law is the target's: the chi-square of the first SAMPLING_LENGTH tokens' joint law and the
    drafted-token statistic each have a p-value above SAMPLING_MIN_P / 2."""
    draws = sampled_draws(engine_for(name, small_vocab_lm(), SAMPLING), trials)
    counts = Counter(tuple(draw.output[:SAMPLING_LENGTH]) for draw in draws)
    stat, dof, p_value = chi_square(counts, exact_output_law())
    z, positions, z_p_value = drafted_token_statistic(draws)
    verdict = (
        f"T={SAMPLING.temperature}, {trials} draws: chi2 {stat:.1f} on {dof} dof, p {p_value:.2g}; drafted tokens "
        f"z {z:+.2f} over {positions} positions, p {z_p_value:.2g}"
    )
    if min(p_value, z_p_value) <= SAMPLING_MIN_P / 2:
        raise AssertionError(f"output law differs from the target's: {verdict}")
    return verdict


def numeric_knobs(cfg: DictConfig) -> list[str]:
    """The drafter's knobs whose default is a number (not a bool), in config order."""
    drafter = OmegaConf.to_container(cfg.drafter, resolve=True)
    assert isinstance(drafter, dict)
    return [
        str(key)
        for key, value in drafter.items()
        if key != "_target_" and isinstance(value, (int, float)) and not isinstance(value, bool)
    ]


def check_knobs(name: str) -> str:
    """Each numeric knob given a string is refused before any model loads, naming the knob."""
    knobs = numeric_knobs(method_config(name))
    for key in knobs:
        try:
            check_method(method_config(name, f"method.drafter.{key}=abc"))
        except UserError as error:
            if f"method.drafter.{key}" not in str(error):
                raise AssertionError(f"method.drafter.{key}=abc: the error does not name the knob: {error}") from None
        except Exception as error:  # a crash instead of a clear error is what this check exists to find
            crash = " ".join(f"{type(error).__name__}: {error}".split())
            raise AssertionError(f"method.drafter.{key}=abc crashed ({crash[:160]})") from None
        else:
            raise AssertionError(f"method.drafter.{key}=abc was accepted")
    return f"{len(knobs)} numeric knobs refuse a string, naming the knob" if knobs else "no numeric knobs"


def check_breakdown(name: str) -> str:
    """Every phase is timed once per step and the phases cover the step time within BREAKDOWN_TOLERANCE."""
    gen = generate(engine_for(name, tiny_lm(), breakdown=True), list(prompts()[0]), GREEDY_TOKENS)
    assert gen.step_s is not None
    for phase in PHASES:
        laps = getattr(gen, f"{phase}_s")
        if laps is None or len(laps) != gen.target_forwards or min(laps, default=0.0) < 0:
            raise AssertionError(f"phase {phase}: not one non-negative time per step")
    phases = sum(sum(getattr(gen, f"{phase}_s")) for phase in PHASES)
    steps = sum(gen.step_s)
    if phases > steps or abs(phases - steps) > BREAKDOWN_TOLERANCE * steps:
        raise AssertionError(f"phases sum to {phases:.4f} s of {steps:.4f} s of steps")
    return f"phases cover {phases / steps:.1%} of the step time"


RESUME_PROMPTS = "Name a color.\nCount to three.\nCount to three.\nName a color.\n"
"""Prompts of the resume check: repeats, so that what a drafter keeps across requests changes what it drafts."""
RESUME_LIMITS = (1, 4)
RESUME_FIELDS = (
    "output_ids",
    "target_forwards",
    "accept_lengths",
    "draft_tokens",
    "draft_depth",
    "verify_tokens",
    "side_branch",
)
"""What a resumed run's records must share with an uninterrupted run's (with the drafter's counters, timers aside)."""


def resume_run(name: str, folder: Path, limits: tuple[int, ...]) -> list[dict]:
    """The records of runs of the method over RESUME_PROMPTS into one folder, one per limit (the default warm-up)."""
    prompts_file = folder.parent / "prompts.txt"
    prompts_file.write_text(RESUME_PROMPTS)
    for limit in limits:
        cfg = compose_config(
            "model=tiny_llama",
            f"method={name}",
            *STAND_IN_OVERRIDES.get(name, ()),
            "dataset=jsonl",
            f"dataset.path={prompts_file}",
            f"limit={limit}",
            "max_new_tokens=12",
            "progress=false",
            f"output_dir={folder}",
        )
        Runner(cfg).run()
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]


def steps_of(record: dict) -> dict:
    """What a record says about the steps of its generation: RESUME_FIELDS and the drafter's counters (no timers)."""
    stats = {key: value for key, value in (record["drafter_stats"] or {}).items() if not key.endswith("_s")}
    return {**{field: record[field] for field in RESUME_FIELDS}, "drafter_stats": stats}


def generation_steps(engine: Engine, prompt: tuple[int, ...]) -> dict:
    """What a greedy generation of ``prompt`` says about its steps (``steps_of`` its record's fields); seeded, as a
    run's sample is, so random pads (LADE, Self-Draft) are drawn alike."""
    gen = generate(engine, list(prompt), GREEDY_TOKENS, seed=0)
    return steps_of({**{field: getattr(gen, field) for field in RESUME_FIELDS}, "drafter_stats": engine.stats()})


def check_forget(name: str) -> str:
    """An engine that generated and then forgot (``Engine.forget``, as after the runner's warm-up) records the same
    steps on a prompt as a freshly built one: what a drafter keeps across requests is dropped, counters included."""
    first, second = prompts()
    expected = generation_steps(engine_for(name, tiny_lm()), second)
    used = engine_for(name, tiny_lm())
    for prompt in (second, first):  # what it learns from the prompt asked again, then from another
        generate(used, list(prompt), GREEDY_TOKENS)
    used.forget()
    got = generation_steps(used, second)
    different = sorted(key for key, value in expected.items() if got[key] != value)
    if different:
        raise AssertionError(f"after forget, a generation recorded other {different} than on a freshly built engine")
    return "two generations, then forget: the next records the steps of a freshly built engine"


def check_resume(name: str) -> str:
    """A run stopped after its first sample and resumed holds each sample once and records the same steps as a run
    that went through: what a drafter keeps across requests is rebuilt before the first pending sample."""
    with tempfile.TemporaryDirectory() as folder:
        resumed = resume_run(name, Path(folder) / "resumed", RESUME_LIMITS)
        straight = resume_run(name, Path(folder) / "straight", RESUME_LIMITS[-1:])
    ids = [record["sample_id"] for record in resumed]
    if ids != [record["sample_id"] for record in straight]:
        raise AssertionError(f"after resuming to limit={RESUME_LIMITS[-1]} the run holds samples {ids}")
    for before, after in zip(straight, resumed):
        different = {key for key, value in steps_of(before).items() if steps_of(after)[key] != value}
        if different:
            raise AssertionError(
                f"sample {before['sample_id']} recorded other {sorted(different)} after the resume than without it"
            )
    return f"limit {RESUME_LIMITS[0]} then {RESUME_LIMITS[-1]}: each sample once, the steps of an uninterrupted run"


def check_compiled(name: str) -> str:
    """Compiled output equals eager output on a prompt, greedy (AR's for a lossless method) and sampled at SAMPLING
    with one seed; a method that cannot run compiled says why and runs eager."""
    reason = eager_because(method_config(name), check_method(method_config(name)))
    prompt = prompts()[0]
    for sampling, seed in ((Sampling(), None), (SAMPLING, 0)):
        engine = engine_for(name, tiny_lm(), sampling, compiled=True)
        if engine.compiled == (reason is not None):
            raise AssertionError(f"compiled={engine.compiled}, but the method's reason to run eager is {reason!r}")
        out = tuple(generate(engine, list(prompt), GREEDY_TOKENS, seed).output_ids)
        if sampling.greedy and is_lossless(name):
            truth = ar_output(prompt, GREEDY_TOKENS)
        else:
            truth = tuple(generate(engine_for(name, tiny_lm(), sampling), list(prompt), GREEDY_TOKENS, seed).output_ids)
        if out != truth:
            first = next((i for i, (a, b) in enumerate(zip(out, truth)) if a != b), len(truth))
            raise AssertionError(f"T={sampling.temperature}: the output differs from the eager path's at token {first}")
    path = "compiled" if reason is None else f"eager ({reason})"
    return f"{path}: greedy and sampled (T={SAMPLING.temperature}, one seed) outputs equal the eager path's"


CHECK_FUNCTIONS: dict[str, Callable[[str], str]] = {
    "builds": check_builds,
    "greedy": check_greedy,
    "budget": check_budget,
    "eos": check_eos,
    "sampling": check_sampling,
    "knobs": check_knobs,
    "breakdown": check_breakdown,
    "forget": check_forget,
    "resume": check_resume,
    "compiled": check_compiled,
}


def not_applicable(name: str, check: str) -> str | None:
    """Why ``check`` does not apply to the method (None when it does): exactness needs a lossless method,
    knobs and the breakdown need a drafter on the shared loop."""
    cfg = method_config(name)
    if check in ("greedy", "sampling") and not cfg.get("lossless", False):
        return "lossy (lossless: false): its outputs are not the target's"
    if check in ("knobs", "breakdown", "compiled") and cfg.engine != "loop":
        return f"engine {cfg.engine}: no drafter on the shared loop"
    return None


def run_check(name: str, check: str, thorough: bool = False) -> Result:
    """One check on one method (``thorough``: the sampling check draws THOROUGH_TRIALS); whatever it raises (a failed
    assertion, a user error, a crash in the drafter) is a failure captured in the Result with its one-line cause, so
    the suite goes on to the next check."""
    try:
        reason = not_applicable(name, check)
        if reason is not None:
            return Result(name, check, None, reason)
        if check == "sampling" and thorough:
            return Result(name, check, True, check_sampling(name, THOROUGH_TRIALS))
        return Result(name, check, True, CHECK_FUNCTIONS[check](name))
    except Exception as failure:  # a judge: every crash is a verdict, not the end of the suite
        return Result(name, check, False, one_line(failure))


def one_line(error: Exception) -> str:
    """An exception as one line: its message (with its type unless it is a failed check or a user error)."""
    message = next((line.strip() for line in str(error).splitlines() if line.strip()), "(no message)")
    return message if isinstance(error, (AssertionError, UserError)) else f"{type(error).__name__}: {message}"


# -- the command line ------------------------------------------------------------------------------


def _parser() -> ArgumentParser:
    """The command line of ``python -m specbench.conformance``."""
    parser = ArgumentParser(prog="python -m specbench.conformance", description=__doc__.splitlines()[0])
    parser.add_argument("methods", nargs="*", metavar="METHOD", help="method configs (default: every one)")
    parser.add_argument("--config-dir", "-cd", dest="config_dirs", action="append", default=[], metavar="DIR")
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS), help="which checks to run")
    parser.add_argument(
        "--thorough",
        action="store_true",
        help=f"the sampling check with {THOROUGH_TRIALS} draws instead of {SAMPLING_TRIALS} (minutes per method)",
    )
    parser.add_argument(
        "--backend", default=COMPILE_BACKEND, help="torch.compile's backend for the compiled check (default inductor)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks, print one line each; exit 1 if any failed."""
    args = _parser().parse_args(argv)
    global COMPILE_BACKEND
    COMPILE_BACKEND = args.backend
    with user_errors(argv):
        add_user_config_dirs(args.config_dirs)
        names = args.methods or methods()
        unknown = sorted(set(names) - set(methods()))
        if unknown:
            raise UserError(f"unknown method {unknown[0]!r}; choose one of {methods()}")
        failed = 0
        for name in names:
            for check in args.checks:
                result = run_check(name, check, args.thorough)
                mark = {True: "pass", False: "FAIL", None: "n/a "}[result.passed]
                print(f"{mark}  {name:20s} {check:10s} {result.detail}", flush=True)
                failed += result.passed is False
    print(f"{failed} check(s) failed" if failed else "every check passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
