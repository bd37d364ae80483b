"""ANPD and prompt lookup through the shared loop: greedy output equals AR, drafts get accepted."""

import random

import pytest
import torch

from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.drafters.anpd import ANPD
from specbench.drafters.ar import NoDraft
from specbench.drafters.pld import PromptLookup
from specbench.errors import ConfigError
from tests.test_loop import ar_greedy

DRAFTERS = {
    "anpd": lambda: ANPD(),
    "anpd_no_mln": lambda: ANPD(multi_level=False),
    "anpd_pad": lambda: ANPD(on_miss="pad"),
    "pld": lambda: PromptLookup(),
    "pld_first": lambda: PromptLookup(occurrence="first"),
}


GREEDY = Sampling()


def decode(model, drafter, prompt, max_new_tokens, eos_ids=frozenset(), sampling=GREEDY, generator=None):
    with torch.inference_mode():
        return Decoder(model, drafter, eos_ids, sampling).generate(prompt, max_new_tokens, generator)


def embedded_multi_token_steps(embedded, drafter, max_new_tokens: int = 48) -> int:
    """Decode CODE_PROMPTS on the embedded model with ``drafter`` (set up on it), asserting each output equals
    AR's; returns how many steps emitted more than one token."""
    model, tok = embedded.model, embedded.tokenizer
    drafter.setup(model, tok)
    multi_token_steps = 0
    for text in CODE_PROMPTS:
        prompt = tok(text)["input_ids"]
        truth = ar_greedy(model, prompt, max_new_tokens, embedded.eos_ids)
        gen = decode(model, drafter, prompt, max_new_tokens, embedded.eos_ids)
        assert gen.output_ids == truth.output_ids
        multi_token_steps += sum(length > 1 for length in gen.accept_lengths)
    return multi_token_steps


def repetitive_prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    phrase = [rng.randrange(97) for _ in range(8)]
    return phrase * 3 + [rng.randrange(97) for _ in range(4)] + phrase[:3]


def looping_prompt(model, seed: int) -> list[int]:
    """A prompt followed by the model's own greedy continuation, which the model then tends to repeat."""
    prompt = repetitive_prompt(seed)
    return prompt + ar_greedy(model, prompt, 30).output_ids


def eos_inside_a_draft(gen) -> int | None:
    """Output index of a token's first occurrence strictly inside a step's accepted draft (drafts on both sides)."""
    out, done = gen.output_ids, 1  # the prefill emitted output[0]
    for length in gen.accept_lengths:
        for index in range(done + 1, done + length - 1):  # not the first drafted token, not the bonus
            if out[index] not in out[:index]:
                return index
        done += length
    return None


@pytest.fixture(scope="module")
def tiny_truths(tiny) -> list[tuple[list[int], list[int]]]:
    """(prompt, AR greedy output of 60 tokens) for three repetitive prompts."""
    return [(prompt, ar_greedy(tiny, prompt, 60).output_ids) for prompt in map(repetitive_prompt, range(3))]


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_equals_ar_on_tiny(tiny, tiny_truths, name):
    multi_token_steps = 0
    for prompt, truth in tiny_truths:
        drafter = DRAFTERS[name]()
        gen = decode(tiny, drafter, prompt, 60)
        assert gen.output_ids == truth
        assert sum(gen.accept_lengths) == 59
        multi_token_steps += sum(length > 1 for length in gen.accept_lengths)
        stats = drafter.stats()
        assert stats["steps"] == gen.target_forwards
        assert stats["accepted_tokens"] == 59 - gen.target_forwards  # no EOS or budget cut here
    assert multi_token_steps >= 5


@pytest.mark.parametrize("name", ["anpd", "pld"])
def test_eos_inside_an_accepted_draft_and_budget_cuts_on_tiny(tiny, name):
    for seed in range(2):
        prompt = looping_prompt(tiny, seed)
        full = decode(tiny, DRAFTERS[name](), prompt, 40)
        index = eos_inside_a_draft(full)
        assert index is not None
        eos = frozenset({full.output_ids[index]})
        gen = decode(tiny, DRAFTERS[name](), prompt, 40, eos)
        assert gen.output_ids == full.output_ids[: index + 1] == ar_greedy(tiny, prompt, 40, eos).output_ids
        assert gen.stop_reason == "eos" and gen.accept_lengths[-1] > 1
    prompt = repetitive_prompt(1)
    truth = ar_greedy(tiny, prompt, 40).output_ids
    drafter = DRAFTERS[name]()  # one drafter reused: reset must clear everything between generations
    for budget in (1, 2, 5, 9, 17, 31):
        gen = decode(tiny, drafter, prompt, budget)
        assert gen.output_ids == truth[:budget] and gen.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("name", ["anpd", "pld"])
def test_sampling_draws_the_same_tokens_as_ar(tiny, name):
    """Sample-and-match consumes one target draw per emitted token, so with one seed it replays AR's samples."""
    sampling = Sampling(temperature=0.7, top_p=0.9)
    prompt = repetitive_prompt(2)
    for seed in range(3):
        ar = decode(tiny, NoDraft(), prompt, 40, sampling=sampling, generator=torch.Generator().manual_seed(seed))
        gen = decode(
            tiny, DRAFTERS[name](), prompt, 40, sampling=sampling, generator=torch.Generator().manual_seed(seed)
        )
        assert gen.output_ids == ar.output_ids


def test_configs_instantiate_the_drafters():
    import hydra

    for method, cls, key in [("anpd", ANPD, "draft_len"), ("pld", PromptLookup, "num_pred_tokens")]:
        cfg = compose_config(f"method={method}").method
        assert cfg.engine == "loop" and cfg.lossless and cfg.acceptance == "match"
        drafter = hydra.utils.instantiate(cfg.drafter)
        assert isinstance(drafter, cls) and drafter.draft_len == cfg.drafter[key]
    ablation = hydra.utils.instantiate(compose_config("method=anpd", "method.drafter.multi_level=false").method.drafter)
    assert ablation.table.levels == (5,)


def test_bad_hyper_parameters_name_the_key():
    for make, key in [
        (lambda: ANPD(draft_len=0), "draft_len"),
        (lambda: ANPD(max_ngram_size=1), "max_ngram_size"),
        (lambda: ANPD(on_miss="skip"), "on_miss"),
        (lambda: PromptLookup(num_pred_tokens=0), "num_pred"),
        (lambda: PromptLookup(max_ngram_size=0), "max_ngram_size"),
        (lambda: PromptLookup(occurrence="any"), "occurrence"),
    ]:
        with pytest.raises(ConfigError, match=key):
            make()


CODE_PROMPTS = [
    'def sum_of_squares(numbers: list) -> int:\n    """Return the sum of the squares of numbers.\n'
    '    >>> sum_of_squares([1, 2, 3])\n    14\n    """\n',
    "from typing import List\n\n\ndef filter_by_prefix(strings: List[str], prefix: str) -> List[str]:\n"
    '    """ Filter an input list of strings only for ones that start with a given prefix.\n'
    "    >>> filter_by_prefix([], 'a')\n    []\n    >>> filter_by_prefix(['abc', 'bcd', 'cde', 'array'], 'a')\n"
    "    ['abc', 'array']\n    \"\"\"\n",
]


@pytest.mark.slow
def test_greedy_equals_ar_on_the_embedded_model(embedded):
    model, tok = embedded.model, embedded.tokenizer
    multi_token_steps = 0
    for text in CODE_PROMPTS:
        prompt = tok(text)["input_ids"]
        truth = ar_greedy(model, prompt, 48, embedded.eos_ids)
        for name in ("anpd", "pld"):
            gen = decode(model, DRAFTERS[name](), prompt, 48, embedded.eos_ids)
            assert gen.output_ids == truth.output_ids, name
            multi_token_steps += sum(length > 1 for length in gen.accept_lengths)
    assert multi_token_steps >= 4
    prompt = tok(CODE_PROMPTS[1])["input_ids"]
    full = decode(model, ANPD(), prompt, 48)
    index = eos_inside_a_draft(full)
    assert index is not None
    eos = frozenset({full.output_ids[index]})
    gen = decode(model, ANPD(), prompt, 48, eos)
    assert gen.output_ids == full.output_ids[: index + 1] and gen.accept_lengths[-1] > 1
    assert decode(model, PromptLookup(), prompt, 13).output_ids == full.output_ids[:13]
