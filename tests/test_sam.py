"""SAM-Decoding: the suffix automaton against brute force, greedy = AR through the shared loop, knobs."""

import random

import hydra
import pytest
import torch

from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.drafters.ar import NoDraft
from specbench.drafters.sam import SAMDecoding
from specbench.errors import ConfigError, DataUnavailable
from specbench.structures.suffix_automaton import SEPARATOR, SuffixAutomaton, SuffixMatcher
from tests.test_anpd_pld import CODE_PROMPTS, decode, looping_prompt, repetitive_prompt
from tests.test_loop import ar_greedy

# -- brute-force references ------------------------------------------------------------------------


def longest_earlier_match(tokens: list[int]) -> int:
    """The length of the longest suffix of ``tokens`` that also ends at an earlier position."""
    n, best = len(tokens), 0
    for end in range(n - 1):
        length = 0
        while length <= end and tokens[end - length] == tokens[n - 1 - length]:
            length += 1
        best = max(best, length)
    return best


def longest_suffix_in(text: list[int], stream: list[int]) -> int:
    """The length of the longest suffix of ``stream`` that occurs somewhere in ``text``."""
    for length in range(len(stream), 0, -1):
        suffix = stream[len(stream) - length :]
        if any(text[i : i + length] == suffix for i in range(len(text) - length + 1)):
            return length
    return 0


def first_end(text: list[int], pattern: list[int]) -> int:
    """End position of the first occurrence of ``pattern`` in ``text``."""
    n = len(pattern)
    return next(i + n - 1 for i in range(len(text) - n + 1) if text[i : i + n] == pattern)


# -- the automaton ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_dynamic_match_equals_brute_force_on_random_sequences(seed):
    """After every append, ``repeat`` is the longest earlier suffix match, at its first occurrence."""
    rng = random.Random(seed)
    for _ in range(40):
        vocab = rng.choice([1, 2, 3, 5, 30])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 80))]
        automaton = SuffixAutomaton()
        for i, token in enumerate(tokens):
            automaton.append(token)
            prefix = tokens[: i + 1]
            state, length = automaton.repeat()
            assert length == longest_earlier_match(prefix), prefix
            if length:
                suffix = prefix[len(prefix) - length :]
                end = automaton.first_end[state]
                assert end == first_end(prefix, suffix) < i
                k = rng.randrange(1, 12)
                copied = automaton.continuation(state, k, wrap=False)
                assert copied == prefix[end + 1 : end + 1 + k]
                wrapped = automaton.continuation(state, k, wrap=True)
                grown = list(prefix)  # an overlapping copy reads the tokens it has just written
                for j in range(k):
                    grown.append(grown[end + 1 + j])
                assert wrapped == grown[len(prefix) :]
        n = len(tokens)
        assert automaton.num_states <= max(2 * n - 1, n + 1)
        assert sum(map(len, automaton.next)) <= max(3 * n - 4, n + 1)  # the linear-size bounds


@pytest.mark.parametrize("seed", range(4))
def test_static_match_equals_brute_force_across_documents(seed):
    """A matcher fed a random stream keeps the longest suffix found in the corpus, never across documents."""
    rng = random.Random(100 + seed)
    for _ in range(25):
        vocab = rng.choice([2, 3, 6])
        documents = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 25))] for _ in range(rng.randrange(1, 4))]
        automaton = SuffixAutomaton()
        for document in documents:
            automaton.add_document(document)
        text = automaton.text
        assert text.count(SEPARATOR) == len(documents)
        matcher = SuffixMatcher(automaton)
        stream = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        for i, token in enumerate(stream):
            matcher.feed(token)
            fed = stream[: i + 1]
            assert matcher.length == longest_suffix_in(text, fed), (documents, fed)
            if matcher.length:
                suffix = fed[len(fed) - matcher.length :]
                end = first_end(text, suffix)
                assert automaton.first_end[matcher.state] == end
                copied = automaton.continuation(matcher.state, 30, wrap=True)
                rest = text[end + 1 :]
                assert copied == rest[: rest.index(SEPARATOR)][:30]  # stops at the document's end
        matcher.reset()
        assert (matcher.state, matcher.length) == (0, 0)


def test_work_per_token_is_amortised_constant():
    """Link walks of appends and feeds stay linear in the tokens (worst cases: one repeated token, random text)."""
    for tokens in ([7] * 3000, [random.Random(1).randrange(4) for _ in range(3000)]):
        automaton = SuffixAutomaton(tokens)
        assert automaton.num_states < 2 * len(tokens)
        matcher = SuffixMatcher(automaton)
        walks = 0
        link, lengths = automaton.link, automaton.length
        for token in tokens[::-1]:  # a stream unlike the text forces link walks
            before = matcher.length
            matcher.feed(token)
            walks += before + 1 - matcher.length  # each walk step shortens the match by >= 1
            assert matcher.length <= before + 1
        assert walks <= 2 * len(tokens)
        assert link[0] == -1 and lengths[0] == 0


# -- the drafter through the shared loop -----------------------------------------------------------

DRAFTERS = {  # the defaults (l_threshold 5) rarely draft on a random model: conformance runs them
    "sam_eager": lambda: SAMDecoding(len_threshold=1),
    "sam_short": lambda: SAMDecoding(n_predicts=4, len_threshold=2),
}


@pytest.fixture(scope="module")
def tiny_cases(tiny) -> list[tuple[list[int], list[int]]]:
    """(prompt, AR greedy output of 60 tokens) for repetitive prompts and prompts the model keeps repeating."""
    prompts = [repetitive_prompt(seed) for seed in range(2)] + [looping_prompt(tiny, seed) for seed in range(2)]
    return [(prompt, ar_greedy(tiny, prompt, 60).output_ids) for prompt in prompts]


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_equals_ar_on_tiny(tiny, tiny_cases, name):
    multi_token_steps = 0
    for prompt, truth in tiny_cases:
        drafter = DRAFTERS[name]()
        gen = decode(tiny, drafter, prompt, 60)
        assert gen.output_ids == truth
        multi_token_steps += sum(length > 1 for length in gen.accept_lengths)
        stats = drafter.stats()
        assert stats["steps"] == gen.target_forwards
        assert stats["accepted_tokens"] == 59 - gen.target_forwards  # no EOS or budget cut here
        assert stats["accepted_dynamic"] == stats["accepted_tokens"]  # no static automaton, no fallback
        assert stats["drafted"] <= (drafter.n_predicts - 1) * stats["dynamic_drafts"]
        assert stats["dynamic_states"] <= 2 * (len(prompt) + 60)
    assert multi_token_steps >= 5


def test_greedy_equals_ar_with_a_static_automaton(tiny, tiny_cases):
    """A corpus holding AR's continuation (plus noise) is drafted from, and the output stays AR's."""
    rng = random.Random(5)
    for prompt, truth in tiny_cases[:3]:
        drafter = SAMDecoding(len_bias=0, len_threshold=2)
        static = SuffixAutomaton()
        static.add_document([rng.randrange(97) for _ in range(50)])
        static.add_document(prompt[-6:] + truth)
        drafter.static = static
        gen = decode(tiny, drafter, prompt, 60)
        assert gen.output_ids == truth
        stats = drafter.stats()
        assert stats["static_drafts"] > 0 and stats["accepted_static"] > 0
        assert stats["static_states"] == static.num_states
        assert gen.target_forwards < 30


def recycling(tiny, **knobs) -> SAMDecoding:
    drafter = SAMDecoding(fallback="token_recycling", **knobs)
    drafter.setup(tiny, None)
    return drafter


def test_greedy_equals_ar_with_the_token_recycling_fallback(tiny, tiny_cases):
    """Short matches draft Token Recycling's tree over the successor table (kept across requests), long ones a chain."""
    drafter = recycling(tiny)
    sources = {"dynamic_drafts": 0, "fallback_drafts": 0, "accepted_fallback": 0, "accepted_dynamic": 0}
    for prompt, truth in tiny_cases:
        gen = decode(tiny, drafter, prompt, 60)
        assert gen.output_ids == truth
        stats = drafter.stats()
        assert stats["steps"] == gen.target_forwards
        assert stats["accepted_tokens"] == stats["accepted_fallback"] + stats["accepted_dynamic"]
        assert stats["matrix_rows_filled"] > 0
        for key in sources:
            sources[key] += stats[key]
    assert all(sources.values()), sources
    paper = recycling(tiny, recycling_tree="paper", len_threshold=1)
    for prompt, truth in tiny_cases[:2]:
        assert decode(tiny, paper, prompt, 60).output_ids == truth


@pytest.mark.parametrize("check", ["greedy", "budget", "eos", pytest.param("sampling", marks=pytest.mark.slow)])
def test_conformance_with_the_token_recycling_fallback(monkeypatch, check):
    """The conformance suite (run on the defaults by tests/test_conformance.py) on the fallback variant too."""
    from specbench import conformance

    monkeypatch.setitem(conformance.STAND_IN_OVERRIDES, "sam", ("method.drafter.fallback=token_recycling",))
    conformance.CHECK_FUNCTIONS[check]("sam")  # not run_check: it caches results by method name


def test_eos_and_budget_cuts_on_tiny(tiny):
    prompt = looping_prompt(tiny, 0)
    full = decode(tiny, SAMDecoding(len_threshold=1), prompt, 40)
    eos = frozenset({full.output_ids[20]})
    gen = decode(tiny, SAMDecoding(len_threshold=1), prompt, 40, eos)
    assert gen.output_ids == ar_greedy(tiny, prompt, 40, eos).output_ids and gen.stop_reason == "eos"
    truth = ar_greedy(tiny, prompt, 40).output_ids
    drafter = SAMDecoding(len_threshold=1)  # one drafter reused: reset must clear everything between generations
    for budget in (1, 2, 9, 31):
        gen = decode(tiny, drafter, prompt, budget)
        assert gen.output_ids == truth[:budget] and gen.stop_reason == "max_new_tokens"


def test_sampling_draws_the_same_tokens_as_ar(tiny):
    """Sample-and-match consumes one target draw per emitted token, so with one seed it replays AR's samples."""
    sampling = Sampling(temperature=0.7, top_p=0.9)
    prompt = repetitive_prompt(2)
    for seed in range(2):
        ar = decode(tiny, NoDraft(), prompt, 40, sampling=sampling, generator=torch.Generator().manual_seed(seed))
        for drafter in (SAMDecoding(len_threshold=1), recycling(tiny)):
            gen = decode(tiny, drafter, prompt, 40, sampling=sampling, generator=torch.Generator().manual_seed(seed))
            assert gen.output_ids == ar.output_ids


@pytest.mark.slow
def test_greedy_equals_ar_on_the_embedded_model(embedded):
    model, tok = embedded.model, embedded.tokenizer
    multi_token_steps = 0
    for text in CODE_PROMPTS:
        prompt = tok(text)["input_ids"]
        truth = ar_greedy(model, prompt, 48, embedded.eos_ids)
        gen = decode(model, SAMDecoding(len_threshold=2), prompt, 48, embedded.eos_ids)
        assert gen.output_ids == truth.output_ids
        multi_token_steps += sum(length > 1 for length in gen.accept_lengths)
    assert multi_token_steps >= 4


# -- config, knobs, the static corpus --------------------------------------------------------------


def test_config_instantiates_the_drafter():
    cfg = compose_config("method=sam").method
    assert cfg.engine == "loop" and cfg.lossless and cfg.acceptance == "match"
    drafter = hydra.utils.instantiate(cfg.drafter)
    assert isinstance(drafter, SAMDecoding)
    assert (drafter.n_predicts, drafter.len_threshold, drafter.len_bias) == (40, 5, 5)
    assert drafter.fallback == "none" and drafter.corpus is None and drafter.artefacts() == []


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"n_predicts": 1}, r"method\.drafter\.n_predicts \(n\) must be an integer >= 2"),
        ({"n_predicts": "abc"}, r"method\.drafter\.n_predicts"),
        ({"len_threshold": 0}, r"method\.drafter\.len_threshold \(l_threshold\)"),
        ({"len_bias": -1}, r"method\.drafter\.len_bias \(l_bias\)"),
        ({"fallback": "eagle"}, r"method\.drafter\.fallback must be one of \['none', 'token_recycling'\]"),
        ({"static_sam": "yes"}, r"method\.drafter\.static_sam must be true or false"),
        ({"static_sam": True}, r"method\.drafter\.corpus\.files=DIR"),
        ({"static_sam": True, "corpus": {"files": "x", "top_k": 3}}, r"method\.drafter\.corpus\.top_k"),
        ({"static_sam": True, "corpus": {"files": "x", "max_tokens": 0}}, r"method\.drafter\.corpus\.max_tokens"),
    ],
)
def test_bad_knobs_name_the_key(knobs, message):
    with pytest.raises(ConfigError, match=message):
        SAMDecoding(**knobs)


def test_token_recycling_fallback_knobs():
    assert len(SAMDecoding(fallback="token_recycling").shape) == 61  # the official SAMD tree: 60 drafted nodes
    assert len(SAMDecoding(fallback="token_recycling", recycling_tree="paper").shape) == 81
    assert SAMDecoding(topk=1).shape is None  # the fallback's knobs are checked, its tree built only when on
    with pytest.raises(ConfigError, match=r"method\.drafter\.topk \(k\) = 6 is too small for the samd recycling tree"):
        SAMDecoding(fallback="token_recycling", topk=6)
    with pytest.raises(ConfigError, match=r"method\.drafter\.recycling_tree must be one of \['samd', 'paper'\]"):
        SAMDecoding(recycling_tree="eagle")
    with pytest.raises(ConfigError, match=r"method\.drafter\.topk \(k\) must be an integer >= 1"):
        SAMDecoding(topk=0)


def test_static_corpus_is_tokenised_with_the_target_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from specbench.models.embedded import embedded_checkpoint

    tok = AutoTokenizer.from_pretrained(embedded_checkpoint())
    with pytest.raises(DataUnavailable, match="no .txt files"):
        SAMDecoding(static_sam=True, corpus={"files": str(tmp_path)})
    (tmp_path / "a.txt").write_text("The budget of the United States is balanced.")
    (tmp_path / "b.txt").write_text("We will balance the budget this year.")
    drafter = SAMDecoding(static_sam=True, corpus={"files": str(tmp_path), "max_tokens": None})
    drafter.setup(None, tok)
    documents = [tok(text, add_special_tokens=False)["input_ids"] for text in sorted_texts(tmp_path)]
    assert drafter.static is not None and drafter.static.text == [t for d in documents for t in (*d, SEPARATOR)]
    (part,) = drafter.artefacts()
    assert part.startswith("sam-corpus:")
    again = SAMDecoding(static_sam=True, corpus={"files": str(tmp_path)})
    again.setup(None, tok)
    assert again.static is drafter.static  # built once per process
    with pytest.raises(ConfigError, match="tokenizer"):
        SAMDecoding(static_sam=True, corpus={"files": str(tmp_path)}).setup(None, None)


def sorted_texts(folder) -> list[str]:
    return [path.read_text() for path in sorted(folder.rglob("*.txt"))]
