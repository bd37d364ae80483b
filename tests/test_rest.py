"""REST: the suffix-array datastore, its retrieval and trie selection, the drafter on the shared loop.

Retrieval and selection are checked against brute force on hand-built and random corpora; decoding
against AR on tiny random models (with datastores holding their own continuations, so drafts are
accepted) and on the embedded model; the datastore cache against its identity.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from specbench import conformance
from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.core.drafter import DecodeContext
from specbench.core.loop import Decoder
from specbench.drafters import rest
from specbench.drafters.rest import Rest, datastore_for, datastore_spec
from specbench.engines import check_method
from specbench.errors import ConfigError
from specbench.structures.datastore import (
    DatastoreMismatch,
    SuffixDatastore,
    build_suffix_array,
    draft_nodes,
)
from tests.test_loop import ar_greedy

VOCAB = 97
GREEDY = Sampling()


def decode(model, drafter, prompt, max_new_tokens, eos_ids=frozenset(), sampling=GREEDY, seed=0):
    """One generation through the shared loop (the drafter already set up)."""
    with torch.inference_mode():
        return Decoder(model, drafter, eos_ids, sampling).generate(
            prompt, max_new_tokens, torch.Generator().manual_seed(seed)
        )


def rest_with(store: SuffixDatastore, model=None, **knobs) -> Rest:
    """A REST drafter wired to an in-memory datastore."""
    drafter = Rest(**knobs)
    drafter.datastore = store
    drafter.setup(model, None)
    return drafter


def paths_of(tokens: list[int], parents: list[int]) -> list[tuple[int, ...]]:
    """Each selected node's token path from the root (parents as ``draft_nodes`` returns them)."""
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(tokens, parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return paths


# --- retrieval ----------------------------------------------------------------------------------

HAND_BUILT = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [7, 2, 3, 4, 6], [8, 8, 8]]


def test_retrieval_on_a_hand_built_corpus():
    store = SuffixDatastore.build(HAND_BUILT)
    assert store.info["corpus"] == {"tokens": 17, "documents": 4} and store.info["max_token_id"] == 9

    found = store.search([0, 2, 3], 16, 2, 5000, 3)  # "2 3" occurs three times
    assert (found.suffix_len, found.occurrences) == (2, 3)
    assert found.continuations() == [[4, 5], [4, 6], [9]]  # sorted; cut at each document's end

    found = store.search([6, 1, 2, 3], 16, 2, 5000, 3)  # the longest suffix wins: "1 2 3"
    assert (found.suffix_len, found.continuations()) == (3, [[4, 5], [9]])
    assert store.search([6, 1, 2, 3], 2, 2, 5000, 3).suffix_len == 2  # n_max caps it
    assert store.search([6, 1, 2, 3], 16, 2, 1, 3).continuations() == [[4, 5]]  # k: the first occurrences
    assert store.search([1, 2, 3], 16, 2, 5000, 1).continuations() == [[4], [9]]  # m tokens each

    assert store.search([4, 5], 16, 1, 5000, 3).suffix_len == 0  # only at a document's end: nothing follows
    assert store.search([5, 1], 16, 2, 5000, 3).suffix_len == 0  # never across two documents
    assert store.search([3], 16, 2, 5000, 3).suffix_len == 0  # shorter than n_min
    assert store.search([3], 16, 1, 5000, 3).continuations() == [[4, 5], [4, 6], [9]]
    assert store.search([8, 8], 16, 2, 5000, 4).continuations() == [[8]]  # overlapping occurrences
    assert store.search([42, 43], 16, 2, 5000, 3).suffix_len == 0


def brute_force_search(docs, context, n_max, n_min, k, m):
    """The retrieval by definition: longest suffix first, continuations of every occurrence, sorted, first k."""
    for n in range(min(n_max, len(context)), n_min - 1, -1):
        query = context[len(context) - n :]
        found = [doc[i + n : i + n + m] for doc in docs for i in range(len(doc) - n) if doc[i : i + n] == query]
        if found:
            return n, sorted(found)[:k]
    return 0, []


def test_suffix_array_and_retrieval_equal_brute_force_on_random_corpora():
    rng = random.Random(0)
    for _ in range(40):
        vocab = rng.choice([2, 3, 5, 20])
        docs = [[rng.randrange(vocab) for _ in range(rng.randrange(0, 30))] for _ in range(rng.randrange(1, 6))]
        store = SuffixDatastore.build(docs)
        data = store.data.tolist()
        assert store.suffix_array.tolist() == sorted(range(len(data)), key=lambda i: data[i:])
        for _ in range(15):
            context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 8))]
            n_max, n_min, k, m = rng.randrange(1, 6), rng.randrange(1, 3), rng.randrange(1, 6), rng.randrange(1, 5)
            found = store.search(context, n_max, n_min, k, m)
            assert (found.suffix_len, found.continuations()) == brute_force_search(docs, context, n_max, n_min, k, m)


def test_suffix_array_of_edge_cases():
    assert build_suffix_array(np.zeros(0, dtype=np.uint32)).tolist() == []
    assert build_suffix_array(np.array([0], dtype=np.uint32)).tolist() == [0]
    assert build_suffix_array(np.array([2, 2, 2, 0], dtype=np.uint32)).tolist() == [3, 2, 1, 0]
    empty = SuffixDatastore.build([[], []])
    assert len(empty) == 0 and empty.search([1, 2], 16, 2, 10, 4).suffix_len == 0


# --- the trie and its top nodes -----------------------------------------------------------------


def sorted_rows(continuations: list[list[int]], m: int) -> np.ndarray:
    """Continuations as ``Retrieved.rows``: sorted, stored ids (token + 1), zero-padded."""
    rows = np.zeros((len(continuations), m), dtype=np.uint32)
    for row, continuation in zip(rows, sorted(continuations)):
        row[: len(continuation)] = np.array(continuation) + 1
    return rows


def test_top_nodes_are_the_most_frequent_prefixes():
    rows = sorted_rows([[5, 6, 7], [5, 6, 8], [5, 6, 7], [5, 9], [3]], 3)
    tokens, parents = draft_nodes(rows, 4)
    # weights: (5) 4, (5 6) 3, (5 6 7) 2, then (5 6 8), (5 9), (3) 1 each: the shallower (3), (5 9) next
    assert paths_of(tokens, parents) == [(5,), (5, 6), (5, 6, 7), (3,)]
    assert parents == [-1, 0, 1, -1]  # rank order is topological; siblings heaviest first
    assert draft_nodes(rows, 0) == ([], [])
    assert draft_nodes(rows[:0], 4) == ([], [])


def test_top_nodes_equal_brute_force_and_the_official_cut_keeps_a_subtree():
    rng = random.Random(1)
    for _ in range(300):
        vocab = rng.choice([2, 3, 6])
        continuations = [
            [rng.randrange(vocab) for _ in range(rng.randrange(0, 5))] for _ in range(rng.randrange(1, 12))
        ]
        rows, budget = sorted_rows(continuations, 4), rng.randrange(1, 12)
        weights = Counter(tuple(c[:depth]) for c in continuations for depth in range(1, len(c) + 1))
        ranked = sorted(weights, key=lambda path: (-weights[path], len(path), path))
        assert paths_of(*draft_nodes(rows, budget)) == ranked[:budget]
        cut = paths_of(*draft_nodes(rows, budget, official_cut=True))
        assert set(cut) <= set(ranked[:budget]) and sum(len(set(path)) for path in cut) <= budget
        assert all(len(path) == 1 or path[:-1] in cut for path in cut)  # still a tree


def test_official_cut_drops_the_paths_with_most_distinct_tokens():
    rows = sorted_rows([[1, 2, 3, 4]] * 3 + [[1, 5]] * 2, 4)
    assert paths_of(*draft_nodes(rows, 5)) == [(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), (1, 5)]
    # distinct tokens per path 1, 2, 3, 4, 2 (sum 12): drop (1 2 3 4), then (1 2 3): 5 <= 5
    assert paths_of(*draft_nodes(rows, 5, official_cut=True)) == [(1,), (1, 2), (1, 5)]


# --- the drafter ---------------------------------------------------------------------------------


def test_propose_builds_the_tree_of_the_longest_match():
    drafter = rest_with(SuffixDatastore.build(HAND_BUILT), num_draft=3, continuation_len=4)
    ctx = DecodeContext([7, 1, 2, 3], prompt_len=2, remaining=10, step=0, generator=None)
    tree = drafter.propose(ctx)
    assert tree.tokens == [3, 4, 9, 5] and tree.parents == [-1, 0, 0, 1]
    short = drafter.propose(DecodeContext([7, 1, 2, 3], 2, remaining=2, step=1, generator=None))
    assert short.tokens == [3, 4, 9] and short.depth == 1  # nothing deeper than the budget allows
    assert drafter.propose(DecodeContext([1, 2, 3], 2, remaining=1, step=2, generator=None)).num_drafted == 0
    assert drafter.propose(DecodeContext([1, 42], 1, remaining=9, step=3, generator=None)).num_drafted == 0
    stats = drafter.stats()
    assert (stats["steps"], stats["hits"], stats["suffix_tokens"], stats["nodes_proposed"]) == (4, 2, 6, 5)
    assert stats["hit_rate"] == 0.5 and stats["datastore_tokens"] == 17 and "retrieve_s" in stats


@pytest.fixture(scope="module")
def tiny_cases(tiny) -> list[tuple[list[int], list[int]]]:
    """(prompt, AR greedy output of 48 tokens) for three random prompts of the tiny model."""
    cases = []
    for seed in range(3):
        rng = random.Random(seed)
        prompt = [rng.randrange(VOCAB) for _ in range(12)]
        cases.append((prompt, ar_greedy(tiny, prompt, 48).output_ids))
    return cases


@pytest.fixture(scope="module")
def tiny_store(tiny_cases) -> SuffixDatastore:
    """A datastore holding the tiny model's own greedy text (cut in pieces) among random documents."""
    rng = random.Random(7)
    docs = [[rng.randrange(VOCAB) for _ in range(40)] for _ in range(20)]
    for prompt, output in tiny_cases:
        text = prompt + output
        docs += [text[start : start + 20] for start in range(0, len(text), 15)]
    return SuffixDatastore.build(docs)


@pytest.mark.parametrize(
    "knobs", [{}, {"official_cut": True}, {"num_draft": 1}, {"max_suffix_len": 3, "continuation_len": 2}]
)
def test_greedy_equals_ar_on_tiny(tiny, tiny_cases, tiny_store, knobs):
    drafter = rest_with(tiny_store, tiny, **knobs)
    accepted_drafts = 0
    for prompt, truth in tiny_cases:
        gen = decode(tiny, drafter, prompt, 48)
        assert gen.output_ids == truth
        accepted_drafts += sum(length - 1 for length in gen.accept_lengths)
    assert accepted_drafts > 20  # the datastore's drafts were accepted, not just verified


def test_eos_inside_a_draft_and_budget_cuts_on_tiny(tiny, tiny_cases, tiny_store):
    prompt, truth = tiny_cases[0]
    drafter = rest_with(tiny_store, tiny)
    full = decode(tiny, drafter, prompt, 48)
    done, index = 1, None  # the first emitted token strictly inside an accepted multi-token step
    for length in full.accept_lengths:
        index = next((i for i in range(done + 1, done + length - 1) if truth[i] not in truth[:i]), None)
        if index is not None:
            break
        done += length
    assert index is not None
    gen = decode(tiny, drafter, prompt, 48, eos_ids=frozenset({truth[index]}))
    assert gen.output_ids == truth[: index + 1] and gen.stop_reason == "eos"
    for budget in (1, 2, 7, 13):
        assert decode(tiny, drafter, prompt, budget).output_ids == truth[:budget]


def test_setup_refuses_ids_beyond_the_vocabulary_and_copes_without_a_tokenizer(tiny):
    with pytest.raises(ConfigError, match="token id 200"):
        rest_with(SuffixDatastore.build([[1, 2, 200]]), tiny)
    drafter = Rest(datastore={"source": "files", "files": "/nowhere"})
    with pytest.warns(UserWarning, match="no tokenizer"):
        drafter.setup(tiny, None)
    assert decode(tiny, drafter, [1, 2, 3, 1, 2], 6).accept_lengths == [1] * 5 and drafter.artefacts() == []
    with pytest.raises(ConfigError, match="method.drafter.datastore"):
        Rest().setup(tiny, None)


# --- sampling ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sampling_law_is_the_targets():
    """At T = 0.7 the output law equals the target's (the conformance chi-square), with drafts accepted."""
    lm = conformance.small_vocab_lm()
    prompt = list(conformance.sampling_prompt())
    sampler = Decoder(lm.model, rest_with(SuffixDatastore.build([])), frozenset(), conformance.SAMPLING)
    with torch.inference_mode():
        docs = [prompt + sampler.generate(prompt, 6, torch.Generator().manual_seed(s)).output_ids for s in range(40)]
    drafter = rest_with(SuffixDatastore.build(docs), lm.model)
    counts, drafted_steps = Counter(), 0
    for seed in range(conformance.SAMPLING_TRIALS):
        gen = decode(lm.model, drafter, prompt, conformance.SAMPLING_LENGTH, sampling=conformance.SAMPLING, seed=seed)
        counts[tuple(gen.output_ids)] += 1
        drafted_steps += sum(length > 1 for length in gen.accept_lengths)
    stat, dof, p_value = conformance.chi_square(counts, conformance.exact_output_law())
    assert p_value > conformance.SAMPLING_MIN_P, (stat, dof, p_value)
    assert drafted_steps > 100


# --- knobs and config ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("max_suffix_len", 0, "max_suffix_len (n_max)"),
        ("min_suffix_len", 0, "min_suffix_len (n_min)"),
        ("num_retrieved", 0, "num_retrieved (k)"),
        ("continuation_len", "abc", "continuation_len (m)"),
        ("num_draft", 2.5, "num_draft (c)"),
        ("official_cut", "yes", "official_cut"),
    ],
)
def test_bad_knobs_name_the_key(key, value, named):
    with pytest.raises(ConfigError, match=f"method.drafter.{named}".replace("(", r"\(").replace(")", r"\)")):
        Rest(**{key: value})


def test_bad_settings_are_refused_before_any_model_loads():
    with pytest.raises(ConfigError, match="must not exceed"):
        Rest(max_suffix_len=3, min_suffix_len=4)
    with pytest.raises(ConfigError, match="method.drafter.datastore has unknown key"):
        Rest(datastore={"source": "files", "files": "x", "top_k": 3})
    with pytest.raises(ConfigError, match="method.drafter.datastore: corpus.source=files needs"):
        Rest(datastore={"source": "files", "files": None})
    with pytest.raises(ConfigError, match="method.drafter.num_draft"):
        check_method(compose_config("method=rest", "method.drafter.num_draft=abc").method)
    drafter = check_method(compose_config("method=rest", "method.drafter.datastore.files=/corpus").method)
    assert isinstance(drafter, Rest) and (drafter.n_max, drafter.n_min, drafter.k, drafter.m, drafter.c) == (
        16,
        2,
        5000,
        10,
        64,
    )
    assert drafter.spec is not None and drafter.spec.source == "files" and drafter.official_cut is False


# --- the datastore cache -------------------------------------------------------------------------


class CharTokenizer:
    """A character-level stand-in tokenizer (ids = code points below 256): fast and deterministic."""

    name_or_path = "chars"

    def __len__(self) -> int:
        return 256

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(256)}

    def __call__(self, texts, **_):
        return {"input_ids": [[min(ord(ch), 255) for ch in text] for text in texts]}


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch) -> Path:
    """Two text files, and a fresh SPECBENCH_CACHE."""
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 5)
    (folder / "b.txt").write_text("def square(x):\n    return x * x\n" * 3)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    return folder


def test_datastore_is_built_once_cached_and_keyed_by_its_identity(corpus_dir, tmp_path, monkeypatch):
    spec = datastore_spec({"source": "files", "files": str(corpus_dir)})
    assert spec is not None
    store = datastore_for(CharTokenizer(), spec, progress=False)
    path = Path(store.info["path"])
    assert path.parent == tmp_path / "cache" / "datastore" and path.name.startswith("text-v256-")
    assert store.part == f"datastore:{path.stem}"
    header = SuffixDatastore.load(path).header()
    assert header["tokenizer"]["name"] == "chars" and header["source"]["files"] == 2
    assert header["corpus"] == {"tokens": 225 + 96, "documents": 2}
    found = store.search([ord(ch) for ch in "the lazy "], 16, 2, 50, 4)
    assert found.suffix_len == 9 and found.continuations() == [[ord(ch) for ch in "dog."]] * 5

    def no_build(*_args, **_kwargs):
        raise AssertionError("rebuilt although the datastore is stored")

    monkeypatch.setattr(rest, "build_datastore", no_build)
    again = datastore_for(CharTokenizer(), spec, progress=False)
    assert again.part == store.part and np.array_equal(again.suffix_array, store.suffix_array)
    drafter = Rest(datastore={"source": "files", "files": str(corpus_dir)})
    drafter.setup(None, CharTokenizer())
    assert drafter.artefacts() == [store.part]
    monkeypatch.undo()
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))

    (corpus_dir / "b.txt").write_text("something else entirely\n")
    changed = datastore_for(CharTokenizer(), spec, progress=False)
    assert changed.part != store.part and changed.info["corpus"]["tokens"] == 225 + 24
    assert len(list((tmp_path / "cache" / "datastore").glob("*.npz"))) == 2

    with pytest.raises(DatastoreMismatch, match="tokenizer.vocab_size"):
        SuffixDatastore.load(path, expect={"tokenizer": {"vocab_size": 1}})
    path.write_bytes(b"not a datastore")
    with pytest.raises(DatastoreMismatch, match="not a readable REST datastore"):
        SuffixDatastore.load(path)


@pytest.mark.slow
def test_a_run_records_the_datastore(training_cache, corpus_dir, tmp_path):
    """The runner names the datastore among the run's artefacts (so a folder never mixes two)."""
    from specbench.runner import Runner

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hello.\n")
    cfg = compose_config(
        "model=tiny_llama",
        "method=rest",
        f"method.drafter.datastore.files={corpus_dir}",
        "dataset=jsonl",
        f"dataset.path={prompts}",
        "limit=1",
        "max_new_tokens=4",
        "warmup=0",
        "progress=false",
        f"output_dir={tmp_path / 'run'}",
    )
    Runner(cfg).run()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (stored,) = (tmp_path / "cache" / "datastore").glob("*.npz")
    assert summary["artefacts"] == [f"datastore:{stored.stem}"]


# --- the embedded model --------------------------------------------------------------------------

QUESTIONS = [
    "Write a Python function that returns the squares of the numbers 1 to 10 as a list.",
    "Name three primary colors and say one sentence about each.",
]


@pytest.mark.slow
def test_greedy_equals_ar_embedded(embedded, tmp_path, monkeypatch):
    """A datastore built from text files (among them AR's own answers) drafts accepted tokens on real prompts."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    tok, model, eos = embedded.tokenizer, embedded.model, embedded.eos_ids
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        for q in QUESTIONS
    ]
    truths = [ar_greedy(model, prompt, 40, eos).output_ids for prompt in prompts]
    text = tmp_path / "text"
    text.mkdir()
    (text / "answers.txt").write_text(tok.decode(truths[0], skip_special_tokens=True))
    (text / "other.txt").write_text("The quick brown fox jumps over the lazy dog.\n" * 10)
    drafter = Rest(datastore={"source": "files", "files": str(text)})
    drafter.setup(model, tok)
    accepted = []
    for prompt, truth in zip(prompts, truths):
        gen = decode(model, drafter, prompt, 40, eos)
        assert gen.output_ids == truth
        accepted.append(sum(length - 1 for length in gen.accept_lengths))
    assert accepted[0] > 20, accepted  # the answer in the datastore is drafted and accepted
    assert drafter.artefacts() == [f"datastore:{next((tmp_path / 'cache' / 'datastore').glob('*.npz')).stem}"]
