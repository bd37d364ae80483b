"""OPT-Tree's tree construction (model-free), fixed tree shapes, and sampled draft methods' output law."""

import itertools

import pytest
import torch
from omegaconf import OmegaConf

from specbench.core.acceptance import Sampling
from specbench.core.drafter import DecodeContext
from specbench.core.loop import Decoder
from specbench.core.rules import acceptance_rule
from specbench.drafters.opt_tree import FixedTree, OptTree
from specbench.drafters.spede import SpeDe
from specbench.errors import ConfigError
from specbench.structures.tree_builders import OptTreeBuilder
from specbench.structures.tree_shapes import EAGLE1_TREE, TreeShape, binary_paths, fixed_shape, static_paths
from tests.conftest import tiny_model
from tests.helpers import exact_joint, pearson_statistic, sampled_outputs


def random_probs(rows: int, vocab: int, rng: torch.Generator, sharpness: float = 3.0) -> torch.Tensor:
    """[rows, vocab] random distributions, peaked like a draft model's."""
    return torch.softmax(sharpness * torch.randn(rows, vocab, generator=rng), dim=-1)


def build(nodes: int, layers: int, vocab: int = 20, seed: int = 0) -> OptTreeBuilder:
    """A builder grown ``layers`` layers deep on random draft distributions."""
    rng = torch.Generator().manual_seed(seed)
    builder = OptTreeBuilder(nodes)
    builder.add_layer(random_probs(1, vocab, rng))
    for _ in range(layers - 1):
        builder.add_layer(random_probs(len(builder.tokens[-1]), vocab, rng))
    return builder


@pytest.mark.parametrize("seed", range(6))
def test_selection_is_a_root_subtree_within_budget(seed):
    nodes = [1, 3, 8, 15, 30, 50][seed]
    builder = build(nodes, layers=6, seed=seed)
    tree, chosen, expected = builder.tree(root=99)
    assert tree.tokens[0] == 99 and len(tree) - 1 == min(nodes, sum(map(len, builder.tokens)))
    chosen_set = set(chosen)
    for layer, i in chosen:  # closed under parents: every chosen node's parent is chosen (or is the root)
        assert layer == 0 or (layer - 1, builder.parents[layer][i]) in chosen_set
    for node in range(1, len(tree)):  # the DraftTree path of every node spells the builder's tokens
        layer, i = chosen[node - 1]
        assert tree.depths[node] == layer + 1 and tree.tokens[node] == builder.tokens[layer][i]
    all_values = sorted((v for layer in builder.values for v in layer), reverse=True)
    assert expected == pytest.approx(sum(all_values[:nodes]), rel=1e-6)
    assert expected == pytest.approx(builder.expected[-1], rel=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_values_are_path_products_and_decrease_along_paths(seed):
    rng = torch.Generator().manual_seed(seed)
    builder = OptTreeBuilder(6)
    root = random_probs(1, 12, rng)
    builder.add_layer(root)
    layer2 = random_probs(len(builder.tokens[0]), 12, rng)
    builder.add_layer(layer2)
    for i, token in enumerate(builder.tokens[0]):
        assert builder.values[0][i] == pytest.approx(float(root[0, token]))
    for i, token in enumerate(builder.tokens[1]):
        parent = builder.parents[1][i]
        assert builder.values[1][i] == pytest.approx(builder.values[0][parent] * float(layer2[parent, token]))
        assert builder.values[1][i] <= builder.values[0][parent]
    # the layer keeps the global top-n of parent x top-n children
    every = sorted(
        (builder.values[0][p] * float(q), p, t)
        for p in range(len(builder.tokens[0]))
        for t, q in enumerate(layer2[p].tolist())
    )
    best = sorted(v for v, _, _ in every)[-6:]
    assert sorted(builder.values[1]) == pytest.approx(best, rel=1e-6)


def test_expected_length_never_decreases_with_depth():
    for seed in range(5):
        builder = build(10, layers=8, seed=seed)
        assert builder.expected[0] == 0.0
        assert all(a <= b + 1e-7 for a, b in itertools.pairwise(builder.expected))


def test_ties_and_zero_values_keep_the_tree_closed():
    """Deterministic drafts (q = 1 for one token) and underflow to 0 must not orphan a node."""
    builder = OptTreeBuilder(4)
    builder.add_layer(torch.tensor([[1.0, 0.0, 0.0]]))
    builder.add_layer(torch.tensor([[1.0, 0.0, 0.0]] * 3))
    builder.add_layer(torch.tensor([[0.0, 1.0, 0.0]] * 4))
    tree, _, expected = builder.tree(root=5)
    assert expected == pytest.approx(3.0) and len(tree) == 5
    deepest = max(range(len(tree)), key=tree.depths.__getitem__)
    assert [tree.tokens[i] for i in tree.path_to(deepest)] == [5, 0, 0, 1]


def test_stopping_rule():
    """Grow iff E_d - E_{d-1} > threshold and d < depth limit; keep the top-n over the layers built."""
    builder = OptTreeBuilder(2)
    builder.add_layer(torch.tensor([[0.6, 0.3, 0.05, 0.05]]))  # layer 1: 0.6, 0.3 -> E_1 = 0.9
    assert builder.expected == [0.0, pytest.approx(0.9)]
    assert builder.grows(threshold=0.5, depth_limit=5) and not builder.grows(threshold=0.95, depth_limit=5)
    assert not builder.grows(threshold=0.5, depth_limit=1)
    builder.add_layer(torch.tensor([[0.9, 0.1, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]))  # 0.54, 0.15, 0.15, 0.06
    assert builder.values[1] == pytest.approx([0.54, 0.15])
    assert builder.expected[-1] == pytest.approx(0.6 + 0.54)  # top-2 of {0.6, 0.3, 0.54, 0.15}
    assert builder.grows(threshold=0.2, depth_limit=5) and not builder.grows(threshold=0.3, depth_limit=5)
    tree, _, _ = builder.tree(root=7)
    assert tree.tokens == [7, 0, 0] and tree.parents == [-1, 0, 1]  # a chain: the 0.3 sibling lost to 0.54


class CountingOptTree(OptTree):
    """OptTree that records how many layers each step built (to check the stopping rule end to end)."""

    def draft_tree(self, ctx):
        tree = super().draft_tree(ctx)
        self.built = getattr(self, "built", []) + [max(tree.depths)]
        return tree


def test_depth_limit_and_budget_in_the_drafter():
    target = tiny_model(seed=0)
    with torch.no_grad():
        target.lm_head.weight.mul_(30)  # near-deterministic: every layer adds almost 1 to E
    drafter = CountingOptTree(nodes=5, threshold=0.0, max_depth=4, draft=OmegaConf.create({"source": "target"}))
    drafter.setup(target, None)
    with torch.inference_mode():
        gen = Decoder(target, drafter, frozenset(), Sampling()).generate([1, 2, 3], 20)
    assert max(drafter.built) == 3  # max_depth 4 = the official counter: at most 3 layers verified
    assert max(gen.draft_tokens) <= 5
    stats = drafter.stats()
    assert len(stats["step_expected_accept"]) == len(stats["step_accepted"]) == stats["steps"]
    assert stats["accepted_per_step"] > 2  # the target drafting for itself is accepted deep
    # per step: the sync forward builds layer 1, each fed layer builds the next (the last is never fed)
    assert stats["draft_forwards"] == sum(drafter.built)


def test_bad_hyperparameters_name_the_key():
    for kwargs, key in [({"nodes": 0}, "nodes"), ({"max_depth": 1}, "max_depth"), ({"threshold": -1}, "threshold")]:
        with pytest.raises(ConfigError, match=key):
            OptTree(**kwargs)
    with pytest.raises(ConfigError, match="shape"):
        FixedTree(shape="star")
    with pytest.raises(ConfigError, match="paths"):
        FixedTree(shape="paths", paths=None)


def test_tree_shapes():
    static = TreeShape.from_paths(static_paths([0.5, 0.2, 0.1], nodes=7, max_depth=3))
    # values: (0) .5, (1) .2, (0,0) .25, (0,0,0) .125, (0,1) .1, (1,0) .1, (2) .1, (0,0,1) .05 ...
    assert len(static) - 1 == 7 and static.max_depth == 3
    assert [len(static.layer(d)) for d in range(1, 4)] == [3, 3, 1]
    assert static_paths([0.9, 0.05], nodes=3, max_depth=2) == [(0,), (0, 0), (1,)]  # depth capped at 2
    for bad in (
        {"rank_hits": [], "nodes": 3, "max_depth": 2},
        {"rank_hits": [0.5], "nodes": 0, "max_depth": 2},
        {"rank_hits": [0.5], "nodes": 3, "max_depth": 0},
    ):
        with pytest.raises(ConfigError):
            static_paths(**bad)
    assert len(binary_paths(30)) == 30 and max(map(len, binary_paths(30))) == 4
    binary = TreeShape.from_paths(binary_paths(25))
    assert [len(binary.layer(d)) for d in range(1, 5)] == [2, 4, 8, 11]
    assert binary.pruned(2).max_depth == 2 and len(binary.pruned(2)) == 7
    with pytest.raises(ConfigError, match="no parent"):
        TreeShape.from_paths([[0], [1, 0]])
    with pytest.raises(ConfigError, match="ranks"):
        TreeShape.from_paths([[0], [2]])


def test_eagle1_tree_is_the_published_25_node_tree():
    assert len(EAGLE1_TREE) == len(set(EAGLE1_TREE)) == 25 and max(map(len, EAGLE1_TREE)) == 5
    assert all(len(path) == 1 or path[:-1] in EAGLE1_TREE for path in EAGLE1_TREE)
    full = fixed_shape("eagle1", nodes=None, paths=None)
    assert len(full) - 1 == 25 and [len(full.layer(d)) for d in range(1, 6)] == [4, 8, 8, 3, 2]
    assert fixed_shape("eagle1", nodes=30, paths=None) == full  # a budget above its size keeps the whole tree
    cut = fixed_shape("eagle1", nodes=6, paths=None)  # its first 6 nodes: the 4 roots' children, 2 under rank 0
    assert len(cut) - 1 == 6 and [len(cut.layer(d)) for d in (1, 2)] == [4, 2]


def test_static_tree_is_eagle1_by_default_and_needs_no_rank_profile():
    drafter = FixedTree(draft=OmegaConf.create({"source": "target"}))
    assert drafter.shape == fixed_shape("eagle1", nodes=25, paths=None)
    with pytest.raises(ConfigError, match="rank hit rates"):
        FixedTree(shape="static", draft=OmegaConf.create({"source": "target"}))


def test_fixed_tree_children_are_the_drafts_top_k():
    target = tiny_model(seed=0)
    drafter = FixedTree(
        shape="paths", paths=[[0], [1], [2], [0, 0], [0, 1]], draft=OmegaConf.create({"source": "target"})
    )
    drafter.setup(target, None)
    drafter.reset([4, 5])
    with torch.inference_mode():
        tree = drafter.propose(DecodeContext([4, 5], 2, 10, 0, None))
        first = target(torch.tensor([[4, 5]])).logits[0, -1].topk(3).indices.tolist()
        second = target(torch.tensor([[4, 5, first[0]]])).logits[0, -1].topk(2).indices.tolist()
    assert tree.tokens[1:4] == first and tree.tokens[4:] == second and tree.parents == [-1, 0, 0, 0, 1, 1]


TEMP = 0.5  # far from 1, so a draft distribution recorded without the warping would bias the output
SAMPLED = {
    "spede": (lambda d: SpeDe(num_assistant_tokens=3, schedule="constant", draft=d), "speculative"),
    "binary_sampled": (
        lambda d: FixedTree(shape="binary", nodes=6, sample_children=True, draft=d),
        "speculative",
    ),
}


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_sampled_outputs_follow_the_target(name):
    """T > 0 end to end with a draft that disagrees with the target: 4-token outputs follow the target law."""
    target = tiny_model(vocab_size=2, seed=5, hidden_size=16, num_hidden_layers=1, intermediate_size=32)
    draft = tiny_model(vocab_size=2, seed=9, hidden_size=16, num_hidden_layers=1, intermediate_size=32)
    with torch.no_grad():
        target.lm_head.weight.mul_(8)
        draft.lm_head.weight.mul_(25)  # a confident draft, so recording the wrong q (e.g. unwarped) shows
    sampling = Sampling(temperature=TEMP)
    prompt = [0, 1, 1]
    expected = exact_joint(target, prompt, 4, sampling)
    make, rule = SAMPLED[name]
    drafter = make(OmegaConf.create({"source": "target"}))
    drafter.setup(draft, None)  # "target" source: the draft model drafts for itself
    decoder = Decoder(target, drafter, frozenset(), sampling, acceptance_rule(rule))
    generator = torch.Generator().manual_seed(sorted(SAMPLED).index(name))
    counts = sampled_outputs(decoder, prompt, 4, generator, trials=1500)
    assert pearson_statistic(counts, expected) < 37.70  # 99.9% quantile of chi-square with 15 degrees of freedom
    assert drafter.stats()["drafted_per_step"] >= 1
