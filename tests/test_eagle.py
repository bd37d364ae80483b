"""EAGLE / EAGLE-2: the published head layout (built here, loaded, checked against a hand-written forward),
the head cache (rollback == recomputation, pair alignment with an oracle head), the dynamic tree's budgets,
greedy equality with AR, exact sampling at T > 0 (chi-square, with negative controls), and the trainer."""

from __future__ import annotations

import copy
import json
import math
import random
import time

import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig

from specbench.conformance import chi_square
from specbench.core import speculative
from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.core.rules import acceptance_rule
from specbench.drafters.eagle import Eagle, Eagle2, Eagle3, EagleOptTree, HeadCache
from specbench.errors import ConfigError, ModelUnavailable
from specbench.models.eagle_heads import (
    EagleHead,
    config_for_target,
    config_from_json,
    head_from_state,
    load_head,
    random_head,
    save_head,
    vllm_state,
)
from specbench.models.parts import part_kind
from specbench.structures.tree_builders import ExpandRerankBuilder
from tests.conftest import tiny_model
from tests.helpers import embedded_head, exact_joint, sampled_outputs
from tests.test_loop import ar_greedy

RANDOM_HEAD = OmegaConf.create({"source": "random", "seed": 0})
MIN_P = 1e-3  # a correct method must pass the chi-square test at this p-value; a broken one must fail
GREEDY = Sampling()


def decode(model, drafter, prompt, max_new_tokens, eos=frozenset(), sampling=GREEDY, rule="speculative"):
    with torch.inference_mode():
        return Decoder(model, drafter, eos, sampling, acceptance_rule(rule)).generate(prompt, max_new_tokens)


# ----------------------------------------------------------------------------------- published layout


def published_state(config: dict, seed: int = 0, embed: bool = True, dtype=torch.float16) -> dict[str, torch.Tensor]:
    """A state dict in the yuhuili EAGLE layout for ``config`` (random weights)."""
    gen = torch.Generator().manual_seed(seed)
    hidden, inter, heads = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads) * hidden // heads

    def rand(*shape, scale=None):
        return (torch.randn(*shape, generator=gen) * (scale or 1 / math.sqrt(shape[-1]))).to(dtype)

    state = {"fc.weight": rand(hidden, 2 * hidden), "fc.bias": rand(hidden, scale=0.1)}
    for i in range(config["num_hidden_layers"]):
        prefix = f"layers.{i}."
        state.update(
            {
                prefix + "self_attn.q_proj.weight": rand(hidden, hidden),
                prefix + "self_attn.k_proj.weight": rand(kv, hidden),
                prefix + "self_attn.v_proj.weight": rand(kv, hidden),
                prefix + "self_attn.o_proj.weight": rand(hidden, hidden),
                prefix + "mlp.gate_proj.weight": rand(inter, hidden),
                prefix + "mlp.up_proj.weight": rand(inter, hidden),
                prefix + "mlp.down_proj.weight": rand(hidden, inter),
                prefix + "post_attention_layernorm.weight": (1 + rand(hidden, scale=0.1)).to(dtype),
            }
        )
        if i > 0:
            state[prefix + "input_layernorm.weight"] = (1 + rand(hidden, scale=0.1)).to(dtype)
    if embed:
        state["embed_tokens.weight"] = rand(config["vocab_size"], hidden, scale=1.0)
    return state


TINY_EAGLE_CONFIG = {  # the published config.json keys (EAGLE-Vicuna-7B-v1.3's, scaled down to the tiny model)
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.28.1",
    "use_cache": True,
    "vocab_size": 97,
    "bias": True,
}


PROJECTION_SIZES = {"q_proj": 64, "k_proj": 32, "v_proj": 32, "o_proj": 64}  # TINY_EAGLE_CONFIG's attention outputs


def write_checkpoint(folder, config: dict, state: dict) -> None:
    """config.json + pytorch_model.bin, as the yuhuili repos ship them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    torch.save(state, folder / "pytorch_model.bin")


def rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def reference_layer(state, prefix, x, positions, config):
    """One Llama layer by hand (no input norm for layer 0), causal attention with rotary at ``positions``."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads, dim = config["num_key_value_heads"], hidden // config["num_attention_heads"]
    w = {key[len(prefix) :]: value.float() for key, value in state.items() if key.startswith(prefix)}
    h = rms(x, w["input_layernorm.weight"], config["rms_norm_eps"]) if "input_layernorm.weight" in w else x
    n = x.shape[0]
    q = (h @ w["self_attn.q_proj.weight"].T).view(n, heads, dim)
    k = (h @ w["self_attn.k_proj.weight"].T).view(n, kv_heads, dim)
    v = (h @ w["self_attn.v_proj.weight"].T).view(n, kv_heads, dim)
    inv_freq = 1.0 / (config.get("rope_theta", 10000.0) ** (torch.arange(0, dim, 2).float() / dim))
    angles = positions.float()[:, None] * inv_freq[None]
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]

    def rotate(t):
        return torch.cat([-t[..., dim // 2 :], t[..., : dim // 2]], -1)

    q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(dim)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, hidden)
    x = x + attn @ w["self_attn.o_proj.weight"].T
    h = rms(x, w["post_attention_layernorm.weight"], config["rms_norm_eps"])
    mlp = torch.nn.functional.silu(h @ w["mlp.gate_proj.weight"].T) * (h @ w["mlp.up_proj.weight"].T)
    return x + mlp @ w["mlp.down_proj.weight"].T


def reference_head(state, config, features, tokens, embeddings):
    """The EAGLE head by hand: fc(cat(embed(x_{t+1}), f_t)), then the layers, causal, positions 0..n-1."""
    x = torch.cat([embeddings[tokens], features], -1) @ state["fc.weight"].float().T + state["fc.bias"].float()
    for i in range(config["num_hidden_layers"]):
        x = reference_layer(state, f"layers.{i}.", x, torch.arange(len(tokens)), config)
    return x


def head_output(head: EagleHead, features, tokens):
    """The loaded head on one causal sequence (positions 0..n-1)."""
    n = len(tokens)
    mask = torch.zeros(n, n).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    with torch.no_grad():
        return head(features[None], torch.tensor([tokens]), torch.arange(n)[None], mask[None, None])[0]


@pytest.mark.parametrize("layers,embed", [(1, True), (2, True), (1, False)])
def test_published_layout_loads_and_matches_a_hand_written_forward(tiny, tmp_path, layers, embed):
    """A checkpoint in the yuhuili layout (config.json + pytorch_model.bin, fp16) loads strictly; the head's
    forward equals fc -> (no input norm in layer 0) -> attention -> MLP written out by hand."""
    config = {**TINY_EAGLE_CONFIG, "num_hidden_layers": layers}
    state = published_state(config, seed=layers, embed=embed)
    write_checkpoint(tmp_path / "EAGLE-tiny", config, state)
    loaded = load_head(OmegaConf.create({"source": "hub", "path": str(tmp_path / "EAGLE-tiny")}), tiny, "tiny")
    head = loaded.head
    assert head.shares_embeddings is not embed and head.fc.weight.dtype == torch.float32  # the target's dtype
    assert set(head.checkpoint_state()) == set(state)  # exactly the published keys, no more, no fewer
    features, tokens = torch.randn(6, 64), [5, 17, 3, 96, 40, 2]
    embeddings = state["embed_tokens.weight"].float() if embed else tiny.get_input_embeddings().weight
    expected = reference_head({k: v.float() for k, v in state.items()}, config, features, tokens, embeddings)
    torch.testing.assert_close(head_output(head, features, tokens), expected, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("layers,qkv_bias", [(1, False), (2, False), (1, True)])
def test_fc_bias_moved_into_attention_computes_the_same_head(tiny, layers, qkv_bias):
    """vLLM's EAGLE fc has no bias: the state ``vllm_state`` writes (b moved into the first layer's q, k, v and o
    biases, zero biases elsewhere) loads strictly into a bias-free-fc head with attention biases, which computes
    what the head with fc's bias computes."""
    state = published_state({**TINY_EAGLE_CONFIG, "num_hidden_layers": layers}, seed=layers, dtype=torch.float32)
    config, _ = config_from_json({**TINY_EAGLE_CONFIG, "num_hidden_layers": layers, "qkv_bias": qkv_bias})
    if qkv_bias:  # published heads with q, k, v (and, in this layout, o) biases of their own
        state |= {f"layers.0.self_attn.{name}.bias": torch.randn(size) for name, size in PROJECTION_SIZES.items()}
    head = head_from_state(state, config, True, tiny, "with fc bias")
    biased = copy.deepcopy(config)
    biased.attention_bias = True
    moved = head_from_state(vllm_state(head), biased, False, tiny, "moved")
    dropped = head_from_state({k: v for k, v in state.items() if k != "fc.bias"}, config, False, tiny, "dropped")
    features, tokens = torch.randn(6, 64), [5, 17, 3, 96, 40, 2]
    expected = head_output(head, features, tokens)
    torch.testing.assert_close(head_output(moved, features, tokens), expected)
    assert not torch.allclose(head_output(dropped, features, tokens), expected, atol=1e-3)  # the bias matters here


def test_published_checkpoint_problems_are_clear(tiny, tmp_path):
    with pytest.raises(ConfigError, match="holds no EAGLE head"):
        load_head(OmegaConf.create({"source": "hub", "path": str(tmp_path)}), tiny, "tiny")
    wide = {**TINY_EAGLE_CONFIG, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2}
    write_checkpoint(tmp_path / "wide", wide, published_state(wide))
    with pytest.raises(ConfigError, match="hidden size 32 but the target has 64"):
        load_head(OmegaConf.create({"source": "hub", "path": str(tmp_path / "wide")}), tiny, "tiny")
    state = published_state(TINY_EAGLE_CONFIG)
    state["layers.0.input_layernorm.weight"] = torch.ones(64)  # EAGLE's first layer has no input norm
    write_checkpoint(tmp_path / "extra", TINY_EAGLE_CONFIG, state)
    with pytest.raises(ConfigError, match="unexpected keys"):
        load_head(OmegaConf.create({"source": "hub", "path": str(tmp_path / "extra")}), tiny, "tiny")
    with pytest.raises(ConfigError, match="no 'eagle:' node"):
        load_head(None, tiny, "tiny")
    with pytest.raises(ConfigError, match="source must be one of"):
        load_head(OmegaConf.create({"source": "nope"}), tiny, "tiny")


def test_hub_head_offline_fails_fast_naming_the_id_and_the_setting(tiny, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from specbench.models import medusa_heads

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(medusa_heads, "hub_reachable", lambda: False)  # the loaders' shared Hub fallback
    start = time.perf_counter()
    with pytest.raises(ModelUnavailable) as caught:
        load_head(OmegaConf.create({"source": "hub", "path": "yuhuili/EAGLE-Vicuna-7B-v1.3"}), tiny, "vicuna_7b")
    message = str(caught.value)
    assert "yuhuili/EAGLE-Vicuna-7B-v1.3" in message and "model.eagle.path=DIR" in message and "\n" not in message
    assert time.perf_counter() - start < 5


def test_trained_head_roundtrip_and_missing_message(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    node = OmegaConf.create({"source": "trained"})
    with pytest.raises(ModelUnavailable, match="python -m specbench.train eagle model=tiny_x"):
        load_head(node, tiny, "tiny_x")
    head = random_head(tiny, seed=3)
    record = {
        "digest": "d" * 16,
        "data": "e" * 16,
        "accuracy": {"top1": [0.5, 0.3]},
        "result": {"steps": 4, "steps_planned": 9, "stopped_by": "max_minutes"},
    }
    save_head(head, part_kind("eagle").folder("tiny_x"), "tiny", record)
    loaded = load_head(node, tiny, "tiny_x")
    assert loaded.top1_by_depth == [0.5, 0.3] and loaded.head.shares_embeddings
    manifest = json.loads((part_kind("eagle").folder("tiny_x") / "manifest.json").read_text())
    assert (
        manifest["finished"] and manifest["steps_done"] == 4 and loaded.origin == f"eagle:{manifest['weights_digest']}"
    )
    assert sorted(p.name for p in part_kind("eagle").folder("tiny_x").iterdir()) == [
        "config.json",
        "manifest.json",
        "model.safetensors",
        "training.json",
    ]
    features, tokens = torch.randn(5, 64), [1, 2, 3, 4, 5]
    torch.testing.assert_close(head_output(loaded.head, features, tokens), head_output(head, features, tokens))
    config = json.loads((part_kind("eagle").folder("tiny_x") / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["bias"] is True and config["hidden_size"] == 64
    (part_kind("eagle").folder("tiny_x") / "manifest.json").unlink()  # unfinished or older: never used silently
    with pytest.raises(ModelUnavailable, match="no manifest.json"):
        load_head(node, tiny, "tiny_x")


def test_model_configs_name_the_published_heads():
    from specbench.config import compose_config

    expected = {
        "vicuna_7b": "yuhuili/EAGLE-Vicuna-7B-v1.3",
        "vicuna_13b": "yuhuili/EAGLE-Vicuna-13B-v1.3",
        "vicuna_33b": "yuhuili/EAGLE-Vicuna-33B-v1.3",
        "llama2_7b_chat": "yuhuili/EAGLE-llama2-chat-7B",
        "llama2_13b_chat": "yuhuili/EAGLE-llama2-chat-13B",
        "llama2_70b": "yuhuili/EAGLE-llama2-chat-70B",
    }
    for model, hub_id in expected.items():
        head = compose_config(f"model={model}", "method=eagle2").method.drafter.head
        assert (head.source, head.path) == ("hub", hub_id)
    assert compose_config("model=smollm2_135m", "method=eagle").method.drafter.head.source == "trained"
    assert compose_config("model=tiny_llama", "method=opt_tree_eagle").method.drafter.head.source == "random"
    cfg = compose_config("model=tiny_llama", "method=eagle2")
    # the authors' evaluation values (SafeAILab/EAGLE's EAGLE-2 eval scripts)
    assert (cfg.method.drafter.top_k, cfg.method.drafter.depth, cfg.method.drafter.total_tokens) == (10, 5, 60)


def test_bad_knobs_name_the_key():
    for make, key in [
        (lambda: Eagle2(top_k=0), "top_k"),
        (lambda: Eagle2(total_tokens=1), "total_tokens"),
        (lambda: Eagle2(depth=0), "depth"),
        (lambda: EagleOptTree(nodes=0), "nodes"),
        (lambda: Eagle(shape="star"), "shape"),
        (lambda: Eagle(shape="paths"), "paths"),
    ]:
        with pytest.raises(ConfigError, match=key):
            make()


# ----------------------------------------------------------------------------------- the dynamic tree


def random_logprobs(rows: int, vocab: int, rng: torch.Generator) -> torch.Tensor:
    return torch.log_softmax(3 * torch.randn(rows, vocab, generator=rng), dim=-1)


@pytest.mark.parametrize("seed", range(4))
def test_expand_rerank_budgets_values_and_closure(seed):
    """Frontier = the top_k of each layer; values = sums of log q along the path; the rerank is the brute-force
    top-(m-1) over every candidate, closed under parents, no deeper than depth + 1."""
    rng = torch.Generator().manual_seed(seed)
    top_k, depth, vocab = [2, 3, 4, 5][seed], 3, 12
    builder = ExpandRerankBuilder(top_k)
    rows = {}  # (layer, index) -> log q row it was fed with (for its children)
    root = random_logprobs(1, vocab, rng)
    builder.add_layer(root)
    while builder.depth < depth + 1:
        fed = list(builder.frontier)
        values = [builder.values[-1][i] for i in fed]
        assert values == sorted(builder.values[-1], reverse=True)[:top_k]  # the top_k by path confidence
        layer = random_logprobs(len(fed), vocab, rng)
        for row, i in enumerate(fed):
            rows[(builder.depth - 1, i)] = layer[row]
        builder.add_layer(layer)
    assert [len(t) for t in builder.tokens] == [top_k] + [top_k * top_k] * depth
    for layer in range(1, builder.depth):  # value = parent's value + log q(token | parent)
        for i, (token, parent) in enumerate(zip(builder.tokens[layer], builder.parents[layer])):
            expected = builder.values[layer - 1][parent] + float(rows[(layer - 1, parent)][token])
            assert builder.values[layer][i] == pytest.approx(expected, abs=1e-5)
    every = sorted((v for values in builder.values for v in values), reverse=True)
    for total_tokens in (2, 5, 26, 60, 10_000):
        tree, chosen = builder.tree(root=7, budget=total_tokens - 1)
        assert tree.num_drafted == min(total_tokens - 1, len(every)) and max(tree.depths) <= depth + 1
        assert sorted((builder.values[layer][i] for layer, i in chosen), reverse=True) == every[: tree.num_drafted]
        chosen_set = set(chosen)
        assert all(layer == 0 or (layer - 1, builder.parents[layer][i]) in chosen_set for layer, i in chosen)


def test_ties_keep_the_reranked_tree_closed():
    builder = ExpandRerankBuilder(2)
    certain = torch.log(torch.tensor([[1.0, 0.0, 0.0]]))
    builder.add_layer(certain)
    builder.add_layer(certain.expand(2, 3))
    tree, _ = builder.tree(root=9, budget=2)  # four nodes of value 0 (log 1): the two shallowest win
    assert tree.parents == [-1, 0, 0] or tree.parents == [-1, 0, 1]
    assert all(parent < node for node, parent in enumerate(tree.parents) if node)


def build_expand_rerank(table: torch.Tensor, top_k: int, layers: int, budget: int | None) -> ExpandRerankBuilder:
    """An EAGLE-2 tree whose draft row for a node is ``table[layer, parent token]`` ([layers, vocab, vocab] log q),
    expanded to ``layers`` layers, or (``budget`` given) only while a deeper node could enter the best ``budget``."""
    builder = ExpandRerankBuilder(top_k)
    builder.add_layer(table[0, :1])
    while builder.depth < layers and (budget is None or builder.can_improve(budget)):
        builder.add_layer(table[builder.depth, builder.frontier_tokens])
    return builder


@pytest.mark.parametrize("sharpness", [0.3, 1.0, 3.0, 10.0])
def test_expand_rerank_early_stop_keeps_the_tree(sharpness):
    """Stopping the expansion once no deeper node can enter the best m - 1 gives the full expansion's tree, never
    builds more layers for fewer nodes, and stops early on flat drafts."""
    rng = torch.Generator().manual_seed(int(sharpness * 10))
    top_k, layers, vocab = 4, 6, 16
    table = torch.log_softmax(sharpness * torch.randn(layers, vocab, vocab, generator=rng), dim=-1)
    full = build_expand_rerank(table, top_k, layers, None)
    built = []
    for budget in (1, 2, 3, 5, 8, 13, 30):
        early = build_expand_rerank(table, top_k, layers, budget)
        assert early.tree(root=7, budget=budget)[0] == full.tree(root=7, budget=budget)[0]
        built.append(early.depth)
    assert built[0] == 1 and built == sorted(built)  # one node: the best first-layer one; more nodes, more layers
    assert built[-1] < layers or sharpness > 1  # flat drafts stop before the last layer even at 30 nodes


def test_expand_rerank_early_stop_on_a_uniform_draft():
    """A uniform draft: every deeper node is worth less than any first-layer one, so a budget the first layer fills
    builds that layer alone; ties with the frontier stop too (the shallower node wins them)."""
    uniform = torch.full((3, 8, 8), -math.log(8))
    assert build_expand_rerank(uniform, 4, 3, budget=4).depth == 1
    assert build_expand_rerank(uniform, 4, 3, budget=5).depth == 2


def test_eagle2_drafter_respects_total_tokens_depth_and_forward_count(tiny):
    drafter = Eagle2(head=RANDOM_HEAD, top_k=3, depth=4, total_tokens=10)
    drafter.setup(tiny, None)
    prompt = [3, 1, 4, 1, 5, 9]
    gen = decode(tiny, drafter, prompt, 30)
    assert gen.output_ids == ar_greedy(tiny, prompt, 30).output_ids
    assert all(n <= 9 for n in gen.draft_tokens) and max(gen.draft_tokens) == 9
    stats = drafter.stats()
    assert stats["tree_depth_mean"] <= 5
    assert stats["head_forwards"] <= stats["steps"] * (1 + 4)  # one catch-up + `depth` expansions per step


# ----------------------------------------------------------------------------------- the head cache


def committed_features(model, tokens: list[int]) -> torch.Tensor:
    """f_0 .. f_{n-1} of ``tokens`` from one plain forward of the target ([n, H])."""
    with torch.no_grad():
        return model(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1][0]


@pytest.mark.parametrize(
    "make",
    [
        lambda: Eagle(head=RANDOM_HEAD),
        lambda: Eagle2(head=RANDOM_HEAD, top_k=4, depth=3),
        lambda: EagleOptTree(head=RANDOM_HEAD, nodes=6),
    ],
    ids=["eagle", "eagle2", "opt"],
)
def test_head_cache_after_rollbacks_equals_recomputation(tiny, make):
    """After a generation of many tree steps, the head's cache equals feeding the committed pairs from scratch."""
    drafter = make()
    drafter.setup(tiny, None)
    prompt = [7, 3, 9, 1, 12, 40]
    gen = decode(tiny, drafter, prompt, 25)
    tokens = prompt + gen.output_ids
    committed = drafter.draft.committed
    assert drafter.draft.tree_rows == 0 and gen.target_forwards > 5
    assert committed == len(tokens) - 1 - len(drafter.pending)  # the last step's features wait for the next step
    fresh = HeadCache(drafter.draft.head, tiny.get_output_embeddings())
    with torch.no_grad():
        fresh.extend(committed_features(tiny, tokens)[:committed], tokens[1 : committed + 1])
    for ours, theirs in zip(drafter.draft.cache.layers, fresh.cache.layers):
        assert ours.keys.shape == theirs.keys.shape
        torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours.values, theirs.values, atol=1e-4, rtol=1e-4)


class OracleHead(torch.nn.Module):
    """A stand-in head that knows the greedy continuation: the pair (f, x) at position i returns the target's
    true feature f_{i+1} when x is the true token at i + 1 (else zeros: a flat draft law), and keeps a KV cache
    of one value per row, so the drafter's rollback is exercised. With it the true path is the most confident
    one, and every drafted path of true tokens must be accepted."""

    def __init__(self, features: torch.Tensor, tokens: list[int]):
        super().__init__()
        self.features, self.tokens = features, tokens
        self.config = LlamaConfig(hidden_size=8, num_attention_heads=1, num_hidden_layers=1, intermediate_size=8)
        self.fc = torch.nn.Linear(1, 1)

    def forward(self, features, input_ids, position_ids, attention_mask, cache=None):
        rows = []
        for token, position in zip(input_ids[0].tolist(), position_ids[0].tolist()):
            known = position + 1 < len(self.tokens) and self.tokens[position + 1] == token
            rows.append(self.features[position + 1] if known else torch.zeros(self.features.shape[1]))
        n = len(rows)
        if cache is not None:
            cache.update(torch.zeros(1, 1, n, 1), torch.zeros(1, 1, n, 1), 0)
        return torch.stack(rows)[None]


def true_depth(tree, truth: list[int], position: int) -> int:
    """Depth of the deepest node of ``tree`` whose path spells the true continuation after ``position``."""
    best = 0
    for node in range(1, len(tree)):
        path = tree.path_to(node)[1:]
        if [tree.tokens[i] for i in path] == truth[position + 1 : position + 1 + len(path)]:
            best = max(best, len(path))
    return best


@pytest.mark.parametrize(
    "make,full_depth",
    [
        (lambda: Eagle(head=RANDOM_HEAD), 5),
        (lambda: Eagle2(head=RANDOM_HEAD, top_k=2, depth=3, total_tokens=8), 4),
        (lambda: EagleOptTree(head=RANDOM_HEAD, nodes=4, max_depth=5), None),
    ],
    ids=["eagle", "eagle2", "opt"],
)
def test_pairs_are_aligned_an_oracle_head_is_accepted_as_deep_as_it_drafts_the_truth(make, full_depth):
    """With a head that predicts the true next feature, every step accepts exactly the deepest true path it
    drafted: the pairs (feature, token) and their positions line up with what the target verifies. The static
    tree and EAGLE-2's tree hold the whole true chain every step (OPT-Tree's 4 nodes may prefer siblings)."""
    target = tiny_model(seed=0)
    with torch.no_grad():
        target.lm_head.weight.mul_(30)  # a confident target: its greedy path is the most confident one
    prompt = [3, 1, 4, 1, 5]
    truth = ar_greedy(target, prompt, 41).output_ids
    drafter = make()
    drafter.setup(target, None)
    sequence = prompt + truth
    drafter.draft.head = OracleHead(committed_features(target, sequence), sequence)
    drafted = []
    draft_tree = drafter.draft_tree

    def recording(ctx, root_feature, root_logits):
        tree = draft_tree(ctx, root_feature, root_logits)
        drafted.append(true_depth(tree, sequence, ctx.position))
        return tree

    drafter.draft_tree = recording
    gen = decode(target, drafter, prompt, 41)
    assert gen.output_ids == truth
    assert [n - 1 for n in gen.accept_lengths] == drafted
    if full_depth:
        full, rest = divmod(40, full_depth + 1)  # the last step's tree is cut to the budget
        assert gen.accept_lengths == [full_depth + 1] * full + ([rest] if rest else [])
        reached_by_all = rest - 1 if rest else full_depth  # depths every step's accepted path reached
        assert drafter.stats()["depth_accept_rate"][:reached_by_all] == [1.0] * reached_by_all
    else:
        assert max(drafted) >= 3 and sum(drafted) / len(drafted) > 1.5


# ----------------------------------------------------------------------------------- greedy equality


DRAFTERS = {
    "eagle": lambda seed: Eagle(head=OmegaConf.create({"source": "random", "seed": seed})),
    "eagle_binary": lambda seed: Eagle(
        head=OmegaConf.create({"source": "random", "seed": seed}), shape="binary", nodes=14
    ),
    "eagle2": lambda seed: Eagle2(
        head=OmegaConf.create({"source": "random", "seed": seed}), top_k=5, depth=4, total_tokens=20
    ),
    "opt_tree_eagle": lambda seed: EagleOptTree(
        head=OmegaConf.create({"source": "random", "seed": seed}), nodes=10, threshold=0.0
    ),
}


@pytest.mark.parametrize("name", sorted(DRAFTERS))
@pytest.mark.parametrize("seed", range(2))
def test_greedy_equals_ar_tiny(tiny, name, seed):
    rng = random.Random(seed)
    drafter = DRAFTERS[name](seed)
    drafter.setup(tiny, None)
    for _ in range(2):
        prompt = [rng.randrange(97) for _ in range(rng.randrange(2, 20))]
        truth = ar_greedy(tiny, prompt, 40).output_ids
        assert decode(tiny, drafter, prompt, 40, rule="match" if seed else "speculative").output_ids == truth
    stats = drafter.stats()
    assert stats["steps"] > 0 and stats["drafted"] > 0 and stats["head"] == f"random(seed={seed})"


def test_eos_and_budget_inside_a_tree_step(tiny):
    prompt = [7, 8, 9]
    truth = ar_greedy(tiny, prompt, 30).output_ids
    drafter = Eagle(head=RANDOM_HEAD)
    drafter.setup(tiny, None)
    sequence = prompt + truth
    drafter.draft.head = OracleHead(committed_features(tiny, sequence), sequence)
    eos = truth[8]
    gen = decode(tiny, drafter, prompt, 30, eos=frozenset({eos}))
    assert gen.output_ids == truth[: truth.index(eos) + 1] and gen.stop_reason == "eos"
    gen = decode(tiny, drafter, prompt, 7)
    assert gen.output_ids == truth[:7] and gen.stop_reason == "max_new_tokens"


@pytest.mark.slow
def test_greedy_equals_ar_embedded_random_head(embedded):
    model, tok = embedded.model, embedded.tokenizer
    for drafter in (Eagle(head=RANDOM_HEAD), Eagle2(head=RANDOM_HEAD, top_k=4, depth=3, total_tokens=16)):
        drafter.setup(model, tok)
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "Write a Python function that adds two numbers."}],
            add_generation_prompt=True,
            tokenize=True,
        )["input_ids"]
        truth = ar_greedy(model, prompt, 20, embedded.eos_ids).output_ids
        assert decode(model, drafter, prompt, 20, eos=embedded.eos_ids).output_ids == truth


@pytest.mark.slow
def test_greedy_equals_ar_embedded_trained_head(embedded, shared_data, tmp_path):
    """The embedded model with a trained head: the cached full one, or a small stand-in trained here."""
    model, tok = embedded.model, embedded.tokenizer
    from specbench.train import eagle as eagle_train

    folder = part_kind("eagle").folder("smollm2_135m")
    settings = ["train.max_steps=60", "train.eval_depth=2"]
    node, cached = embedded_head(folder, eagle_train.main, tmp_path / "head", shared_data, settings)
    least_accepted = 0.3 if cached else 0.05
    drafters = [
        Eagle(head=node, target_name="smollm2_135m"),
        Eagle2(head=node, target_name="smollm2_135m", total_tokens=26),
        EagleOptTree(head=node, target_name="smollm2_135m", nodes=25),
    ]
    questions = ["Write a Python function that returns the factorial of n.", "Name three prime numbers."]
    for drafter in drafters:
        drafter.setup(model, tok)
        for question in questions:
            prompt = tok.apply_chat_template(
                [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
            )["input_ids"]
            truth = ar_greedy(model, prompt, 48, embedded.eos_ids).output_ids
            assert decode(model, drafter, prompt, 48, eos=embedded.eos_ids).output_ids == truth
        assert drafter.stats()["accepted_per_step"] > least_accepted  # trained: drafts the target accepts


# ----------------------------------------------------------------------------------- exact sampling at T > 0


TEMP = 0.5  # far from 1, so a draft law recorded without the warping would bias the output
TRIALS = 1200


def keep_token(weights, mass, token):
    """BUG (negative control): a rejected token stays in the residual."""
    return mass


SAMPLED = {  # name -> (drafter, acceptance rule, negative control)
    "eagle_sampled": (lambda h: Eagle(head=h, shape="binary", nodes=6), "speculative", "draws"),
    "eagle2": (
        lambda h: Eagle2(head=h, top_k=2, depth=2, total_tokens=6),
        "speculative",
        "keep_token",
    ),
    "eagle3": (  # the one-layer target: fuse embeddings, embeddings, last
        lambda h: Eagle3(head=OmegaConf.merge(h, {"layers": [0, 0, 1]}), top_k=2, depth=2, total_tokens=6),
        "speculative",
        "keep_token",
    ),
    "eagle3_1": (  # EAGLE-3.1's norms (fc_norm, norm_output) on the same head: the same law
        lambda h: Eagle3(
            head=OmegaConf.merge(h, {"layers": [0, 0, 1], "fc_norm": True, "norm_output": True}),
            top_k=2,
            depth=2,
            total_tokens=6,
        ),
        "speculative",
        None,
    ),
    "opt_tree_eagle": (lambda h: EagleOptTree(head=h, nodes=4, threshold=0.0), "match", None),
    "opt_tree_eagle_speculative": (
        lambda h: EagleOptTree(head=h, nodes=4, threshold=0.0),
        "speculative",
        "keep_token",
    ),
}


def run_sampled(name: str) -> tuple[float, int, float]:
    target = tiny_model(vocab_size=2, seed=5, hidden_size=16, num_hidden_layers=1, intermediate_size=32)
    with torch.no_grad():
        target.lm_head.weight.mul_(8)  # peaked target (and head: it reads the target's LM head)
    sampling = Sampling(temperature=TEMP)
    prompt = [0, 1, 1]
    expected = exact_joint(target, prompt, 4, sampling)
    make, rule, _ = SAMPLED[name]
    drafter = make(OmegaConf.create({"source": "random", "seed": 4}))
    drafter.setup(target, None)
    decoder = Decoder(target, drafter, frozenset(), sampling, acceptance_rule(rule))
    generator = torch.Generator().manual_seed(sorted(SAMPLED).index(name))
    counts = sampled_outputs(decoder, prompt, 4, generator, trials=TRIALS)
    assert drafter.stats()["drafted_per_step"] >= 1
    return chi_square(counts, expected)


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_sampled_outputs_follow_the_target(name):
    """T > 0 end to end (tiny target, 2-token vocabulary, random head): 4-token outputs follow the target's law."""
    stat, dof, p_value = run_sampled(name)
    print(f"{name}: chi2={stat:.1f} dof={dof} p={p_value:.3g}")
    assert p_value > MIN_P, (stat, dof)


def skewed_draws(probs, k, generator):
    """BUG (negative control): children drawn from a law other than the recorded q (uniform)."""
    return torch.randperm(probs.numel(), generator=generator)[:k].tolist()


@pytest.mark.parametrize("name", [name for name in sorted(SAMPLED) if SAMPLED[name][2]])
def test_negative_controls_fail_the_same_test(name, monkeypatch):
    """The same test at the same size rejects a broken variant: children not drawn from the recorded q
    (sampled static tree), or a rejected token left in the residual (one-hot rule over a deterministic tree)."""
    from specbench.drafters import tree_fill

    bug = SAMPLED[name][2]
    if bug == "draws":
        monkeypatch.setattr(tree_fill, "sample_without_replacement", skewed_draws)
    else:
        monkeypatch.setattr(speculative, "drop_token", keep_token)
    stat, dof, p_value = run_sampled(name)
    print(f"{name} bug={bug}: chi2={stat:.1f} dof={dof} p={p_value:.3g}")
    assert p_value < MIN_P, (stat, dof)


# ----------------------------------------------------------------------------------- training


def test_evaluation_of_a_perfect_head_is_perfect_at_every_depth(tiny):
    """The trainer's depth-k evaluation feeds (own feature, true token) at the right positions: a head that
    returns the true next feature scores 1.0 at every depth on the target's own greedy continuation."""
    from specbench.train.eagle import Sequence, evaluate

    prompt = [5, 6, 7]
    sequence = prompt + ar_greedy(tiny, prompt, 20).output_ids
    features = committed_features(tiny, sequence)
    item = Sequence(
        torch.tensor(sequence), features, len(prompt), torch.zeros(20, 1, dtype=torch.long), torch.zeros(20, 1)
    )

    class TrueNext(torch.nn.Module):
        def forward(self, features, input_ids, position_ids, attention_mask, cache=None):
            return torch.stack(
                [
                    item.features[p + 1] if sequence[p + 1] == t else torch.zeros(64)
                    for t, p in zip(input_ids[0].tolist(), position_ids[0].tolist())
                ]
            )[None]

    result = evaluate(TrueNext(), tiny.get_output_embeddings(), [item], depth=4, top_k=3, device=torch.device("cpu"))
    assert result["top1"] == [1.0] * 4 and result["positions"] == [19, 18, 17, 16]
    random_result = evaluate(random_head(tiny, 0), tiny.get_output_embeddings(), [item], 4, 3, torch.device("cpu"))
    assert random_result["top1"][0] < 0.5


def test_collate_aligns_pairs_targets_and_teacher_rows():
    from specbench.train.eagle import Sequence, collate

    ids = torch.tensor([10, 11, 12, 13, 14, 15])  # prompt 10 11 12, answer 13 14 15
    features = torch.arange(6.0)[:, None].expand(6, 2).clone()  # f_t = t
    topk = torch.tensor([[13], [14], [15]])  # the target's law at positions 2, 3, 4 (predicting 13, 14, 15)
    batch = collate([Sequence(ids, features, 3, topk, torch.zeros(3, 1))])
    assert batch.next_ids[0].tolist() == [11, 12, 13, 14, 15]  # pair t = (f_t, x_{t+1})
    assert batch.targets[0, :, 0].tolist() == [1, 2, 3, 4, 5]  # regression target f_{t+1}
    assert batch.reg_rows[0].tolist() == [False, False, True, True, True]  # t + 1 in [P, T - 1]
    assert batch.cls_rows[0].tolist() == [False, False, True, True, False]  # t + 1 in [P, T - 2]
    assert batch.topk_ids[:, 0].tolist() == [14, 15]  # the law at t + 1 = 3, 4 predicts x_4, x_5


@pytest.mark.slow
def test_train_eagle_end_to_end_tiny(training_cache, shared_data):
    """`train eagle` on tiny_llama: saves the head + per-depth accuracy, is a no-op when rerun, and decodes."""
    from specbench.config import compose_config
    from specbench.models.loading import load_model
    from specbench.train import eagle as eagle_train

    args = [
        "model=tiny_llama",
        f"data_dir={shared_data}",
        "prompts.max_prompts=5",
        "prompts.max_new_tokens=10",
        "train.max_steps=2",
        "train.batch_size=2",
        "train.eval_sequences=2",
        "train.eval_depth=3",
        "progress=false",
    ]
    folder = eagle_train.main(args)
    record = json.loads((folder / "training.json").read_text())
    assert record["result"]["steps"] == 2 and len(record["accuracy"]["top1"]) == 3
    assert record["accuracy"]["positions"][0] > 0
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert eagle_train.main(args) == folder and weights.stat().st_mtime_ns == stamp  # cached: no-op
    lm = load_model(compose_config("model=tiny_llama").model, torch.device("cpu"), torch.float32)
    drafter = Eagle2(head=OmegaConf.create({"source": "trained"}), target_name="tiny_llama", top_k=3, depth=2)
    drafter.setup(lm.model, lm.tokenizer)
    assert drafter.stats()["trained_top1_by_depth"] == record["accuracy"]["top1"]
    prompt = [1, 2, 3, 4]
    assert decode(lm.model, drafter, prompt, 12).output_ids == ar_greedy(lm.model, prompt, 12).output_ids


def test_head_config_follows_the_target(tiny):
    config = config_for_target(tiny)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (
        64,
        4,
        2,
        97,
    ) and config.num_hidden_layers == 1


def test_tree_row_mask_sees_committed_rows_ancestors_and_itself():
    from specbench.structures.tree_rows import TreeRowMask

    rows = TreeRowMask()
    first = rows.add([-1, -1], past=3, dtype=torch.float32)  # two children of the root
    second = rows.add([0, 0, 1], past=3, dtype=torch.float32)  # rows 2, 3 under row 0; row 4 under row 1
    assert first.shape == (2, 5) and second.shape == (3, 8)
    seen = (second == 0).int().tolist()
    assert seen == [[1, 1, 1, 1, 0, 1, 0, 0], [1, 1, 1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 1, 0, 0, 1]]
    assert len(rows) == 5
