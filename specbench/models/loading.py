"""Load a target model + tokenizer from a model config: Hub id / local path, embedded, or tiny random."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from omegaconf import OmegaConf

from specbench.environment import cudnn_attention
from specbench.errors import ConfigError, ModelUnavailable
from specbench.hub import hub_reachable
from specbench.models.embedded import embedded_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SOURCES = ("hub", "embedded", "tiny")
DEVICE_MAP_MODES = ("auto", "balanced", "balanced_low_0", "sequential")
"""The named ``device_map`` plans accelerate (and transformers' ``from_pretrained``) accept."""


@dataclass
class LoadedModel:
    """A target model ready for decoding, with what the runner needs to know about it."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str  # config name, e.g. smollm2_135m
    path: str  # Hub id or local directory the weights came from
    eos_ids: frozenset[int]
    context_length: int
    device_map: dict[str, object] | None = None  # module -> device when model.device_map placed it, else None


@dataclass
class TargetFiles:
    """A target known by its files alone: what the runner needs when another engine (vLLM) loads the weights."""

    tokenizer: PreTrainedTokenizerBase
    name: str
    path: str  # Hub id or local directory the engine loads
    eos_ids: frozenset[int]
    context_length: int
    device_map: dict[str, object] | None = None  # the engine places the weights itself


DEVICES = re.compile(r"auto|cpu|cuda(:\d+)?")
"""The values of a ``device`` setting."""


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; anything but auto, cpu, cuda or cuda:N is a ConfigError."""
    if not isinstance(device, str) or not DEVICES.fullmatch(device):
        raise ConfigError(f"device must be auto, cpu, cuda or cuda:N (got {device!r})")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device=cuda was requested but torch sees no CUDA device; use device=cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` -> float16 on GPU (the papers' setting), float32 on CPU (exactness, CPU speed)."""
    names = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if not isinstance(dtype, str) or dtype not in names:
        raise ConfigError(f"dtype must be one of auto, {', '.join(names)}; got {dtype!r}")
    return names[dtype]


def _from_pretrained(loader, path: str, **kwargs):
    """Call ``loader.from_pretrained``: local dir or HF cache first, the Hub only if reachable."""
    if Path(path).is_dir():
        return loader.from_pretrained(path, **kwargs)
    try:
        return loader.from_pretrained(path, local_files_only=True, **kwargs)
    except OSError:
        if not hub_reachable():
            raise ModelUnavailable(
                f"Model '{path}' is not in the local Hugging Face cache and the Hub cannot be reached. "
                f"Download it where you have network (huggingface-cli download {path} --local-dir DIR) "
                f"and run with model.path=DIR, or pre-fill the HF cache (HF_HOME)."
            ) from None
        return loader.from_pretrained(path, **kwargs)


def load_pretrained(
    path: str, dtype: torch.dtype, revision: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """A causal LM and its tokenizer (None if it ships none) from a dir, the HF cache or the Hub (drafts)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _from_pretrained(AutoModelForCausalLM, path, revision=revision, dtype=dtype)
    try:
        tokenizer = _from_pretrained(AutoTokenizer, path, revision=revision)
    except (OSError, ValueError):
        tokenizer = None
    return model.eval(), tokenizer


def build_tiny_llama(
    vocab_size: int, seed: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, **arch
) -> PreTrainedModel:
    """A random Llama built from a config in code, allocated and seeded directly on ``device`` in ``dtype``.

    NOTE: building in place (no fp32 CPU copy first) makes a 7B-shaped model take seconds on a GPU;
    the seeded init is deterministic for a given device and dtype, and matches the former
    build-then-cast for the default cpu/float32.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=False, **arch)
    torch.manual_seed(seed)  # seeds the CPU and every CUDA generator
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None
    return model.eval()


def eos_token_ids(model, tokenizer) -> frozenset[int]:
    """Every token id that ends a generation (generation config and tokenizer)."""
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def checkpoint_path(cfg) -> str:
    """Where a ``conf/model`` node's files live (tiny models borrow the embedded model's tokenizer)."""
    if cfg.source not in SOURCES:
        raise ConfigError(f"model.source must be one of {SOURCES}; got {cfg.source!r}")
    if cfg.source == "hub" and not cfg.path:  # a model with no published checkpoint (model.obtain says how)
        raise ModelUnavailable(
            f"model {cfg.name} names no checkpoint: {cfg.get('obtain') or 'set model.path=<Hub id or folder>'}"
        )
    return str(embedded_checkpoint()) if cfg.source in ("embedded", "tiny") else cfg.path


def load_tokenizer(cfg):
    """The tokenizer of a ``conf/model`` node alone (no weights), with its chat-template override."""
    from transformers import AutoTokenizer

    tokenizer = _from_pretrained(AutoTokenizer, checkpoint_path(cfg), revision=cfg.get("revision"))
    if cfg.get("chat_template"):
        tokenizer.chat_template = cfg.chat_template
    return tokenizer


def device_map_setting(cfg) -> str | dict | None:
    """``model.device_map`` as accelerate takes it: None (one device), a named plan, or a module -> device dict."""
    device_map = cfg.get("device_map")
    if device_map is None or isinstance(device_map, str) and device_map in DEVICE_MAP_MODES:
        return device_map
    if OmegaConf.is_dict(device_map):
        plan = OmegaConf.to_container(device_map)
        assert isinstance(plan, dict)  # a config mapping converts to a dict
        return plan
    raise ConfigError(
        f"model.device_map must be null (load on `device`), one of {', '.join(DEVICE_MAP_MODES)}, "
        f"or a dict module -> device like {{model:0,lm_head:1}}; got {device_map!r}"
    )


def planned_device_map(model: PreTrainedModel, mode: str, dtype: torch.dtype) -> dict:
    """accelerate's module -> device plan for ``mode``, never splitting a decoder layer across devices."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory, get_max_memory

    no_split = model._no_split_modules
    memory = (
        get_max_memory()
        if mode == "sequential"
        else get_balanced_memory(
            model, no_split_module_classes=no_split, dtype=dtype, low_zero=mode == "balanced_low_0"
        )
    )
    return infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split, dtype=dtype)


def dispatch(model: PreTrainedModel, device_map: str | dict, dtype: torch.dtype) -> PreTrainedModel:
    """Spread a built model over devices with accelerate (a named plan is inferred first, a dict used as given)."""
    from accelerate import dispatch_model

    plan = planned_device_map(model, device_map, dtype) if isinstance(device_map, str) else device_map
    try:
        return dispatch_model(model, device_map=plan)
    except ValueError as exc:  # e.g. a dict that leaves some parameters without a device
        raise ConfigError(f"model.device_map {plan!r} cannot be applied: {exc}") from None


def tiny_target(cfg, tokenizer, device: torch.device, dtype: torch.dtype, device_map) -> PreTrainedModel:
    """The tiny random target: built in place on ``device``, or on the CPU and then dispatched."""
    # NOTE: with a device map the model is built on the CPU (the one place every module fits before the
    # plan exists; slower than a GPU build) and dispatch then moves each module to its device
    build_on = device if device_map is None else torch.device("cpu")
    model = build_tiny_llama(len(tokenizer), device=build_on, dtype=dtype, **cfg.tiny)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model if device_map is None else dispatch(model, device_map, dtype)


def pretrained_target(cfg, device: torch.device, dtype: torch.dtype, device_map) -> PreTrainedModel:
    """A Hub / local / embedded target: loaded onto ``device``, or placed by ``from_pretrained(device_map=)``."""
    from transformers import AutoModelForCausalLM

    placed = {} if device_map is None else {"device_map": device_map}
    model = _from_pretrained(
        AutoModelForCausalLM,
        checkpoint_path(cfg),
        revision=cfg.get("revision"),
        dtype=dtype,
        attn_implementation=cfg.get("attn_implementation"),
        **placed,
    )
    return model if device_map is not None else model.to(device=device, dtype=dtype)


def placement(model: PreTrainedModel, device_map) -> dict | None:
    """Where a device map put the model, module -> device (None without one), for what the run reports.

    NOTE: accelerate records ``hf_device_map`` whenever it dispatches, but ``from_pretrained`` only when
    the map spans several devices; a one-device map is reported as ``{"": device}``.
    """
    if device_map is None:
        return None
    return getattr(model, "hf_device_map", None) or {"": str(model.device)}


def choose_attention_kernels(device: torch.device) -> None:
    """On CUDA, take SDPA's cuDNN backend out of PyTorch's choice (unless SPECBENCH_CUDNN_ATTENTION=1; the run's
    environment records which, ``cudnn_attention``).

    NOTE: cuDNN attention builds an execution graph for every new (query, key, mask) shape and caches it; an
    eager decode loop meets a new key length at every step, so a masked forward (every tree or multi-token
    verify, HF's masked prefill) pays the build each step. On an H200 (torch 2.11, cu130) the entries that
    verify with a mask ran 50-60 ms per 7B forward instead of ~20 ms on every prompt after the warm-up's
    (docs/measuring.md); flash and memory-efficient attention have no per-shape build.
    """
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(bool(cudnn_attention(device)))


def load_model(cfg, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Instantiate the model of a ``conf/model/*.yaml`` node on ``device`` (or its device map) in ``dtype``."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor "Loading weights" bars would drown the run's own bar
    choose_attention_kernels(device)
    device_map = device_map_setting(cfg)
    tokenizer = load_tokenizer(cfg)
    if cfg.source == "tiny":
        model = tiny_target(cfg, tokenizer, device, dtype, device_map)
        path = f"tiny-random-llama(seed={cfg.tiny.seed})"
    else:
        model = pretrained_target(cfg, device, dtype, device_map)
        path = checkpoint_path(cfg)
    model.eval()
    context = cfg.get("context_length") or getattr(model.config, "max_position_embeddings", None)
    if context is None:
        raise ConfigError(f"model {cfg.name} declares no context length; set model.context_length")
    return LoadedModel(
        model, tokenizer, cfg.name, path, eos_token_ids(model, tokenizer), int(context), placement(model, device_map)
    )


def describe_target(cfg) -> TargetFiles:
    """The tokenizer, end-of-sequence ids and context length of a ``conf/model`` node, read from its files without
    loading the weights (engine=vllm loads them in its own process)."""
    from transformers import AutoConfig, GenerationConfig

    path = checkpoint_path(cfg)
    tokenizer = load_tokenizer(cfg)
    config = _from_pretrained(AutoConfig, path, revision=cfg.get("revision"))
    try:
        generation = _from_pretrained(GenerationConfig, path, revision=cfg.get("revision"))
    except OSError:  # a checkpoint without generation_config.json: the model config's ids
        generation = GenerationConfig.from_model_config(config)
    context = cfg.get("context_length") or getattr(config, "max_position_embeddings", None)
    if context is None:
        raise ConfigError(f"model {cfg.name} declares no context length; set model.context_length")
    return TargetFiles(
        tokenizer, cfg.name, path, eos_token_ids(SimpleNamespace(generation_config=generation), tokenizer), int(context)
    )
