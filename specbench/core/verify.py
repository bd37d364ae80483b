"""The one verification primitive: a flattened tree in one target forward, and KV-cache compaction.

The eager path's KV cache is transformers' ``DynamicCache`` with its full-attention layers swapped for
``ReservedLayer``: keys and values live in a buffer reserved for the whole generation, so a verify
forward writes its rows in place instead of concatenating (reallocating and copying) every layer's
cache every step, and compaction moves only the kept rows. The compiled path
(``specbench.core.compiled``) keeps a ``static_cache`` of fixed-size ``StaticRows`` layers instead; both
kinds are compacted by ``compact_cache`` and held behind the ``Verifier`` interface the loop calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

from specbench.core.tree import DraftTree, FlatPass, flatten
from specbench.errors import ConfigError


@dataclass
class VerifyOutput:
    """What one verify forward returns: tree logits for acceptance, aux logits for the drafter."""

    logits: torch.Tensor  # [num_nodes, vocab] float32, row i = P_t(.|path to node i)
    aux_logits: torch.Tensor | None  # [num_aux, vocab] float32
    hidden: torch.Tensor | None  # [num_nodes, layers x hidden] the asked-for hidden states, concatenated


class ReservedLayer(DynamicLayer):
    """A full-attention cache layer whose keys/values are views of a buffer reserved ahead.

    ``keys``/``values`` stay views ``buffer[..., :length, :]``, so ``DynamicLayer``'s length, crop and
    mask-size logic apply unchanged; ``update`` writes the new rows into the buffer, which grows
    (doubling, one copy) only when a forward would overflow it.
    """

    def __init__(self, reserve: int = 0):
        super().__init__()
        self.reserve = reserve  # rows to allocate at the first update (0 = just what it needs)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Empty views on buffers of ``reserve`` rows, laid out like the first states."""
        self.dtype, self.device = key_states.dtype, key_states.device
        self.key_buffer = key_states.new_empty(*key_states.shape[:-2], self.reserve, key_states.shape[-1])
        self.value_buffer = value_states.new_empty(*value_states.shape[:-2], self.reserve, value_states.shape[-1])
        self.keys, self.values = self.key_buffer[..., :0, :], self.value_buffer[..., :0, :]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new rows ([batch, heads, q, head_dim]) after the cached ones; return all rows (views)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None  # a view of the key buffer since lazy_initialization
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.key_buffer.shape[-2]:
            self._grow(max(end, 2 * self.key_buffer.shape[-2]))
        self.key_buffer[..., start:end, :] = key_states
        self.value_buffer[..., start:end, :] = value_states
        self.keys, self.values = self.key_buffer[..., :end, :], self.value_buffer[..., :end, :]
        return self.keys, self.values

    def keep(self, length: int) -> None:
        """Hold the first ``length`` rows only (new views; the buffer stays)."""
        assert self.keys is not None and self.values is not None  # a forward has filled the layer
        self.keys, self.values = self.keys[..., :length, :], self.values[..., :length, :]

    def _grow(self, rows: int) -> None:
        """Move the cached rows into buffers of ``rows`` rows (the only reallocation)."""
        assert self.keys is not None  # only update grows the buffers, after lazy_initialization
        length = self.keys.shape[-2]
        for name in ("key_buffer", "value_buffer"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:-2], rows, old.shape[-1])
            new[..., :length, :] = old[..., :length, :]
            setattr(self, name, new)


def new_cache(model, reserve: int = 0) -> DynamicCache:
    """An empty KV cache for ``model`` with room for ``reserve`` positions per layer before it grows.

    Only full-attention layers can be compacted row by row, so other layer kinds are refused.
    """
    cache = refuse_other_layers(model)
    cache.layers = [ReservedLayer(reserve) for _ in cache.layers]
    return cache


def refuse_other_layers(model) -> DynamicCache:
    """``model``'s own (dynamic) cache, or a ConfigError when a layer of it is not plain full attention."""
    cache = DynamicCache(config=model.config)
    unsupported = {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
    if unsupported:
        raise ConfigError(
            f"{model.config.model_type} uses cache layers {sorted(unsupported)} (sliding-window "
            f"or recurrent); specbench's tree verifier needs full-attention KV caches"
        )
    return cache


class StaticRows(StaticLayer):
    """A full-attention cache layer of a fixed number of rows (``torch.compile``'s static shapes): a forward
    writes its rows after the valid ones (transformers' ``StaticLayer``: at the device-side length
    ``cumulative_length``) and attends to all rows, the mask blocking the ones past the valid length; ``keep``
    sets that length, so dropping rows moves nothing and never syncs with the host."""

    def keep(self, length: int) -> None:
        """Hold the first ``length`` rows only (the rows after them are overwritten by the next forward)."""
        self.cumulative_length.fill_(length)


def static_cache(model, rows: int) -> Cache:
    """A KV cache of ``rows`` rows per layer, allocated now (not at the first forward) and empty.

    Only full-attention layers can be compacted row by row, so other layer kinds are refused.
    """
    refuse_other_layers(model)
    layers, heads, head_dim = kv_dims(model)
    cache = Cache(layers=[StaticRows(rows) for _ in range(layers)])
    cache.early_initialization(1, heads, head_dim, model.dtype, model.device)
    return cache


def kv_dims(model) -> tuple[int, int, int]:
    """The target's KV cache per token: (layers, key/value heads, head dimension)."""
    config = model.config.get_text_config(decoder=True)
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, heads, head_dim


def cache_length(cache: DynamicCache) -> int:
    """Number of positions held in the cache."""
    return cache.get_seq_length()


def lay_out(model, cache: DynamicCache, tree: DraftTree) -> FlatPass:
    """``tree``'s forward inputs (tokens, positions, mask) on the model's device, after the cached rows."""
    return flatten(tree, cache_length(cache), model.dtype, model.device)


def forward_tree(
    model, cache: DynamicCache, tree: DraftTree, hidden_layers: tuple[int, ...] = (), flat: FlatPass | None = None
) -> VerifyOutput:
    """Run ONE target forward over ``tree`` (+ aux rows) on top of ``cache``; the cache grows by all rows.

    ``hidden_layers`` index the model's hidden-states tuple (0 = embeddings, i = output of decoder layer i - 1,
    -1 = the last, after the final norm); their rows come back concatenated in that order (``hidden``).
    ``flat`` is the tree already laid out by ``lay_out`` (the loop times the layout apart from the forward).
    """
    if flat is None:
        flat = lay_out(model, cache, tree)
    out = model(
        input_ids=flat.input_ids,
        position_ids=flat.position_ids,
        attention_mask=flat.attention_mask,
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=bool(hidden_layers),
    )
    return verify_output(tree, out.logits, out.hidden_states, hidden_layers)


def verify_output(
    tree: DraftTree,
    logits: torch.Tensor,
    hidden_states: tuple[torch.Tensor, ...] | None,
    hidden_layers: tuple[int, ...],
    copy: bool = False,
) -> VerifyOutput:
    """The rows a verify forward's outputs (logits ``[1, q, vocab]``, hidden states ``[1, q, hidden]`` each, ``q``
    at least the tree's and aux rows) hold for the tree (float32 logits, the asked-for hidden rows) and for the aux
    rows; ``copy`` returns copies (outputs a CUDA graph overwrites at its next replay)."""
    n = len(tree)
    rows = logits[0, : n + (len(tree.aux) if tree.aux is not None else 0)]  # [n + aux, vocab]
    rows = rows.to(torch.float32, copy=copy)
    hidden = None
    if hidden_layers:
        assert hidden_states is not None  # asked for whenever hidden_layers is set
        hidden = layer_rows(hidden_states, hidden_layers, n)  # [n, layers x hidden]
        hidden = hidden.clone() if copy and len(hidden_layers) == 1 else hidden
    return VerifyOutput(rows[:n], rows[n:] if tree.aux is not None else None, hidden)


WARM_UP_WIDTHS = (2, 16, 64)
"""Verify widths (rows) that ``warm_up_verify`` runs once with each mask before any step is timed."""


def warm_up_verify(model, widths: tuple[int, ...] = WARM_UP_WIDTHS) -> None:
    """One chain and one star verify forward per width on a throwaway cache, so the first use of multi-token
    forwards (mask construction, attention-kernel choice) is not paid inside a timed step.

    NOTE: a warm-up generation whose drafter drafts nothing (n-gram methods on a prompt without repeats)
    runs only one-token forwards; on an H200 the first 7- and 10-token verify forwards of such runs then
    cost 1.0-1.3 s each inside the timed run.
    """
    for width in widths:
        for tree in (DraftTree.chain(0, [1] * (width - 1)), DraftTree.from_paths(0, [[t] for t in range(1, width)])):
            cache = new_cache(model, 4 + width)
            prefill(model, cache, torch.zeros(4, dtype=torch.long))
            forward_tree(model, cache, tree)


def prefill(model, cache: DynamicCache, prompt_ids: torch.Tensor) -> torch.Tensor:
    """Fill the cache with the prompt; return the last row's logits [vocab] (float32)."""
    ids = prompt_ids.to(model.device)[None]  # [1, prompt_len]
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1].float()


def layer_rows(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...], rows: int) -> torch.Tensor:
    """The first ``rows`` rows of the hidden states at ``layers`` (each [1, q, hidden]), concatenated:
    [rows, len(layers) x hidden] (EAGLE-3 fuses three layers; Medusa and EAGLE read the last alone)."""
    parts = [hidden_states[layer][0, :rows] for layer in layers]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def prefill_hidden(
    model, cache: DynamicCache, prompt_ids: torch.Tensor, hidden_layers: tuple[int, ...] = (-1,)
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prefill`` that also returns the hidden states at ``hidden_layers`` of every prompt row (for drafters
    with ``hidden_layers``): the last row's logits [vocab] (float32) and hidden [prompt_len, layers x hidden]."""
    ids = prompt_ids.to(model.device)[None]  # [1, prompt_len]
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, output_hidden_states=True)
    return out.logits[0, -1].float(), layer_rows(out.hidden_states, hidden_layers, ids.shape[1])


def prefill_with_tail(
    model, cache: DynamicCache, prompt_ids: torch.Tensor, tail_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill with a drafter's ``tail`` riding after the prompt under the plain causal mask (LADE's
    official window start); the cache keeps the prompt only. Returns the last prompt row's logits
    [vocab] (the prompt rows never see the tail) and the tail's logits [tail_len, vocab] (float32).
    """
    prompt_len, tail_len = prompt_ids.numel(), tail_ids.numel()
    ids = torch.cat([prompt_ids, tail_ids]).to(model.device)[None]  # [1, prompt_len + tail_len]
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=tail_len + 1)
    compact_cache(cache, prompt_len, [])  # drop the tail's KV rows
    logits = out.logits[0].float()  # [tail_len + 1, vocab]
    return logits[0], logits[1:]


def compact_cache(cache: Cache, past_len: int, kept_nodes: list[int]) -> None:
    """Keep cache rows ``0..past_len-1`` plus the new rows of ``kept_nodes`` (node order), drop the rest.

    NOTE: when the kept rows are already contiguous from ``past_len`` (chains, AR) this is a plain
    crop (new views, or a new valid length); otherwise one ``index_select`` per layer gathers the few kept
    rows in place.
    """
    keep_len = past_len + len(kept_nodes)
    contiguous = kept_nodes == list(range(len(kept_nodes)))
    rows = None if contiguous else torch.tensor(kept_nodes, dtype=torch.long) + past_len  # [kept]
    rows_on: dict[torch.device, torch.Tensor] = {}  # one copy per device (layers may span GPUs)
    for layer in cache.layers:
        # new_cache and static_cache make only these layers, and a forward (or allocation) has filled them
        assert isinstance(layer, ReservedLayer | StaticRows) and layer.keys is not None and layer.values is not None
        if rows is not None:
            if layer.keys.device not in rows_on:
                rows_on[layer.keys.device] = rows.to(layer.keys.device)
            index = rows_on[layer.keys.device]
            layer.keys[..., past_len:keep_len, :] = layer.keys.index_select(-2, index)
            layer.values[..., past_len:keep_len, :] = layer.values.index_select(-2, index)
        layer.keep(keep_len)


class Verifier(Protocol):
    """How the loop runs its verify forwards: a cache per generation, each tree laid out and verified on it
    (``EagerVerifier`` here; ``specbench.core.compiled.CompiledVerifier`` on a static cache)."""

    compiled: bool  # whether forwards run through torch.compile on a static cache

    def cache_for(self, context: int) -> Cache:
        """An empty KV cache with room for ``context`` positions (prompt and budget) and one step's pass after them."""
        ...

    def lay_out(self, tree: DraftTree, past_len: int) -> FlatPass:
        """``tree``'s forward inputs after ``past_len`` cached rows."""
        ...

    def verify(self, cache: Cache, tree: DraftTree, hidden_layers: tuple[int, ...], flat: FlatPass) -> VerifyOutput:
        """ONE target forward over the laid-out ``tree`` on ``cache``; the cache holds all its rows after."""
        ...


TREE_ROWS = 128
"""Cache rows the eager path reserves beyond prompt + budget for the last step's tree and aux rows (more grows once)."""


class EagerVerifier:
    """The eager path: a reserved dynamic cache per generation, every tree verified at its own width (a chain
    without aux rows on the causal fast path)."""

    compiled = False

    def __init__(self, model) -> None:
        self.model = model

    def cache_for(self, context: int) -> DynamicCache:
        """A reserved dynamic cache (``new_cache``) of ``context`` + ``TREE_ROWS`` rows (a wider pass grows it)."""
        return new_cache(self.model, context + TREE_ROWS)

    def lay_out(self, tree: DraftTree, past_len: int) -> FlatPass:
        """``flatten`` on the model's device, at the tree's own width."""
        return flatten(tree, past_len, self.model.dtype, self.model.device)

    def verify(self, cache: Cache, tree: DraftTree, hidden_layers: tuple[int, ...], flat: FlatPass) -> VerifyOutput:
        """``forward_tree``."""
        return forward_tree(self.model, cache, tree, hidden_layers, flat)
