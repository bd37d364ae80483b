"""Hydra heads (Ankner et al. 2024; docs/methods/hydra.md): sequentially dependent Medusa-style draft heads.

Head i (0-based) predicts the token ``i + 2`` positions after the last verified one, ``t``, from the target's
last hidden state ``h_t`` AND the input embeddings of the tokens between: ``x_{t+1}`` (the target's own next
token, the tree's root) and the tokens heads ``< i`` drafted on the same path. Its input is the concatenation
``[h_t, E(x_{t+1}), ..., E(x_{t+i+1})]`` ((i + 2) H wide); a first residual block maps it to H (its residual
branch is a linear map, as the widths differ), ``num_layers - 1`` more residual blocks follow, and the head's
own LM head (a biased linear layer started from the target's) gives the logits.

Two architectures, as the authors' code names them:

- ``mlp``: ``h_t`` is the target's last hidden state itself.
- ``prefix-mlp`` (Hydra++, the paper's best recipe): ``h_t`` is first passed through one extra Llama decoder
  layer (and a final RMSNorm) that attends over the target's hidden states of every earlier position, with
  its own KV cache ("prefix attention"); the heads read its output.

Published layout (``ankner/hydra-vicuna-{7,13,33}b-v1.3``): ``config.json`` with ``hydra_num_heads``,
``hydra_num_layers``, ``hydra_head_arch``, ``grounded_heads``, ``base_model_name_or_path``, and
``hydra_lm_head.pt``, the state dict of the authors' head module:

- ``hydra_mlp.{i}.{j}.linear.weight|bias`` and, for the first block, ``hydra_mlp.{i}.{j}.res_connection.weight|bias``;
  in ``prefix-mlp`` a dropout sits before every block, so block ``b`` is at ``j = 2 b + 1`` (else ``j = b``). The
  blocks after the first are ONE module repeated (the authors build them by repeating a list), so their keys
  hold the same tensors.
- ``hydra_lm_head.{i}.weight|bias`` (``mlp``) or ``hydra_lm_head.{i}.1.weight|bias`` (``prefix-mlp``: dropout first).
- ``prefix-mlp`` only: ``prefix_embeding_layer.layers.0.*`` (a Llama decoder layer),
  ``prefix_embeding_layer.norm.weight`` and ``prefix_embeding_layer.embed_tokens.weight`` (unused: the layer
  reads hidden states, never tokens; not kept).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from specbench.errors import ConfigError
from specbench.manifest import part_name, save_trained_heads
from specbench.models.medusa_heads import (
    CheckpointFiles,
    cached_then_hub,
    calibration_table,
    head_source,
    read_tensors,
)
from specbench.models.parts import part_kind

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ARCHS = ("mlp", "prefix-mlp")
WEIGHT_FILES = ("hydra_lm_head.safetensors", "hydra_lm_head.pt")
"""Heads trained here (safetensors), the authors' release (a torch pickle); the first one found is read."""
CONFIG_FILE = "config.json"
UNUSED_KEYS = ("prefix_embeding_layer.embed_tokens.weight",)
"""Published keys with no use here: the prefix layer is fed hidden states, never token ids."""


class HydraBlock(nn.Module):
    """``res(x) + SiLU(W x + b)``: ``res`` is the identity, or a linear map when the input is wider than H."""

    def __init__(self, hidden_size: int, conditions: int = 0):
        super().__init__()
        self.linear = nn.Linear(hidden_size * (conditions + 1), hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.res_connection: nn.Module = (
            nn.Linear(hidden_size * (conditions + 1), hidden_size) if conditions else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., (conditions + 1) H] -> [..., H]."""
        return self.res_connection(x) + nn.functional.silu(self.linear(x))


class PrefixLayer(nn.Module):
    """Hydra++'s prefix attention: one Llama decoder layer and a final RMSNorm over the target's hidden states."""

    def __init__(self, config):
        super().__init__()
        config = copy.deepcopy(config)
        config.num_hidden_layers = 1
        config._attn_implementation = "sdpa"
        self.config = config
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(config)  # buffers only, none persistent: not in the state dict

    def forward(self, hidden: torch.Tensor, position_ids: torch.Tensor, cache=None) -> torch.Tensor:
        """hidden [B, n, H] at ``position_ids`` [B, n], causal over ``cache``'s rows and themselves -> [B, n, H]."""
        past = cache.get_seq_length() if cache is not None else 0
        n = hidden.shape[1]
        mask = torch.full((n, past + n), torch.finfo(hidden.dtype).min, dtype=hidden.dtype, device=hidden.device)
        mask = mask.triu(past + 1)[None, None]  # [1, 1, n, past + n]: row r sees rows <= past + r
        rotary = self.rotary(hidden, position_ids)
        out = self.layers[0](
            hidden, attention_mask=mask, position_ids=position_ids, past_key_values=cache, position_embeddings=rotary
        )
        return self.norm(out)


class HydraHeads(nn.Module):
    """K grounded Hydra heads; ``checkpoint_state()`` is the authors' ``hydra_lm_head.pt`` layout."""

    def __init__(
        self,
        config,
        num_heads: int,
        num_layers: int,
        arch: str,
        lm_head_init: torch.Tensor | None = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        if arch not in ARCHS:
            raise ConfigError(f"Hydra head architecture must be one of {list(ARCHS)}; got {arch!r}")
        if num_heads < 1 or num_layers < 1:
            raise ConfigError(f"Hydra heads need num_heads >= 1 and num_layers >= 1; got {num_heads} and {num_layers}")
        self.hidden_size, self.vocab_size = config.hidden_size, config.vocab_size
        self.num_layers, self.arch, self.dropout = num_layers, arch, dropout
        self.hydra_mlp = nn.ModuleList(self._blocks(i) for i in range(num_heads))
        self.hydra_lm_head = nn.ModuleList(self._output() for _ in range(num_heads))
        if lm_head_init is not None:
            with torch.no_grad():
                for i in range(num_heads):
                    self.output_layer(i).weight.copy_(lm_head_init)
        self.prefix_embeding_layer = PrefixLayer(config) if arch == "prefix-mlp" else None

    def _blocks(self, index: int) -> nn.Sequential:
        """Head ``index``'s blocks: the widening first block, then one block repeated (dropouts in prefix-mlp)."""
        first, repeated = HydraBlock(self.hidden_size, index + 1), HydraBlock(self.hidden_size)
        if self.arch == "mlp":
            return nn.Sequential(first, *([repeated] * (self.num_layers - 1)))
        drop = nn.Dropout(self.dropout)  # training only (eval() turns it off)
        return nn.Sequential(drop, first, *([drop, repeated] * (self.num_layers - 1)))

    def _output(self) -> nn.Module:
        """A head's LM head (after a dropout in prefix-mlp, as the published keys number it)."""
        linear = nn.Linear(self.hidden_size, self.vocab_size)
        return linear if self.arch == "mlp" else nn.Sequential(nn.Dropout(self.dropout), linear)

    @property
    def num_heads(self) -> int:
        return len(self.hydra_mlp)

    def output_layer(self, index: int) -> nn.Linear:
        """Head ``index``'s LM head."""
        layer = self.hydra_lm_head[index]
        if isinstance(layer, nn.Linear):
            return layer
        assert isinstance(layer, nn.Sequential) and isinstance(layer[1], nn.Linear)  # prefix-mlp: (dropout, linear)
        return layer[1]

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The heads' tensors in the published layout (repeated blocks under every key they sit at)."""
        return self.state_dict()

    def load_checkpoint_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load tensors in the published layout: strict, except the unused prefix token embeddings."""
        kept = {key: value for key, value in state.items() if key not in UNUSED_KEYS}
        self.load_state_dict(kept, strict=True)

    def prefix(self, hidden: torch.Tensor, position_ids: torch.Tensor, cache=None) -> torch.Tensor:
        """The heads' view of the target's hidden states [B, n, H]: the prefix layer's output, or themselves."""
        if self.prefix_embeding_layer is None:
            return hidden
        return self.prefix_embeding_layer(hidden, position_ids, cache)

    def head_logits(self, index: int, inputs: torch.Tensor) -> torch.Tensor:
        """Head ``index`` on inputs [..., (index + 2) H] (base state, then index + 1 token embeddings) -> [..., V]."""
        return self.hydra_lm_head[index](self.hydra_mlp[index](inputs))

    def forward(self, base: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Every head along one sequence (training): base [B, n, H], embeds [B, n, H] of the input tokens.

        Head i at position t reads ``[base_t, embeds_{t+1}, ..., embeds_{t+i+1}]`` (rows past the end wrap
        around, as in the authors' code; their targets are masked) -> logits [K, B, n, V].
        """
        inputs = [base, *(torch.roll(embeds, shifts=-(i + 1), dims=1) for i in range(self.num_heads))]
        return torch.stack([self.head_logits(i, torch.cat(inputs[: i + 2], dim=-1)) for i in range(self.num_heads)])


@dataclass
class LoadedHydra:
    """Hydra heads ready for the drafter and where they came from."""

    heads: HydraHeads
    origin: str
    rank_accuracy: list[list[float]] | None = None  # a_k^(i) measured after training (sparse trees), if any
    part: str = ""

    def __post_init__(self) -> None:
        self.part = self.part or f"hydra:{self.origin}"


def layout_from_config(config: dict, path: str) -> tuple[int, int, str]:
    """(num_heads, num_layers, arch) of a published ``config.json``; ungrounded heads are refused."""
    missing = [key for key in ("hydra_num_heads", "hydra_num_layers", "hydra_head_arch") if key not in config]
    if missing:
        raise ConfigError(f"{path}/{CONFIG_FILE} is not a Hydra config: it lacks {missing}")
    if not config.get("grounded_heads", False):
        raise ConfigError(
            f"{path} holds ungrounded Hydra heads (grounded_heads false): they read only the hidden state, "
            f"which is Medusa; use method=medusa"
        )
    return int(config["hydra_num_heads"]), int(config["hydra_num_layers"]), str(config["hydra_head_arch"])


def heads_for(target: PreTrainedModel, num_heads: int, num_layers: int, arch: str, dropout: float = 0.0) -> HydraHeads:
    """Heads shaped for ``target`` (LM heads started from the target's), on the CPU in float32."""
    lm_head = target.get_output_embeddings().weight
    return HydraHeads(target.config, num_heads, num_layers, arch, lm_head.detach().float().cpu(), dropout)


def bound(heads: HydraHeads, target: PreTrainedModel) -> HydraHeads:
    """``heads`` on the target's device and dtype, frozen."""
    weight = target.get_output_embeddings().weight
    return heads.to(device=weight.device, dtype=weight.dtype).eval().requires_grad_(False)


def published_hydra(path: str, revision: str | None, target: PreTrainedModel) -> LoadedHydra:
    """Heads in the authors' layout from a Hub id or a folder (HF cache first, then the Hub)."""
    files = CheckpointFiles(path, revision)
    found = cached_then_hub(
        files, lambda cached: checkpoint_files(files, cached), lambda found: None not in found, "Hydra heads hydra"
    )
    config_file, weight_file = found
    if config_file is None or weight_file is None:
        raise ConfigError(f"'{path}' holds no Hydra heads (looked for {CONFIG_FILE} and one of {list(WEIGHT_FILES)})")
    num_heads, num_layers, arch = layout_from_config(json.loads(config_file.read_text()), path)
    heads = heads_for(target, num_heads, num_layers, arch)
    state = read_tensors(weight_file)
    check_fits(state, heads, path)
    heads.load_checkpoint_state(state)
    return LoadedHydra(bound(heads, target), path, calibration_table(Path(path)) if files.local else None)


def checkpoint_files(files: CheckpointFiles, cached_only: bool) -> list[Path | None]:
    """[config file, weight file] of a checkpoint (None where absent)."""
    weights = next((file for name in WEIGHT_FILES if (file := files.get(name, cached_only)) is not None), None)
    return [files.get(CONFIG_FILE, cached_only), weights]


def check_fits(state: dict[str, torch.Tensor], heads: HydraHeads, path: str) -> None:
    """A ConfigError naming the first tensor whose shape does not fit the target-shaped heads."""
    own = heads.state_dict()
    for key, value in state.items():
        if key in own and tuple(own[key].shape) != tuple(value.shape):
            raise ConfigError(
                f"Hydra heads in {path} do not fit this target: {key} is {tuple(value.shape)}, the target needs "
                f"{tuple(own[key].shape)}; use heads trained for this model"
            )


def random_hydra(target: PreTrainedModel, num_heads: int, num_layers: int, arch: str, seed: int) -> LoadedHydra:
    """Seeded random heads (tests and smoke runs of the machinery)."""
    heads = heads_for(target, num_heads, num_layers, arch)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in heads.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) / heads.hidden_size**0.5)
    return LoadedHydra(bound(heads, target), f"random(seed={seed},arch={arch})")


def trained_hydra(target_name: str, target: PreTrainedModel) -> LoadedHydra:
    """Heads trained here for ``target_name`` (only with a finished manifest)."""
    folder, manifest = part_kind("hydra").built(target_name)
    loaded = published_hydra(str(folder), None, target)
    return LoadedHydra(loaded.heads, str(folder), loaded.rank_accuracy, part_name("hydra", folder, manifest))


def load_hydra(node, target: PreTrainedModel, target_name: str) -> LoadedHydra:
    """The heads a model config's ``hydra:`` node names, bound to ``target``."""
    source = head_source(node, "hydra", target_name)
    if source == "hub":
        return published_hydra(node["path"], node.get("revision"), target)
    if source == "trained":
        return trained_hydra(target_name, target)
    arch = node.get("arch", "prefix-mlp")
    return random_hydra(
        target, int(node.get("num_heads", 4)), int(node.get("num_layers", 1)), arch, node.get("seed", 0)
    )


def save_hydra(heads: HydraHeads, folder: Path, base_model: str, training: dict) -> None:
    """Write heads + config.json + training.json and, last, manifest.json into ``folder`` atomically."""
    config = {
        "hydra_num_heads": heads.num_heads,
        "hydra_num_layers": heads.num_layers,
        "hydra_head_arch": heads.arch,
        "grounded_heads": True,
        "base_model_name_or_path": base_model,
    }
    state = {key: value.clone() for key, value in heads.checkpoint_state().items()}  # repeated blocks: own copies
    save_trained_heads(folder, "Hydra heads", WEIGHT_FILES[0], state, CONFIG_FILE, config, training)
