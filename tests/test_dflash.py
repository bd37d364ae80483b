"""DFlash: one drafter forward per step, greedy == AR (tiny random drafter; embedded model with a trained stand-in),
the sampling law at T > 0, the authors' layout (saved, loaded strictly), the trainer's blocks, and the trainer."""

from __future__ import annotations

import json
import random

import pytest
import torch
from omegaconf import OmegaConf

from specbench.core.acceptance import Sampling
from specbench.drafters.dflash import DFlash
from specbench.errors import ConfigError, ModelUnavailable
from specbench.models.dflash import (
    DFlashDraft,
    config_json,
    default_target_layers,
    draft_from_checkpoint,
    load_dflash,
    random_draft,
)
from specbench.train.dflash import block_inputs, block_labels
from specbench.train.eagle import Sequence
from tests.conftest import tiny_model
from tests.helpers import embedded_head, exact_joint, pearson_statistic, sampled_outputs
from tests.test_eagle import decode
from tests.test_loop import ar_greedy


def random_node(seed: int = 0, block_size: int = 4, **extra) -> dict:
    return {"source": "random", "seed": seed, "layers": [0, 1], "block_size": block_size, "mask_token": 0, **extra}


def drafter_for(model, block_size: int | None = None, **node) -> DFlash:
    drafter = DFlash(block_size=block_size, draft=OmegaConf.create(random_node(**node)))
    drafter.setup(model, None)
    return drafter


class CountingDraft(torch.nn.Module):
    """Wraps a drafter model and counts its forwards."""

    def __init__(self, draft: DFlashDraft):
        super().__init__()
        self.inner, self.calls = draft, 0

    def __getattr__(self, name):
        if name in ("inner", "calls"):
            return super().__getattr__(name)
        return getattr(self.inner, name)

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


# ----------------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("block_size", [2, 5, 9])
def test_greedy_equals_ar_tiny(block_size):
    tiny = tiny_model()
    drafter = drafter_for(tiny, block_size, seed=1)
    assert drafter.hidden_layers == (1, 2)  # layers 0 and 1's outputs: hidden-states indices 1, 2
    rng = random.Random(block_size)
    for _ in range(3):
        prompt = [rng.randrange(97) for _ in range(rng.randrange(2, 20))]
        assert decode(tiny, drafter, prompt, 40).output_ids == ar_greedy(tiny, prompt, 40).output_ids
    stats = drafter.stats()
    assert stats["steps"] > 0 and stats["drafted_per_step"] > 0 and stats["drafter"] == "random(seed=1)"


def test_one_drafter_forward_per_step_drafts_the_whole_block():
    tiny = tiny_model()
    drafter = drafter_for(tiny, 6)
    counting = CountingDraft(drafter.draft)
    drafter.loaded = counting  # type: ignore[assignment]
    prompt = [3, 1, 4, 1, 5]
    gen = decode(tiny, drafter, prompt, 30)
    assert gen.output_ids == ar_greedy(tiny, prompt, 30).output_ids
    steps = len(gen.accept_lengths)
    drafting_steps = sum(1 for drafted in gen.draft_tokens if drafted > 0)
    assert counting.calls == drafting_steps == drafter.stats()["draft_forwards"]
    assert max(gen.draft_tokens) == 5 and steps >= drafting_steps  # B - 1 drafts from one forward
    # every committed position's context row was fed exactly once
    assert drafter.stats()["context_rows"] == drafter.committed


def test_context_keys_equal_one_pass_over_the_committed_rows():
    """The incremental cache (prompt, then each step's accepted rows) gives the block the same logits as feeding every
    committed row's features at once: the features and positions line up."""
    tiny = tiny_model()
    drafter = drafter_for(tiny, 4, seed=3)
    prompt = [7, 2, 9, 4]
    gen = decode(tiny, drafter, prompt, 12)
    sequence = prompt + gen.output_ids
    with torch.no_grad():
        states = tiny(torch.tensor([sequence]), output_hidden_states=True).hidden_states
        features = torch.cat([states[i][0] for i in drafter.hidden_layers], dim=-1)  # [T, F]
        c = drafter.committed
        draft = drafter.draft
        block = torch.tensor([[sequence[c]] + [0] * 3])
        one_pass, _ = draft(features[None, :c], torch.arange(c)[None], block, torch.arange(c, c + 4)[None])
        cached, _ = draft(
            features[None, c:c], torch.arange(c, c)[None], block, torch.arange(c, c + 4)[None], None, drafter.past
        )
    torch.testing.assert_close(cached, one_pass, atol=1e-5, rtol=1e-5)


def test_sampling_law_is_the_targets():
    """At T > 0 the drafts are sampled from the warped rows recorded in draft_probs: the output law is the target's."""
    from specbench.core.loop import Decoder
    from specbench.core.rules import acceptance_rule

    model = tiny_model(vocab_size=5)
    sampling = Sampling(temperature=0.9, top_p=1.0)
    drafter = drafter_for(model, 3, seed=2)
    prompt, length = [1, 2, 3], 3  # the first token is the prefill's: steps 1 and 2 draft
    expected = exact_joint(model, prompt, length, sampling)
    decoder = Decoder(model, drafter, frozenset(), sampling, acceptance_rule("speculative"))
    counts = sampled_outputs(decoder, prompt, length, torch.Generator().manual_seed(0), 1200)
    statistic = pearson_statistic(counts, expected)
    assert statistic < 124 + 5 * (2 * 124) ** 0.5  # 5^3 cells: chi-square with 124 degrees of freedom, 5 sigma
    assert drafter.stats()["drafted"] > 0


# ----------------------------------------------------------------------------------- the authors' layout


def test_saved_layout_is_the_authors_and_loads_strictly(tmp_path):
    from safetensors.torch import save_file

    tiny = tiny_model()
    draft = random_draft(tiny, OmegaConf.create(random_node(seed=4, num_layers=2)))
    config = config_json(draft, "tiny", 2)
    assert config["architectures"] == ["DFlashDraftModel"] and config["dflash_config"] == {
        "mask_token_id": 0,
        "target_layer_ids": [0, 1],
    }
    state = draft.checkpoint_state()
    assert "embed_tokens.weight" not in state and not any(key.startswith("lm_head") for key in state)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.k_norm.weight"} <= set(state)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_dflash(OmegaConf.create({"source": "hub", "path": str(tmp_path)}), tiny, "tiny")
    block = torch.tensor([[5, 0, 0, 0]])
    features = torch.randn(1, 3, 128)
    with torch.no_grad():
        a, _ = draft(features, torch.arange(3)[None], block, torch.arange(3, 7)[None])
        b, _ = loaded.draft(features, torch.arange(3)[None], block, torch.arange(3, 7)[None])
    torch.testing.assert_close(a, b)
    with pytest.raises(ConfigError, match="missing keys"):
        draft_from_checkpoint(config, {k: v for k, v in state.items() if k != "fc.weight"}, tiny, "x")
    with pytest.raises(ConfigError, match="unexpected keys"):
        draft_from_checkpoint(config, {**state, "mask_hidden": torch.zeros(64)}, tiny, "x")
    with pytest.raises(ConfigError, match="not a DFlash drafter"):
        draft_from_checkpoint({**config, "dflash_config": {}}, state, tiny, "x")
    with pytest.raises(ConfigError, match="sliding-window"):
        draft_from_checkpoint({**config, "layer_types": ["sliding_attention"] * 2}, state, tiny, "x")


def test_hub_drafter_offline_names_the_id(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr("specbench.models.medusa_heads.hub_reachable", lambda: False)
    node = OmegaConf.create({"source": "hub", "path": "z-lab/Qwen3-8B-DFlash-b16"})
    with pytest.raises(ModelUnavailable, match="z-lab/Qwen3-8B-DFlash-b16"):
        load_dflash(node, tiny_model(), "tiny")


def test_target_layers_follow_the_authors_rule():
    assert default_target_layers(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B's 36 layers, a 5-layer drafter
    assert default_target_layers(30, 1) == [15]
    with pytest.raises(ConfigError, match="model.dflash.layers"):
        default_target_layers(2, 2)


# ----------------------------------------------------------------------------------- training


def test_training_blocks_see_the_context_before_their_anchor_and_their_own_block():
    ids = torch.arange(10, 20)  # T = 10
    item = Sequence(ids, torch.zeros(10, 4), 4, torch.zeros(6, 2, dtype=torch.long), torch.zeros(6, 2))
    anchors = torch.tensor([4, 8])
    block, positions, mask = block_inputs(item, anchors, 3, 99)
    assert block.tolist() == [[14, 99, 99, 18, 99, 99]] and positions.tolist() == [[4, 5, 6, 8, 9, 10]]
    mask = mask[0, 0]
    assert mask[0, :10].tolist() == [True] * 4 + [False] * 6  # anchor 4's rows: context 0..3
    assert mask[3, :10].tolist() == [True] * 8 + [False] * 2
    assert mask[1, 10:].tolist() == [True, True, True, False, False, False]  # its own block only
    index, valid = block_labels(item, anchors, 3)
    assert valid.tolist() == [False, True, True, False, True, False]  # row 0 is the anchor; 8 + 2 is past T - 1
    assert index[valid].tolist() == [1, 2, 5]  # laws at positions 4, 5 and 8 (P - 1 = 3 is index 0)


@pytest.mark.slow
def test_train_dflash_end_to_end_tiny(training_cache, shared_data):
    """`train dflash` on tiny_llama: saves the authors' layout + per-row accuracy, reruns as a no-op, decodes."""
    from specbench.config import compose_config
    from specbench.models.loading import load_model
    from specbench.train import dflash as dflash_train

    args = [
        "model=tiny_llama",
        f"data_dir={shared_data}",
        "prompts.max_prompts=5",
        "prompts.max_new_tokens=10",
        "train.max_steps=2",
        "train.batch_size=2",
        "train.anchors=3",
        "train.eval_sequences=2",
        "head.num_layers=1",
        "head.block_size=4",
        "head.mask_token=0",
        "progress=false",
    ]
    folder = dflash_train.main(args)
    record = json.loads((folder / "training.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    assert record["result"]["steps"] == 2 and len(record["accuracy"]["top1"]) == 3
    assert config["block_size"] == 4 and config["dflash_config"]["target_layer_ids"] == [0, 1]
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert dflash_train.main(args) == folder and weights.stat().st_mtime_ns == stamp  # cached: no-op
    lm = load_model(compose_config("model=tiny_llama").model, torch.device("cpu"), torch.float32)
    drafter = DFlash(draft=OmegaConf.create({"source": "trained"}), target_name="tiny_llama")
    drafter.setup(lm.model, lm.tokenizer)
    assert drafter.block_size == 4 and drafter.stats()["trained_top1_by_position"] == record["accuracy"]["top1"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert drafter.artefacts() == [f"dflash:{manifest['weights_digest']}"]
    prompt = [1, 2, 3, 4]
    assert decode(lm.model, drafter, prompt, 12).output_ids == ar_greedy(lm.model, prompt, 12).output_ids


@pytest.mark.slow
def test_greedy_equals_ar_embedded(embedded, shared_data, tmp_path):
    """The embedded model (30 layers) with a random drafter and with a trained one: the cached drafter, or a stand-in
    trained here in a few steps."""
    from specbench.models.parts import part_kind
    from specbench.train import dflash as dflash_train

    model, tok = embedded.model, embedded.tokenizer
    settings = ["train.max_steps=6", "train.anchors=4", "head.num_layers=1", "head.block_size=8"]
    folder = part_kind("dflash").folder("smollm2_135m")
    node, _ = embedded_head(folder, dflash_train.main, tmp_path / "drafter", shared_data, settings)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that returns the factorial of n."}],
        add_generation_prompt=True,
        tokenize=True,
    )["input_ids"]
    truth = ar_greedy(model, prompt, 32, embedded.eos_ids).output_ids
    random_node_ = OmegaConf.create({"source": "random", "seed": 0, "num_layers": 1, "mask_token": 0})
    for drafter_node in (random_node_, node):
        drafter = DFlash(block_size=8, draft=drafter_node, target_name="smollm2_135m")
        drafter.setup(model, tok)
        assert decode(model, drafter, prompt, 32, eos=embedded.eos_ids).output_ids == truth
        assert drafter.stats()["draft_forwards"] >= 1


def test_a_random_drafter_is_written_once_for_vllm_as_the_loop_draws_it(embedded, training_cache):
    """engine=vllm with a random drafter: the folder vLLM loads holds the drafter the shared loop draws from the same
    node (the authors' layout, read back strictly), named as a random part; a second call reuses the folder; a
    published one goes as it is."""
    from pathlib import Path

    from specbench.models.dflash import published_draft, vllm_checkpoint
    from specbench.models.embedded import embedded_checkpoint

    node = OmegaConf.create({"source": "random", "seed": 2, "block_size": 6, "mask_token": 5})
    folder, part = vllm_checkpoint(node, "smollm2_135m", str(embedded_checkpoint()), None)
    assert folder.startswith(str(training_cache / "vllm" / "dflash")) and part == "dflash:random(seed=2)"
    config = json.loads((Path(folder) / "config.json").read_text())
    assert config["block_size"] == 6 and config["dflash_config"]["mask_token_id"] == 5
    loop = load_dflash(node, embedded.model, "smollm2_135m").draft
    written, _ = published_draft(folder, None, embedded.model)
    assert written.target_layer_ids == loop.target_layer_ids
    for key, value in loop.checkpoint_state().items():
        torch.testing.assert_close(written.checkpoint_state()[key], value)
    stamp = Path(folder, "model.safetensors").stat().st_mtime_ns
    assert vllm_checkpoint(node, "smollm2_135m", str(embedded_checkpoint()), None) == (folder, part)
    assert Path(folder, "model.safetensors").stat().st_mtime_ns == stamp
    hub = OmegaConf.create({"source": "hub", "path": "z-lab/some-drafter"})
    assert vllm_checkpoint(hub, "smollm2_135m", "target", None) == (hub.path, f"dflash:{hub.path}")
