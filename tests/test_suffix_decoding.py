"""SuffixDecoding: suffix-tree counts against brute force, speculation on hand-built data, the drafter's
two trees, greedy output equal to AR (tiny and embedded models), knob errors."""

import random

import pytest
import torch

from specbench.core.acceptance import Sampling
from specbench.core.drafter import DecodeContext
from specbench.core.loop import Decoder
from specbench.drafters.suffix_decoding import SuffixDecoding
from specbench.errors import ConfigError
from specbench.structures.suffix_tree import SuffixNode, SuffixTree
from tests.test_anpd_pld import embedded_multi_token_steps, repetitive_prompt
from tests.test_loop import ar_greedy

GREEDY = Sampling()
SEQ = [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2]  # [1, 2] occurs 4 times (once at the end), then 3 twice and 4 once


def brute_count(seqs: dict[int, list[int]], pattern: list[int], max_depth: int) -> int:
    if not pattern or len(pattern) > max_depth:
        return 0
    n = len(pattern)
    return sum(seq[i : i + n] == pattern for seq in seqs.values() for i in range(len(seq) - n + 1))


def check_counts(tree: SuffixTree, seqs: dict[int, list[int]], rng: random.Random) -> None:
    """Every substring (and some random patterns) counts as brute force says; so does every stored node."""
    depth = tree.max_depth
    patterns = {tuple(seq[i:j]) for seq in seqs.values() for i in range(len(seq)) for j in range(i + 1, i + depth + 2)}
    patterns |= {tuple(rng.randrange(4) for _ in range(rng.randint(1, depth + 2))) for _ in range(50)}
    for pattern in patterns:
        assert tree.count(pattern) == brute_count(seqs, list(pattern), depth), pattern
    stored, stack = 0, [(tree.root, [])]
    while stack:
        node, string = stack.pop()
        if string:
            stored += 1
            assert (node.depth, node.count) == (len(string), brute_count(seqs, string, depth)), string
            counts = [child.count for child in node.order]  # the ranked children: all of them, most frequent first
            assert counts == sorted(counts, reverse=True) and len(node.order) == len(node.children)
        stack.extend((child, [*string, token]) for token, child in node.children.items())
    assert stored == tree.nodes


@pytest.mark.parametrize("seed", range(40))
def test_counts_equal_brute_force_through_appends_closes_and_removals(seed):
    rng = random.Random(seed)
    tree = SuffixTree(rng.randint(1, 7))
    seqs: dict[int, list[int]] = {}
    live: list[int] = []
    for step in range(12):
        action = rng.random()
        if action < 0.6 or not seqs:  # grow a live sequence (several may grow in turn) or open one
            seq_id = rng.choice(live) if live and rng.random() < 0.7 else step
            tokens = [rng.randrange(rng.choice([2, 3, 5])) for _ in range(rng.randint(1, 15))]
            tree.extend(seq_id, tokens)
            seqs.setdefault(seq_id, []).extend(tokens)
            live += [seq_id] if seq_id not in live else []
        elif action < 0.8:
            seq_id = rng.choice(list(seqs))
            tree.close(seq_id)
            live = [s for s in live if s != seq_id]
        else:
            seq_id = rng.choice(list(seqs))
            tree.remove(seq_id)
            del seqs[seq_id]
            live = [s for s in live if s != seq_id]
        check_counts(tree, seqs, rng)


def test_a_closed_sequence_refuses_tokens_and_leaves_compress_unique_strings():
    tree = SuffixTree(64)
    tree.extend(0, range(100))  # no repeats: one leaf head per start, read from the sequence
    assert tree.nodes == 100 and tree.count(range(10, 74)) == 1 and tree.count(range(10, 75)) == 0
    tree.close(0)
    with pytest.raises(ValueError, match="closed"):
        tree.append(0, 5)


def test_tree_speculation_grows_best_first_by_probability():
    tree = SuffixTree(8)
    tree.extend(0, SEQ)
    match = tree.match([1, 2])
    assert isinstance(match, SuffixNode) and match.count == 4  # the context's own occurrence counts too
    draft = tree.grow(match, max_tokens=4, min_token_prob=0.1, max_draft_depth=8)
    assert (draft.tokens, draft.parents, draft.depths()) == ([3, 4, 1, 9], [-1, -1, 0, 0], [1, 1, 2, 2])
    assert (draft.probs, draft.score) == ([0.5, 0.25, 0.25, 0.25], 1.25)
    assert tree.grow(match, 4, 0.3, 8).tokens == [3]  # tau: the 0.25 nodes are left out
    assert tree.grow(match, 4, 0.1, 1).tokens == [3, 4]  # the depth bound (the loop's budget)
    linear = tree.grow(match, 3, 0.1, 8, tree=False)  # the most frequent child only, first seen on ties
    assert (linear.tokens, linear.parents, linear.probs) == ([3, 1, 2], [-1, 0, 1], [0.5, 0.25, 0.25])
    assert tree.grow(match, 0, 0.1, 8).tokens == []


@pytest.mark.parametrize(
    ("seq", "ranked"),
    [
        ([7, 1, 7, 2, 7, 2, 7, 1], [1, 2]),
        ([7, 1, 7, 2, 7, 1, 7, 2], [2, 1]),
        ([7, 1, 7, 2, 7, 3, 7, 3, 7, 2], [3, 2, 1]),
    ],
)
def test_equal_counts_keep_the_official_sibling_order(seq, ranked):
    """The first of a count group that grows heads the next group, any other member ends it (ArcticInference)."""
    tree = SuffixTree(8)
    tree.extend(0, [*seq, 7])
    assert [token for _, token, _ in tree.continuations(tree.match([7]))] == ranked


def test_speculate_scores_every_match_length_and_caps_by_alpha():
    tree = SuffixTree(8)
    tree.extend(0, SEQ)
    draft = tree.speculate(SEQ, max_spec_tokens=64, max_spec_factor=1.0, min_token_prob=0.1, max_draft_depth=8)
    # p = 1: [3] (0.5); p = 2: [3, 4] (0.75); p = 3 ([9, 1, 2]) occurs only as the context itself
    assert (draft.tokens, draft.match_len, draft.score) == ([3, 4], 2, 0.75)
    wide = tree.speculate(SEQ, 64, 2.0, 0.1, 8)  # alpha 2: four nodes for the two-token match
    assert (wide.tokens, wide.parents, wide.match_len) == ([3, 4, 1, 9], [-1, -1, 0, 0], 2)
    assert tree.speculate(SEQ, 1, 2.0, 0.1, 8).tokens == [3]  # the MAX_SPEC cap
    assert tree.speculate(SEQ, 64, 1.0, 0.1, 8, selection="longest").match_len == 2
    assert tree.speculate([7, 7], 64, 1.0, 0.1, 8).tokens == []  # no match at all


def test_the_depth_bound_limits_match_plus_draft():
    seq = [5, 6, 7, 8, 9, 5, 6, 7]
    tree = SuffixTree(4)
    tree.extend(0, seq)
    longest = tree.speculate(seq, 64, 4.0, 0.0, 64, selection="longest")
    assert (longest.tokens, longest.match_len) == ([8], 3)  # a 3-token match leaves one level of the 4
    best = tree.speculate(seq, 64, 4.0, 0.0, 64)
    assert (best.tokens, best.match_len, best.score) == ([8, 9, 5], 1, 1.5)  # [7] leaves three levels
    assert tree.count([5, 6, 7, 8, 9]) == 0 and tree.count([5, 6, 7, 8]) == 1


def committed(drafter: SuffixDecoding, prompt: list[int], output: list[int], remaining: int = 32) -> DecodeContext:
    """The decode context after ``output`` was committed (the loop's token list), drafter already reset."""
    return DecodeContext([*prompt, *output], len(prompt), remaining, 0, None)


def test_the_global_tree_drafts_earlier_responses_and_evicts_fifo():
    earlier, response = [50, 51, 52], [10, 11, 12, 13, 14, 15, 16, 17]
    prompt = [60, 61, 10, 11, 12]
    for bound, expected in ((None, [14, 15, 16, 17]), (2, [14, 15, 16, 17]), (1, [])):
        drafter = SuffixDecoding(max_cached_requests=bound)
        drafter.setup(None, None)
        drafter.start(earlier)
        drafter.propose(committed(drafter, earlier, response[:1]))
        drafter._tokens.extend(response[1:])  # the loop commits the rest; the next request flushes it
        drafter.start(prompt)
        tree = drafter.propose(committed(drafter, prompt, [13]))
        assert tree.tokens == [13, *expected] and tree.is_chain
        stats = drafter.stats()
        assert stats["global_hits"] == bool(expected) and stats["cached_requests"] == min(2, bound or 2)
        if expected:
            assert stats["match_length"] == 4  # [10, 11, 12, 13], of which [10, 11, 12] is the prompt's tail


def test_the_per_request_tree_wins_ties_and_either_tree_can_be_switched_off():
    earlier, prompt = [50], [7, 8, 9, 5]
    both = SuffixDecoding()
    both.setup(None, None)
    both.start(earlier)
    both.propose(committed(both, earlier, [7]))
    both._tokens.extend([8, 9])  # earlier response [7, 8, 9]
    both.start(prompt)
    # [7] occurs twice in each tree (the prompt's and the context's; the earlier and the live response's)
    assert both.propose(committed(both, prompt, [7])).tokens == [7, 8]
    assert both.stats()["global_hits"] == 0  # equal scores: the per-request tree's draft
    assert both.propose(committed(both, prompt, [7], remaining=1)).tokens == [7]  # the budget allows no draft
    request_only = SuffixDecoding(max_cached_requests=0)
    request_only.setup(None, None)
    request_only.start([1, 2, 3, 4, 1, 2])
    assert request_only.propose(committed(request_only, [1, 2, 3, 4, 1, 2], [3])).tokens == [3, 4, 1, 2]
    assert request_only.stats()["cached_requests"] == 0
    global_only = SuffixDecoding(per_request_tree=False)
    global_only.setup(None, None)
    global_only.start([1, 2, 3, 4, 1, 2])  # the prompt is not in the global tree
    assert global_only.propose(committed(global_only, [1, 2, 3, 4, 1, 2], [3])).tokens == [3]


@pytest.mark.parametrize(
    ("knobs", "key"),
    [
        ({"max_tree_depth": 1}, "max_tree_depth (d_max)"),
        ({"max_spec_factor": -1}, "max_spec_factor (alpha)"),
        ({"min_token_prob": 1.5}, "min_token_prob (tau)"),
        ({"max_spec_tokens": "8"}, "max_spec_tokens"),
        ({"speculation": "beam"}, "speculation"),
        ({"selection": "first"}, "selection"),
        ({"max_cached_requests": -1}, "max_cached_requests"),
        ({"per_request_tree": "yes"}, "per_request_tree"),
        ({"per_request_tree": False, "max_cached_requests": 0}, "no suffix tree"),
    ],
)
def test_bad_knobs_are_one_clear_error(knobs, key):
    with pytest.raises(ConfigError, match=key.replace("(", r"\(").replace(")", r"\)")):
        SuffixDecoding(**knobs)


def decode(model, drafter, prompt, max_new_tokens, eos_ids=frozenset()):
    with torch.inference_mode():
        return Decoder(model, drafter, eos_ids, GREEDY).generate(prompt, max_new_tokens)


@pytest.mark.parametrize("knobs", [{}, {"speculation": "linear"}, {"selection": "longest", "max_spec_factor": 2.0}])
def test_greedy_equals_ar_on_tiny_and_the_global_tree_learns(tiny, knobs):
    drafter = SuffixDecoding(**knobs)
    drafter.setup(None, None)
    multi_token_steps = 0
    for prompt in map(repetitive_prompt, range(3)):
        truth = ar_greedy(tiny, prompt, 60).output_ids
        first = decode(tiny, drafter, prompt, 60)
        assert first.output_ids == truth
        assert drafter.stats()["steps"] == first.target_forwards
        multi_token_steps += sum(length > 1 for length in first.accept_lengths)
        again = decode(tiny, drafter, prompt, 60)  # the first answer is now in the global tree
        assert again.output_ids == truth and again.target_forwards < first.target_forwards
    assert multi_token_steps >= 5


@pytest.mark.slow
def test_greedy_equals_ar_on_the_embedded_model(embedded):
    assert embedded_multi_token_steps(embedded, SuffixDecoding()) >= 4
