"""Load a target model + tokenizer from a model config: Hub id / local path, embedded, or tiny random."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.errors import ConfigError, ModelUnavailable
from specbench.hub import hub_reachable
from specbench.models.embedded import embedded_checkpoint

SOURCES = ("hub", "embedded", "tiny")


@dataclass
class LoadedModel:
    """A target model ready for decoding, with what the runner needs to know about it."""

    model: torch.nn.Module
    tokenizer: object
    name: str  # config name, e.g. smollm2_135m
    path: str  # Hub id or local directory the weights came from
    eos_ids: frozenset[int]
    context_length: int


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu."""
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
    if dtype not in names:
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
                f"and run with model.path=DIR, or pre-fill the HF cache (HF_HOME).") from None
        return loader.from_pretrained(path, **kwargs)


def load_pretrained(path: str, dtype: torch.dtype, revision: str | None = None) -> tuple[torch.nn.Module, object | None]:
    """A causal LM and its tokenizer (None if it ships none) from a dir, the HF cache or the Hub (drafts)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _from_pretrained(AutoModelForCausalLM, path, revision=revision, dtype=dtype)
    try:
        tokenizer = _from_pretrained(AutoTokenizer, path, revision=revision)
    except (OSError, ValueError):
        tokenizer = None
    return model.eval(), tokenizer


def build_tiny_llama(vocab_size: int, seed: int, **arch) -> torch.nn.Module:
    """A small random Llama built from a config in code (unit tests, smoke runs)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=False, **arch)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
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
    return str(embedded_checkpoint()) if cfg.source in ("embedded", "tiny") else cfg.path


def load_tokenizer(cfg):
    """The tokenizer of a ``conf/model`` node alone (no weights), with its chat-template override."""
    from transformers import AutoTokenizer

    tokenizer = _from_pretrained(AutoTokenizer, checkpoint_path(cfg), revision=cfg.get("revision"))
    if cfg.get("chat_template"):
        tokenizer.chat_template = cfg.chat_template
    return tokenizer


def load_model(cfg, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Instantiate the model described by a ``conf/model/*.yaml`` node on ``device`` in ``dtype``."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor "Loading weights" bars would drown the run's own bar
    tokenizer = load_tokenizer(cfg)
    if cfg.source == "tiny":
        model = build_tiny_llama(len(tokenizer), **cfg.tiny)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        path = f"tiny-random-llama(seed={cfg.tiny.seed})"
    else:
        path = checkpoint_path(cfg)
        model = _from_pretrained(AutoModelForCausalLM, path, revision=cfg.get("revision"), dtype=dtype,
                                 attn_implementation=cfg.get("attn_implementation"))
    model = model.to(device=device, dtype=dtype).eval()
    context = cfg.get("context_length") or getattr(model.config, "max_position_embeddings", None)
    return LoadedModel(model, tokenizer, cfg.name, path, eos_token_ids(model, tokenizer), int(context))
