"""The one verification primitive: a flattened tree in one target forward, and KV-cache compaction."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specbench.core.tree import DraftTree, flatten
from specbench.errors import ConfigError


@dataclass
class VerifyOutput:
    """What one verify forward returns: tree logits for acceptance, aux logits for the drafter."""

    logits: torch.Tensor  # [num_nodes, vocab] float32, row i = P_t(.|path to node i)
    aux_logits: torch.Tensor | None  # [num_aux, vocab] float32
    hidden: torch.Tensor | None  # [num_nodes, hidden] last hidden states, when asked for


def new_cache(model) -> DynamicCache:
    """An empty KV cache laid out for ``model``; only full-attention layers can be compacted row by row."""
    cache = DynamicCache(config=model.config)
    unsupported = {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
    if unsupported:
        raise ConfigError(f"{model.config.model_type} uses cache layers {sorted(unsupported)} (sliding-window "
                          f"or recurrent); specbench's tree verifier needs full-attention KV caches")
    return cache


def cache_length(cache: DynamicCache) -> int:
    """Number of positions held in the cache."""
    return cache.get_seq_length()


def forward_tree(model, cache: DynamicCache, tree: DraftTree, want_hidden: bool = False) -> VerifyOutput:
    """Run ONE target forward over ``tree`` (+ aux rows) on top of ``cache``; the cache grows by all rows."""
    past_len = cache_length(cache)
    flat = flatten(tree, past_len, model.dtype, model.device)
    out = model(
        input_ids=flat.input_ids,
        position_ids=flat.position_ids,
        attention_mask=flat.attention_mask,
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=want_hidden,
    )
    logits = out.logits[0].float()  # [q, vocab]
    n = len(tree)
    hidden = out.hidden_states[-1][0, :n] if want_hidden else None  # [n, hidden]
    aux_logits = logits[n:] if tree.aux is not None else None
    return VerifyOutput(logits[:n], aux_logits, hidden)


def prefill(model, cache: DynamicCache, prompt_ids: torch.Tensor) -> torch.Tensor:
    """Fill the cache with the prompt; return the last row's logits [vocab] (float32)."""
    ids = prompt_ids.to(model.device)[None]  # [1, prompt_len]
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1].float()


def compact_cache(cache: DynamicCache, past_len: int, kept_nodes: list[int]) -> None:
    """Keep cache rows ``0..past_len-1`` plus the new rows of ``kept_nodes`` (node order), drop the rest.

    NOTE: when the kept rows are already contiguous from ``past_len`` (chains, AR) this is a plain
    crop; otherwise one ``index_select`` per layer gathers them.
    """
    keep_len = past_len + len(kept_nodes)
    contiguous = kept_nodes == list(range(len(kept_nodes)))
    index = None
    if not contiguous:
        index = torch.tensor(kept_nodes, dtype=torch.long)
    for layer in cache.layers:
        if not contiguous:
            idx = index.to(layer.keys.device) + past_len
            layer.keys[..., past_len:keep_len, :] = layer.keys.index_select(-2, idx)
            layer.values[..., past_len:keep_len, :] = layer.values.index_select(-2, idx)
        layer.keys = layer.keys[..., :keep_len, :]
        layer.values = layer.values[..., :keep_len, :]
