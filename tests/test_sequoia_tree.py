"""Sequoia's static tree (OPT-Tree Fig 5's baseline): the builder's optimality by brute force, its depth bound and
heap order, the measured acceptance vector, and the method's greedy output equal to AR's on tiny random models."""

import json
import random

import pytest
import torch
from omegaconf import OmegaConf

from specbench import conformance
from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.drafters.opt_tree import AcceptanceCalibration, FixedTree
from specbench.engines import build_engine
from specbench.errors import ConfigError, ModelUnavailable
from specbench.structures.medusa_tree import path_value
from specbench.structures.sequoia_tree import (
    checked_acceptance,
    expected_length,
    is_non_increasing,
    optimal_paths,
    rank_hits,
    sequoia_paths,
)
from specbench.structures.tree_shapes import TreeShape, fixed_shape, static_paths
from specbench.train import sequoia
from tests.conftest import tiny_model
from tests.test_loop import ar_greedy


def every_tree(nodes: int, ranks: int, max_depth: int | None) -> list[frozenset]:
    """Every tree of exactly ``nodes`` drafted nodes (children of a node use ranks 0..j-1, ranks < ``ranks``, at most
    ``max_depth`` deep), or of the most nodes such trees can hold when fewer."""
    trees: set[frozenset] = {frozenset()}
    for _ in range(nodes):
        grown = set()
        for tree in trees:
            for parent in [(), *tree]:
                if max_depth is not None and len(parent) >= max_depth:
                    continue
                rank = sum(1 for path in tree if path[:-1] == parent)
                if rank < ranks:
                    grown.add(tree | {(*parent, rank)})
        if not grown:
            break
        trees = grown
    return list(trees)


def random_vector(rng: random.Random, ranks: int, sorted_: bool) -> list[float]:
    """A random acceptance vector of ``ranks`` entries summing to less than 1 (non-increasing when ``sorted_``)."""
    raw = [rng.random() for _ in range(ranks)]
    scale = sum(raw) * rng.uniform(1.0, 2.0)
    vector = [value / scale for value in raw]
    return sorted(vector, reverse=True) if sorted_ else vector


@pytest.mark.parametrize("seed", range(8))
def test_the_tree_is_optimal_over_every_tree_of_up_to_six_nodes(seed):
    rng = random.Random(seed)
    ranks = 1 + seed % 4
    p = random_vector(rng, ranks, sorted_=seed % 2 == 0)
    if seed % 2 and ranks > 1:  # not monotone: the greedy n largest products would break rank order
        p[0], p[1] = min(p[:2]), max(p[:2]) + 1e-3
    for max_depth in (None, 1, 2, 3):
        for nodes in range(1, 7):
            trees = every_tree(nodes, ranks, max_depth)
            best = max(expected_length(sorted(tree), p) for tree in trees)
            for build in (sequoia_paths, optimal_paths):
                paths = build(p, nodes, max_depth)
                TreeShape.from_paths(paths)  # closed under parents, ranks 0..j-1 under every node
                assert len(paths) == len(trees[0]) and len(set(paths)) == len(paths)
                assert max(map(len, paths)) <= (max_depth or nodes)
                assert expected_length(paths, p) == pytest.approx(best, abs=1e-12), (build.__name__, nodes, max_depth)


def test_a_non_monotone_vector_keeps_rank_order():
    p = [0.2, 0.5]  # rank 1 measured above rank 0: a rank-1 child needs its rank-0 sibling
    assert not is_non_increasing(p)
    assert sequoia_paths(p, 1) == [(0,)]
    assert sequoia_paths(p, 2) == [(0,), (1,)]  # 0.7 beats the chain's 0.2 + 0.04
    assert expected_length(sequoia_paths(p, 4, max_depth=2), p) == pytest.approx(
        max(expected_length(sorted(t), p) for t in every_tree(4, 2, 2))
    )


@pytest.mark.parametrize("max_depth", [None, 2, 4])
def test_monotone_vectors_give_the_n_largest_path_products_in_heap_order(max_depth):
    p = [0.55, 0.15, 0.08, 0.04, 0.02]
    rows = [p] * 40
    previous: set = set()
    for nodes in range(1, 41):
        paths = sequoia_paths(p, nodes, max_depth)
        values = sorted((path_value(path, rows) for path in paths), reverse=True)
        candidates = [path for tree in [set(sequoia_paths(p, 60, max_depth))] for path in tree]
        assert values == pytest.approx(sorted((path_value(c, rows) for c in candidates), reverse=True)[:nodes])
        for path in paths:  # heap order: no node is worth more than its parent or its lower-ranked sibling
            assert path_value(path, rows) <= path_value(path[:-1], rows)
            assert path[-1] == 0 or path_value(path, rows) <= path_value((*path[:-1], path[-1] - 1), rows)
        assert previous <= set(paths)  # nested: the tree of n nodes lies inside the tree of n + 1
        previous = set(paths)
        assert max(map(len, paths)) <= (max_depth or nodes)
        # the shared greedy: the static tree of the same profile and depth bound is the same tree
        if max_depth is not None:
            assert sorted(paths) == sorted(static_paths(p, nodes, max_depth))
        # and the dynamic program finds the same expected length
        assert expected_length(optimal_paths(p, nodes, max_depth), p) == pytest.approx(expected_length(paths, p))


def test_the_depth_bound():
    p = [0.9, 0.05]
    assert sequoia_paths(p, 3) == [(0,), (0, 0), (0, 0, 0)]  # unbounded: the chain (0.9 + 0.81 + 0.729)
    assert sequoia_paths(p, 3, max_depth=2) == [(0,), (1,), (0, 0)]
    assert sequoia_paths(p, 5, max_depth=1) == [(0,), (1,)]  # two ranks, one level: two nodes at most
    assert sequoia_paths([0.3, 0.6], 5, max_depth=1) == [(0,), (1,)]
    for nodes in (10, 50, 120):
        assert max(map(len, sequoia_paths(p, nodes, max_depth=6))) <= 6
        assert max(map(len, optimal_paths([0.1, 0.6, 0.2], nodes, max_depth=6))) <= 6


def test_bad_vectors_and_knobs_name_the_key():
    for bad in ([], [1.2], [0.7, 0.6], ["a"], "0.5", [True], None):
        with pytest.raises(ConfigError, match="acceptance_vector"):
            checked_acceptance(bad)
    with pytest.raises(ConfigError, match="nodes"):
        sequoia_paths([0.5], 0)
    with pytest.raises(ConfigError, match="max_depth"):
        sequoia_paths([0.5], 3, max_depth=0)
    with pytest.raises(ConfigError, match="acceptance vector"):
        fixed_shape("sequoia", 5, None)
    with pytest.raises(ConfigError, match="calibration"):
        FixedTree(shape="sequoia", nodes=5, max_depth=None, calibration={"dataset": "c4"})
    settings = {"dataset": "c4", "limit": 200, "max_length": 256, "top_k": 16, "data_dir": None}
    for key, value in [("dataset", "wikitext"), ("limit", 0), ("max_length", 1), ("top_k", "abc")]:
        with pytest.raises(ConfigError, match=f"calibration.{key}"):
            FixedTree(shape="sequoia", max_depth=None, calibration={**settings, key: value})
    with pytest.raises(ConfigError, match="nodes"):
        FixedTree(shape="sequoia", nodes=0, max_depth=None, calibration=settings)
    # a given vector builds the tree at once, before any model loads
    tree = FixedTree(shape="sequoia", nodes=4, max_depth=None, acceptance_vector=[0.6, 0.3])
    assert tree.shape is not None and tree.shape.rank_paths() == [(0,), (1,), (0, 0), (0, 0, 0)]


def test_rank_hits_count_where_the_target_token_falls():
    draft = torch.tensor([[0.0, 3.0, 2.0, 1.0], [5.0, 1.0, 0.0, 2.0], [0.0, 1.0, 2.0, 3.0]])  # [3 positions, vocab 4]
    target = torch.tensor([1, 3, 0])  # ranks 0, 1, 3
    assert rank_hits(target, draft, 3).tolist() == [1, 1, 0]  # rank 3 lies beyond k = 3
    assert rank_hits(target, draft, 6).tolist() == [1, 1, 0, 1, 0, 0]


TINY_DRAFT = {
    "source": "tiny",
    "tiny": {
        "seed": 3,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 64,
    },
}
CALIBRATION = {"dataset": "mbpp_train", "limit": 8, "max_length": 32, "top_k": 6, "data_dir": None}


def calibration_ids(count: int = 12, vocab: int = 97) -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(8, 30))] for _ in range(count)]


def test_the_measured_vector_is_teacher_forced_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(sequoia, "calibration_token_ids", lambda settings, tokenizer: calibration_ids())
    target = tiny_model(seed=0)
    with torch.no_grad():
        target.lm_head.weight.mul_(6)
    drafter = FixedTree(
        shape="sequoia", nodes=10, max_depth=None, calibration=CALIBRATION, draft=OmegaConf.create(SELF)
    )
    with pytest.raises(ModelUnavailable, match="python -m specbench.train sequoia model=target"):
        drafter.setup(target, None)  # not measured yet: the run names the command
    sequoia.measure(drafter, target, None)
    drafter.setup(target, None)
    assert drafter.acceptance == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # the target drafting for itself: always rank 0
    assert drafter.shape is not None and drafter.shape.rank_paths() == [(0,) * d for d in range(1, 11)]
    # another draft: counts by hand from the two models' logits
    draft_cfg = OmegaConf.create(TINY_DRAFT)
    drafter = FixedTree(shape="sequoia", nodes=12, max_depth=3, calibration=CALIBRATION, draft=draft_cfg)
    sequoia.measure(drafter, target, None)
    drafter.setup(target, None)
    assert drafter.lm is not None
    hits, positions = [0] * 6, 0
    with torch.no_grad():
        for ids in calibration_ids():
            greedy = target(torch.tensor([ids])).logits[0].argmax(-1)
            order = drafter.lm.model(torch.tensor([ids])).logits[0].argsort(-1, descending=True)
            for position, token in enumerate(greedy.tolist()):
                rank = order[position].tolist().index(token)
                if rank < 6:
                    hits[rank] += 1
            positions += len(ids)
    assert drafter.acceptance == pytest.approx([h / positions for h in hits])
    assert drafter.shape is not None and drafter.shape.rank_paths() == sequoia_paths(drafter.acceptance, 12, 3)
    files = list((tmp_path / "sequoia" / "target").glob("*.json"))
    assert len(files) == 2 and drafter.calibration_record is not None
    record = json.loads(files[0].read_text())
    assert record["positions"] == positions and record["texts"] == len(calibration_ids())
    assert any(part.startswith("sequoia:") for part in drafter.artefacts())
    stats = drafter.stats()
    assert stats["acceptance_vector"] == [round(a, 4) for a in drafter.acceptance]
    assert stats["tree_expected_accept"] == pytest.approx(
        expected_length(drafter.shape.rank_paths(), drafter.acceptance), abs=1e-4
    )

    def measured_again(*args):
        raise AssertionError("the cached vector was measured again")

    monkeypatch.setattr(sequoia, "measure_rank_hits", measured_again)
    again = FixedTree(shape="sequoia", nodes=5, max_depth=3, calibration=CALIBRATION, draft=draft_cfg)
    sequoia.measure(again, target, None)  # stored: kept, not measured again
    again.setup(target, None)
    assert again.acceptance == drafter.acceptance
    other = {**CALIBRATION, "top_k": 4}  # other settings: another measurement
    with pytest.raises(AssertionError, match="measured again"):
        sequoia.measure(
            FixedTree(shape="sequoia", nodes=5, calibration=other, max_depth=3, draft=draft_cfg), target, None
        )


SELF = {"source": "target"}


@pytest.mark.parametrize("max_depth", [None, 3])
def test_greedy_output_equals_ar(monkeypatch, tmp_path, max_depth):
    """Lossless on a tiny random Llama: a peaked target and another tiny draft, p measured, 40 tokens equal AR's."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(sequoia, "calibration_token_ids", lambda settings, tokenizer: calibration_ids())
    target = tiny_model(seed=0)
    with torch.no_grad():
        target.lm_head.weight.mul_(6)
    rng = random.Random(0)
    for nodes in (3, 10, 25):
        drafter = FixedTree(
            shape="sequoia",
            nodes=nodes,
            max_depth=max_depth,
            calibration=CALIBRATION,
            draft=OmegaConf.create(TINY_DRAFT),
        )
        sequoia.measure(drafter, target, None)
        drafter.setup(target, None)
        for _ in range(2):
            prompt = [rng.randrange(97) for _ in range(rng.randrange(3, 12))]
            truth = ar_greedy(target, prompt, 40).output_ids
            with torch.inference_mode():
                gen = Decoder(target, drafter, frozenset(), Sampling()).generate(prompt, 40)
            assert gen.output_ids == truth
            assert max(gen.draft_tokens) <= nodes
    # the target drafting for itself: every drafted token of the chain is accepted
    drafter = FixedTree(
        shape="sequoia", nodes=4, max_depth=max_depth, calibration=CALIBRATION, draft=OmegaConf.create(SELF)
    )
    sequoia.measure(drafter, target, None)
    drafter.setup(target, None)
    with torch.inference_mode():
        gen = Decoder(target, drafter, frozenset(), Sampling()).generate([5, 6, 7], 31)
    assert gen.output_ids == ar_greedy(target, [5, 6, 7], 31).output_ids
    assert gen.accept_lengths[:-1] == [min(4, max_depth or 4) + 1] * (len(gen.accept_lengths) - 1)


def test_the_method_config_runs_lossless_on_tiny_llama(training_cache, shared_data):
    """conf/method/sequoia_tree.yaml on the conformance suite's tiny model, p measured by the trainer on MBPP's train
    problems through the model's tokenizer (offline): greedy output equals AR's."""
    overrides = [
        "model=tiny_llama",
        "method.drafter.calibration.dataset=mbpp_train",
        "method.drafter.calibration.limit=20",
        "method.drafter.nodes=25",
        f"data_dir={shared_data}",
        "device=cpu",
        "dtype=float32",
    ]
    cfg = compose_config(*overrides, "method=sequoia_tree")
    assert cfg.method.drafter.calibration.data_dir == str(shared_data)
    assert sequoia.main([*overrides, "progress=false"]) is not None
    engine = build_engine(cfg.method, conformance.tiny_lm(), Sampling())
    drafter = engine.drafter  # the shared loop's Decoder
    assert drafter.calibration_record["texts"] == 20 and len(drafter.acceptance) == 16
    for prompt in conformance.prompts():
        gen = conformance.generate(engine, list(prompt), 24)
        assert tuple(gen.output_ids) == conformance.ar_output(prompt, 40)[:24]
    assert list((training_cache / "sequoia" / "tiny_llama").glob("*.json"))


def test_the_calibration_settings_identity_leaves_the_location_out():
    settings = AcceptanceCalibration.from_node({**CALIBRATION, "data_dir": "/somewhere"})
    assert settings.identity() == {k: v for k, v in CALIBRATION.items() if k != "data_dir"}
