"""Medusa: heads and their checkpoint format, tree builders (sparse greedy == brute force), the drafter's
alignment and losslessness, typical acceptance at T -> 0, and a tiny end-to-end training run."""

from __future__ import annotations

import itertools
import json
import random
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.core.rules import acceptance_rule
from specbench.drafters.medusa import Medusa
from specbench.errors import ConfigError, ModelUnavailable
from specbench.models.medusa_heads import (
    MedusaHeads,
    checkpoint_layout,
    heads_from_state,
    load_heads,
    random_heads,
    random_state,
    save_heads,
    vllm_checkpoint,
    vllm_state,
)
from specbench.models.parts import part_kind
from specbench.structures.medusa_tree import (
    TreeLayout,
    checked_paths,
    dense_paths,
    expected_accepted,
    published_tree,
    published_trees,
    sparse_paths,
    tree_paths,
)
from tests.test_loop import ar_greedy

RANDOM_HEADS = {"source": "random", "num_heads": 4, "seed": 0}
# a 63-node, 4-deep tree with ranks up to 9, shaped like a calibrated sparse tree (geometric accuracies)
SPARSE_63 = [list(path) for path in sparse_paths([[0.6 * 0.5**rank for rank in range(10)]] * 4, 63)]


def medusa(heads=None, first_step="tree", **tree) -> Medusa:
    """A Medusa drafter from plain dicts (random heads and a 63-node sparse-shaped tree unless told otherwise)."""
    tree = {"kind": "choices", "choices": SPARSE_63, **tree}
    return Medusa(OmegaConf.create(heads or RANDOM_HEADS), "test_model", OmegaConf.create(tree), first_step)


GREEDY = Sampling()


def decode(model, drafter, prompt, max_new_tokens, eos=frozenset(), sampling=GREEDY, rule="match"):
    with torch.inference_mode():
        return Decoder(model, drafter, eos, sampling, acceptance_rule(rule)).generate(prompt, max_new_tokens)


# ----------------------------------------------------------------------------------------- heads


def test_heads_shapes_and_identity_init(tiny):
    lm_head = tiny.get_output_embeddings()
    heads = MedusaHeads(64, 97, num_heads=3, num_layers=2, lm_head=lm_head)
    hidden = torch.randn(5, 64)
    logits = heads(hidden)
    assert logits.shape == (3, 5, 97)
    assert heads(hidden, num_heads=2).shape == (2, 5, 97)
    # W_in starts at zero: each head is SiLU(b) away from the LM head, and b starts small
    for block in heads.heads[0][:2]:
        assert torch.count_nonzero(block.linear.weight) == 0
    assert not any(key.endswith(".weight") and key.count(".") == 1 for key in heads.checkpoint_state())
    own = MedusaHeads(64, 97, num_heads=2)
    assert own(hidden).shape == (2, 5, 97)
    assert checkpoint_layout(own.checkpoint_state()) == (2, 1, True)
    assert checkpoint_layout(heads.checkpoint_state()) == (3, 2, False)
    with pytest.raises(ConfigError, match="num_heads"):
        MedusaHeads(64, 97, num_heads=0)


def fabricated_state(num_heads=3, hidden=64, vocab=97, seed=0) -> dict[str, torch.Tensor]:
    """A published-layout medusa_lm_head state dict (1 residual layer per head, own output layers)."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for k in range(num_heads):
        state[f"{k}.0.linear.weight"] = torch.randn(hidden, hidden, generator=gen) * 0.1
        state[f"{k}.0.linear.bias"] = torch.randn(hidden, generator=gen) * 0.1
        state[f"{k}.1.weight"] = torch.randn(vocab, hidden, generator=gen) * 0.1
    return state


def reference_logits(state, hidden, k):
    """Head k by hand: W_out (h + SiLU(W_in h + b))."""
    inner = hidden + torch.nn.functional.silu(hidden @ state[f"{k}.0.linear.weight"].T + state[f"{k}.0.linear.bias"])
    return inner @ state[f"{k}.1.weight"].T


def test_load_published_pt_checkpoint_from_folder(tiny, tmp_path):
    state = fabricated_state()
    torch.save({key: value.half() for key, value in state.items()}, tmp_path / "medusa_lm_head.pt")
    # the published v1.3 configs under-count heads: the keys decide
    (tmp_path / "config.json").write_text(
        json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"})
    )
    loaded = load_heads(OmegaConf.create({"source": "hub", "path": str(tmp_path)}), tiny, "tiny")
    assert loaded.heads.num_heads == 3 and not loaded.heads.shares_lm_head
    assert loaded.heads.heads[0][0].linear.weight.dtype == torch.float32  # the target's dtype
    hidden = torch.randn(4, 64)
    got = loaded.heads(hidden)
    halved = {key: value.half().float() for key, value in state.items()}
    for k in range(3):
        torch.testing.assert_close(got[k], reference_logits(halved, hidden, k), atol=1e-4, rtol=1e-4)
    assert loaded.rank_accuracy is None


def test_load_bundled_medusa2_checkpoint(tiny, tmp_path):
    """medusa-1.0-* repos: heads under ``medusa_head.`` inside the model's sharded weights."""
    state = fabricated_state(num_heads=2)
    torch.save(
        {
            "model.embed_tokens.weight": torch.zeros(97, 64),
            **{f"medusa_head.{key}": value for key, value in state.items()},
        },
        tmp_path / "shard-2.bin",
    )
    torch.save({"lm_head.weight": torch.zeros(97, 64)}, tmp_path / "shard-1.bin")
    weight_map = {
        "lm_head.weight": "shard-1.bin",
        "model.embed_tokens.weight": "shard-2.bin",
        **{f"medusa_head.{key}": "shard-2.bin" for key in state},
    }
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = load_heads(OmegaConf.create({"source": "hub", "path": str(tmp_path)}), tiny, "tiny")
    hidden = torch.randn(3, 64)
    torch.testing.assert_close(loaded.heads(hidden)[1], reference_logits(state, hidden, 1))


def test_checkpoint_problems_are_clear(tiny, tmp_path):
    with pytest.raises(ConfigError, match="holds no Medusa heads"):
        load_heads(OmegaConf.create({"source": "hub", "path": str(tmp_path)}), tiny, "tiny")
    torch.save(fabricated_state(hidden=32), tmp_path / "medusa_lm_head.pt")
    with pytest.raises(ConfigError, match="do not fit this target"):
        load_heads(OmegaConf.create({"source": "hub", "path": str(tmp_path)}), tiny, "tiny")
    with pytest.raises(ConfigError, match="unexpected keys"):
        checkpoint_layout({"medusa.0.weight": torch.zeros(1)})
    with pytest.raises(ConfigError, match="no 'medusa:' node"):
        load_heads(None, tiny, "tiny")
    with pytest.raises(ConfigError, match="source must be one of"):
        load_heads(OmegaConf.create({"source": "nope"}), tiny, "tiny")


def test_hub_heads_offline_fail_fast(tiny, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelUnavailable, match="huggingface-cli download FasterDecoding/medusa-vicuna-7b-v1.3"):
        load_heads(OmegaConf.create({"source": "hub", "path": "FasterDecoding/medusa-vicuna-7b-v1.3"}), tiny, "v")
    assert time.perf_counter() - start < 5


def test_trained_heads_roundtrip_and_missing_message(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    node = OmegaConf.create({"source": "trained"})
    with pytest.raises(ModelUnavailable, match="python -m specbench.train medusa model=tiny_x"):
        load_heads(node, tiny, "tiny_x")
    heads = random_heads(tiny, num_heads=3, seed=1)
    table = [[0.5, 0.2], [0.3, 0.1], [0.1, 0.05]]
    record = {
        "rank_accuracy": table,
        "digest": "settings",
        "data": "data",
        "accuracy": {"top1": [0.5, 0.3, 0.1]},
        "result": {"steps": 5, "steps_planned": 5, "stopped_by": "max_steps"},
    }
    save_heads(heads, part_kind("medusa").folder("tiny_x"), "tiny", record)
    save_heads(heads, part_kind("medusa").folder("tiny_x"), "tiny", record)  # replacing is atomic too
    loaded = load_heads(node, tiny, "tiny_x")
    assert loaded.rank_accuracy == table and loaded.heads.shares_lm_head
    assert loaded.part.startswith("medusa:") and "/" not in loaded.part  # named by the weights' digest
    hidden = torch.randn(2, 64)
    torch.testing.assert_close(loaded.heads(hidden), heads(hidden))
    assert sorted(p.name for p in part_kind("medusa").folder("tiny_x").iterdir()) == [
        "config.json",
        "manifest.json",
        "medusa_lm_head.safetensors",
        "training.json",
    ]
    (part_kind("medusa").folder("tiny_x") / "manifest.json").unlink()  # e.g. a partial copy: never used silently
    with pytest.raises(ModelUnavailable, match="has no manifest.json"):
        load_heads(node, tiny, "tiny_x")


# ----------------------------------------------------------------------------------------- trees


def brute_force_best(rank_accuracy, budget, top_k, depth):
    """Max expected acceptance length over every prefix-closed tree of ``budget`` nodes."""
    nodes = [p for d in range(1, depth + 1) for p in itertools.product(range(top_k), repeat=d)]
    best = 0.0
    for subset in itertools.combinations(nodes, budget):
        chosen = set(subset)
        if all(len(p) == 1 or p[:-1] in chosen for p in chosen):
            best = max(best, expected_accepted(list(chosen), rank_accuracy))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_sparse_greedy_equals_brute_force(seed):
    rng = random.Random(seed)
    top_k, depth = (3, 2) if seed % 2 else (2, 3)
    # descending by rank for even seeds (as measured), arbitrary for odd ones (greedy must not rely on it)
    table = [sorted((rng.random() for _ in range(top_k)), reverse=seed % 2 == 0) for _ in range(depth)]
    for budget in range(1, 7):
        greedy = sparse_paths(table, budget)
        assert len(greedy) == budget and checked_paths(greedy, depth)
        assert expected_accepted(greedy, table) == pytest.approx(brute_force_best(table, budget, top_k, depth))


def test_sparse_respects_depth_top_k_and_ties():
    table = [[0.9, 0.8, 0.7], [0.9, 0.5, 0.1], [0.9, 0.1, 0.1]]
    assert sparse_paths(table, 3, max_depth=1) == [(0,), (1,), (2,)]
    assert all(rank < 2 for path in sparse_paths(table, 8, top_k=2) for rank in path)
    assert sparse_paths([[0.5, 0.5]], 2) == [(0,), (1,)]  # ties: lexicographic order
    with pytest.raises(ConfigError, match="node_budget"):
        sparse_paths(table, 0)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        sparse_paths([[1.5]], 1)


def test_dense_paths_count_and_layout():
    paths = dense_paths([2, 3])
    assert len(paths) == 2 + 2 * 3  # sum_k prod_{i<=k} s_i
    layout = TreeLayout.from_paths(paths)
    assert layout.parents[:3] == (-1, 0, 0) and layout.max_depth == 2 and layout.top_k == 3
    top = [[10, 11], [20, 21, 22]]
    tokens = layout.tokens(5, top)
    assert tokens[:3] == [5, 10, 11] and tokens[3:6] == [20, 21, 22]
    assert all(layout.parents[i] < i for i in range(1, len(tokens)))
    with pytest.raises(ConfigError, match="sizes"):
        dense_paths([2, 0])


def test_choices_validation():
    paths = checked_paths(SPARSE_63, 5)
    assert len(paths) == 63 and max(map(len, paths)) == 4
    assert TreeLayout.from_paths(paths).top_k == max(path[0] for path in paths) + 1
    with pytest.raises(ConfigError, match="prefix-closed"):
        checked_paths([[0], [1, 0]], 3)
    with pytest.raises(ConfigError, match="predict only 1"):
        checked_paths([[0], [0, 0]], 1)


def test_tree_settings():
    cfg = OmegaConf.create({"kind": "sparse", "node_budget": 4, "sizes": [3, 2]})
    paths, source = tree_paths(cfg, [[0.6, 0.3], [0.5, 0.1]], 2)
    assert source == "sparse" and paths == [(0,), (1,), (0, 0), (1, 0)]  # values .6 .3 .3 .15
    with pytest.raises(ConfigError, match="model.medusa.tree=<name>.*tree.kind=dense.*train medusa"):
        tree_paths(cfg, None, 5)  # no calibration table and no published tree: an error naming the ways out
    paths, source = tree_paths(cfg, None, 5, "mc_sim_7b_63")  # published heads: the first 4 published paths
    assert source == "sparse:mc_sim_7b_63[:4]" and paths == [(0,), (1,), (0, 0), (0, 1)]
    dense = tree_paths(OmegaConf.create({"kind": "dense", "sizes": [3, 2]}), None, 5)
    assert dense[1] == "dense" and len(dense[0]) == 3 + 3 * 2
    listed = OmegaConf.create({"kind": "choices", "choices": [[0], [0, 0], [1]]})
    assert tree_paths(listed, None, 2) == ([(0,), (1,), (0, 0)], "choices")
    named = tree_paths(OmegaConf.create({"kind": "choices", "choices": "vicuna_33b_stage1"}), None, 5)
    assert named[1] == "choices:vicuna_33b_stage1" and len(named[0]) == 63
    with pytest.raises(ConfigError, match="no published Medusa tree named"):
        tree_paths(OmegaConf.create({"kind": "choices", "choices": "mc_sim_7b_64"}), None, 2)
    with pytest.raises(ConfigError, match="list rank paths"):
        tree_paths(OmegaConf.create({"kind": "choices", "choices": None}), None, 2)
    chain = tree_paths(OmegaConf.create({"kind": "chain"}), None, 3)
    assert chain == ([(0,), (0, 0), (0, 0, 0)], "chain")  # each head's top-1 token: what vLLM's Medusa drafts
    assert tree_paths(OmegaConf.create({"kind": "chain", "max_depth": 2}), None, 3)[0] == [(0,), (0, 0)]
    with pytest.raises(ConfigError, match="kind"):
        tree_paths(OmegaConf.create({"kind": "bushy"}), None, 2)
    with pytest.raises(ConfigError, match="max_depth"):
        tree_paths(OmegaConf.create({"kind": "dense", "sizes": [2], "max_depth": 3}), None, 2)


def test_published_trees_are_63_node_prefix_closed_trees_in_greedy_order():
    """The shipped trees: 63 distinct nodes each, and every prefix of the published order is a tree (a parent
    precedes its children), so the first n paths are the authors' sparse tree of n nodes."""
    names = published_trees()
    assert {"mc_sim_7b_63", "vicuna_7b_stage2", "vicuna_13b_stage2", "vicuna_33b_stage2", "zephyr_stage2"} <= set(names)
    for name in names:
        paths = published_tree(name)
        assert len(paths) == len(set(paths)) == 63, name
        assert all(len(path) == 1 or path[:-1] in paths[:i] for i, path in enumerate(paths)), name
        assert max(map(len, paths)) == (3 if name == "vicuna_33b_stage1" else 4), name
        assert checked_paths(paths, 4 if name != "vicuna_33b_stage1" else 3) == sorted(paths, key=lambda p: (len(p), p))
    assert published_tree("mc_sim_7b_63")[:6] == ((0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0))


def test_sparse_budget_beyond_the_published_tree_is_an_error():
    cfg = OmegaConf.create({"kind": "sparse", "node_budget": 128})
    with pytest.raises(ConfigError, match="has 63 nodes.*calibration table"):
        tree_paths(cfg, None, 5, "vicuna_7b_stage2")
    # a calibration table still builds any budget (our trained heads)
    paths, source = tree_paths(cfg, [[0.6 * 0.5**r for r in range(10)]] * 4, 4, "vicuna_7b_stage2")
    assert source == "sparse" and len(paths) == 128


@pytest.mark.parametrize(
    "model,tree",
    [
        ("vicuna_7b", "mc_sim_7b_63"),
        ("vicuna_13b", "mc_sim_7b_63"),
        ("vicuna_33b", "mc_sim_7b_63"),
        ("medusa2_vicuna_7b", "vicuna_7b_stage2"),
        ("medusa2_vicuna_13b", "vicuna_13b_stage2"),
        ("medusa2_vicuna_33b", "vicuna_33b_stage2"),
        ("medusa2_zephyr_7b", "zephyr_stage2"),
    ],
)
def test_model_configs_name_their_published_tree(model, tree):
    """Every config of published heads names a published tree, so tree.kind=sparse never lacks one; Medusa-2
    configs load backbone and heads from one checkpoint and say which model they change."""
    from specbench.config import compose_config

    cfg = compose_config(f"model={model}", "method=medusa")
    heads = cfg.method.drafter.heads
    assert heads.tree == tree and tree in published_trees() and cfg.method.drafter.tree.kind == "sparse"
    if model.startswith("medusa2_"):
        assert heads.path == cfg.model.path and cfg.model.changes_target
        moved = compose_config(f"model={model}", "method=medusa", "model.path=/local/copy").method.drafter.heads
        assert moved.path == "/local/copy"


# ----------------------------------------------------------------------------------------- drafter


class OracleHeads(torch.nn.Module):
    """Heads that know the greedy continuation: they find the position t of a hidden state (nearest
    stored row) and put the true token t+k+1 first, so every draft must be accepted in full."""

    def __init__(self, model, sequence: list[int], vocab: int):
        super().__init__()
        with torch.inference_mode():
            out = model(torch.tensor([sequence]), output_hidden_states=True)
        self.table = out.hidden_states[-1][0]  # [T, H]
        self.sequence, self.vocab = sequence, vocab
        self.num_heads = 4

    def forward(self, hidden, num_heads=None):
        t = int(torch.cdist(hidden[None], self.table).argmin())
        logits = torch.zeros(num_heads or self.num_heads, self.vocab)
        for k in range(1, logits.shape[0] + 1):
            if t + k + 1 < len(self.sequence):
                logits[k - 1, self.sequence[t + k + 1]] = 1.0
        return logits


@pytest.mark.parametrize(
    "first_step, lengths",
    [("tree", [5] * 8 + [1]), ("root", [1] + [5] * 8)],  # 1 prefill token + 41 = the 42-token budget
)
def test_head_alignment_with_oracle_heads(tiny, first_step, lengths):
    """Head k on the last accepted node's hidden state (or the prompt's last row) drafts depth k under the next root."""
    prompt = [3, 1, 4, 1, 5]
    truth = ar_greedy(tiny, prompt, 42).output_ids
    drafter = medusa(kind="dense", sizes=[1, 1, 1, 1], first_step=first_step)
    drafter.setup(tiny, None)
    drafter.heads = OracleHeads(tiny, prompt + truth, 97)
    gen = decode(tiny, drafter, prompt, 42)
    assert gen.output_ids == truth
    assert gen.accept_lengths == lengths  # tree: the whole chain from step 1; root: a root-only step first
    stats = drafter.stats()
    assert stats["head_top1_acc"] == [1.0] * 4 and stats["depth_accept_rate"] == [1.0] * 4
    assert stats["first_step"] == first_step


def test_first_step_is_checked():
    with pytest.raises(ConfigError, match="first_step must be one of"):
        medusa(first_step="prefill")


@pytest.mark.parametrize("seed", range(3))
def test_greedy_medusa_equals_ar_tiny(tiny, seed):
    rng = random.Random(seed)
    prompt = [rng.randrange(97) for _ in range(rng.randrange(2, 20))]
    truth = ar_greedy(tiny, prompt, 40).output_ids
    drafter = medusa({**RANDOM_HEADS, "seed": seed})
    drafter.setup(tiny, None)
    rule = "speculative" if seed == 1 else "match"  # multi-candidate rejection with one-hot drafts
    assert decode(tiny, drafter, prompt, 40, rule=rule).output_ids == truth
    stats = drafter.stats()
    assert stats["tree_nodes"] == 63 and stats["steps"] > 0 and stats["heads_s"] > 0
    assert len(stats["head_top1_acc"]) == 4 and stats["heads"] == f"random(seed={seed})"


def test_eos_and_budget_inside_a_tree_step(tiny):
    prompt = [7, 8, 9]
    truth = ar_greedy(tiny, prompt, 30).output_ids
    drafter = medusa(kind="dense", sizes=[1, 1, 1, 1])
    drafter.setup(tiny, None)
    drafter.heads = OracleHeads(tiny, prompt + truth, 97)
    eos = truth[8]
    gen = decode(tiny, drafter, prompt, 30, eos=frozenset({eos}))
    assert gen.output_ids == truth[: truth.index(eos) + 1] and gen.stop_reason == "eos"
    drafter.reset(prompt)
    gen = decode(tiny, drafter, prompt, 7)
    assert gen.output_ids == truth[:7] and gen.stop_reason == "max_new_tokens"


def test_typical_acceptance_tends_to_greedy(tiny):
    """medusa_typical's rule at T -> 0 (and at T = 0) reproduces the greedy output."""
    prompt = [11, 12, 13, 14]
    truth = ar_greedy(tiny, prompt, 30).output_ids
    drafter = medusa()
    drafter.setup(tiny, None)
    for temperature in (0.0, 1e-4):
        gen = decode(tiny, drafter, prompt, 30, sampling=Sampling(temperature=temperature), rule="typical")
        assert gen.output_ids == truth


def test_method_configs_compose():
    from specbench.config import compose_config

    cfg = compose_config("method=medusa_typical", "model=vicuna_7b")
    assert cfg.method.acceptance == "typical" and cfg.method.lossless is False
    assert cfg.method.acceptance_kwargs.posterior_threshold == 0.09
    assert cfg.method.drafter.heads.path == "FasterDecoding/medusa-vicuna-7b-v1.3"
    assert compose_config("method=medusa", "model=tiny_llama").method.drafter.heads.source == "random"


@pytest.mark.slow
def test_greedy_medusa_equals_ar_embedded(embedded):
    model, tok = embedded.model, embedded.tokenizer
    drafter = medusa({**RANDOM_HEADS, "num_heads": 3}, kind="dense", sizes=[3, 2, 1])
    drafter.setup(model, tok)
    for question in ["Write a Python function that adds two numbers.", "Name two colours."]:
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
        )["input_ids"]
        truth = ar_greedy(model, prompt, 20, embedded.eos_ids).output_ids
        assert decode(model, drafter, prompt, 20, eos=embedded.eos_ids).output_ids == truth


# ----------------------------------------------------------------------------------------- training


def test_head_labels_and_feature_alignment(tiny):
    """Head k's label at position t is token t+k+1; features are the verify pass's hidden states."""
    from specbench.train.medusa import IGNORE, head_labels

    ids = torch.tensor([10, 11, 12, 13, 14, 15])
    labels = head_labels(ids, start=2, rows=2, num_heads=3)  # t = 2, 3
    assert labels.tolist() == [[14, 15, IGNORE], [15, IGNORE, IGNORE]]
    prompt = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.inference_mode():
        hidden = tiny.base_model(input_ids=prompt).last_hidden_state
        verify_hidden = tiny(prompt, output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(hidden, verify_hidden)


@pytest.mark.slow
def test_train_medusa_end_to_end_tiny(training_cache, shared_data):
    """`train medusa` on tiny_llama: saves heads + accuracies, is a no-op when rerun, and the heads decode."""
    from specbench.config import compose_config
    from specbench.models.loading import load_model
    from specbench.train import medusa as medusa_train

    args = [
        "model=tiny_llama",
        f"data_dir={shared_data}",
        "prompts.max_prompts=5",
        "prompts.max_new_tokens=10",
        "heads.num_heads=3",
        "train.max_steps=2",
        "train.batch_size=8",
        "train.eval_sequences=2",
        "progress=false",
    ]
    folder = medusa_train.main(args)
    record = json.loads((folder / "training.json").read_text())
    assert record["result"]["steps"] == 2 and record["accuracy"]["positions"] > 0
    assert len(record["rank_accuracy"]) == 3 and len(record["rank_accuracy"][0]) == 10
    weights = folder / "medusa_lm_head.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert medusa_train.main(args) == folder and weights.stat().st_mtime_ns == stamp  # cached: no-op

    lm = load_model(compose_config("model=tiny_llama").model, torch.device("cpu"), torch.float32)
    drafter = Medusa(
        OmegaConf.create({"source": "trained"}), "tiny_llama", OmegaConf.create({"kind": "sparse", "node_budget": 6})
    )
    drafter.setup(lm.model, lm.tokenizer)
    assert drafter.stats()["tree"] == "sparse" and drafter.stats()["tree_nodes"] == 6
    prompt = [1, 2, 3, 4]
    assert decode(lm.model, drafter, prompt, 12).output_ids == ar_greedy(lm.model, prompt, 12).output_ids


def vllm_forward(state: dict[str, torch.Tensor], hidden: torch.Tensor, head: int, layers: int) -> torch.Tensor:
    """Head ``head``'s logits computed from vLLM's names as vLLM's Medusa model reads them (residual SiLU blocks with
    biases, then its LM head; one shared LM head under ``original_lm_head``)."""
    for layer in range(layers):
        weight, bias = state[f"blocks.{head}.layers.{layer}.weight"], state[f"blocks.{head}.layers.{layer}.bias"]
        hidden = hidden + torch.nn.functional.silu(hidden @ weight.T + bias)
    lm_head = state.get(f"lm_heads.{head}.weight", state["lm_heads.0.weight"])
    return hidden @ lm_head.T


@pytest.mark.parametrize("own_output", [False, True])
def test_heads_in_vllms_layout_compute_what_the_loops_heads_compute(tiny, own_output):
    """Renamed for vLLM (biases kept, the shared LM head carried once), every head gives the loop's logits."""
    hidden_size = tiny.config.hidden_size
    state = random_state(hidden_size, 3, 2, seed=1)
    lm_head = tiny.get_output_embeddings().weight.detach()
    if own_output:  # heads with their own output layers (FasterDecoding's medusa-1 checkpoints)
        state.update({f"{k}.2.weight": lm_head.clone() + 0.01 * k for k in range(3)})
    renamed = vllm_state(state, None if own_output else lm_head)
    assert len(renamed) == len(state) + (0 if own_output else 1)
    heads = heads_from_state(state, tiny)
    hidden = torch.randn(5, hidden_size, generator=torch.Generator().manual_seed(0))
    expected = heads(hidden)  # [3, 5, vocab]
    for k in range(3):
        torch.testing.assert_close(vllm_forward(renamed, hidden, k, 2), expected[k])


def test_vllm_checkpoint_is_written_once_with_the_config_vllm_reads(embedded, training_cache):
    """Random heads on the embedded model: config.json with the layout and the flags vLLM needs, the weights, the
    part named as the loop names it; a second call reuses the folder."""
    from safetensors.torch import load_file

    from specbench.models.embedded import embedded_checkpoint

    node = OmegaConf.create({"source": "random", "num_heads": 3, "seed": 0})
    folder, part = vllm_checkpoint(node, "smollm2_135m", str(embedded_checkpoint()), None)
    assert folder.startswith(str(training_cache / "vllm" / "medusa"))
    config = json.loads((Path(folder) / "config.json").read_text())
    assert config["model_type"] == "medusa" and (config["num_heads"], config["num_hidden_layers"]) == (3, 1)
    assert config["medusa_fc_bias"] is True and config["original_lm_head"] is True
    assert (config["hidden_size"], config["vocab_size"]) == (576, 49152)
    weights = load_file(f"{folder}/model.safetensors")
    torch.testing.assert_close(weights["lm_heads.0.weight"], embedded.model.get_output_embeddings().weight)
    assert part == load_heads(node, embedded.model, "smollm2_135m").part == "medusa:random(seed=0)"
    written = (training_cache / "vllm" / "medusa").stat().st_mtime_ns
    assert vllm_checkpoint(node, "smollm2_135m", str(embedded_checkpoint()), None) == (folder, part)
    assert (training_cache / "vllm" / "medusa").stat().st_mtime_ns == written
