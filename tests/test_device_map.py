"""Multi-device targets (model.device_map), the 7B-shaped random model, the GPU suite and its script."""

from __future__ import annotations

import subprocess

import pytest
import torch

from specbench import bench
from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.drafters.ar import NoDraft
from specbench.errors import ConfigError
from specbench.models.loading import DEVICE_MAP_MODES, build_tiny_llama, load_model
from tests.conftest import ROOT
from tests.helpers import method_options
from tests.test_loop import RandomTreeDrafter

CPU = torch.device("cpu")


def load_tiny(*overrides: str):
    """The tiny_llama target on the CPU in float32, with model overrides."""
    return load_model(compose_config("model=tiny_llama", *overrides).model, CPU, torch.float32)


def greedy(model, prompt: list[int], drafter=None) -> list[int]:
    """Greedy output of the shared decode loop (AR unless a drafter is given)."""
    with torch.inference_mode():
        return Decoder(model, drafter or NoDraft(), frozenset(), Sampling()).generate(prompt, 24).output_ids


@pytest.fixture(scope="module")
def plain():
    return load_tiny()


@pytest.mark.parametrize("device_map", ["{model:cpu,lm_head:cpu}", "auto"])
def test_dispatched_tiny_target_decodes_like_the_plain_one(plain, device_map):
    """A per-module dict or a named plan dispatches with accelerate; AR and tree decoding are unchanged."""
    lm = load_tiny(f"model.device_map={device_map}")
    assert lm.device_map == lm.model.hf_device_map and set(lm.device_map.values()) == {"cpu"}
    assert plain.device_map is None
    prompt = [5, 17, 300, 4000, 9]
    truth = greedy(plain.model, prompt)
    assert greedy(lm.model, prompt) == truth
    assert greedy(lm.model, prompt, RandomTreeDrafter(truth, 49152, seed=0)) == truth


@pytest.mark.slow
def test_pretrained_target_is_placed_by_from_pretrained():
    """The embedded (from_pretrained) path hands the map to transformers; a one-device map reads {"": device}."""
    cfg = compose_config("model=smollm2_135m", "model.device_map={model:cpu,lm_head:cpu}").model
    lm = load_model(cfg, CPU, torch.float32)
    assert lm.device_map == {"": "cpu"} and lm.model.dtype == torch.float32


def test_bad_device_map_names_the_valid_ones():
    """An unknown plan name or a dict that leaves modules without a device is a ConfigError, not a crash."""
    with pytest.raises(ConfigError, match=", ".join(DEVICE_MAP_MODES)):
        load_tiny("model.device_map=everywhere")
    with pytest.raises(ConfigError, match="cannot be applied"):
        load_tiny("model.device_map={lm_head:cpu}")


def test_tiny_builder_allocates_in_place_and_repeats_its_seed():
    """The requested dtype comes straight from the builder; one seed gives the same weights twice."""
    arch = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    first, second = (build_tiny_llama(50, seed=3, dtype=torch.float16, **arch) for _ in range(2))
    assert {p.dtype for p in first.parameters()} == {torch.float16}
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))


def test_llama2_7b_random_has_llama2_7b_shape():
    """Built on the meta device (no memory): Llama-2-7B's layers, 6.74B + 0.14B for the 49,152-row vocabulary."""
    model_cfg = compose_config("model=llama2_7b_random").model
    model = build_tiny_llama(49152, device="meta", dtype=torch.float16, **model_cfg.tiny)
    config = model.config
    shape = (
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
        config.max_position_embeddings,
        config.rms_norm_eps,
    )
    assert shape == (4096, 32, 32, 32, 11008, 4096, 1e-5)
    params = sum(p.numel() for p in model.parameters())
    assert params == 6_738_415_616 + 2 * (49152 - 32000) * 4096
    draft = model_cfg.draft.tiny
    assert (draft.hidden_size, draft.num_hidden_layers, draft.num_attention_heads, draft.intermediate_size) == (
        768,
        2,
        12,
        3072,
    )
    assert model_cfg.medusa.source == "random" and model_cfg.medusa.num_heads == 5


def implementation(method_cfg) -> str:
    """What runs a method: its drafter class on the shared loop, else its engine (HF generate)."""
    return method_cfg.drafter._target_ if method_cfg.engine == "loop" else method_cfg.engine


def test_gpu_suite_composes_every_method():
    """conf/bench/all_methods.yaml as gpu_check.sh runs it: every method of conf/method (each drafter class
    and engine at least once), 7B shape, float16 on CUDA, Self-Draft w/o corpus."""
    suite = bench.load_suite("all_methods")
    args = bench.parse_args(["all_methods", "model=llama2_7b_random", "--device", "cuda", "--dtype", "float16"])
    configs = bench.entry_configs(suite, bench.expand_entries(suite), args)
    every = {implementation(compose_config(f"method={name}").method) for name in method_options()}
    assert every - {implementation(cfg.method) for cfg in configs.values()} == set()
    assert all(cfg.method.name == label for label, cfg in configs.items())
    missing = [  # a method reading a model node the 7B stand-in lacks would stop the GPU run at its setup
        f"{label}: drafter.{key}"
        for label, cfg in configs.items()
        for key in ("draft", "head", "heads")
        if key in (cfg.method.get("drafter") or {}) and cfg.method.drafter[key] is None
    ]
    assert missing == []
    first = configs["ar"]
    assert (first.model.name, first.device, first.dtype, first.max_new_tokens) == (
        "llama2_7b_random",
        "cuda",
        "float16",
        128,
    )
    assert configs["self_draft"].method.drafter.use_corpus_cache is False


def test_gpu_check_script_parses():
    """scripts/gpu_check.sh is valid bash (it only runs on a GPU machine)."""
    result = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
