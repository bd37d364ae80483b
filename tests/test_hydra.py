"""Hydra: the authors' checkpoint layout, the heads' forward by hand, path-dependent trees, greedy == AR, training."""

import copy
import json

import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaModel

from specbench.drafters.hydra import Hydra
from specbench.errors import ConfigError, ModelUnavailable
from specbench.models.hydra_heads import HydraHeads, load_hydra, published_hydra
from tests.test_anpd_pld import decode, repetitive_prompt
from tests.test_loop import ar_greedy

AUTHORS_KEYS_PREFIX_MLP = {  # what the authors' HydraPrefixMLP state dict holds for 2 heads of 3 blocks (H = 64)
    *(f"hydra_mlp.{i}.1.{part}" for i in range(2) for part in ("linear.weight", "linear.bias")),
    *(f"hydra_mlp.{i}.1.res_connection.{p}" for i in range(2) for p in ("weight", "bias")),
    *(f"hydra_mlp.{i}.{j}.linear.{p}" for i in range(2) for j in (3, 5) for p in ("weight", "bias")),
    *(f"hydra_lm_head.{i}.1.{p}" for i in range(2) for p in ("weight", "bias")),
    "prefix_embeding_layer.norm.weight",
    *(
        f"prefix_embeding_layer.layers.0.{name}.weight"
        for name in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "input_layernorm",
            "post_attention_layernorm",
        )
    ),
}


def random_heads(tiny, arch: str, num_heads: int = 2, num_layers: int = 3, seed: int = 0) -> HydraHeads:
    """Target-shaped heads with every parameter random (zero-initialised blocks would hide mistakes)."""
    heads = HydraHeads(tiny.config, num_heads, num_layers, arch)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in heads.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) / 8)
    return heads.eval()


def write_authors_checkpoint(heads: HydraHeads, folder, extra: dict | None = None) -> None:
    """The heads as the authors publish them: config.json and a torch pickle hydra_lm_head.pt."""
    folder.mkdir(parents=True, exist_ok=True)
    state = dict(heads.checkpoint_state())
    if heads.arch == "prefix-mlp":
        state["prefix_embeding_layer.embed_tokens.weight"] = torch.zeros(heads.vocab_size, heads.hidden_size)
    torch.save(state, folder / "hydra_lm_head.pt")
    config = {
        "hydra_num_heads": heads.num_heads,
        "hydra_num_layers": heads.num_layers,
        "hydra_head_arch": heads.arch,
        "grounded_heads": True,
        "base_model_name_or_path": "tiny",
        **(extra or {}),
    }
    (folder / "config.json").write_text(json.dumps(config))


def block_by_hand(state: dict, prefix: str, x: torch.Tensor, widening: bool) -> torch.Tensor:
    """res(x) + SiLU(W x + b) from the tensors under ``prefix``."""
    res = x @ state[f"{prefix}.res_connection.weight"].T + state[f"{prefix}.res_connection.bias"] if widening else x
    return res + torch.nn.functional.silu(x @ state[f"{prefix}.linear.weight"].T + state[f"{prefix}.linear.bias"])


def head_by_hand(state: dict, head: int, num_layers: int, x: torch.Tensor) -> torch.Tensor:
    """Head ``head`` of a prefix-mlp checkpoint written out from its tensors: blocks at 1, 3, 5, ..., LM head at 1."""
    x = block_by_hand(state, f"hydra_mlp.{head}.1", x, widening=True)
    for block in range(1, num_layers):
        x = block_by_hand(state, f"hydra_mlp.{head}.{2 * block + 1}", x, widening=False)
    return x @ state[f"hydra_lm_head.{head}.1.weight"].T + state[f"hydra_lm_head.{head}.1.bias"]


def one_layer(config):
    """The authors' prefix layer: a LlamaModel with one decoder layer in the target's shape."""
    one = copy.deepcopy(config)
    one.num_hidden_layers = 1
    return one


def test_the_authors_layout_loads_strictly_and_computes_the_forward_written_out_by_hand(tiny, tmp_path):
    heads = random_heads(tiny, "prefix-mlp")
    write_authors_checkpoint(heads, tmp_path / "ckpt")
    state = torch.load(tmp_path / "ckpt" / "hydra_lm_head.pt")
    assert set(state) == AUTHORS_KEYS_PREFIX_MLP | {"prefix_embeding_layer.embed_tokens.weight"}
    assert torch.equal(state["hydra_mlp.0.3.linear.weight"], state["hydra_mlp.0.5.linear.weight"])  # one block twice
    loaded = published_hydra(str(tmp_path / "ckpt"), None, tiny).heads
    hidden = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(5)[None]
    with torch.no_grad():
        prefix = loaded.prefix(hidden, positions)  # [1, 5, H]
        authors = LlamaModel(one_layer(tiny.config)).eval()
        authors.load_state_dict(
            {k.removeprefix("prefix_embeding_layer."): v for k, v in state.items() if k.startswith("prefix_")}
        )
        expected_prefix = authors(inputs_embeds=hidden, position_ids=positions).last_hidden_state
        torch.testing.assert_close(prefix, expected_prefix, rtol=1e-5, atol=1e-5)
        embeds = torch.randn(2, 64, generator=torch.Generator().manual_seed(2))
        inputs = torch.cat([prefix[0, -1], embeds[0], embeds[1]])  # head 1: base state and two token embeddings
        torch.testing.assert_close(loaded.head_logits(1, inputs), head_by_hand(state, 1, 3, inputs))


def test_the_mlp_layout_has_no_dropout_offsets_and_no_prefix_layer(tiny, tmp_path):
    heads = random_heads(tiny, "mlp", num_layers=2)
    assert {key.split(".")[2] for key in heads.checkpoint_state() if key.startswith("hydra_mlp.")} == {"0", "1"}
    assert "hydra_lm_head.0.weight" in heads.checkpoint_state() and heads.prefix_embeding_layer is None
    write_authors_checkpoint(heads, tmp_path / "mlp")
    loaded = published_hydra(str(tmp_path / "mlp"), None, tiny).heads
    x = torch.randn(3 * 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded.head_logits(1, x), heads.head_logits(1, x))


def test_checkpoints_that_do_not_fit_are_refused_with_the_reason(tiny, tmp_path):
    write_authors_checkpoint(random_heads(tiny, "mlp"), tmp_path / "ungrounded", {"grounded_heads": False})
    with pytest.raises(ConfigError, match="ungrounded.*method=medusa"):
        published_hydra(str(tmp_path / "ungrounded"), None, tiny)
    from tests.conftest import tiny_model

    wide = tiny_model(hidden_size=32, intermediate_size=64)
    write_authors_checkpoint(random_heads(wide, "prefix-mlp"), tmp_path / "wide")
    with pytest.raises(ConfigError, match="do not fit this target"):
        published_hydra(str(tmp_path / "wide"), None, tiny)
    with pytest.raises(ConfigError, match="holds no Hydra heads"):
        published_hydra(str(tmp_path), None, tiny)
    with pytest.raises(ModelUnavailable, match="python -m specbench.train hydra model=tiny_x"):
        load_hydra(OmegaConf.create({"source": "trained"}), tiny, "tiny_x")


def test_published_heads_offline_fail_fast_naming_the_id_and_the_setting(tiny, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from specbench.models import medusa_heads

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(medusa_heads, "hub_reachable", lambda: False)
    with pytest.raises(ModelUnavailable) as caught:
        load_hydra(OmegaConf.create({"source": "hub", "path": "ankner/hydra-vicuna-7b-v1.3"}), tiny, "vicuna_7b")
    message = str(caught.value)
    assert "huggingface-cli download ankner/hydra-vicuna-7b-v1.3" in message and "model.hydra.path=DIR" in message


def hydra_drafter(tiny, arch: str = "prefix-mlp") -> Hydra:
    node = {"source": "random", "num_heads": 3, "num_layers": 2, "arch": arch, "seed": 3, "tree": "mc_sim_7b_63"}
    drafter = Hydra(heads=OmegaConf.create(node), target_name="tiny", tree={"kind": "sparse", "node_budget": 24})
    drafter.setup(tiny, None)
    return drafter


def recorded_trees(drafter: Hydra) -> list:
    """The trees ``drafter`` proposes from now on, in order."""
    trees: list = []
    propose = drafter.propose
    drafter.propose = lambda ctx: trees.append(propose(ctx)) or trees[-1]  # type: ignore[method-assign]
    return trees


@pytest.mark.parametrize("arch", ["prefix-mlp", "mlp"])
def test_greedy_hydra_equals_ar_on_tiny(tiny, arch):
    for seed in range(2):
        prompt = repetitive_prompt(seed)
        drafter = hydra_drafter(tiny, arch)
        trees = recorded_trees(drafter)
        gen = decode(tiny, drafter, prompt, 30)
        assert gen.output_ids == ar_greedy(tiny, prompt, 30).output_ids
        assert len(trees[0]) == 25  # the prompt's states let the first step draft the whole tree
        if arch == "prefix-mlp":  # the prefix cache holds every committed position but the last root
            assert drafter.cache is not None
            assert drafter.cache.get_seq_length() == len(prompt) + len(gen.output_ids) - 1


def test_siblings_subtrees_come_from_their_own_paths(tiny):
    drafter = hydra_drafter(tiny)
    prompt = repetitive_prompt(1)
    trees = recorded_trees(drafter)
    decode(tiny, drafter, prompt, 2)
    tree = trees[0]
    depth_one = [i for i, parent in enumerate(tree.parents) if parent == 0]
    first_children = [[tree.tokens[c] for c, p in enumerate(tree.parents) if p == node] for node in depth_one]
    assert len({tuple(children) for children in first_children if children}) > 1  # grounded: not Medusa's copies


@pytest.mark.slow
def test_greedy_hydra_equals_ar_on_the_embedded_model(embedded, shared_data, tmp_path):
    """The embedded model with random Hydra++ heads, and with trained ones: the cached heads, or a stand-in trained
    here in seconds (the accepted tokens per step show the heads were read)."""
    from specbench.models.parts import part_kind
    from specbench.train import hydra as hydra_train
    from tests.helpers import embedded_head

    model, tok = embedded.model, embedded.tokenizer
    trained, cached = embedded_head(
        part_kind("hydra").folder("smollm2_135m"),
        hydra_train.main,
        tmp_path / "heads",
        shared_data,
        ["train.max_steps=20"],
    )
    random_heads = OmegaConf.create({"source": "random", "num_heads": 3, "num_layers": 1, "arch": "prefix-mlp"})
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that returns the factorial of n."}],
        add_generation_prompt=True,
        tokenize=True,
    )["input_ids"]
    truth = ar_greedy(model, prompt, 40, embedded.eos_ids).output_ids
    for node, tree in ((random_heads, "mc_sim_7b_63"), (trained, None)):
        heads = OmegaConf.merge(node, {"tree": tree}) if tree else node
        drafter = Hydra(heads=heads, target_name="smollm2_135m", tree={"kind": "sparse", "node_budget": 16})
        drafter.setup(model, tok)
        gen = decode(model, drafter, prompt, 40, eos_ids=embedded.eos_ids)
        assert gen.output_ids == truth
    if cached:  # the heads `train hydra` caches draft tokens the target accepts
        assert len(gen.output_ids) / len(gen.accept_lengths) > 1.5


def run_sampled_hydra() -> tuple[float, int, float]:
    """T = 0.5 end to end on a 2-token target with random heads and a dense tree: chi-square of 4-token outputs."""
    from specbench.conformance import chi_square
    from specbench.core.acceptance import Sampling
    from specbench.core.loop import Decoder
    from specbench.core.rules import acceptance_rule
    from tests.conftest import tiny_model
    from tests.helpers import exact_joint, sampled_outputs

    target = tiny_model(vocab_size=2, seed=5, hidden_size=16, num_hidden_layers=1, intermediate_size=32)
    with torch.no_grad():
        target.lm_head.weight.mul_(8)  # peaked, so 1200 draws separate a right law from a wrong one
    sampling, prompt = Sampling(temperature=0.5), [0, 1, 1]
    node = {"source": "random", "num_heads": 2, "num_layers": 1, "arch": "prefix-mlp", "seed": 2}
    drafter = Hydra(heads=OmegaConf.create(node), target_name="tiny", tree={"kind": "dense", "sizes": [2, 1]})
    drafter.setup(target, None)
    decoder = Decoder(target, drafter, frozenset(), sampling, acceptance_rule("match"))
    counts = sampled_outputs(decoder, prompt, 4, torch.Generator().manual_seed(0), trials=1200)
    return chi_square(counts, exact_joint(target, prompt, 4, sampling))


def test_sampled_outputs_follow_the_target():
    """Hydra's trees are deterministic, so sample-and-match is exact at T > 0: outputs follow the target's law."""
    stat, dof, p_value = run_sampled_hydra()
    assert p_value > 1e-3, (stat, dof)


def test_a_pick_biased_toward_the_mode_fails_the_same_test(monkeypatch):
    """Negative control at the same size: a match walk whose pick is the target's argmax half the time."""
    from specbench.core import acceptance

    draw = acceptance.draw
    coin = torch.Generator().manual_seed(1)

    def biased(logits, sampling, generator):
        return int(logits.argmax()) if torch.rand(1, generator=coin) < 0.5 else draw(logits, sampling, generator)

    monkeypatch.setattr(acceptance, "draw", biased)
    stat, dof, p_value = run_sampled_hydra()
    assert p_value < 1e-3, (stat, dof)


def test_train_hydra_end_to_end_tiny(training_cache, shared_data):
    """`train hydra` on tiny_llama: saves heads in the authors' layout + accuracies, a rerun is a no-op, and the
    trained heads (their sparse tree from the saved table) decode exactly."""
    from specbench.config import compose_config
    from specbench.models.loading import load_model
    from specbench.train import hydra as hydra_train

    args = [
        "model=tiny_llama",
        f"data_dir={shared_data}",
        "prompts.max_prompts=5",
        "prompts.max_new_tokens=10",
        "heads.num_heads=3",
        "heads.num_layers=2",
        "train.max_steps=2",
        "train.batch_size=2",
        "train.eval_sequences=2",
        "progress=false",
    ]
    folder = hydra_train.main(args)
    record = json.loads((folder / "training.json").read_text())
    assert record["result"]["steps"] == 2 and len(record["accuracy"]["top1"]) == 3
    assert len(record["rank_accuracy"]) == 3 and record["accuracy"]["positions"][0] > 0
    weights = folder / "hydra_lm_head.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert hydra_train.main(args) == folder and weights.stat().st_mtime_ns == stamp  # cached: no-op
    lm = load_model(compose_config("model=tiny_llama").model, torch.device("cpu"), torch.float32)
    drafter = Hydra(heads=OmegaConf.create({"source": "trained"}), target_name="tiny_llama", tree={"node_budget": 8})
    drafter.setup(lm.model, lm.tokenizer)
    assert drafter.stats()["tree"] == "sparse" and drafter.artefacts()[0].startswith("hydra:")
    prompt = [1, 2, 3, 4]
    assert decode(lm.model, drafter, prompt, 12).output_ids == ar_greedy(lm.model, prompt, 12).output_ids
