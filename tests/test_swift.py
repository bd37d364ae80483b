"""SWIFT: greedy == AR, the match-rate objective, the optimization phase's rules and end, the confidence-aware tree,
forget, sampled drafts' laws, and the fixed-count Bayesian proposals."""

import pytest
import torch

from specbench.core.acceptance import Sampling
from specbench.core.drafter import DecodeContext
from specbench.core.tree import child_lists
from specbench.core.verify import new_cache, prefill
from specbench.drafters.swift import Swift, match_rate
from specbench.errors import ConfigError
from specbench.models.layer_skip import LayerSkip, SkipSet
from specbench.structures.bayes_opt import BinarySearch
from tests.test_anpd_pld import decode, embedded_multi_token_steps, repetitive_prompt
from tests.test_loop import ar_greedy

TINY = {"keep_ends": False, "context_window": 8}  # tiny has 2 layers; a window its short outputs reach


def swift(tiny, **knobs) -> Swift:
    """A SWIFT drafter set up on ``tiny``."""
    drafter = Swift(**{**TINY, **knobs})
    drafter.setup(tiny, None)
    return drafter


def recorded_trees(drafter: Swift) -> list:
    """The trees ``drafter`` proposes from now on, in order."""
    trees: list = []
    propose = drafter.propose
    drafter.propose = lambda ctx: trees.append(propose(ctx)) or trees[-1]  # type: ignore[method-assign]
    return trees


def scripted(drafter: Swift, scores: list[float]) -> list[SkipSet]:
    """Make ``drafter`` score its candidates ``scores`` in turn; returns the candidate sets it scored."""
    scored: list[SkipSet] = []

    def score(ctx, skip):
        scored.append(skip)
        return scores[len(scored) - 1]

    drafter.score = score  # type: ignore[method-assign]
    return scored


# ----------------------------------------------------------------------------------- decoding


def test_greedy_equals_ar_while_the_set_is_searched(tiny):
    for seed in range(3):
        prompt = repetitive_prompt(seed)
        drafter = swift(tiny)
        gen = decode(tiny, drafter, prompt, 48)  # the loop refuses a step that leaves draft rows behind
        assert gen.output_ids == ar_greedy(tiny, prompt, 48).output_ids
        stats = drafter.stats()
        assert stats["optimization_steps"] > 0 and stats["set_changes"] > 0 and stats["drafted"] > stats["steps"]


def test_greedy_equals_ar_on_the_embedded_model(embedded):
    drafter = Swift(context_window=6, max_opt_iter=2, max_draft=8)
    assert embedded_multi_token_steps(embedded, drafter, 20) > 0
    assert drafter.search is not None and drafter.search.iterations > 0


def test_the_tree_is_the_top1_chain_with_siblings_by_confidence(tiny):
    drafter = swift(tiny, threshold=0.0, max_draft=3, tree_widths=[2, 3, 4, 5])
    trees = recorded_trees(drafter)
    decode(tiny, drafter, repetitive_prompt(1), 12)
    tree, kids = trees[0], child_lists(trees[0].parents)  # the first step's tree, drafted on the prompt
    chain = [0]
    while kids[chain[-1]]:
        chain.append(kids[chain[-1]][0])  # the first (top-1) child continues the chain
    assert len(chain) == 4 and tree.num_drafted > 3  # three chain tokens, and siblings beside them
    cache = new_cache(tiny, 64)
    with torch.inference_mode():
        prefill(tiny, cache, torch.tensor(repetitive_prompt(1)))
        skipper = LayerSkip(tiny, SkipSet((0,), (0,)))  # the initial set: every second layer's sub-layers
        for parent in chain[:-1]:
            with skipper.drafting():
                logits = skipper.next_logits(tree.tokens[parent], cache)  # [vocab]
            width = drafter.width(float(logits.softmax(-1).max()), sampled=False)
            assert [tree.tokens[n] for n in kids[parent]] == logits.topk(width).indices.tolist()


def test_widths_follow_the_confidence_bands():
    drafter = Swift()
    assert [drafter.width(p, sampled=False) for p in (0.99, 0.9, 0.6, 0.3, 0.5)] == [3, 5, 8, 10, 10]
    assert [drafter.width(p, sampled=True) for p in (0.99, 0.9, 0.6, 0.3)] == [1, 3, 5, 10]


def test_sampled_drafts_carry_the_law_they_were_drawn_from(tiny):
    drafter = swift(tiny)
    trees = recorded_trees(drafter)
    gen = decode(tiny, drafter, repetitive_prompt(2), 30, sampling=Sampling(0.7, 0.9), generator=torch.Generator())
    assert len(gen.output_ids) == 30  # the chi-square check of the output law is the conformance suite's
    drafted = [tree for tree in trees if tree.num_drafted]
    assert drafted and drafter.stats()["optimization_steps"] > 0
    for tree in drafted:
        assert tree.draft_probs is not None and tree.draft_probs.shape == (len(tree), 97)
        parents = sorted(set(tree.parents[1:]))
        torch.testing.assert_close(tree.draft_probs[parents].sum(-1), torch.ones(len(parents)))
        for node in range(1, len(tree)):  # each candidate was drawn from its parent's row, without replacement
            assert tree.draft_probs[tree.parents[node], tree.tokens[node]] > 0
        for parent in parents:
            siblings = [tree.tokens[n] for n in range(1, len(tree)) if tree.parents[n] == parent]
            assert len(set(siblings)) == len(siblings)


# ----------------------------------------------------------------------------------- the objective


def test_the_match_rate_counts_argmax_hits_on_the_next_token():
    logits = torch.zeros(4, 5)  # [positions, vocab]
    logits[0, 2] = logits[1, 0] = logits[2, 4] = logits[3, 1] = 1.0  # argmax 2, 0, 4, (last row unused)
    assert match_rate(logits, torch.tensor([9, 2, 3, 4])) == pytest.approx(2 / 3)


def context_after(tiny, prompt: list[int], output: list[int]) -> DecodeContext:
    """A decode context after ``output``: the target's cache holding every committed token but the root."""
    tokens = prompt + output
    cache = new_cache(tiny, len(tokens) + 64)
    with torch.inference_mode():
        prefill(tiny, cache, torch.tensor(tokens[:-1]))
    return DecodeContext(tokens, len(prompt), remaining=20, step=len(output), generator=None, cache=cache)


def test_a_set_is_scored_by_its_drafts_match_rate_on_the_verified_window(tiny):
    prompt = repetitive_prompt(0)
    output = ar_greedy(tiny, prompt, 14).output_ids  # window: the first 9 output tokens
    drafter = swift(tiny)
    ctx = context_after(tiny, prompt, output)
    with torch.inference_mode():
        assert drafter.score(ctx, SkipSet()) == pytest.approx(1.0)  # nothing skipped: the target's own argmax
        wrong = (output[8] + 1) % 97
        assert drafter.score(context_after(tiny, prompt, [*output[:8], wrong, *output[9:]]), SkipSet()) == 7 / 8
        skip = SkipSet((1,), (0,))
        cache = new_cache(tiny, 64)  # by hand: the prompt by the full model, then the window by the draft
        prefill(tiny, cache, torch.tensor(prompt))
        with LayerSkip(tiny, skip).drafting():
            logits = tiny(input_ids=torch.tensor([output[:9]]), past_key_values=cache).logits[0]  # [9, vocab]
        expected = sum(int(logits[i].argmax()) == output[i + 1] for i in range(8)) / 8
        assert drafter.score(ctx, skip) == pytest.approx(expected)
    assert expected < 1.0  # the skipped set misses some: a score that tells sets apart
    assert ctx.cache is not None and ctx.cache.get_seq_length() == ctx.position  # the window's rows cropped
    assert drafter.skipper is not None and drafter.skipper.skip == SkipSet((0,), (0,))  # the current set is back


# ----------------------------------------------------------------------------------- the optimization phase


def test_a_better_candidate_replaces_the_set_and_the_best_score_ends_the_phase(tiny):
    drafter = swift(tiny)
    scored = scripted(drafter, [0.5, 0.4, 0.6, 0.95])
    ctx = context_after(tiny, repetitive_prompt(0), list(range(1, 12)))
    history = []
    for _ in range(4):
        drafter.optimize(ctx)
        history.append((drafter.skipper.skip, drafter.search.tolerance, drafter.search.running))
    assert [h[0] for h in history] == [scored[0], scored[0], scored[2], scored[3]]
    assert [h[1] for h in history] == [0, 1, 0, 0]
    assert [h[2] for h in history] == [True, True, True, False]  # 0.95 > max_score 0.93: acceleration phase
    assert drafter.stats()["phase"] == "acceleration" and drafter.stats()["best_match_rate"] == 0.95
    assert all(len(s.attention) + len(s.mlp) == int(4 * 0.45) for s in scored)  # r of the 2L sub-layers


def test_the_phase_ends_after_the_tolerance_or_the_step_limit(tiny):
    drafter = swift(tiny, max_tolerance_iter=2)
    scripted(drafter, [0.5, 0.1, 0.1, 0.1])
    ctx = context_after(tiny, repetitive_prompt(0), list(range(1, 12)))
    for expected in (True, True, True, False):  # the third miss in a row exceeds the tolerance of 2
        drafter.optimize(ctx)
        assert drafter.search.running is expected
    drafter = swift(tiny, max_opt_iter=2)
    scripted(drafter, [0.1, 0.2, 0.3])
    for expected in (True, True, False):  # more than 2 steps
        drafter.optimize(ctx)
        assert drafter.search.running is expected


def test_every_bayes_interval_th_step_is_a_bayesian_proposal(tiny):
    drafter = swift(tiny, bayes_interval=3)
    scripted(drafter, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    ctx = context_after(tiny, repetitive_prompt(0), list(range(1, 12)))
    for _ in range(6):
        drafter.optimize(ctx)
    assert drafter.books.counts["bayes_steps"] == 2 and drafter.books.counts["optimization_steps"] == 6


def test_the_search_ends_and_its_set_carries_over_until_forget(tiny):
    drafter = swift(tiny, max_opt_iter=2, max_score=1.0)  # no score exceeds 1: the step limit ends the phase
    initial = drafter.skipper.skip
    prompt = repetitive_prompt(0)
    first = decode(tiny, drafter, prompt, 40)
    stats = drafter.stats()
    assert stats["phase"] == "acceleration" and stats["optimization_steps"] == 3 and stats["set_changes"] > 0
    found = drafter.skipper.skip
    assert found != initial
    second = decode(tiny, drafter, prompt, 40)  # the acceleration phase: no more optimization steps
    assert drafter.stats()["optimization_steps"] == 0 and drafter.skipper.skip == found
    assert second.output_ids == first.output_ids
    drafter.forget()
    assert drafter.skipper.skip == initial and drafter.search.iterations == 0 and drafter.search.running
    again = decode(tiny, drafter, prompt, 40)
    fresh = swift(tiny, max_opt_iter=2, max_score=1.0)
    decode(tiny, fresh, prompt, 40)
    assert again.accept_lengths == first.accept_lengths
    assert {k: v for k, v in drafter.stats().items() if not k.endswith("_s")} == {
        k: v for k, v in fresh.stats().items() if not k.endswith("_s")
    }


def test_no_optimization_before_the_output_holds_the_window(tiny):
    drafter = swift(tiny, context_window=30)
    decode(tiny, drafter, repetitive_prompt(0), 31)  # at most 31 output tokens: never more than window + 1
    assert drafter.stats()["optimization_steps"] == 0 and drafter.stats()["phase"] == "optimization"


def test_knobs_are_checked(tiny):
    with pytest.raises(ConfigError, match=r"method.drafter.skip_ratio \(r\)"):
        Swift(skip_ratio=1.5)
    with pytest.raises(ConfigError, match="confidence_levels must be a non-empty decreasing"):
        Swift(confidence_levels=[0.5, 0.8])
    with pytest.raises(ConfigError, match="tree_widths must list 4 counts"):
        Swift(tree_widths=[3, 5])
    with pytest.raises(ConfigError, match="tree_widths_sampled must be a list"):
        Swift(tree_widths_sampled=3)
    with pytest.raises(ConfigError, match="no layer is left to skip"):
        Swift().setup(tiny, None)  # keep_ends on a 2-layer model


# ----------------------------------------------------------------------------------- fixed-count proposals


def test_fixed_count_proposals_keep_their_number_of_ones():
    search = BinarySearch(8, seed=1, ones=3)
    points = [search.random_point() for _ in range(20)]
    assert all(sum(p) == 3 for p in points) and len(set(points)) > 1
    for i, bits in enumerate(points[:5]):
        search.observe(bits, float(i))
    assert sum(search.propose()) == 3
    neighbours = search.neighbours((1, 1, 1, 0, 0, 0, 0, 0))
    assert neighbours.shape == (15, 8) and bool((neighbours.sum(-1) == 3).all())
    assert bool(((neighbours != torch.tensor([1, 1, 1, 0, 0, 0, 0, 0])).sum(-1) == 2).all())
