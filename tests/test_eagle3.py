"""EAGLE-3: the authors' checkpoint layout (built here, loaded, checked against a hand-written forward), the
fused layers, the reduced draft vocabulary, training-time test == decoding, greedy == AR, and the trainer.
(Exact sampling at T > 0 and its negative control run in tests/test_eagle.py beside EAGLE-2's.)"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig

from specbench.drafters.eagle import Eagle3, HeadCache
from specbench.errors import ConfigError, ModelUnavailable
from specbench.models.eagle3_heads import Eagle3Head, fused_layers, load_eagle3, random_head
from specbench.models.eagle_heads import config_for_target
from tests.conftest import tiny_model
from tests.helpers import embedded_head
from tests.test_eagle import decode, rms, write_checkpoint
from tests.test_loop import ar_greedy

LAYERS = [0, 1, 2]  # the tiny target has 2 layers: embeddings, layer 1's input, the last (normed)


EAGLE3_1 = ("fc_norm", "norm_output")  # the two norms EAGLE-3.1 adds (vLLM's config.json keys)


def random_node(seed: int = 0, draft_vocab: int | None = None, norms: tuple[str, ...] = ()) -> dict:
    node = {"source": "random", "seed": seed, "layers": LAYERS, **dict.fromkeys(norms, True)}
    return node if draft_vocab is None else {**node, "draft_vocab": draft_vocab}


# ----------------------------------------------------------------------------------- the authors' layout

AUTHORS_CONFIG = {  # the keys of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's config.json, scaled to the tiny target
    "architectures": ["LlamaForCausalLMEagle3"],
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
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.28.1",
    "use_cache": True,
    "vocab_size": 97,
    "draft_vocab_size": 32,
}
DRAFT_TOKENS = torch.arange(0, 96, 3)  # 32 target tokens: 0, 3, 6, ...


def authors_state(config: dict, seed: int = 0, embed: bool = False) -> dict[str, torch.Tensor]:
    """A random state dict in the authors' EAGLE-3 key layout (fp16 weights, int64 d2t, bool t2d)."""
    gen = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    dim, draft = hidden // heads, config["draft_vocab_size"]

    def rand(*shape, scale=None):
        return (torch.randn(*shape, generator=gen) * (scale or 1 / math.sqrt(shape[-1]))).half()

    def gain():
        return (1 + torch.randn(hidden, generator=gen) * 0.1).half()

    state = {
        "fc.weight": rand(hidden, 3 * hidden),
        "midlayer.input_layernorm.weight": gain(),
        "midlayer.hidden_norm.weight": gain(),
        "midlayer.post_attention_layernorm.weight": gain(),
        "midlayer.self_attn.q_proj.weight": rand(heads * dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * dim),
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden),
        "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, inter),
        "norm.weight": gain(),
        "lm_head.weight": rand(draft, hidden),
    }
    if draft != config["vocab_size"]:
        state["d2t"] = DRAFT_TOKENS - torch.arange(draft)
        state["t2d"] = torch.zeros(config["vocab_size"], dtype=torch.bool).index_fill_(0, DRAFT_TOKENS, True)
    if embed:
        state["embed_tokens.weight"] = rand(config["vocab_size"], hidden, scale=1.0)
    if config.get("fc_norm"):
        state.update({f"fc_norm.{i}.weight": gain() for i in range(3)})
    if config.get("norm_before_fc"):
        state["input_norm.weight"] = torch.cat([gain() for _ in range(3)])
    return state


def rope(x, positions, dim):
    """Rotary embedding of x [n, heads, dim] at ``positions`` [n] (base 10000)."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2).float() / dim))
    angles = positions.float()[:, None] * inv_freq[None]
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
    return x * cos + torch.cat([-x[..., dim // 2 :], x[..., : dim // 2]], -1) * sin


def reference_eagle3(state, config, fused, tokens, embeddings):
    """The EAGLE-3 head by hand on one causal sequence: g = fc(fused); x = [rms(e); rms(g)]; attention from 2H with
    rotary at 0..n-1; residual from g; MLP; then the draft-vocabulary logits and their target ids. EAGLE-3.1's keys:
    ``fc_norm`` rms-normalises each third of ``fused`` with its own gain, ``norm_before_fc`` the whole of it, and
    ``norm_output`` returns the normed output (the state the next drafting step reads)."""
    w = {key: value.float() for key, value in state.items() if value.is_floating_point()}
    eps, heads, kv_heads = config["rms_norm_eps"], config["num_attention_heads"], config["num_key_value_heads"]
    hidden = config["hidden_size"]
    dim, n = hidden // heads, len(tokens)
    if config.get("norm_before_fc"):
        fused = rms(fused, w["input_norm.weight"], eps)
    if config.get("fc_norm"):
        fused = torch.cat([rms(part, w[f"fc_norm.{i}.weight"], eps) for i, part in enumerate(fused.chunk(3, -1))], -1)
    g = fused @ w["fc.weight"].T
    x = torch.cat(
        [
            rms(embeddings[tokens], w["midlayer.input_layernorm.weight"], eps),
            rms(g, w["midlayer.hidden_norm.weight"], eps),
        ],
        -1,
    )
    q = rope((x @ w["midlayer.self_attn.q_proj.weight"].T).view(n, heads, dim), torch.arange(n), dim)
    k = rope((x @ w["midlayer.self_attn.k_proj.weight"].T).view(n, kv_heads, dim), torch.arange(n), dim)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(n, kv_heads, dim)
    k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(dim)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    h = (
        g
        + torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, hidden)
        @ w["midlayer.self_attn.o_proj.weight"].T
    )
    m = rms(h, w["midlayer.post_attention_layernorm.weight"], eps)
    h = (
        h
        + (
            torch.nn.functional.silu(m @ w["midlayer.mlp.gate_proj.weight"].T)
            * (m @ w["midlayer.mlp.up_proj.weight"].T)
        )
        @ w["midlayer.mlp.down_proj.weight"].T
    )
    normed = rms(h, w["norm.weight"], eps)
    logits = normed @ w["lm_head.weight"].T  # [n, draft]
    ids = torch.arange(logits.shape[1]) + state["d2t"] if "d2t" in state else torch.arange(logits.shape[1])
    return normed if config.get("norm_output") else h, logits, ids


def causal_run(head: Eagle3Head, fused, tokens):
    """The loaded head on one causal sequence (positions 0..n-1): outputs [n, H] and target-vocabulary logits."""
    n = len(tokens)
    mask = torch.zeros(n, n).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    with torch.no_grad():
        out = head(fused[None], torch.tensor([tokens]), torch.arange(n)[None], mask[None, None])[0]
        return out, head.target_logits(out)


@pytest.mark.parametrize(
    "draft_vocab,embed,norms",
    [(32, False, ()), (97, False, ()), (32, True, ()), (32, False, EAGLE3_1), (97, False, ("norm_before_fc",))],
)
def test_authors_layout_loads_and_matches_a_hand_written_forward(tmp_path, draft_vocab, embed, norms):
    """EAGLE-3's layout, and EAGLE-3.1's (the norms' keys in config.json, their gains in the state dict)."""
    tiny = tiny_model()
    config = {**AUTHORS_CONFIG, "draft_vocab_size": draft_vocab, **dict.fromkeys(norms, True)}
    state = authors_state(config, embed=embed)
    write_checkpoint(tmp_path / "head", config, state)
    loaded = load_eagle3(
        OmegaConf.create({"source": "hub", "path": str(tmp_path / "head"), "layers": LAYERS}), tiny, "t"
    )
    head = loaded.head
    assert loaded.layers == tuple(LAYERS) and head.shares_embeddings is not embed
    assert set(head.checkpoint_state()) == set(state) and head.reduced is (draft_vocab < 97)
    gen = torch.Generator().manual_seed(1)
    fused, tokens = torch.randn(6, 3 * 64, generator=gen), [5, 9, 3, 0, 12, 6]
    embeddings = state["embed_tokens.weight"].float() if embed else tiny.get_input_embeddings().weight.detach()
    out, full = causal_run(head, fused, tokens)
    hand, hand_logits, ids = reference_eagle3(state, config, fused, tokens, embeddings)
    torch.testing.assert_close(out, hand, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(full[:, ids], hand_logits, atol=2e-4, rtol=2e-4)
    outside = torch.ones(97, dtype=torch.bool).index_fill_(0, ids, False)
    assert torch.isinf(full[:, outside]).all() and outside.sum() == 97 - draft_vocab


def test_authors_checkpoint_problems_are_clear(tmp_path):
    tiny = tiny_model()

    def load(config, state, name):
        write_checkpoint(tmp_path / name, config, state)
        node = OmegaConf.create({"source": "hub", "path": str(tmp_path / name), "layers": LAYERS})
        return load_eagle3(node, tiny, "t")

    state = authors_state(AUTHORS_CONFIG)
    with pytest.raises(ConfigError, match="missing keys.*hidden_norm"):
        load(AUTHORS_CONFIG, {k: v for k, v in state.items() if "hidden_norm" not in k}, "missing")
    with pytest.raises(ConfigError, match="unexpected keys.*extra"):
        load(AUTHORS_CONFIG, {**state, "extra.weight": torch.zeros(1)}, "unexpected")
    with pytest.raises(ConfigError, match="not an EAGLE-3 head: expected fc.weight"):
        load(AUTHORS_CONFIG, {**state, "fc.weight": torch.zeros(64, 128)}, "eagle1")  # an EAGLE-1/2 head's fc
    with pytest.raises(ConfigError, match="no d2t mapping"):
        load(AUTHORS_CONFIG, {k: v for k, v in state.items() if k != "d2t"}, "no_d2t")
    with pytest.raises(ConfigError, match="t2d does not mark"):
        load(AUTHORS_CONFIG, {**state, "t2d": torch.zeros(97, dtype=torch.bool)}, "bad_t2d")
    with pytest.raises(ConfigError, match="width 64 and vocabulary 200; this target has 64 and 97"):
        load({**AUTHORS_CONFIG, "vocab_size": 200}, state, "other_vocab")
    with pytest.raises(ConfigError, match=r"missing keys \['fc_norm.0.weight'"):  # config.json says 3.1, weights 3
        load({**AUTHORS_CONFIG, "fc_norm": True}, state, "norms_missing")
    with pytest.raises(ConfigError, match=r"unexpected keys \['fc_norm.0.weight'"):  # weights 3.1, config.json 3
        load(AUTHORS_CONFIG, authors_state({**AUTHORS_CONFIG, "fc_norm": True}), "norms_unexpected")


def test_hub_head_offline_names_the_id_and_the_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    node = OmegaConf.create({"source": "hub", "path": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "layers": LAYERS})
    with pytest.raises(ModelUnavailable, match=r"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B.*model\.eagle3\.path=DIR"):
        load_eagle3(node, tiny_model(), "t")


def test_trained_head_missing_says_how_to_train(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(ModelUnavailable, match="python -m specbench.train eagle3 model=t"):
        load_eagle3(OmegaConf.create({"source": "trained", "layers": LAYERS}), tiny_model(), "t")


def test_fused_layers_follow_the_authors_rule():
    assert fused_layers(32) == (2, 16, 29)  # LLaMA-3.1-8B
    assert fused_layers(40) == (2, 20, 37)  # Vicuna-13B
    assert fused_layers(30) == (2, 15, 27)  # SmolLM2-135M
    with pytest.raises(ConfigError, match="model.eagle3.layers"):
        fused_layers(2)
    assert fused_layers(2, [0, 1, 2]) == (0, 1, 2)
    with pytest.raises(ConfigError, match=r"three hidden-state indices in \[0, 2\]"):
        fused_layers(2, [0, 1, 3])


def test_eagle3_1_is_eagle3_with_its_own_head_node():
    """method=eagle3_1 composes EAGLE-3's drafter and tree with the model's `eagle3_1:` node and its part kind."""
    from specbench.config import compose_config

    eagle3, eagle3_1 = (
        compose_config("model=smollm2_135m", f"method={name}").method for name in ("eagle3", "eagle3_1")
    )
    assert eagle3_1.drafter.part == "eagle3_1" and eagle3_1.drafter.head.source == "trained"
    same = {key: eagle3.drafter[key] for key in eagle3.drafter if key not in ("head", "part")}
    assert {key: eagle3_1.drafter[key] for key in same} == same and eagle3_1.acceptance == eagle3.acceptance


def test_model_configs_name_the_published_heads():
    from specbench.config import compose_config

    for model, hub_id in {
        "llama3_1_8b_instruct": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "vicuna_13b": "yuhuili/EAGLE3-Vicuna1.3-13B",
    }.items():
        node = compose_config(f"model={model}", "method=eagle3").method.drafter.head
        assert node.source == "hub" and node.path == hub_id


# ----------------------------------------------------------------------------------- training-time test


@pytest.mark.parametrize("norms", [(), EAGLE3_1])
def test_unroll_equals_what_decoding_computes(norms):
    """The trainer's unroll step j at anchor t equals the head cache's chain drafted from t (committed pairs
    0..t, then own outputs with the teacher-forced tokens at positions t + 1 .. t + j): training-time test
    trains exactly the rows decoding builds (EAGLE-3.1's post-norm feedback included)."""
    from specbench.train.eagle import Sequence
    from specbench.train.eagle3 import all_anchors, collate, unroll

    tiny = tiny_model()
    head = random_head(tiny, seed=3, draft_vocab=40, norms=norms)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 97, (12,), generator=gen)
    item = Sequence(
        ids, torch.randn(12, 3 * 64, generator=gen), 4, torch.zeros(8, 2, dtype=torch.long), torch.zeros(8, 2)
    )
    steps = 3
    with torch.no_grad():
        batch = collate([item], steps)
        full = unroll(head, batch, steps, all_anchors(batch), torch.device("cpu"), None)  # steps x [1, 11, H]
        some = unroll(head, batch, steps, torch.tensor([[6, 3]]), torch.device("cpu"), None)  # steps >= 1: [1, 2, H]
        cache = HeadCache(head, head.target_logits)
        for column, anchor in enumerate((6, 3)):
            cache.reset()
            outputs = [cache.extend(item.features[: anchor + 1], ids[1 : anchor + 2].tolist())[-1]]
            for depth in range(1, steps):
                token = int(ids[anchor + 1 + depth])
                outputs.append(cache.tree_layer(outputs[-1][None], [token], [depth - 2 if depth > 1 else -1], depth)[0])
            for j, out in enumerate(outputs):
                torch.testing.assert_close(out, full[j][0, anchor], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(out, some[j][0, anchor if j == 0 else column], atol=1e-5, rtol=1e-5)


def test_draft_vocabulary_keeps_the_most_frequent_answer_tokens():
    from specbench.train.eagle import Sequence
    from specbench.train.eagle3 import draft_vocabulary

    ids = torch.tensor([50, 50, 50, 7, 7, 9, 9, 9, 3])  # prompt 50 50 50; answer 7 7 9 9 9 3
    item = Sequence(ids, torch.zeros(9, 3), 3, torch.zeros(6, 1, dtype=torch.long), torch.zeros(6, 1))
    assert draft_vocabulary([item], 2, 97).tolist() == [7, 9]
    assert draft_vocabulary([item], 4, 97).tolist() == [0, 3, 7, 9]  # ties (count 0) by id
    assert draft_vocabulary([item], None, 97) is None and draft_vocabulary([item], 97, 97) is None


# ----------------------------------------------------------------------------------- greedy equality


@pytest.mark.parametrize("draft_vocab,norms", [(None, ()), (24, ()), (24, EAGLE3_1)])
@pytest.mark.parametrize("rule", ["speculative", "match"])
def test_greedy_equals_ar_tiny(draft_vocab, norms, rule):
    tiny = tiny_model()
    node = OmegaConf.create(random_node(1, draft_vocab, norms))
    drafter = Eagle3(head=node, top_k=4, depth=3, total_tokens=12)
    drafter.setup(tiny, None)
    assert drafter.hidden_layers == tuple(LAYERS)
    rng = random.Random(1)
    for _ in range(2):
        prompt = [rng.randrange(97) for _ in range(rng.randrange(2, 20))]
        assert decode(tiny, drafter, prompt, 40, rule=rule).output_ids == ar_greedy(tiny, prompt, 40).output_ids
    stats = drafter.stats()
    assert stats["steps"] > 0 and stats["drafted_per_step"] > 1 and stats["head"] == "random(seed=1)"
    head = drafter.draft.head
    assert (head.fc_norm is not None, head.norm_output) == (bool(norms), bool(norms))


class FusedOracle(torch.nn.Module):
    """A stand-in head that checks every committed pair's fused features against one plain forward of the target
    (the loop must hand over layers (0, 1, 2) of the right rows), and drafts the greedy continuation: the pair at
    position i carrying the true x_{i+1} outputs the id of x_{i+2} (+1) in its first entry."""

    def __init__(self, fused: torch.Tensor, tokens: list[int]):
        super().__init__()
        self.fused, self.tokens, self.checked = fused, tokens, 0
        self.config = LlamaConfig(hidden_size=8, num_attention_heads=1, num_hidden_layers=1, intermediate_size=8)
        self.fc = torch.nn.Linear(1, 1)

    def forward(self, features, input_ids, position_ids, attention_mask, cache=None):
        out = torch.zeros(*input_ids.shape, 64)  # [1, n, H]
        for row, (token, position) in enumerate(zip(input_ids[0].tolist(), position_ids[0].tolist())):
            if features.shape[-1] == self.fused.shape[-1]:  # a committed pair: the target's fused layers
                torch.testing.assert_close(features[0, row], self.fused[position], atol=1e-4, rtol=1e-4)
                self.checked += 1
            if position + 2 < len(self.tokens) and self.tokens[position + 1] == token:
                out[0, row, 0] = self.tokens[position + 2] + 1
        cache.update(torch.zeros(1, 1, out.shape[1], 1), torch.zeros(1, 1, out.shape[1], 1), 0)
        return out

    def target_logits(self, out: torch.Tensor) -> torch.Tensor:
        ids = out[:, 0].long() - 1  # [k]; -1 = no idea
        logits = torch.full((out.shape[0], 97), -10.0)
        known = ids >= 0
        logits[known.nonzero()[:, 0], ids[known]] = 10.0
        return logits


def test_fused_features_and_pairs_line_up_an_oracle_is_accepted_as_deep_as_it_drafts():
    tiny = tiny_model()
    prompt = [4, 8, 15]
    truth = ar_greedy(tiny, prompt, 30).output_ids
    sequence = prompt + truth
    with torch.no_grad():
        states = tiny(torch.tensor([sequence]), output_hidden_states=True).hidden_states
    oracle = FusedOracle(torch.cat([states[layer][0] for layer in LAYERS], dim=-1), sequence)
    drafter = Eagle3(head=OmegaConf.create(random_node()), top_k=1, depth=3, total_tokens=5)
    drafter.setup(tiny, None)
    drafter.loaded_head = HeadCache(oracle, oracle.target_logits)
    gen = decode(tiny, drafter, prompt, 30)
    assert gen.output_ids == truth
    assert gen.accept_lengths[:-1] == [5] * (len(gen.accept_lengths) - 1)  # 4 drafted + the target's token
    assert oracle.checked == len(sequence) - gen.accept_lengths[-1] - 1  # every pair committed before the last step


@pytest.mark.slow
def test_greedy_equals_ar_embedded(embedded, shared_data, tmp_path):
    """The embedded model (30 layers: the authors' rule fuses 2, 15, 27) with a random head over a reduced
    vocabulary, and with a trained head: the cached one, or a stand-in trained here in seconds."""
    model, tok = embedded.model, embedded.tokenizer
    from specbench.models.parts import part_kind
    from specbench.train import eagle3 as eagle3_train

    settings = ["train.max_steps=40", "train.ttt_steps=2", "train.eval_depth=2"]
    folder = part_kind("eagle3").folder("smollm2_135m")
    node, cached = embedded_head(folder, eagle3_train.main, tmp_path / "head", shared_data, settings)
    trained = (node, 0.5 if cached else 0.05)
    random_headed = OmegaConf.create({"source": "random", "seed": 0, "draft_vocab": 4096})
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that returns the factorial of n."}],
        add_generation_prompt=True,
        tokenize=True,
    )["input_ids"]
    truth = ar_greedy(model, prompt, 40, embedded.eos_ids).output_ids
    for node, least_accepted in ((random_headed, 0.0), trained):
        drafter = Eagle3(head=node, target_name="smollm2_135m", top_k=4, depth=4, total_tokens=16)
        drafter.setup(model, tok)
        assert drafter.hidden_layers == (2, 15, 27)
        assert decode(model, drafter, prompt, 40, eos=embedded.eos_ids).output_ids == truth
        assert drafter.stats()["accepted_per_step"] >= least_accepted


# ----------------------------------------------------------------------------------- training


@pytest.mark.slow
@pytest.mark.parametrize("command", ["eagle3", "eagle3_1"])
def test_train_eagle3_end_to_end_tiny(training_cache, shared_data, command):
    """`train eagle3` (and `eagle3_1`) on tiny_llama: saves the authors' layout (EAGLE-3.1's norms in config.json
    and the weights, in a folder of its own) + per-depth accuracy, reruns as a no-op, decodes."""
    import importlib

    from specbench.config import compose_config
    from specbench.models.loading import load_model
    from specbench.models.parts import part_kind

    eagle3_train = importlib.import_module(f"specbench.train.{command}")

    args = [
        "model=tiny_llama",
        f"data_dir={shared_data}",
        "prompts.max_prompts=5",
        "prompts.max_new_tokens=10",
        "train.max_steps=2",
        "train.batch_size=2",
        "train.ttt_steps=3",
        "train.eval_sequences=2",
        "train.eval_depth=3",
        "head.draft_vocab_size=300",
        "progress=false",
    ]
    folder = eagle3_train.main(args)
    record = json.loads((folder / "training.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    assert record["result"]["steps"] == 2 and len(record["accuracy"]["top1"]) == 3
    assert len(record["result"]["loss_curve"]) == 0 or len(record["result"]["loss_curve"][0]) == 4
    assert config["draft_vocab_size"] == 300 and record["fused_layers"] == LAYERS
    assert folder == part_kind(command).folder("tiny_llama")
    norms = command == "eagle3_1"
    assert all(config.get(key, False) is norms for key in EAGLE3_1) and "norm_before_fc" not in config
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert eagle3_train.main(args) == folder and weights.stat().st_mtime_ns == stamp  # cached: no-op
    lm = load_model(compose_config("model=tiny_llama").model, torch.device("cpu"), torch.float32)
    node = OmegaConf.create({"source": "trained", "layers": LAYERS})
    drafter = Eagle3(head=node, target_name="tiny_llama", top_k=3, depth=2, part=command)
    drafter.setup(lm.model, lm.tokenizer)
    assert drafter.stats()["trained_top1_by_depth"] == record["accuracy"]["top1"]
    assert drafter.draft.head.draft_vocab_size == 300
    assert (drafter.draft.head.fc_norm is not None, drafter.draft.head.norm_output) == (norms, norms)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert drafter.artefacts() == [f"{command}:{manifest['weights_digest']}"]
    prompt = [1, 2, 3, 4]
    assert decode(lm.model, drafter, prompt, 12).output_ids == ar_greedy(lm.model, prompt, 12).output_ids


def test_head_config_follows_the_target():
    tiny = tiny_model()
    head = Eagle3Head(config_for_target(tiny))
    assert head.fc.in_features == 3 * 64 and head.midlayer.self_attn.q_proj.in_features == 128
    assert not head.reduced and "d2t" not in head.checkpoint_state()


@pytest.mark.parametrize("kind", ["eagle3", "eagle3_1"])
def test_a_random_head_is_written_once_for_vllm_as_the_loop_draws_it(kind, embedded, training_cache):
    """engine=vllm with a random head: the folder vLLM loads holds the head the shared loop draws from the same node
    (weights, reduced vocabulary, EAGLE-3.1's norms), the fused layers under vLLM's key, the part named as the loop
    names it; a second call reuses the folder."""
    from specbench.models.eagle3_heads import published_head, vllm_checkpoint
    from specbench.models.embedded import embedded_checkpoint

    norms = dict.fromkeys(EAGLE3_1, True) if kind == "eagle3_1" else {}
    node = OmegaConf.create({"source": "random", "seed": 3, "draft_vocab": 500, **norms})
    folder, part = vllm_checkpoint(node, "smollm2_135m", str(embedded_checkpoint()), None, kind)
    assert folder.startswith(str(training_cache / "vllm" / kind)) and part == f"{kind}:random(seed=3)"
    config = json.loads((Path(folder) / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27] and config["draft_vocab_size"] == 500
    assert all(config.get(key) is True for key in norms)
    loop = load_eagle3(node, embedded.model, "smollm2_135m", kind).head
    written, _ = published_head(folder, None, embedded.model)
    assert written.state_dict().keys() == loop.state_dict().keys()
    for key, value in loop.state_dict().items():
        torch.testing.assert_close(written.state_dict()[key], value)
    stamp = Path(folder, "model.safetensors").stat().st_mtime_ns
    assert vllm_checkpoint(node, "smollm2_135m", str(embedded_checkpoint()), None, kind) == (folder, part)
    assert Path(folder, "model.safetensors").stat().st_mtime_ns == stamp


def test_published_and_trained_heads_go_to_vllm_as_they_are(training_cache):
    """A Hub id or folder is passed on untouched; a trained head is its cache folder, named as the loop names it;
    an untrained one says how to train it."""
    from specbench.models.eagle3_heads import vllm_checkpoint

    hub = OmegaConf.create({"source": "hub", "path": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"})
    assert vllm_checkpoint(hub, "m", "target", None, "eagle3") == (hub.path, f"eagle3:{hub.path}")
    with pytest.raises(ModelUnavailable, match="python -m specbench.train eagle3_1 model=m"):
        vllm_checkpoint(OmegaConf.create({"source": "trained"}), "m", "target", None, "eagle3_1")
