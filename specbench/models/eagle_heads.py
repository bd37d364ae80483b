"""EAGLE draft heads (Li et al. 2024; docs/methods/eagle.md): a one-layer decoder that extrapolates features.

The head drafts at the feature level. Its input at position t is the pair (f_t, x_{t+1}): f_t is the
target's last hidden state at t (after the final norm, the vector its LM head reads) and x_{t+1} the
token that followed. ``fc`` maps ``cat(embed(x_{t+1}), f_t)`` (2H -> H) into a Llama decoder layer
whose output is the predicted feature f̂_{t+1}; the TARGET's own LM head turns f̂_{t+1} into the draft
distribution of x_{t+2}. Drafting deeper feeds (f̂_{t+1}, x_{t+2}) back in, with the head's own KV cache.

Published layout (SafeAILab's EAGLE-1/2 heads, e.g. ``yuhuili/EAGLE-Vicuna-7B-v1.3``,
``yuhuili/EAGLE-llama2-chat-7B``): a folder / Hub repo with ``config.json`` (Llama config keys with
``num_hidden_layers: 1``; optional ``bias``: whether ``fc`` has a bias, default true; optional
``qkv_bias``) and ``pytorch_model.bin`` (``model.safetensors`` also read) holding the state dict
``fc.weight``, ``fc.bias``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``layers.{i}.post_attention_layernorm.weight``,
``layers.{i}.input_layernorm.weight`` for i >= 1 only (the first layer has no input norm: fc's output
enters attention directly), and ``embed_tokens.weight`` (the target's frozen input embeddings). A
checkpoint without ``embed_tokens.weight`` uses the target's input embeddings (shared, not copied);
the heads ``python -m specbench.train eagle`` writes are saved that way. Rotary ``inv_freq`` buffers,
if a file carries them, are ignored (they are recomputed from the config).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from specbench.errors import ConfigError
from specbench.manifest import TRAINING_FILE, part_name, save_trained_heads, write_checkpoint
from specbench.models.medusa_heads import CheckpointFiles, cached_then_hub, head_source, part_files, read_tensors
from specbench.models.parts import part_kind

if TYPE_CHECKING:
    from transformers import PreTrainedModel

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # the yuhuili releases ship pytorch_model.bin
CONFIG_FILE = "config.json"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
NOT_LLAMA_KEYS = (
    "bias",
    "qkv_bias",
    "architectures",
    "torch_dtype",
    "transformers_version",
    "model_type",
    "base_model_name_or_path",
    "shares_embeddings",
    "auto_map",
    "draft_vocab_size",  # EAGLE-3 (specbench.models.eagle3_heads)
    "fused_layers",
)


class EagleLayer(LlamaDecoderLayer):
    """A Llama decoder layer; EAGLE's first layer has no input RMSNorm (``fc``'s output goes straight in)."""

    def __init__(self, config: LlamaConfig, index: int):
        super().__init__(config, index)
        if index == 0:
            self.input_layernorm = nn.Identity()  # same call, no gain


class FeatureHead(nn.Module):
    """What the EAGLE heads share: token embeddings of their own (``embed_tokens``, as the published files carry
    them) or the target's (given: shared, frozen, neither saved nor trained), and ``checkpoint_state()``, exactly
    the published state-dict layout."""

    def own_or_shared_embeddings(self, vocab: int, hidden: int, embed_tokens: nn.Module | None) -> None:
        """Own an ``embed_tokens`` [vocab, H] unless the target's ``embed_tokens`` are given to share."""
        if embed_tokens is None:
            self.embed_tokens = nn.Embedding(vocab, hidden)
        # NOTE: a tuple keeps the target's embeddings out of this module's parameters and state dict.
        self._shared = (embed_tokens,) if embed_tokens is not None else None

    @property
    def shares_embeddings(self) -> bool:
        return self._shared is not None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [..., H] of ``input_ids`` [...] (the target's when shared)."""
        return (self._shared[0] if self._shared is not None else self.embed_tokens)(input_ids)

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The head's tensors in the published layout (``fc.weight``, then the decoder layer's, ...)."""
        return self.state_dict()


class EagleHead(FeatureHead):
    """EAGLE-1/2's draft head (token embeddings own or shared: ``FeatureHead``)."""

    def __init__(self, config: LlamaConfig, fc_bias: bool = True, embed_tokens: nn.Module | None = None):
        super().__init__()
        if config.num_hidden_layers < 1:
            raise ConfigError(f"an EAGLE head needs num_hidden_layers >= 1, got {config.num_hidden_layers}")
        config._attn_implementation = "sdpa"
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=fc_bias)
        self.layers = nn.ModuleList(EagleLayer(config, index) for index in range(config.num_hidden_layers))
        self.rotary = LlamaRotaryEmbedding(config)  # buffers only, none persistent: not in the state dict
        self.own_or_shared_embeddings(config.vocab_size, hidden, embed_tokens)

    @property
    def fc_bias(self) -> bool:
        return self.fc.bias is not None

    def forward(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache=None,
    ) -> torch.Tensor:
        """Predicted next features [B, n, H] from pairs (features [B, n, H], next tokens input_ids [B, n]).

        ``position_ids`` [B, n]; ``attention_mask`` additive [B or 1, 1, n, past + n] (always explicit:
        rows see what the mask allows, never an implicit causal rule); ``cache`` a DynamicCache or None.
        """
        embeds = self.embed(input_ids).to(features.dtype)  # [B, n, H]
        x = self.fc(torch.cat([embeds, features], dim=-1))  # [B, n, H]
        rotary = self.rotary(x, position_ids)
        for layer in self.layers:
            x = layer(
                x,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=cache is not None,
                position_embeddings=rotary,
            )
        return x


@dataclass
class LoadedHead:
    """A head ready for the drafter, where it came from, and its held-out accuracy if it was trained here."""

    head: EagleHead
    origin: str  # Hub id, folder, or "random(seed=...)"
    top1_by_depth: list[float] | None  # training.json's held-out top-1 accuracy at depth 1, 2, ...


def config_from_json(raw: dict) -> tuple[LlamaConfig, bool]:
    """(LlamaConfig, fc bias) from an EAGLE ``config.json`` (Llama keys, ``bias``, ``qkv_bias``)."""
    config = LlamaConfig(**{key: value for key, value in raw.items() if key not in NOT_LLAMA_KEYS})
    config.attention_bias = bool(raw.get("qkv_bias", False))
    return config, bool(raw.get("bias", True))


def config_for_target(target: PreTrainedModel, num_layers: int = 1) -> LlamaConfig:
    """A head config matching ``target``'s width, attention, vocabulary and rotary settings."""
    source = target.config
    vocab, hidden = target.get_output_embeddings().weight.shape
    rope = getattr(source, "rope_parameters", None) or {
        "rope_type": "default",
        "rope_theta": getattr(source, "rope_theta", 10000.0),
    }
    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=source.intermediate_size,
        num_attention_heads=source.num_attention_heads,
        num_key_value_heads=getattr(source, "num_key_value_heads", None) or source.num_attention_heads,
        head_dim=getattr(source, "head_dim", None) or hidden // source.num_attention_heads,
        num_hidden_layers=num_layers,
        vocab_size=vocab,
        rms_norm_eps=getattr(source, "rms_norm_eps", 1e-6),
        max_position_embeddings=getattr(source, "max_position_embeddings", 2048),
        hidden_act=getattr(source, "hidden_act", "silu"),
        rope_parameters=dict(rope),
    )


def decoder_keys(config: LlamaConfig) -> dict:
    """The decoder-layer keys of a saved head's ``config.json`` (sizes, norm, positions, activation, rope theta), which
    EAGLE's and DFlash's layouts share."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    return {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": config.num_hidden_layers,
        "vocab_size": config.vocab_size,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "hidden_act": config.hidden_act,
        "rope_theta": rope.get("rope_theta", 10000.0),
    }


def config_json(head: EagleHead, base_model: str) -> dict:
    """The head's ``config.json`` in EAGLE's format (Llama keys + ``bias``), plus where it belongs."""
    config = head.config
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "bias": head.fc_bias,
        **decoder_keys(config),
        "base_model_name_or_path": base_model,
        "shares_embeddings": head.shares_embeddings,
    }


def head_from_state(
    state: dict[str, torch.Tensor], config: LlamaConfig, fc_bias: bool, target: PreTrainedModel, origin: str
) -> EagleHead:
    """Build a head for ``target`` from a published-layout state dict, on its device and in its dtype."""
    state = {key: value for key, value in state.items() if not key.endswith(IGNORED_SUFFIXES)}
    lm_head = target.get_output_embeddings()
    vocab, hidden = lm_head.weight.shape
    fc = state.get("fc.weight")
    if fc is None or tuple(fc.shape) != (config.hidden_size, 2 * config.hidden_size):
        raise ConfigError(
            f"'{origin}' is not an EAGLE head: expected fc.weight of shape "
            f"({config.hidden_size}, {2 * config.hidden_size}), found "
            f"{None if fc is None else tuple(fc.shape)}"
        )
    if config.hidden_size != hidden:
        raise ConfigError(
            f"EAGLE head '{origin}' has hidden size {config.hidden_size} but the target has {hidden}; "
            f"use the head trained for this target"
        )
    own_embeddings = "embed_tokens.weight" in state
    if own_embeddings and state["embed_tokens.weight"].shape[0] != vocab:
        raise ConfigError(
            f"EAGLE head '{origin}' embeds {state['embed_tokens.weight'].shape[0]} tokens but the "
            f"target's vocabulary has {vocab}; use the head trained for this target"
        )
    with torch.device("meta"):
        head = EagleHead(config, fc_bias, None if own_embeddings else target.get_input_embeddings())
    assign_strictly(head, state, "EAGLE", origin)
    return head.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype).eval().requires_grad_(False)


def assign_strictly(head: FeatureHead, state: dict[str, torch.Tensor], kind: str, origin: str) -> None:
    """Load ``state`` into a head built on the meta device, refusing missing or unexpected keys (``kind``: EAGLE or
    EAGLE-3, for the message); then real rotary buffers."""
    expected = set(head.checkpoint_state())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ConfigError(
            f"{kind} head '{origin}' does not match its config.json: missing keys {missing[:4]}, "
            f"unexpected keys {unexpected[:4]}"
        )
    head.load_state_dict(state, strict=True, assign=True)
    head.rotary = LlamaRotaryEmbedding(head.config)  # real (not meta) rotary buffers


def random_head(target: PreTrainedModel, seed: int, num_layers: int = 1) -> EagleHead:
    """A seeded random head sharing the target's embeddings (tests and smoke runs of the machinery)."""
    head = EagleHead(config_for_target(target, num_layers), True, target.get_input_embeddings())
    return randomized(head, torch.Generator().manual_seed(seed), target)


def randomized(head: FeatureHead, generator: torch.Generator, target: PreTrainedModel):
    """``head`` with seeded random weights (N(0, 1 / fan_in); RMSNorm gains stay 1), frozen, on the target's device
    and in its dtype."""
    with torch.no_grad():
        for name, param in head.named_parameters():
            if any("norm" in part for part in name.split(".")):  # every RMSNorm gain: its own name holds "norm"
                continue
            fan_in = param.shape[-1] if param.dim() > 1 else 1
            param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(fan_in))
    weight = target.get_output_embeddings().weight
    return head.to(device=weight.device, dtype=weight.dtype).eval().requires_grad_(False)


def read_checkpoint(files: CheckpointFiles, cached_only: bool) -> tuple[dict | None, dict | None]:
    """(config.json contents, state dict) of a head checkpoint; None for what is absent."""
    config_file = files.get(CONFIG_FILE, cached_only)
    raw = json.loads(config_file.read_text()) if config_file is not None else None
    for name in WEIGHT_FILES:
        if (file := files.get(name, cached_only)) is not None:
            return raw, read_tensors(file)
    return raw, None


def published_head(path: str, revision: str | None, target: PreTrainedModel) -> LoadedHead:
    """A head from a Hub id or a local folder in the published layout (HF cache first, then the Hub)."""
    files = CheckpointFiles(path, revision)
    raw, state = cached_then_hub(
        files, lambda cached: read_checkpoint(files, cached), lambda found: None not in found, "EAGLE head eagle"
    )
    if raw is None or state is None:
        raise ConfigError(f"'{path}' holds no EAGLE head (needs {CONFIG_FILE} and one of {', '.join(WEIGHT_FILES)})")
    config, fc_bias = config_from_json(raw)
    accuracy = trained_accuracy(Path(path)) if files.local else None
    return LoadedHead(head_from_state(state, config, fc_bias, target, path), path, accuracy)


def trained_accuracy(folder: Path) -> list[float] | None:
    """The held-out top-1 accuracy per depth a training run saved beside its head (``training.json``)."""
    record = folder / TRAINING_FILE
    return json.loads(record.read_text()).get("accuracy", {}).get("top1") if record.is_file() else None


def trained_head(target_name: str, target: PreTrainedModel) -> LoadedHead:
    """Our own trained head for ``target_name`` (only if its manifest says training finished), named in runs by
    its weights digest."""
    folder, manifest = part_kind("eagle").built(target_name)
    loaded = published_head(str(folder), None, target)
    return LoadedHead(loaded.head, part_name("eagle", folder, manifest), loaded.top1_by_depth)


def load_head(node, target: PreTrainedModel, target_name: str) -> LoadedHead:
    """The head a ``conf/model/*.yaml`` ``eagle:`` node names, bound to ``target``."""
    source = head_source(node, "eagle", target_name)
    if source == "hub":
        return published_head(str(node["path"]), node.get("revision"), target)
    if source == "trained":
        return trained_head(target_name, target)
    seed = int(node.get("seed", 0))
    return LoadedHead(random_head(target, seed, int(node.get("num_layers", 1))), f"random(seed={seed})", None)


def save_head(head: EagleHead, folder: Path, base_model: str, training: dict) -> None:
    """Write the head (safetensors) + config.json + training.json and, last, manifest.json into ``folder``
    atomically (``training`` holds ``digest``, ``data``, ``result`` and ``accuracy``)."""
    config = config_json(head, base_model)
    save_trained_heads(folder, "EAGLE head", WEIGHT_FILES[0], head.checkpoint_state(), CONFIG_FILE, config, training)


def vllm_checkpoint(node, target_name: str, target_path: str, revision: str | None) -> tuple[str, str]:
    """The head an ``eagle:`` node names, written once (under ``$SPECBENCH_CACHE/vllm/eagle/``) in the layout vLLM's
    ``eagle`` speculation loads, and how runs name it: vLLM's ``fc`` has no bias, so ``vllm_state`` moves it."""

    def write(target: PreTrainedModel, folder: Path) -> None:
        head = load_head(node, target, target_name).head
        config = {key: value for key, value in config_json(head, target_path).items() if key != "bias"}
        config["attention_bias"] = head.fc_bias or bool(head.config.attention_bias)  # vLLM: q, k, v and o biases
        write_checkpoint(folder, WEIGHT_FILES[0], vllm_state(head), CONFIG_FILE, config)

    return part_files(node, "eagle", target_name, target_path, revision, write, converted=True)


def vllm_state(head: EagleHead) -> dict[str, torch.Tensor]:
    """The head's tensors with ``fc``'s bias b moved into the first layer's attention, for an engine whose ``fc`` has
    none: that layer reads fc(x) + b with no input norm, so its q, k, v projections gain W b (softmax weights sum to
    one, so v's shift passes through attention unchanged) and o gains b, the residual's share; every layer then has
    all four attention biases (zero where the head had none). The same function of the input, up to rounding."""
    state = head.checkpoint_state()  # a fresh dict of detached tensors: popping and rebinding leave the head alone
    shift = state.pop("fc.bias", None)  # [H] or None
    for index, layer in enumerate(head.layers):
        attention = layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            projection = getattr(attention, name)
            key = f"layers.{index}.self_attn.{name}.bias"
            bias = state.get(key, projection.weight.new_zeros(projection.out_features))
            if index == 0 and shift is not None:
                bias = bias + (shift if name == "o_proj" else projection.weight.detach() @ shift)
            state[key] = bias
    return state
