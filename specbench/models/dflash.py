"""DFlash drafters (Chen, Liang and Liu 2026; docs/methods/dflash.md): a block of mask tokens denoised in ONE forward,
conditioned on the target's hidden states injected as the drafter's context keys and values.

Architecture (as the authors' ``DFlashDraftModel`` and vLLM's ``DFlashQwen3ForCausalLM`` define it; written here
from their description, not copied):

- Context. The target's hidden states after its layers ``target_layer_ids`` (0-based layer indices; index i + 1 of
  the model's hidden-states tuple) are concatenated per position and fused by ``fc`` (n x H -> H, no bias), then
  ``hidden_norm`` (RMSNorm): c_t, one row per committed position t.
- Block. The rows of a step are the last committed token x_p followed by B - 1 copies of the mask token, at
  positions p .. p + B - 1, embedded with the TARGET's token embeddings (shared, frozen).
- Layers (Qwen3-style: per-head RMSNorm on queries and keys). In every layer the block rows' queries attend, without
  a causal mask, to keys/values projected from the context rows (the layer's own k/v projections of c_t; no input
  norm) followed by the block rows' own keys/values (of the input-normed block). Keys of both get ``k_norm`` and the
  rotary embedding at their positions. Residual, post-attention norm, MLP, as in a Llama layer.
- Output. ``norm`` then the TARGET's LM head: the logits at block row k (k = 1 .. B - 1) are the draft law of the
  token at position p + k. All B - 1 drafts come out of one forward.

Decoding keeps each layer's context keys/values of the committed positions (what vLLM writes into the draft's KV
cache); the block's own keys/values are dropped after the step.

Published layout (z-lab's ``*-DFlash`` drafts on the Hub): ``config.json`` with Qwen3 keys, ``architectures:
["DFlashDraftModel"]``, ``block_size``, ``num_target_layers`` and ``dflash_config: {mask_token_id,
target_layer_ids}``; ``model.safetensors`` holding ``fc.weight``, ``hidden_norm.weight``, ``norm.weight`` and per
layer ``layers.{i}.{input_layernorm,post_attention_layernorm}.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``
(and biases when ``attention_bias``), ``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj
.weight``; no embeddings and no LM head (the target's). Keys are checked strictly. Sliding-window layers (some later
drafts) are refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.functional import scaled_dot_product_attention
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from specbench.errors import ConfigError
from specbench.manifest import TRAINING_FILE, part_name, save_trained_heads, write_checkpoint
from specbench.models.eagle_heads import (
    IGNORED_SUFFIXES,
    WEIGHT_FILES,
    FeatureHead,
    assign_strictly,
    config_for_target,
    decoder_keys,
)
from specbench.models.medusa_heads import CheckpointFiles, cached_then_hub, head_source, part_files, read_tensors
from specbench.models.parts import part_kind

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CONFIG_FILE = "config.json"
ARCHITECTURE = "DFlashDraftModel"


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The authors' choice of target layers (0-based layer indices): the middle one for a one-layer drafter, else one
    per drafter layer spread evenly from layer 1 to layer L - 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    first, last = 1, num_target_layers - 3
    if last <= first:
        raise ConfigError(
            f"DFlash spreads its target layers over 1 .. L - 3; a {num_target_layers}-layer target needs "
            f"model.dflash.layers: the target layer indices (0-based) to read"
        )
    return [round(first + i * (last - first) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def checked_target_layers(layers, num_target_layers: int) -> list[int]:
    """``layers`` as a list of 0-based target layer indices in [0, L - 1], else a ConfigError."""
    chosen = [int(layer) for layer in layers]
    if not chosen or not all(0 <= layer < num_target_layers for layer in chosen):
        raise ConfigError(
            f"DFlash target_layer_ids must be target layer indices in [0, {num_target_layers - 1}], got {list(layers)}"
        )
    return chosen


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, heads, n, d] with cos / sin [B, n, d]."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashAttention(nn.Module):
    """Block queries over [context keys/values; block keys/values], per-head RMSNorm on queries and keys."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        hidden, bias = config.hidden_size, bool(config.attention_bias)
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)
        self.q_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(
        self,
        block: torch.Tensor,
        context: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Attention output [B, n, H] of the normed block [B, n, H] over the past context keys/values, the new
        context rows [B, c, H] and the block; ``rotary`` (cos, sin) [B, c + n, d] at the context then block
        positions; ``mask`` bool [B, 1, n, past + c + n] (True = attend) or None (every key). Also the new context
        rows' keys and values [B, kv, c, d] (rotated), for the caller's cache."""
        size, n, c = block.shape[0], block.shape[1], context.shape[1]
        cos, sin = rotary
        q = self.q_norm(self.q_proj(block).view(size, n, self.heads, self.head_dim)).transpose(1, 2)
        rows = torch.cat([context, block], dim=1)  # [B, c + n, H]
        k = self.k_norm(self.k_proj(rows).view(size, c + n, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(rows).view(size, c + n, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos[:, c:], sin[:, c:]), rotate(k, cos, sin)
        new_context = (k[:, :, :c], v[:, :, :c])
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, heads, n, d]
        return self.o_proj(out.transpose(1, 2).reshape(size, n, -1)), new_context


class DFlashLayer(nn.Module):
    """One drafter layer: pre-norm attention (context keys/values injected), then the MLP."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x, context, rotary, mask, past):
        attended, kv = self.self_attn(self.input_layernorm(x), context, rotary, mask, past)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class DFlashDraft(FeatureHead):
    """The drafter: ``fc`` + ``hidden_norm`` fuse the target's layers into context rows; ``layers`` denoise a block;
    ``norm`` and the target's LM head (shared, as the embeddings are) give the block's draft logits.

    ``target_layer_ids``: the target layers read (0-based); ``block_size``: B; ``mask_token``: the mask token's id.
    """

    def __init__(
        self,
        config: LlamaConfig,
        target_layer_ids: list[int],
        block_size: int,
        mask_token: int,
        embed_tokens: nn.Module | None = None,
        lm_head: nn.Module | None = None,
    ):
        super().__init__()
        config._attn_implementation = "sdpa"
        self.config = config
        self.target_layer_ids = list(target_layer_ids)
        self.block_size, self.mask_token = int(block_size), int(mask_token)
        hidden = config.hidden_size
        self.fc = nn.Linear(len(self.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(config)  # buffers only, none persistent: not in the state dict
        self.own_or_shared_embeddings(config.vocab_size, hidden, embed_tokens)
        self._lm_head = (lm_head,)  # the target's; a tuple keeps it out of this module's parameters

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """The indices of the target's hidden-states tuple the drafter reads (layer i's output is index i + 1)."""
        return tuple(layer + 1 for layer in self.target_layer_ids)

    def forward(
        self,
        features: torch.Tensor,
        context_positions: torch.Tensor,
        block_ids: torch.Tensor,
        block_positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Block outputs [B, n, H] (before ``norm``) and each layer's new context keys/values.

        ``features`` [B, c, n_layers x H]: the target's layers at the new context positions ``context_positions``
        [B, c]; ``block_ids`` / ``block_positions`` [B, n]; ``mask`` bool [B, 1, n, past + c + n] (True = attend;
        None: every key, as decoding has it); ``past`` per layer (keys, values) [B, kv, past, d] of earlier context.
        """
        weight = self.fc.weight
        context = self.hidden_norm(self.fc(features.to(weight.dtype)))  # [B, c, H]
        x = self.embed(block_ids).to(weight.dtype)  # [B, n, H]
        positions = torch.cat([context_positions, block_positions], dim=1)  # [B, c + n]
        rotary = self.rotary(x, positions)
        new = []
        for index, layer in enumerate(self.layers):
            x, kv = layer(x, context, rotary, mask, past[index] if past else None)
            new.append(kv)
        return x, new

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., vocab] of block outputs [..., H]: ``norm`` then the target's LM head."""
        head = self._lm_head[0]
        if head is None:
            raise RuntimeError("this DFlash drafter was built without the target's LM head")
        return head(self.norm(out))


@dataclass
class LoadedDFlash:
    """A drafter ready for decoding, where it came from, and its held-out accuracy if it was trained here."""

    draft: DFlashDraft
    origin: str  # Hub id, folder, "dflash:<digest>" or "random(seed=...)"
    top1_by_position: list[float] | None


def config_json(draft: DFlashDraft, base_model: str, num_target_layers: int) -> dict:
    """The drafter's ``config.json`` in the authors' layout (Qwen3 keys, block size, ``dflash_config``)."""
    config = draft.config
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        **decoder_keys(config),
        "attention_bias": bool(config.attention_bias),
        "tie_word_embeddings": False,
        "block_size": draft.block_size,
        "num_target_layers": num_target_layers,
        "dflash_config": {"mask_token_id": draft.mask_token, "target_layer_ids": draft.target_layer_ids},
        "base_model_name_or_path": base_model,
    }


def config_from_json(raw: dict, origin: str) -> LlamaConfig:
    """The drafter's architecture from an authors'-layout ``config.json`` (refusing what is not a DFlash draft)."""
    dflash = raw.get("dflash_config") or {}
    if "block_size" not in raw or "mask_token_id" not in dflash:
        raise ConfigError(
            f"'{origin}' is not a DFlash drafter: its config.json needs block_size and dflash_config.mask_token_id"
        )
    layer_types = raw.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types) or dflash.get("use_swa"):
        raise ConfigError(f"DFlash drafter '{origin}' has sliding-window layers, which specbench does not implement")
    if raw.get("rope_scaling"):
        raise ConfigError(f"DFlash drafter '{origin}' scales its rotary embedding, which specbench does not implement")
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        num_hidden_layers=int(raw["num_hidden_layers"]),
        vocab_size=int(raw["vocab_size"]),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
        hidden_act=raw.get("hidden_act", "silu"),
        attention_bias=bool(raw.get("attention_bias", False)),
        rope_parameters={"rope_type": "default", "rope_theta": float(raw.get("rope_theta", 1_000_000.0))},
    )


def draft_from_checkpoint(
    raw: dict, state: dict[str, torch.Tensor], target: PreTrainedModel, origin: str
) -> DFlashDraft:
    """A drafter for ``target`` from an authors'-layout config and state dict, strictly, on its device and dtype."""
    config = config_from_json(raw, origin)
    lm_head = target.get_output_embeddings()
    vocab, hidden = lm_head.weight.shape
    if config.hidden_size != hidden or config.vocab_size != vocab:
        raise ConfigError(
            f"DFlash drafter '{origin}' is for a target of width {config.hidden_size} and vocabulary "
            f"{config.vocab_size}; this target has {hidden} and {vocab}: use the drafter trained for this target"
        )
    dflash = raw["dflash_config"]
    num_target = target.config.num_hidden_layers
    layers = dflash.get("target_layer_ids")
    if layers is None:
        layers = default_target_layers(int(raw.get("num_target_layers", num_target)), config.num_hidden_layers)
    layers = checked_target_layers(layers, num_target)
    state = {key: value for key, value in state.items() if not key.endswith(IGNORED_SUFFIXES)}
    own_embeddings = "embed_tokens.weight" in state
    with torch.device("meta"):
        draft = DFlashDraft(
            config,
            layers,
            int(raw["block_size"]),
            int(dflash["mask_token_id"]),
            None if own_embeddings else target.get_input_embeddings(),
            lm_head,
        )
    assign_strictly(draft, state, "DFlash", origin)
    return draft.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype).eval().requires_grad_(False)


def read_checkpoint(files: CheckpointFiles, cached_only: bool) -> tuple[dict | None, dict | None]:
    """(config.json contents, state dict) of a drafter checkpoint; None for what is absent."""
    config_file = files.get(CONFIG_FILE, cached_only)
    raw = json.loads(config_file.read_text()) if config_file is not None else None
    for name in WEIGHT_FILES:
        if (file := files.get(name, cached_only)) is not None:
            return raw, read_tensors(file)
    return raw, None


def published_draft(path: str, revision: str | None, target: PreTrainedModel) -> tuple[DFlashDraft, list | None]:
    """A drafter from a Hub id or a local folder in the authors' layout (HF cache first, then the Hub; offline, an
    error naming the id), and the held-out accuracy a training run here saved beside it."""
    files = CheckpointFiles(path, revision)
    raw, state = cached_then_hub(
        files, lambda cached: read_checkpoint(files, cached), lambda found: None not in found, "DFlash drafter dflash"
    )
    if raw is None or state is None:
        raise ConfigError(
            f"'{path}' holds no DFlash drafter (needs {CONFIG_FILE} and one of {', '.join(WEIGHT_FILES)})"
        )
    accuracy = None
    if files.local and (Path(path) / TRAINING_FILE).is_file():
        accuracy = json.loads((Path(path) / TRAINING_FILE).read_text()).get("accuracy", {}).get("top1")
    return draft_from_checkpoint(raw, state, target, path), accuracy


def build_draft(
    target: PreTrainedModel, num_layers: int, target_layer_ids: list[int], block_size: int, mask_token: int
) -> DFlashDraft:
    """A fresh drafter shaped like ``target`` (width, heads, rotary settings), sharing its embeddings and LM head."""
    return DFlashDraft(
        config_for_target(target, num_layers),
        target_layer_ids,
        block_size,
        mask_token,
        target.get_input_embeddings(),
        target.get_output_embeddings(),
    )


def random_draft(target: PreTrainedModel, node) -> DFlashDraft:
    """A seeded random drafter (tests and smoke runs of the machinery): the node's ``num_layers`` (1), ``layers``
    (else the authors' rule), ``block_size`` (16) and ``mask_token`` (0)."""
    num_layers = int(node.get("num_layers", 1))
    num_target = target.config.num_hidden_layers
    layers = node.get("layers")
    chosen = checked_target_layers(layers, num_target) if layers is not None else None
    draft = build_draft(
        target,
        num_layers,
        chosen or default_target_layers(num_target, num_layers),
        int(node.get("block_size", 16)),
        int(node.get("mask_token", 0)),
    )
    generator = torch.Generator().manual_seed(int(node.get("seed", 0)))
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name.endswith("norm.weight"):
                continue
            param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(param.shape[-1]))
    weight = target.get_output_embeddings().weight
    return draft.to(device=weight.device, dtype=weight.dtype).eval().requires_grad_(False)


def load_dflash(node, target: PreTrainedModel, target_name: str) -> LoadedDFlash:
    """The drafter a ``conf/model/*.yaml`` ``dflash:`` node names, bound to ``target``."""
    source = head_source(node, "dflash", target_name)
    if source == "hub":
        draft, accuracy = published_draft(str(node["path"]), node.get("revision"), target)
        return LoadedDFlash(draft, str(node["path"]), accuracy)
    if source == "trained":
        folder, manifest = part_kind("dflash").built(target_name)
        draft, accuracy = published_draft(str(folder), None, target)
        return LoadedDFlash(draft, part_name("dflash", folder, manifest), accuracy)
    seed = int(node.get("seed", 0))
    return LoadedDFlash(random_draft(target, node), f"random(seed={seed})", None)


def save_draft(draft: DFlashDraft, folder: Path, base_model: str, num_target_layers: int, training: dict) -> None:
    """Write the drafter (safetensors, authors' keys) + config.json + training.json and, last, manifest.json."""
    config = config_json(draft, base_model, num_target_layers)
    save_trained_heads(
        folder, "DFlash drafter", WEIGHT_FILES[0], draft.checkpoint_state(), CONFIG_FILE, config, training
    )


def vllm_checkpoint(node, target_name: str, target_path: str, revision: str | None) -> tuple[str, str]:
    """The drafter a ``dflash:`` node names as a folder or Hub id vLLM's ``dflash`` speculation loads, and how runs
    name it. The authors' layout is the one vLLM reads, so a published or trained drafter goes as it is; a random
    one is written once, drawn from the node as the shared loop draws it."""

    def write_random(target: PreTrainedModel, folder: Path) -> None:
        draft = random_draft(target, node)
        config = config_json(draft, target_path, target.config.num_hidden_layers)
        write_checkpoint(folder, WEIGHT_FILES[0], draft.checkpoint_state(), CONFIG_FILE, config)

    return part_files(node, "dflash", target_name, target_path, revision, write_random)
