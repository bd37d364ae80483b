"""Helpers shared by tests: exact target joints, sampled output counts, chi-square goodness of fit, draws
without replacement, the method configs."""

from __future__ import annotations

import math
from collections import Counter

import torch
from omegaconf import OmegaConf

from specbench.config import CONF_DIR, group_options
from specbench.core.acceptance import Sampling, target_probs


def exact_joint(model, prompt: list[int], length: int, sampling: Sampling) -> dict[tuple, float]:
    """The target's probability of every continuation of ``length`` tokens (small vocabularies only)."""
    from itertools import product

    vocab = model.config.vocab_size
    joint = {}
    with torch.inference_mode():
        for tokens in product(range(vocab), repeat=length):
            logits = model(torch.tensor([prompt + list(tokens[:-1])])).logits[0, len(prompt) - 1 :]  # [length, vocab]
            probs = target_probs(logits.float(), sampling)
            joint[tokens] = float(torch.prod(probs[torch.arange(length), torch.tensor(tokens)]))
    return joint


def sampled_outputs(
    decoder, prompt: list[int], max_new_tokens: int, generator: torch.Generator, trials: int, keep: int | None = None
) -> Counter:
    """How often each output (its first ``keep`` tokens) comes out of ``trials`` seeded generations."""
    counts: Counter = Counter()
    with torch.inference_mode():
        for _ in range(trials):
            counts[tuple(decoder.generate(prompt, max_new_tokens, generator).output_ids[:keep])] += 1
    return counts


def pearson_statistic(counts: dict, expected: dict[tuple, float]) -> float:
    """Pearson's chi-square statistic of ``counts`` against probabilities ``expected`` (no pooling)."""
    trials = sum(counts.values())
    return sum((counts.get(key, 0) - trials * p) ** 2 / (trials * p) for key, p in expected.items())


def chi_square(counts: dict, expected: dict[tuple, float], min_expected: float = 5.0) -> tuple[float, int, float]:
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


def draw_without_replacement(probs: torch.Tensor, k: int, generator: torch.Generator) -> list[int]:
    """Up to ``k`` tokens drawn one after another from ``probs`` [vocab], each from the rest renormalised.

    torch.multinomial without replacement is an exponential race (Gumbel-top-k), whose sorted order
    has exactly this sequential law; fewer than ``k`` come back when the support is smaller.
    """
    k = min(k, int((probs > 0).sum()))
    return torch.multinomial(probs, k, replacement=False, generator=generator).tolist()


def method_options(engine: str | None = None) -> list[str]:
    """The method configs of ``conf/method`` (those run by ``engine`` only, when given), so a new method
    is tested without anyone adding it to a hand-kept list."""
    names = group_options("method")
    if engine is None:
        return names
    return [name for name in names if OmegaConf.load(CONF_DIR / "method" / f"{name}.yaml").get("engine") == engine]


def exit_code(main, *args) -> int:
    """The exit status a command-line ``main`` ends with, whether it returns it or exits with it."""
    try:
        return main(*args)
    except SystemExit as stop:
        return stop.code
