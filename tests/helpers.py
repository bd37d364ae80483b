"""Helpers shared by tests: exact target joints, sampled output counts, draws
without replacement, the method configs."""

from __future__ import annotations

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


def embedded_head(cached, train_main, folder, shared_data, settings: list[str]) -> tuple[object, bool]:
    """The model-config node of the embedded model's head that ``python -m specbench.train ...`` cached in ``cached``
    (and True), else of a stand-in trained into ``folder`` in seconds (8 prompts x 32 tokens plus ``settings``)
    by ``train_main`` (and False), so tests of trained heads never skip on a fresh clone."""
    if (cached / "manifest.json").is_file():
        return OmegaConf.create({"source": "trained"}), True
    args = [
        "model=smollm2_135m",
        f"data_dir={shared_data}",
        f"output_dir={folder}",
        "prompts.max_prompts=8",
        "prompts.max_new_tokens=32",
        "train.max_minutes=null",
        "train.batch_size=4",
        "train.eval_sequences=2",
        "progress=false",
        *settings,
    ]
    return OmegaConf.create({"source": "hub", "path": str(train_main(args))}), False
