"""Model loading: embedded and tiny models offline; Hub models fail fast with advice when offline."""

import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from specbench.config import compose_config as compose_run
from specbench.config import group_options as options
from specbench.environment import CUDNN_ATTENTION_ENV, capture, cudnn_attention
from specbench.errors import ConfigError, ModelUnavailable
from specbench.models.loading import choose_attention_kernels, load_model, resolve_device, resolve_dtype

PAPER_MODELS = [
    m
    for m in options("model")
    if compose_run(f"model={m}").model.source == "hub"
    and not OmegaConf.is_missing(compose_run(f"model={m}").model, "path")
    and compose_run(f"model={m}").model.path  # alpaca_7b: no published checkpoint (next test)
]


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """Simulate an offline machine whose HF cache is empty (a refused local endpoint)."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def test_paper_model_configs_exist():
    expected = {
        "llama_7b",
        "llama2_7b",
        "llama2_13b",
        "llama2_7b_chat",
        "llama2_13b_chat",
        "codellama_7b",
        "codellama_13b",
        "vicuna_7b",
        "vicuna_13b",
        "vicuna_33b",
    }
    assert expected <= set(PAPER_MODELS)


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_paper_models_fail_fast_offline_with_advice(no_hub, name):
    cfg = compose_run(f"model={name}").model
    start = time.time()
    with pytest.raises(ModelUnavailable) as info:
        load_model(cfg, torch.device("cpu"), torch.float32)
    assert time.time() - start < 10
    assert cfg.path in str(info.value) and "model.path=" in str(info.value)


def test_a_model_without_a_published_checkpoint_says_how_to_get_it():
    """alpaca_7b names no checkpoint (only a weight diff was released): loading it says how to recover it."""
    cfg = compose_run("model=alpaca_7b").model
    with pytest.raises(ModelUnavailable, match=r"weight_diff\.py recover.*model\.path=") as info:
        load_model(cfg, torch.device("cpu"), torch.float32)
    assert "alpaca_7b" in str(info.value)
    given = compose_run("model=alpaca_7b", "model.path=/no/such/folder").model
    with pytest.raises((ModelUnavailable, OSError)) as info:  # the given folder is tried, not refused
        load_model(given, torch.device("cpu"), torch.float32)
    assert "names no checkpoint" not in str(info.value)


def test_generic_hub_model_needs_a_path(tmp_path):
    from specbench.runner import validate

    with pytest.raises(ConfigError, match="model.path must be set"):
        validate(compose_run("model=hub"))
    assert compose_run("model=hub", "model.path=org/some-model").model.path == "org/some-model"


def test_local_path_is_used_directly(tmp_path):
    from transformers import AutoTokenizer

    from specbench.models.embedded import embedded_checkpoint
    from specbench.models.loading import build_tiny_llama

    build_tiny_llama(
        vocab_size=49152,
        seed=3,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    ).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(embedded_checkpoint()).save_pretrained(tmp_path)
    cfg = OmegaConf.create({"name": "local", "source": "hub", "path": str(tmp_path), "attn_implementation": "sdpa"})
    lm = load_model(cfg, torch.device("cpu"), torch.float32)
    assert lm.path == str(tmp_path) and lm.model.config.num_hidden_layers == 1


def test_embedded_checkpoint_converts_a_given_gguf(tmp_path, monkeypatch):
    """A GGUF outside the wheel (the GPU check's, rebuilt from parts) is what gets converted, once, into the cache."""
    from specbench.models import embedded

    converted: list[Path] = []

    def fake_dequantize(source: Path, out_dir: Path) -> None:
        converted.append(source)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "_dequantize", fake_dequantize)
    given = tmp_path / "parts" / embedded.GGUF_FILE
    target = embedded.embedded_checkpoint(given)
    assert converted == [given] and target == tmp_path / "cache" / "smollm2-135m-instruct"
    assert embedded.embedded_checkpoint(given) == target and len(converted) == 1  # cached: not converted again


def test_tiny_model_uses_embedded_tokenizer():
    lm = load_model(compose_run("model=tiny_llama").model, torch.device("cpu"), torch.float32)
    assert lm.model.config.vocab_size == len(lm.tokenizer) and lm.eos_ids == frozenset({2})


@pytest.mark.slow
def test_embedded_model_facts(embedded):
    assert embedded.model.config.num_hidden_layers == 30 and embedded.model.config.hidden_size == 576
    assert embedded.model.config.vocab_size == 49152 and embedded.tokenizer.chat_template


def test_device_and_dtype_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ConfigError):
        resolve_dtype("float8", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device=cpu"):
            resolve_device("cuda")


@pytest.mark.parametrize("setting, expected", [(None, False), ("1", True), ("0", False)])
def test_cuda_attention_leaves_out_cudnn_unless_asked(monkeypatch, setting, expected):
    """On CUDA, SDPA's cuDNN backend (a graph build per new shape) is off unless SPECBENCH_CUDNN_ATTENTION=1,
    and the run's environment records the choice; on the CPU nothing changes."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    if setting is None:
        monkeypatch.delenv(CUDNN_ATTENTION_ENV, raising=False)
    else:
        monkeypatch.setenv(CUDNN_ATTENTION_ENV, setting)
    try:
        torch.backends.cuda.enable_cudnn_sdp(not expected)
        choose_attention_kernels(torch.device("cpu"))
        assert torch.backends.cuda.cudnn_sdp_enabled() is (not expected)
        assert capture(torch.device("cpu"), torch.float32)["cudnn_attention"] is None
        choose_attention_kernels(torch.device("cuda"))
        assert torch.backends.cuda.cudnn_sdp_enabled() is expected
        assert cudnn_attention(torch.device("cuda")) is expected  # what capture() records on CUDA
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
