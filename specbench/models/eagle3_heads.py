"""EAGLE-3 draft heads (Li et al. 2025; docs/methods/eagle3.md): one decoder layer on FUSED target features.

Where an EAGLE-1/2 head reads the target's last hidden state, an EAGLE-3 head reads three: the hidden states
entering the target's decoder layers 2, L // 2 and L - 3 (low, middle, high; L = number of layers), i.e.
indices 2, L // 2 and L - 3 of the model's hidden-states tuple (0 = embeddings), concatenated in that order
and projected by ``fc`` (3H -> H, no bias) to the draft's input g_t. Its input at position t is the pair
(g_t, x_{t+1}). The layer normalises both halves apart (``input_layernorm`` on the token embedding,
``hidden_norm`` on g_t), concatenates them (embedding first) and runs attention with q/k/v projections
from 2H; the residual stream starts from g_t. The output a_t is a hidden state, not a predicted target
feature: the head's own ``norm`` and ``lm_head`` turn it into logits over the DRAFT vocabulary, and
drafting deeper feeds a_t back in place of g (no ``fc``). There is no feature-regression target.

Reduced vocabulary: ``lm_head`` has ``draft_vocab_size`` rows; draft token d is target token d + d2t[d]
(``d2t`` [draft_vocab_size] int64 offsets) and ``t2d`` [vocab] bool marks the target tokens the draft
vocabulary holds. Heads whose draft vocabulary is the target's omit both.

EAGLE-3.1 (the EAGLE, vLLM and TorchSpec teams, 2026; docs/methods/eagle3.md#eagle-31) is the same head with two
norms against attention drift, switched on by ``config.json`` keys as vLLM reads them (a head without them is
EAGLE-3): ``fc_norm`` gives each of the three fused hidden states its own RMSNorm before ``fc``
(``fc_norm.{0,1,2}.weight``), and ``norm_output`` feeds the POST-norm output ``norm(a_t)`` to the next drafting
step (the logits read it directly) instead of a_t. vLLM also reads ``norm_before_fc`` (one RMSNorm over the
whole 3H concatenation, ``input_norm.weight``), loaded here too.

Published layout (SafeAILab's EAGLE-3 heads, e.g. ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``,
``yuhuili/EAGLE3-Vicuna1.3-13B``): ``config.json`` (Llama keys with ``num_hidden_layers: 1`` and
``draft_vocab_size``) and ``pytorch_model.bin`` (``model.safetensors`` also read) holding ``fc.weight``,
``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``, ``norm.weight``,
``lm_head.weight``, ``d2t`` and ``t2d`` (reduced vocabularies), optionally ``embed_tokens.weight`` (else the
target's input embeddings are used, shared). Keys are checked strictly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from specbench.errors import ConfigError
from specbench.manifest import part_name, save_trained_heads, write_checkpoint
from specbench.models.eagle_heads import (
    CONFIG_FILE,
    IGNORED_SUFFIXES,
    WEIGHT_FILES,
    FeatureHead,
    assign_strictly,
    config_for_target,
    config_from_json,
    randomized,
    read_checkpoint,
    trained_accuracy,
)
from specbench.models.medusa_heads import CheckpointFiles, cached_then_hub, head_source, part_files
from specbench.models.parts import part_kind
from specbench.models.vocab import place_in_vocab

if TYPE_CHECKING:
    from transformers import PreTrainedModel

VOCAB_MAP_KEYS = ("d2t", "t2d")
EAGLE3_1_KEYS = ("fc_norm", "norm_output", "norm_before_fc")
"""The ``config.json`` keys of EAGLE-3.1's norms (vLLM's names); absent or false on an EAGLE-3 head."""


def fused_layers(num_layers: int, override=None) -> tuple[int, ...]:
    """Indices into the target's hidden-states tuple that the head fuses: the authors' (2, L // 2, L - 3),
    or the model config's ``eagle3.layers``; a model too shallow for the rule must name its own."""
    if override is not None:
        layers = tuple(int(layer) for layer in override)
        if len(layers) != 3 or not all(0 <= layer <= num_layers for layer in layers):
            raise ConfigError(
                f"model.eagle3.layers must be three hidden-state indices in [0, {num_layers}], got {list(override)}"
            )
        return layers
    layers = (2, num_layers // 2, num_layers - 3)
    if num_layers < 7:  # below 7 layers the rule repeats or reverses layers
        raise ConfigError(
            f"EAGLE-3 fuses the hidden states entering layers (2, L//2, L-3); a {num_layers}-layer target needs "
            f"model.eagle3.layers: three hidden-state indices in [0, {num_layers}]"
        )
    return layers


class Eagle3Layer(nn.Module):
    """EAGLE-3's decoder layer: attention over [norm(embedding); norm(hidden)] (2H), residual from the hidden."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):  # widened to read the 2H concatenation
            out_features = getattr(self.self_attn, name).out_features
            setattr(self.self_attn, name, nn.Linear(2 * hidden, out_features, bias=config.attention_bias))
        self.mlp = LlamaMLP(config)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, attention_mask, rotary, cache) -> torch.Tensor:
        """Next hidden [B, n, H] from token embeddings [B, n, H] and input hidden states [B, n, H]."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # [B, n, 2H]
        attended, _ = self.self_attn(
            hidden_states=x, position_embeddings=rotary, attention_mask=attention_mask, past_key_values=cache
        )
        hidden = hidden + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(FeatureHead):
    """EAGLE-3's draft head (token embeddings own or shared, published layout: ``FeatureHead``).

    ``draft_tokens`` (sorted target ids, [draft_vocab_size]) gives a reduced draft vocabulary (``d2t``/``t2d``
    buffers); None drafts over the whole target vocabulary. With ``embed_tokens`` given, the token embeddings are
    the target's (shared, frozen, neither saved nor trained).
    """

    d2t: torch.Tensor  # [draft_vocab_size] int64 (reduced vocabularies only)
    t2d: torch.Tensor  # [vocab] bool

    def __init__(
        self,
        config: LlamaConfig,
        draft_tokens: torch.Tensor | None = None,
        embed_tokens: nn.Module | None = None,
    ):
        super().__init__()
        config._attn_implementation = "sdpa"
        self.config = config
        hidden, vocab, eps = config.hidden_size, config.vocab_size, config.rms_norm_eps
        self.input_norm = LlamaRMSNorm(3 * hidden, eps=eps) if getattr(config, "norm_before_fc", False) else None
        self.fc_norm = (
            nn.ModuleList(LlamaRMSNorm(hidden, eps=eps) for _ in range(3))
            if getattr(config, "fc_norm", False)
            else None
        )
        self.norm_output = bool(getattr(config, "norm_output", False))
        self.fc = nn.Linear(3 * hidden, hidden, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        draft_vocab = vocab if draft_tokens is None else draft_tokens.numel()
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
        if draft_tokens is not None:
            device = draft_tokens.device
            self.register_buffer("d2t", draft_tokens - torch.arange(draft_vocab, device=device))  # target = d + d2t[d]
            self.register_buffer(
                "t2d", torch.zeros(vocab, dtype=torch.bool, device=device).index_fill_(0, draft_tokens, True)
            )
        self.rotary = LlamaRotaryEmbedding(config)  # buffers only, none persistent: not in the state dict
        self.own_or_shared_embeddings(vocab, hidden, embed_tokens)

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.out_features

    @property
    def reduced(self) -> bool:
        """Whether the draft vocabulary is a subset of the target's (``d2t``/``t2d`` present)."""
        return self.draft_vocab_size != self.config.vocab_size

    def draft_tokens(self) -> torch.Tensor:
        """The target id of every draft token [draft_vocab_size]."""
        ids = torch.arange(self.draft_vocab_size, device=self.lm_head.weight.device)
        return ids + self.d2t if self.reduced else ids

    def forward(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache=None,
    ) -> torch.Tensor:
        """Output hidden states [B, n, H] from pairs (features, next tokens input_ids [B, n]): what the next
        drafting step reads (post-norm with ``norm_output``).

        ``features`` are either the target's fused layers [B, n, 3H] (projected by ``fc``) or the head's own
        outputs [B, n, H] (deeper drafts). ``position_ids`` [B, n]; ``attention_mask`` additive
        [B or 1, 1, n, past + n]; ``cache`` a DynamicCache or None.
        """
        hidden = self.fuse(features) if features.shape[-1] != self.config.hidden_size else features  # [B, n, H]
        embeds = self.embed(input_ids).to(hidden.dtype)  # [B, n, H]
        rotary = self.rotary(hidden, position_ids)
        out = self.midlayer(embeds, hidden, attention_mask, rotary, cache)  # [B, n, H]
        return self.norm(out) if self.norm_output else out

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """g_t [..., H] from the target's three fused hidden states [..., 3H], normed first where the head says."""
        if self.input_norm is not None:
            features = self.input_norm(features)
        if self.fc_norm is not None:
            parts = features.chunk(3, dim=-1)  # 3 x [..., H], low / middle / high
            features = torch.cat([norm(part) for norm, part in zip(self.fc_norm, parts, strict=True)], dim=-1)
        return self.fc(features)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [..., draft_vocab_size] of output hidden states [..., H] (already
        normed with ``norm_output``)."""
        return self.lm_head(hidden if self.norm_output else self.norm(hidden))

    def target_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits placed in the target vocabulary [k, vocab] (float32; -inf where the draft vocabulary has
        no token), so tree builders rank target ids directly."""
        logits = self.draft_logits(hidden).float()  # [k, draft_vocab]
        return place_in_vocab(logits, self.draft_tokens(), self.config.vocab_size) if self.reduced else logits


@dataclass
class LoadedEagle3:
    """A head ready for the drafter, the target layers it fuses, where it came from, its held-out accuracy."""

    head: Eagle3Head
    layers: tuple[int, ...]
    origin: str  # Hub id, folder, or "random(seed=...)"
    top1_by_depth: list[float] | None


def draft_vocab_of(state: dict[str, torch.Tensor], raw: dict, vocab: int, origin: str) -> torch.Tensor | None:
    """The draft vocabulary's target ids (from ``d2t``) of a published state dict; None for the full vocabulary."""
    size = int(raw.get("draft_vocab_size", vocab))
    if size == vocab:
        return None
    if "d2t" not in state:
        raise ConfigError(f"EAGLE-3 head '{origin}' drafts over {size} of {vocab} tokens but has no d2t mapping")
    d2t = state["d2t"].long()
    if d2t.numel() != size:
        raise ConfigError(f"EAGLE-3 head '{origin}': d2t has {d2t.numel()} entries, config says {size}")
    tokens = d2t + torch.arange(size)
    if tokens.min() < 0 or tokens.max() >= vocab or tokens.unique().numel() != size:
        raise ConfigError(f"EAGLE-3 head '{origin}': d2t maps draft tokens outside the target's {vocab} tokens")
    return tokens


def head_from_state(state: dict[str, torch.Tensor], raw: dict, target: PreTrainedModel, origin: str) -> Eagle3Head:
    """Build a head for ``target`` from a published-layout state dict, on its device and in its dtype."""
    config, _ = config_from_json(raw)
    state = {key: value for key, value in state.items() if not key.endswith(IGNORED_SUFFIXES)}
    lm_head = target.get_output_embeddings()
    vocab, hidden = lm_head.weight.shape
    fc = state.get("fc.weight")
    if fc is None or tuple(fc.shape) != (config.hidden_size, 3 * config.hidden_size):
        raise ConfigError(
            f"'{origin}' is not an EAGLE-3 head: expected fc.weight of shape "
            f"({config.hidden_size}, {3 * config.hidden_size}), found {None if fc is None else tuple(fc.shape)}"
        )
    if config.hidden_size != hidden or config.vocab_size != vocab:
        raise ConfigError(
            f"EAGLE-3 head '{origin}' is for a target of width {config.hidden_size} and vocabulary "
            f"{config.vocab_size}; this target has {hidden} and {vocab}: use the head trained for this target"
        )
    draft_tokens = draft_vocab_of(state, raw, vocab, origin)
    if draft_tokens is None:  # the authors drop unused maps of full-vocabulary heads; accept them if present
        state = {key: value for key, value in state.items() if key not in VOCAB_MAP_KEYS}
    own_embeddings = "embed_tokens.weight" in state
    with torch.device("meta"):
        head = Eagle3Head(config, draft_tokens, None if own_embeddings else target.get_input_embeddings())
    assign_strictly(head, state, "EAGLE-3", origin)
    if draft_tokens is not None and not torch.equal(head.t2d.nonzero()[:, 0], draft_tokens.sort().values):
        raise ConfigError(f"EAGLE-3 head '{origin}': t2d does not mark exactly the tokens d2t maps to")
    weight = lm_head.weight  # .to(dtype) leaves the integer d2t and boolean t2d as they are
    return head.to(device=weight.device, dtype=weight.dtype).eval().requires_grad_(False)


def random_head(
    target: PreTrainedModel, seed: int, draft_vocab: int | None = None, norms: tuple[str, ...] = ()
) -> Eagle3Head:
    """A seeded random head sharing the target's embeddings, over a seeded random draft vocabulary of
    ``draft_vocab`` tokens (None: the whole vocabulary), with the EAGLE-3.1 ``norms`` named (``EAGLE3_1_KEYS``);
    tests and smoke runs of the machinery."""
    config = config_for_target(target)
    for key in norms:
        setattr(config, key, True)
    generator = torch.Generator().manual_seed(seed)
    tokens = None
    if draft_vocab is not None and draft_vocab < config.vocab_size:
        tokens = torch.randperm(config.vocab_size, generator=generator)[:draft_vocab].sort().values
    return randomized(Eagle3Head(config, tokens, target.get_input_embeddings()), generator, target)


def published_head(path: str, revision: str | None, target: PreTrainedModel) -> tuple[Eagle3Head, list | None]:
    """A head from a Hub id or a local folder in the published layout (HF cache first, then the Hub), and the
    held-out accuracy a training run here saved beside it."""
    files = CheckpointFiles(path, revision)
    raw, state = cached_then_hub(
        files, lambda cached: read_checkpoint(files, cached), lambda found: None not in found, "EAGLE-3 head eagle3"
    )
    if raw is None or state is None:
        raise ConfigError(f"'{path}' holds no EAGLE-3 head (needs {CONFIG_FILE} and one of {', '.join(WEIGHT_FILES)})")
    accuracy = trained_accuracy(Path(path)) if files.local else None
    return head_from_state(state, raw, target, path), accuracy


def load_eagle3(node, target: PreTrainedModel, target_name: str, kind: str = "eagle3") -> LoadedEagle3:
    """The head a ``conf/model/*.yaml`` ``eagle3:`` node (``kind``: or ``eagle3_1:``, whose trained heads live
    apart) names, bound to ``target``, with the layers it fuses."""
    source = head_source(node, kind, target_name)
    layers = fused_layers(target.config.num_hidden_layers, node.get("layers"))
    if source == "hub":
        head, accuracy = published_head(str(node["path"]), node.get("revision"), target)
        return LoadedEagle3(head, layers, str(node["path"]), accuracy)
    if source == "trained":
        folder, manifest = part_kind(kind).built(target_name)
        head, accuracy = published_head(str(folder), None, target)
        return LoadedEagle3(head, layers, part_name(kind, folder, manifest), accuracy)
    seed = int(node.get("seed", 0))
    draft_vocab = node.get("draft_vocab")
    norms = tuple(key for key in EAGLE3_1_KEYS if node.get(key))
    head = random_head(target, seed, None if draft_vocab is None else int(draft_vocab), norms)
    return LoadedEagle3(head, layers, f"random(seed={seed})", None)


def config_json(head: Eagle3Head, base_model: str, layers: tuple[int, ...]) -> dict:
    """The head's ``config.json`` in the authors' format (Llama keys + ``draft_vocab_size``)."""
    config = head.config
    rope = dict(getattr(config, "rope_parameters", None) or {})
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": head.draft_vocab_size,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "hidden_act": config.hidden_act,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "base_model_name_or_path": base_model,
        "eagle_aux_hidden_state_layer_ids": list(layers),  # vLLM's key; the authors' heads use (2, L // 2, L - 3)
        **{key: True for key in EAGLE3_1_KEYS if flag_of(head, key)},
    }


def flag_of(head: Eagle3Head, key: str) -> bool:
    """Whether ``head`` has the EAGLE-3.1 norm that ``config.json`` key ``key`` names."""
    return bool(getattr(head.config, key, False))


def save_head(head: Eagle3Head, folder: Path, base_model: str, layers: tuple[int, ...], training: dict) -> None:
    """Write the head (safetensors) + config.json + training.json and, last, manifest.json into ``folder``."""
    config = config_json(head, base_model, layers)
    save_trained_heads(folder, "EAGLE-3 head", WEIGHT_FILES[0], head.checkpoint_state(), CONFIG_FILE, config, training)


def vllm_checkpoint(node, target_name: str, target_path: str, revision: str | None, kind: str) -> tuple[str, str]:
    """The head an ``eagle3:`` (``kind``: or ``eagle3_1:``) node names as a folder or Hub id vLLM's ``eagle3``
    speculation loads, and how runs name it. The published layout is the one vLLM reads, so a published or trained
    head goes as it is; a random head is written once, drawn from the node as the shared loop draws it."""

    def write_random(target: PreTrainedModel, folder: Path) -> None:
        loaded = load_eagle3(node, target, target_name, kind)
        write_head(loaded.head, folder, target_path, loaded.layers)

    return part_files(node, kind, target_name, target_path, revision, write_random)


def write_head(head: Eagle3Head, folder: Path, base_model: str, layers: tuple[int, ...]) -> None:
    """Write ``head`` into ``folder`` in the published layout (``model.safetensors`` and ``config.json``); no
    training record (``save_head`` writes a trained head's)."""
    write_checkpoint(
        folder, WEIGHT_FILES[0], head.checkpoint_state(), CONFIG_FILE, config_json(head, base_model, layers)
    )
