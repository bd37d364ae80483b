"""The target with some attention and MLP sub-layers skipped: the draft model of self-speculative decoding.

Draft&Verify (Zhang et al., ACL 2024) drafts with the target itself, skipping a chosen set of attention
sub-layers and MLP sub-layers. A skipped sub-layer adds nothing to the residual stream. ``LayerSkip.drafting``
swaps stand-ins into the decoder layers for the duration of a draft forward, so the draft runs the
model's own forward code (masks, rotary embeddings, cache handling) with no copy of it:

- a skipped attention writes zero key/value rows into the KV cache for the positions it skips, so every
  layer's cache keeps the same length (the model derives positions and mask sizes from one layer's
  length), and returns a zero update;
- a skipped MLP returns a zero update.

The draft rows the stand-ins and the kept layers write are the drafter's to crop away before the target
verifies (the shared loop checks that the cache holds only committed rows when a step's tree is laid out).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from specbench.errors import ConfigError


@dataclass(frozen=True)
class SkipSet:
    """Which sub-layers the draft skips: layer indices of skipped attention and of skipped MLP blocks."""

    attention: tuple[int, ...] = ()
    mlp: tuple[int, ...] = ()

    @classmethod
    def from_bits(cls, bits: list[int], num_layers: int) -> SkipSet:
        """The set a 0/1 vector of length 2L names: bit i skips attention i, bit L + i skips MLP i."""
        return cls(
            tuple(i for i in range(num_layers) if bits[i]), tuple(i for i in range(num_layers) if bits[num_layers + i])
        )

    def bits(self, num_layers: int) -> list[int]:
        """The 0/1 vector of length 2L (attention bits first, then MLP bits)."""
        return [int(i in self.attention) for i in range(num_layers)] + [int(i in self.mlp) for i in range(num_layers)]

    def as_dict(self) -> dict[str, list[int]]:
        """Plain data for configs and JSON records."""
        return {"attention": list(self.attention), "mlp": list(self.mlp)}


def decoder_layers(model) -> nn.ModuleList:
    """The model's decoder layers (``model.model.layers``), or a ConfigError for an architecture without them."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or not all(
        hasattr(layer, "self_attn") and hasattr(layer, "mlp") for layer in layers
    ):
        raise ConfigError(
            f"{type(model).__name__} has no decoder layers with `self_attn` and `mlp` sub-layers at model.layers; "
            f"self-speculative drafting (layer skipping) supports decoder-only models laid out like Llama"
        )
    return layers


def check_skip_set(skip: SkipSet, num_layers: int) -> SkipSet:
    """``skip`` if every index names a layer of the model, else a ConfigError naming the bad ones."""
    for part, indices in (("attention", skip.attention), ("mlp", skip.mlp)):
        bad = [i for i in indices if not 0 <= i < num_layers]
        if bad or len(set(indices)) != len(indices):
            raise ConfigError(
                f"layer_skip.{part} must list distinct layer indices in [0, {num_layers - 1}] "
                f"(the model has {num_layers} layers); got {list(indices)}"
            )
    return skip


class SkippedAttention(nn.Module):
    """Stands in for a skipped attention sub-layer: zero K/V rows in the cache, a zero update."""

    def __init__(self, layer_idx: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.kv_heads = kv_heads
        self.head_dim = head_dim

    def forward(self, hidden_states: torch.Tensor, past_key_values=None, **kwargs) -> tuple[torch.Tensor, None]:
        """hidden_states [batch, q, hidden] -> a zero update of the same shape (and no attention weights)."""
        if past_key_values is not None:
            batch, q = hidden_states.shape[:2]
            rows = hidden_states.new_zeros(batch, self.kv_heads, q, self.head_dim)  # [batch, kv_heads, q, head_dim]
            past_key_values.update(rows, rows, self.layer_idx)
        return torch.zeros_like(hidden_states), None


class SkippedMLP(nn.Module):
    """Stands in for a skipped MLP sub-layer: a zero update."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [batch, q, hidden] -> zeros of the same shape."""
        return torch.zeros_like(hidden_states)


class LayerSkip:
    """A target model and the sub-layers its draft forwards skip."""

    def __init__(self, model, skip: SkipSet):
        self.model = model
        self.layers = decoder_layers(model)
        self.num_layers = len(self.layers)
        config = model.config
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.skip = SkipSet()
        self.use(skip)

    def use(self, skip: SkipSet) -> None:
        """Skip ``skip`` from now on (checked against the model's layer count)."""
        self.skip = check_skip_set(skip, self.num_layers)
        self.attention_stand_ins = {i: SkippedAttention(i, self.kv_heads, self.head_dim) for i in skip.attention}
        self.mlp_stand_in = SkippedMLP()

    @property
    def skipped_fraction(self) -> float:
        """Share of the 2L sub-layers the draft skips."""
        return (len(self.skip.attention) + len(self.skip.mlp)) / (2 * self.num_layers)

    def next_logits(self, token: int, cache) -> torch.Tensor:
        """The model's logits [vocab] (float32) for the token after ``token``, whose KV row it appends to ``cache`` (the
        skipped-layer draft's when called inside ``drafting``)."""
        ids = torch.tensor([[token]], device=self.model.device)  # [1, 1]
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float()

    @contextmanager
    def drafting(self) -> Iterator[None]:
        """Within the block the model's forward skips the chosen sub-layers; the originals return after it."""
        swapped: list[tuple[nn.Module, str, object]] = []  # (decoder layer, attribute, original sub-layer)
        try:
            for i, stand_in in self.attention_stand_ins.items():
                swapped.append((self.layers[i], "self_attn", self.layers[i].self_attn))
                self.layers[i].self_attn = stand_in
            for i in self.skip.mlp:
                swapped.append((self.layers[i], "mlp", self.layers[i].mlp))
                self.layers[i].mlp = self.mlp_stand_in
            yield
        finally:
            for layer, name, original in reversed(swapped):
                setattr(layer, name, original)
