"""N-gram tables on hand-written token arrays: ANPD's multi-level n-gram model and the prompt-lookup index."""

import random

import pytest
import torch

from specbench.errors import ConfigError
from specbench.structures.ngram import MultiLevelNgram, PromptLookupIndex


def mln(tokens, max_ngram_size=3, multi_level=True) -> MultiLevelNgram:
    model = MultiLevelNgram(max_ngram_size, multi_level)
    model.extend(tokens)
    return model


def counts(model: MultiLevelNgram, n: int) -> dict:
    return {context: dict(s.counts) for context, s in model.tables[n].items()}


def reference_favourite(tokens: list[int], context: tuple) -> int | None:
    """Most frequent successor of ``context`` in ``tokens`` (ties: first seen), by a naive scan."""
    n = len(context)
    successors: dict[int, int] = {}
    for i in range(n, len(tokens)):
        if tuple(tokens[i - n : i]) == context:
            successors[tokens[i]] = successors.get(tokens[i], 0) + 1
    if not successors:
        return None
    top = max(successors.values())
    return next(token for token, count in successors.items() if count == top)


def reference_predict(tokens: list[int], tail: list[int], levels: tuple) -> int | None:
    """The first level (in query order) whose context has a successor in ``tokens``, naively."""
    for n in levels:
        if len(tail) >= n - 1:
            favourite = reference_favourite(tokens, tuple(tail[len(tail) - n + 1 :]))
            if favourite is not None:
                return favourite
    return None


def test_mln_counts_each_level_once():
    model = mln([1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert model.levels == (3, 2)
    assert counts(model, 2) == {(1,): {2: 3}, (2,): {3: 2, 4: 1}, (3,): {1: 1}, (4,): {1: 1}}
    assert counts(model, 3) == {(1, 2): {3: 2, 4: 1}, (2, 3): {1: 1}, (3, 1): {2: 1}, (2, 4): {1: 1}, (4, 1): {2: 1}}
    # the prompt is fed once: no doubled counts, no wrap-around (3, 1) transition at level 2 from [1, 2, 3]
    assert counts(mln([1, 2, 3]), 2) == {(1,): {2: 1}, (2,): {3: 1}}
    assert model.sizes() == {"n=2": 4, "n=3": 5} and len(model) == 9


def test_mln_queries_from_the_highest_level_down():
    # level 3 says (7, 1) -> 5; level 2 says (1,) -> 6 (seen twice, 5 once)
    model = mln([7, 1, 5, 8, 1, 6, 8, 1, 6])
    assert model.predict([7, 1]) == 5
    assert model.predict([9, 1]) == 6  # unknown bigram context: fall back to level 2
    assert model.predict([1]) == 6  # too short for level 3
    assert model.predict([4, 9]) is None and model.predict([]) is None


def test_mln_ties_go_to_the_first_seen_successor():
    assert mln([1, 5, 1, 6], 2).predict([1]) == 5
    # 6 reaches two counts first, but 5 was seen first: 5 wins the 2-2 tie
    assert mln([1, 5, 1, 6, 1, 6, 1, 5], 2).predict([1]) == 5
    assert mln([1, 5, 1, 6, 1, 6, 1, 5, 1, 6], 2).predict([1]) == 6


def test_mln_without_fallback_uses_only_level_n():
    model = mln([7, 1, 5, 8, 1, 6], multi_level=False)
    assert model.levels == (3,) and set(model.tables) == {3}
    assert model.predict([7, 1]) == 5
    assert model.predict([9, 1]) is None  # level 2 would have answered
    assert mln([7, 1, 5, 8, 1, 6]).predict([9, 1]) == 5


def test_mln_chain_iterates_on_its_own_draft_and_stops_or_pads_at_a_miss():
    model = mln([1, 2, 3, 4, 9, 2, 3, 4, 1, 2])
    assert model.chain(3) == [3, 4, 9]  # (1, 2) -> 3, (2, 3) -> 4, (3, 4) -> 9 (first seen of 9 and 1)
    assert model.chain(0) == []
    assert mln([1, 2, 3, 1, 2]).chain(5) == [3, 1, 2, 3, 1]
    stuck = mln([5, 6, 7, 8])  # 8 was never followed by anything
    assert stuck.chain(3) == [] and stuck.chain(3, pad=1) == [1, 1, 1]
    assert mln([1], 5).chain(2) == [] and MultiLevelNgram(4).chain(2) == []


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("multi_level", [True, False])
def test_mln_incremental_updates_equal_a_rebuild_and_a_naive_count(seed, multi_level):
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(300)]  # small vocabulary: many repeats and ties
    incremental = mln(tokens[:40], 4, multi_level)
    for start in range(40, len(tokens), 17):
        incremental.extend(tokens[start : start + 17])
        seen = tokens[: start + 17]
        for n in incremental.levels:
            for context, successors in incremental.tables[n].items():
                assert successors.best == reference_favourite(seen, context)
    rebuilt = mln(tokens, 4, multi_level)
    for n in rebuilt.levels:
        assert counts(incremental, n) == counts(rebuilt, n)
    for end in range(1, len(tokens)):
        tail = tokens[max(0, end - 3) : end]
        assert rebuilt.predict(tail) == reference_predict(tokens, tail, rebuilt.levels)


def test_mln_rejects_bad_sizes():
    with pytest.raises(ConfigError, match="max_ngram_size"):
        MultiLevelNgram(1)


def index(tokens, max_ngram_size=2, min_ngram_size=1, occurrence="latest", continuation="repeat") -> PromptLookupIndex:
    table = PromptLookupIndex(max_ngram_size, min_ngram_size, occurrence, continuation)
    table.extend(tokens)
    return table


def test_lookup_latest_or_first_occurrence():
    tokens = [1, 2, 3, 9, 1, 2, 4, 9, 1, 2]
    assert index(tokens).lookup(3) == [4, 9, 1]
    assert index(tokens, occurrence="first").lookup(3) == [3, 9, 1]


def test_lookup_prefers_the_longest_matching_ngram():
    tokens = [5, 1, 2, 7, 6, 1, 2, 8, 5, 1, 2]
    assert index(tokens, 3).lookup(3) == [7, 6, 1]  # (5, 1, 2) ended at 2
    assert index(tokens, 2).lookup(3) == [8, 5, 1]  # (1, 2) last ended at 6
    assert index([7, 3, 8, 3], 2).lookup(2) == [8, 3]  # no (8, 3) before: the 1-gram (3,) matches
    assert index([7, 3, 8, 3], 2, 2).lookup(2) == []  # ... unless min_ngram_size forbids it
    assert index([7, 3, 8, 3], 2).sizes() == {"n=1": 3, "n=2": 2}


def test_lookup_finds_only_earlier_occurrences_and_copies_past_the_end():
    assert index([1, 2]).lookup(4) == []  # the final n-gram itself is no match
    assert index([3, 3]).lookup(3) == [3, 3, 3]
    assert index([4, 5, 6, 4, 5]).lookup(5) == [6, 4, 5, 6, 4]  # the span 6 4 5 repeats
    assert index([4, 5, 6, 4, 5]).lookup(2) == [6, 4]
    assert index([]).lookup(3) == [] and index([8]).lookup(3) == []
    assert index([4, 5, 6, 4, 5], continuation="truncate").lookup(5) == [6, 4, 5]  # cut at the context's end
    assert index([3, 3], continuation="truncate").lookup(3) == [3]


def naive_lookup(tokens, k, sizes, first, repeat=True):
    """Scan every earlier occurrence of the longest matching suffix; copy k tokens, repeating past the end (or
    stopping there)."""
    for n in sizes:
        ends = [e for e in range(n - 1, len(tokens) - 1) if tokens[e - n + 1 : e + 1] == tokens[len(tokens) - n :]]
        if len(tokens) > n and ends:
            end = ends[0] if first else ends[-1]
            out = []
            for j in range(k):
                i = end + 1 + j
                if i >= len(tokens) and not repeat:
                    break
                out.append(tokens[i] if i < len(tokens) else out[i - len(tokens)])
            return out
    return []


@pytest.mark.parametrize("continuation", ["repeat", "truncate"])
@pytest.mark.parametrize("occurrence", ["latest", "first"])
def test_lookup_incremental_index_equals_a_naive_scan(occurrence, continuation):
    rng = random.Random(7)
    tokens = [rng.randrange(5) for _ in range(200)]
    table = index(tokens[:10], 3, 1, occurrence, continuation)
    for length in range(10, len(tokens) + 1):
        expected = naive_lookup(tokens[:length], 6, (3, 2, 1), occurrence == "first", continuation == "repeat")
        assert table.lookup(6) == expected
        if length < len(tokens):
            table.append(tokens[length])


def test_first_occurrence_agrees_with_hf_prompt_lookup_where_hf_has_tokens():
    """HF takes the earliest occurrence too, but truncates at the end of the context: so does continuation=truncate,
    token for token; the default keeps copying."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = random.Random(3)
    tokens = [rng.randrange(8) for _ in range(120)]
    table = index(tokens[:5], 2, 1, "first")
    cut = index(tokens[:5], 2, 1, "first", "truncate")
    hf = PromptLookupCandidateGenerator(num_output_tokens=5, max_matching_ngram_size=2, max_length=10_000)
    hits = shorter = 0
    for length in range(5, len(tokens)):
        candidates, _ = hf.get_candidates(torch.tensor([tokens[:length]]))
        expected = candidates[0, length:].tolist()
        ours = table.lookup(5)
        assert ours[: len(expected)] == expected and bool(ours) == bool(expected)
        assert cut.lookup(5) == expected
        hits += bool(expected)
        shorter += 0 < len(expected) < 5
        table.append(tokens[length])
        cut.append(tokens[length])
    assert hits > 50 and shorter > 0


def test_lookup_rejects_bad_sizes():
    with pytest.raises(ConfigError, match="min_ngram_size"):
        PromptLookupIndex(2, 0)
    with pytest.raises(ConfigError, match="max_ngram_size"):
        PromptLookupIndex(1, 2)
    with pytest.raises(ConfigError, match="occurrence"):
        PromptLookupIndex(2, 1, "middle")
    with pytest.raises(ConfigError, match="continuation"):
        PromptLookupIndex(2, 1, "first", "wrap")
