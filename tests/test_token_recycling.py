"""Token Recycling: the successor matrix's update and expansion, the drafter's knobs, greedy == AR."""

import hydra
import pytest
import torch

from specbench.config import compose_config
from specbench.core.acceptance import Sampling, accept_match
from specbench.core.drafter import DecodeContext
from specbench.core.verify import forward_tree, lay_out, new_cache, prefill
from specbench.drafters.token_recycling import TokenRecycling
from specbench.errors import ConfigError
from specbench.structures.successors import (
    RECYCLING_TREE_CHILDREN,
    SuccessorTable,
    paths_from_children,
    recycling_tree,
)
from specbench.structures.tree_shapes import TreeShape
from tests.test_anpd_pld import decode, embedded_multi_token_steps, looping_prompt, repetitive_prompt
from tests.test_loop import ar_greedy

# ----------------------------------------------------------------------------------- the matrix


def one_hot_logits(rows: list[list[int]], vocab: int) -> torch.Tensor:
    """Logits [n, vocab] whose ranking puts row i's listed tokens first, in order, then the rest."""
    logits = torch.zeros(len(rows), vocab)
    for i, ranked in enumerate(rows):
        for rank, token in enumerate(ranked):
            logits[i, token] = 10.0 - rank
    return logits


def test_update_replaces_each_verified_tokens_row_with_its_top_k():
    table = SuccessorTable(12, 3)
    assert table.matrix.shape == (12, 3) and table.rows_filled == 0 and not table.matrix.any()
    table.update([5, 7], one_hot_logits([[1, 2, 3], [9, 8, 4]], 12))
    assert table.matrix[5].tolist() == [1, 2, 3] and table.matrix[7].tolist() == [9, 8, 4]
    assert table.rows_filled == 2 and table.filled[5] and table.filled[7] and not table.filled[0]
    assert not table.matrix[[0, 1, 6, 11]].any()  # untouched rows keep their initial zeros
    table.update(torch.tensor([5]), one_hot_logits([[11, 0, 6]], 12))  # a row is replaced, not merged
    assert table.matrix[5].tolist() == [11, 0, 6] and table.matrix[7].tolist() == [9, 8, 4]
    table.reset()
    assert not table.matrix.any() and table.rows_filled == 0


def test_a_token_on_several_rows_gets_the_top_k_of_its_last_row():
    table = SuccessorTable(10, 2)
    table.update([3, 4, 3, 3, 4], one_hot_logits([[0, 1], [2, 5], [6, 7], [8, 9], [1, 2]], 10))
    assert table.matrix[3].tolist() == [8, 9] and table.matrix[4].tolist() == [1, 2]
    table.update([], torch.zeros(0, 10))  # an empty pass changes nothing
    assert table.matrix[3].tolist() == [8, 9]


def test_the_drafter_recycles_every_verified_row_not_only_the_accepted_path(tiny, truths):
    drafter = TokenRecycling()
    drafter.setup(tiny, None)
    decode(tiny, drafter, truths[0][0], 20)  # a warm matrix: the next tree holds varied tokens
    prompt = truths[1][0]
    drafter.start(prompt)
    with torch.inference_mode():
        cache = new_cache(tiny, len(prompt) + 100)
        root = int(prefill(tiny, cache, torch.tensor(prompt)).argmax())
        ctx = DecodeContext([*prompt, root], len(prompt), 50, 0, None)
        tree = drafter.propose(ctx)
        verified = forward_tree(tiny, cache, tree, (), lay_out(tiny, cache, tree))
        accepted = accept_match(tree, verified.logits, Sampling())
        drafter.observe(ctx, tree, verified, accepted)
    assert len(set(tree.tokens)) > len(accepted.path) + 1  # rows off the accepted path exist
    for node, token in enumerate(tree.tokens):
        last = max(i for i, other in enumerate(tree.tokens) if other == token)
        assert drafter.table.matrix[token].tolist() == verified.logits[last].topk(8).indices.tolist(), node


# ----------------------------------------------------------------------------------- the tree


def test_the_paper_tree_has_80_nodes_over_six_levels():
    shape = recycling_tree()
    assert len(shape) == 81 and shape.max_depth == 6
    assert [len(shape.layer(depth)) for depth in range(1, 7)] == [8, 21, 25, 15, 8, 3]
    assert max(shape.ranks) == 7  # every candidate rank of a row of k = 8
    assert sorted(len(kids) for kids in shape.children())[-3:] == [8, 8, 8]  # root, [0] and [0, 0]
    assert paths_from_children(RECYCLING_TREE_CHILDREN)[:3] == [(0,), (1,), (2,)]
    with pytest.raises(ValueError, match="child counts"):
        paths_from_children([(2,), (1,)])


def test_expansion_follows_the_matrix_rank_by_rank():
    vocab, k = 50, 8
    table = SuccessorTable(vocab, k)
    table.matrix.copy_((torch.arange(vocab)[:, None] * 7 + torch.arange(k)[None, :] + 1) % vocab)
    shape = recycling_tree()
    tree = table.tree(3, shape)
    assert tree.parents == list(shape.parents) and tree.tokens[0] == 3 and tree.num_drafted == 80
    for node in range(1, len(shape)):
        parent_token = tree.tokens[shape.parents[node]]
        assert tree.tokens[node] == table.matrix[parent_token, shape.ranks[node]]
    small = TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    chain = table.tree(4, small)
    m = table.matrix
    assert chain.tokens == [4, m[4, 0], m[4, 1], m[m[4, 0], 0], m[m[4, 0], 1], m[m[m[4, 0], 0], 0]]
    assert table.tree(4, small.pruned(0)).tokens == [4]
    with pytest.raises(ValueError, match="rank 2"):
        SuccessorTable(vocab, 2).tree(0, TreeShape.from_paths([[0], [1], [2]]))


def test_stats_report_the_matrix_as_extra_memory(tiny):
    drafter = TokenRecycling()
    drafter.setup(tiny, None)
    decode(tiny, drafter, repetitive_prompt(1), 20)
    stats = drafter.stats()
    assert (stats["matrix_rows"], stats["matrix_k"]) == (97, 8)
    assert stats["matrix_bytes"] == 97 * 8 * 8  # int64 token ids
    assert stats["steps"] >= 1 and stats["drafted"] <= 80 * stats["steps"]
    assert 0 < stats["matrix_rows_filled"] <= 97 and stats["matrix_generations"] == 1


# ----------------------------------------------------------------------------------- knobs


@pytest.mark.parametrize(
    "knobs, key",
    [
        (dict(topk="8"), "topk"),
        (dict(topk=0), "topk"),
        (dict(topk=4), "topk"),  # the paper tree uses ranks up to 7
        (dict(tree="dynamic"), "tree"),
        (dict(tree="paths"), "paths"),
        (dict(paths=[[0]]), "paths"),
        (dict(tree="paths", paths=[[1]]), "ranks"),
        (dict(tree="paths", paths=[[0, 0]]), "parent"),
        (dict(hot_start="yes"), "hot_start"),
    ],
)
def test_bad_knobs_name_the_key(knobs, key):
    with pytest.raises(ConfigError, match=key):
        TokenRecycling(**knobs)


def test_topk_beyond_the_vocabulary_is_refused_at_setup():
    from tests.conftest import tiny_model

    with pytest.raises(ConfigError, match="topk"):
        TokenRecycling(topk=20, tree="paths", paths=[[0]]).setup(tiny_model(vocab_size=16), None)
    with pytest.raises(RuntimeError, match="setup"):
        TokenRecycling().stats()


def test_the_config_instantiates_the_paper_defaults():
    cfg = compose_config("method=token_recycling").method
    assert cfg.engine == "loop" and cfg.lossless and cfg.acceptance == "match"
    drafter = hydra.utils.instantiate(cfg.drafter)
    assert isinstance(drafter, TokenRecycling) and drafter.topk == 8 and drafter.hot_start
    assert drafter.shape == recycling_tree()
    custom = compose_config(
        "method=token_recycling", "method.drafter.tree=paths", "method.drafter.paths=[[0],[1],[0,0]]"
    ).method.drafter
    assert len(hydra.utils.instantiate(custom).shape) == 4


# ----------------------------------------------------------------------------------- decoding


@pytest.fixture(scope="module")
def truths(tiny) -> list[tuple[list[int], list[int]]]:
    """(prompt, AR greedy output of 40 tokens) for two prompts the tiny model continues repetitively."""
    prompts = [looping_prompt(tiny, seed) for seed in range(2)]
    return [(prompt, ar_greedy(tiny, prompt, 40).output_ids) for prompt in prompts]


@pytest.mark.parametrize(
    "make",
    [
        lambda: TokenRecycling(),
        lambda: TokenRecycling(hot_start=False),
        lambda: TokenRecycling(topk=2, tree="paths", paths=[[0], [1], [0, 0], [0, 0, 0], [0, 0, 0, 0]]),
    ],
    ids=["paper", "cold_start", "small_tree"],
)
def test_greedy_equals_ar_on_a_tiny_model(tiny, truths, make):
    drafter = make()
    drafter.setup(tiny, None)
    multi_token_steps = 0
    for prompt, truth in truths:
        gen = decode(tiny, drafter, prompt, 40)  # one drafter across prompts: M carries over when hot
        assert gen.output_ids == truth
        multi_token_steps += sum(length > 1 for length in gen.accept_lengths)
    assert multi_token_steps >= 4  # the recycled candidates do get accepted


def test_budget_and_eos_cut_the_tree(tiny, truths):
    prompt, truth = truths[0]
    drafter = TokenRecycling()
    drafter.setup(tiny, None)
    decode(tiny, drafter, prompt, 40)  # warm M so that later steps accept deep drafts
    for budget in (1, 2, 7, 23):
        assert decode(tiny, drafter, prompt, budget).output_ids == truth[:budget]
    eos = frozenset({truth[12]})
    stop = truth.index(truth[12])
    assert decode(tiny, drafter, prompt, 40, eos).output_ids == truth[: stop + 1]


def test_hot_start_keeps_the_matrix_across_generations_and_cold_start_resets_it(tiny, truths):
    (first, _), (second, _) = truths
    hot, cold, fresh = TokenRecycling(), TokenRecycling(hot_start=False), TokenRecycling()
    for drafter in (hot, cold, fresh):
        drafter.setup(tiny, None)
    decode(tiny, hot, first, 20)
    decode(tiny, cold, first, 20)
    kept = hot.table.matrix.clone()
    hot.reset(second)  # what the loop's start() does before the next generation
    cold.reset(second)
    assert torch.equal(hot.table.matrix, kept) and hot.table.rows_filled > 0
    assert not cold.table.matrix.any() and cold.table.rows_filled == 0
    cold_gen, fresh_gen = decode(tiny, cold, second, 20), decode(tiny, fresh, second, 20)
    assert cold_gen.accept_lengths == fresh_gen.accept_lengths  # a cold start is a fresh matrix
    assert torch.equal(cold.table.matrix, fresh.table.matrix)


def test_sampling_with_a_seed_is_reproducible(tiny):
    # the exactness of the sampled law is the conformance suite's sampling check (chi-square against the target)
    sampling = Sampling(temperature=0.7, top_p=0.9)
    outputs = []
    for _ in range(2):
        drafter = TokenRecycling()
        drafter.setup(tiny, None)
        generator = torch.Generator().manual_seed(3)
        outputs.append(decode(tiny, drafter, repetitive_prompt(2), 20, sampling=sampling, generator=generator))
    assert outputs[0].output_ids == outputs[1].output_ids and len(outputs[0].output_ids) == 20


@pytest.mark.slow
def test_greedy_equals_ar_on_the_embedded_model(embedded):
    drafter = TokenRecycling()
    assert embedded_multi_token_steps(embedded, drafter) >= 4
    assert drafter.stats()["matrix_rows"] == embedded.model.config.vocab_size
