"""Medusa heads (Cai et al. 2024; docs/methods/medusa.md): K residual SiLU blocks on the target's last hidden state.

Head k (1-based) maps the last hidden state ``h_t`` (after the final norm) to logits for the token at
``t + k + 1``: ``W_out^(k) (h_t + SiLU(W_in^(k) h_t + b^(k)))``; the target's own LM head predicts
``t + 1``. ``W_in`` starts at zero and ``W_out`` from the target's LM head, so an untrained head
copies the LM head.

Checkpoint format (FasterDecoding's, also used for the heads ``python -m specbench.train medusa``
writes): a folder or Hub repo holding ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``,
``base_model_name_or_path``) and ``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt``: the state
dict of K ``Sequential(ResBlock x L, Linear(H, V, bias=False))``, keys ``{k}.{l}.linear.weight|bias``
and ``{k}.{L}.weight`` (k, l 0-based). Medusa-2 repos (``medusa-1.0-*``) bundle the same keys under
``medusa_head.`` in the fine-tuned model's (sharded) weight files. A checkpoint without the
``{k}.{L}.weight`` keys means "W_out = the target's LM head" (FasterDecoding copies the LM head into
every head before a non-strict load); such heads share the target's LM head instead of copying it.
The layout (K, L) is read from the keys: the published v1.3 ``config.json`` files under-count heads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

import torch
from torch import nn

from specbench.errors import ConfigError, ModelUnavailable
from specbench.files import atomic_dir
from specbench.hub import hub_reachable
from specbench.manifest import TRAINING_FILE, digest, part_name, save_trained_heads
from specbench.models.parts import part_kind
from specbench.models.vocab import ReducedHead
from specbench.paths import cache_root

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    PartWriter = Callable[[PreTrainedModel, Path], None]
    """Writes a part, loaded or drawn for the target given, into the folder given."""

SOURCES = ("hub", "trained", "random")
WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
BUNDLED_FILES = (
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
    "model.safetensors",
    "pytorch_model.bin",
)
BUNDLED_PREFIX = "medusa_head."
CONFIG_FILE = "config.json"
T = TypeVar("T")
KEY_PATTERN = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


class ResBlock(nn.Module):
    """``x + SiLU(W_in x + b)``; W_in starts at zero so a fresh block is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K Medusa heads; ``checkpoint_state()`` is exactly the published ``medusa_lm_head`` layout.

    With ``lm_head`` given, every head's output layer is the target's LM head itself (shared, frozen,
    neither saved nor trained); otherwise each head owns a ``Linear(H, V)`` (the paper's W_2^(k)).
    """

    def __init__(
        self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1, lm_head: nn.Module | None = None
    ):
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise ConfigError(f"Medusa heads need num_heads >= 1 and num_layers >= 1; got {num_heads} and {num_layers}")
        self.hidden_size, self.vocab_size, self.num_layers = hidden_size, vocab_size, num_layers
        self.heads = nn.ModuleList(self._head(lm_head is None) for _ in range(num_heads))
        # NOTE: a tuple keeps the target's LM head out of this module's parameters and state dict.
        self._shared = (lm_head,) if lm_head is not None else None
        self._reduced: list[ReducedHead] | None = None  # output layers over a reduced draft vocabulary

    def _head(self, own_output: bool) -> nn.Sequential:
        """One head: L residual blocks, then (unless shared) its own output layer."""
        blocks: list[nn.Module] = [ResBlock(self.hidden_size) for _ in range(self.num_layers)]
        if own_output:
            blocks.append(nn.Linear(self.hidden_size, self.vocab_size, bias=False))
        return nn.Sequential(*blocks)

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    @property
    def shares_lm_head(self) -> bool:
        return self._shared is not None

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The heads' tensors in the published layout (``{k}.{l}.linear.weight``, ...)."""
        return self.heads.state_dict()

    def load_checkpoint_state(self, state: dict[str, torch.Tensor], assign: bool = False) -> None:
        """Load tensors in the published layout (strict: every key must fit)."""
        self.heads.load_state_dict(state, strict=True, assign=assign)

    def restrict_vocabulary(self, tokens: torch.Tensor) -> None:
        """Score only ``tokens`` (sorted target ids) from now on: every output layer keeps just their rows."""
        layers = (
            [self._shared[0]] if self._shared is not None else [self._head_part(k)[-1] for k in range(self.num_heads)]
        )
        self._reduced = [ReducedHead(cast(torch.Tensor, layer.weight), tokens) for layer in layers]

    def _head_part(self, k: int) -> nn.Sequential:
        """Head ``k`` as built: its residual blocks, then (unless shared) its output layer."""
        head = self.heads[k]
        assert isinstance(head, nn.Sequential)  # built by _head
        return head

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """Logits of the first ``num_heads`` heads: hidden [..., H] -> [K, ..., V] (-inf outside a reduced
        vocabulary)."""
        if self._reduced is None:
            outputs = torch.stack([head(hidden) for head in self.heads[:num_heads]])  # [K, ..., H or V]
            return self._shared[0](outputs) if self._shared is not None else outputs
        count = len(self.heads[:num_heads])
        blocks = torch.stack([self._head_part(k)[: self.num_layers](hidden) for k in range(count)])  # [K, ..., H]
        if len(self._reduced) == 1:
            return self._reduced[0](blocks)
        return torch.stack([output(block) for output, block in zip(self._reduced, blocks)])


@dataclass
class LoadedHeads:
    """Heads ready for the drafter, where they came from, and their calibration table if any."""

    heads: MedusaHeads
    origin: str  # Hub id, folder, or "random(seed=...)"
    rank_accuracy: list[list[float]] | None  # a_k^(i): P(head k's i-th top token is right), [K][top_k]
    part: str = ""  # how runs name these heads (trained: their weights digest; else where they came from)

    def __post_init__(self) -> None:
        self.part = self.part or f"medusa:{self.origin}"


def checkpoint_layout(state: dict[str, torch.Tensor]) -> tuple[int, int, bool]:
    """(num_heads, num_layers, own output layers?) read from a ``medusa_lm_head`` state dict."""
    matches = [KEY_PATTERN.match(key) for key in state]
    bad = [key for key, m in zip(state, matches) if m is None]
    if bad or not state:
        raise ConfigError(
            f"not a Medusa heads state dict (unexpected keys {bad[:3] or 'none at all'}); "
            f"expected '{{head}}.{{layer}}.linear.weight' / '{{head}}.{{layers}}.weight'"
        )
    found = [m for m in matches if m is not None]  # all of them: no key was bad
    heads = sorted({int(m.group(1)) for m in found})
    layers = sorted({int(m.group(2)) for m in found if m.group(3).startswith("linear")})
    if heads != list(range(len(heads))) or layers != list(range(len(layers))) or not layers:
        raise ConfigError(f"Medusa heads state dict has gaps: heads {heads}, residual layers {layers}")
    outputs = [f"{k}.{len(layers)}.weight" in state for k in heads]
    if any(outputs) and not all(outputs):
        raise ConfigError("Medusa heads state dict has output layers for some heads only")
    return len(heads), len(layers), all(outputs)


def heads_from_state(state: dict[str, torch.Tensor], target: PreTrainedModel) -> MedusaHeads:
    """Build heads for ``target`` from a state dict (no extra copy), on its device and in its dtype."""
    num_heads, num_layers, own_output = checkpoint_layout(state)
    lm_head = target.get_output_embeddings()
    vocab, hidden = lm_head.weight.shape
    found = state["0.0.linear.weight"].shape
    if tuple(found) != (hidden, hidden) or (own_output and state[f"0.{num_layers}.weight"].shape[0] != vocab):
        raise ConfigError(
            f"Medusa heads do not fit this target: residual block {tuple(found)}, target "
            f"hidden size {hidden} and vocabulary {vocab}; use heads trained for this model"
        )
    with torch.device("meta"):
        heads = MedusaHeads(hidden, vocab, num_heads, num_layers, None if own_output else lm_head)
    heads.load_checkpoint_state(state, assign=True)
    return heads.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype).eval().requires_grad_(False)


def random_heads(target: PreTrainedModel, num_heads: int, seed: int, num_layers: int = 1) -> MedusaHeads:
    """Seeded random heads sharing the target's LM head (tests and smoke runs of the machinery)."""
    hidden = target.get_output_embeddings().weight.shape[1]
    return heads_from_state(random_state(hidden, num_heads, num_layers, seed), target)


def random_state(hidden: int, num_heads: int, num_layers: int, seed: int) -> dict[str, torch.Tensor]:
    """The residual blocks of seeded random heads that share the target's LM head, in the checkpoint layout."""
    generator, state = torch.Generator().manual_seed(seed), {}
    for k in range(num_heads):
        for layer in range(num_layers):
            state[f"{k}.{layer}.linear.weight"] = torch.randn(hidden, hidden, generator=generator) / hidden**0.5
            state[f"{k}.{layer}.linear.bias"] = torch.randn(hidden, generator=generator) / hidden**0.5
    return state


def read_tensors(path: Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensors of a .safetensors / .pt / .bin file whose keys start with ``prefix`` (prefix removed)."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            return {
                key[len(prefix) :]: handle.get_tensor(key)
                for key in handle.keys()  # noqa: SIM118 (safe_open handles have keys() but are not iterable)
                if key.startswith(prefix)
            }
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # legacy (non-zip) pickles cannot be memory-mapped
        state = torch.load(path, map_location="cpu", weights_only=True)
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


class CheckpointFiles:
    """Fetches named files of one checkpoint: a local folder, or a Hub repo (cache first)."""

    def __init__(self, path: str, revision: str | None):
        self.path, self.revision = path, revision
        self.local = Path(path).is_dir()

    def get(self, name: str, cached_only: bool) -> Path | None:
        """The file, or None when the folder / repo has no such file."""
        if self.local:
            file = Path(self.path) / name
            return file if file.is_file() else None
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        try:
            return Path(hf_hub_download(self.path, name, revision=self.revision, local_files_only=cached_only))
        except EntryNotFoundError:
            return None


def cached_then_hub(files: CheckpointFiles, read: Callable[[bool], T], complete: Callable[[T], bool], what: str) -> T:
    """``read(cached_only)`` from the local folder or HF cache first, then (when incomplete) from the Hub; offline, a
    ModelUnavailable saying how to get the checkpoint (``what``: e.g. "Medusa heads", with its model.<key>)."""
    found = read(True)
    if complete(found) or files.local:
        return found
    name, key = what.rsplit(" ", 1)
    if not hub_reachable():
        raise ModelUnavailable(
            f"{name} '{files.path}': not in the local Hugging Face cache, and the Hub cannot be reached. Download "
            f"them where you have network (huggingface-cli download {files.path} --local-dir DIR) and run with "
            f"model.{key}.path=DIR."
        )
    try:
        return read(False)
    except OSError as error:  # unknown or gated repo, bad revision, network failure
        raise ModelUnavailable(f"{name} '{files.path}' cannot be downloaded: {error}") from None


def _read_checkpoint(files: CheckpointFiles, cached_only: bool) -> dict[str, torch.Tensor] | None:
    """The heads' state dict from a separate heads file or a bundled (Medusa-2) model; None if absent."""
    for name in WEIGHT_FILES:
        if (file := files.get(name, cached_only)) is not None:
            return read_tensors(file)
    return bundled_tensors(files, BUNDLED_PREFIX, cached_only)


def bundled_tensors(files: CheckpointFiles, prefix: str, cached_only: bool) -> dict[str, torch.Tensor] | None:
    """The tensors under ``prefix`` (removed) in a model's own weight files, single or sharded; None if absent."""
    for name in BUNDLED_FILES:
        if (file := files.get(name, cached_only)) is None:
            continue
        if not name.endswith(".index.json"):
            return read_tensors(file, prefix) or None
        weight_map = json.loads(file.read_text())["weight_map"]
        shards = sorted({shard for key, shard in weight_map.items() if key.startswith(prefix)})
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            if (shard_file := files.get(shard, cached_only)) is None:
                return None  # e.g. the index is cached but this shard is not
            state.update(read_tensors(shard_file, prefix))
        return state or None
    return None


def published_heads(path: str, revision: str | None, target: PreTrainedModel) -> LoadedHeads:
    """Heads from a Hub id or a local folder in FasterDecoding's format (HF cache first, then the Hub)."""
    files = CheckpointFiles(path, revision)
    state = cached_then_hub(files, lambda cached: _read_checkpoint(files, cached), bool, "Medusa heads medusa")
    if state is None:
        raise ConfigError(f"'{path}' holds no Medusa heads (looked for {', '.join(WEIGHT_FILES + BUNDLED_FILES)})")
    calibration = calibration_table(Path(path)) if files.local else None
    return LoadedHeads(heads_from_state(state, target), path, calibration)


def calibration_table(folder: Path) -> list[list[float]] | None:
    """The a_k^(i) table a training run saved beside its heads (``training.json``), if any."""
    training = folder / TRAINING_FILE
    return json.loads(training.read_text()).get("rank_accuracy") if training.is_file() else None


def trained_heads(target_name: str, target: PreTrainedModel) -> LoadedHeads:
    """Our own trained heads for ``target_name`` (only if their manifest says training finished), with the
    calibration table saved beside them."""
    folder, manifest = part_kind("medusa").built(target_name)
    weights = folder / WEIGHT_FILES[0]
    heads = heads_from_state(read_tensors(weights), target)
    return LoadedHeads(heads, str(folder), calibration_table(folder), part_name("medusa", folder, manifest))


def head_source(node, key: str, target_name: str) -> str:
    """The checked ``source`` of a model config's head node (``medusa:`` or ``eagle:``); a hub node needs a path."""
    if node is None:
        raise ConfigError(
            f"model '{target_name}' has no '{key}:' node; add one to its conf/model file "
            f"(source: {' | '.join(SOURCES)})"
        )
    source = node.get("source")
    if source not in SOURCES:
        raise ConfigError(f"model.{key}.source must be one of {SOURCES}; got {source!r}")
    if source == "hub" and not node.get("path"):
        raise ConfigError(f"model.{key}.path must name a Hub repo or folder when model.{key}.source=hub")
    return str(source)


def part_files(
    node,
    kind: str,
    target_name: str,
    target_path: str,
    revision: str | None,
    write_part: PartWriter,
    converted: bool = False,
) -> tuple[str, str]:
    """Where an engine that loads parts from files (vLLM) finds the part a ``kind:`` model node names, and how runs
    name it (as the shared loop's loader does): a published part's Hub id or folder, a trained part's cache folder;
    a random part, or with ``converted`` (the engine reads another layout) any part, is written once under
    ``$SPECBENCH_CACHE/vllm/<kind>/`` by ``write_part(target, folder)``, which loads it from the node as the loop
    does."""
    source = head_source(node, kind, target_name)
    if source == "hub":
        part = f"{kind}:{node['path']}"
        if not converted:
            return str(node["path"]), part
    elif source == "trained":
        folder, manifest = part_kind(kind).built(target_name)
        part = part_name(kind, folder, manifest)
        if not converted:
            return str(folder), part
    else:
        part = f"{kind}:random(seed={int(node.get('seed', 0))})"
    key: dict[str, object]
    if source == "random":  # named by its seed and shape
        key = {"node": {str(name): node.get(name) for name in node}}
    else:
        key = {"part": part, "written": local_stamp(node, source)}
    folder = cache_root() / "vllm" / kind / digest({**key, "target": target_path, "revision": revision})
    if not folder.is_dir():  # written atomically: a folder that exists is complete
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(target_path, revision=revision, dtype=torch.float32)
        with atomic_dir(folder) as staging:
            write_part(target, staging)
    return str(folder), part


def local_stamp(node, source: str) -> int | None:
    """When a published part in a local folder was last written (its files' latest mtime, ns), so that a converted
    copy follows the folder's contents; None for Hub ids and trained parts (named by id or weights digest)."""
    folder = Path(str(node["path"])) if source == "hub" else None
    if folder is None or not folder.is_dir():
        return None
    return max((file.stat().st_mtime_ns for file in folder.iterdir() if file.is_file()), default=0)


def load_heads(node, target: PreTrainedModel, target_name: str) -> LoadedHeads:
    """The heads a ``conf/model/*.yaml`` ``medusa:`` node names, bound to ``target``."""
    source = head_source(node, "medusa", target_name)
    if source == "hub":
        return published_heads(node["path"], node.get("revision"), target)
    if source == "trained":
        return trained_heads(target_name, target)
    seed = int(node.get("seed", 0))
    heads = random_heads(target, int(node.get("num_heads", 4)), seed, int(node.get("num_layers", 1)))
    return LoadedHeads(heads, f"random(seed={seed})", None)


def save_heads(heads: MedusaHeads, folder: Path, base_model: str, training: dict) -> None:
    """Write heads + config.json + training.json and, last, manifest.json into ``folder`` atomically."""
    config = {
        "medusa_num_heads": heads.num_heads,
        "medusa_num_layers": heads.num_layers,
        "base_model_name_or_path": base_model,
        "hidden_size": heads.hidden_size,
        "vocab_size": heads.vocab_size,
        "shares_lm_head": heads.shares_lm_head,
    }
    save_trained_heads(folder, "Medusa heads", WEIGHT_FILES[0], heads.checkpoint_state(), CONFIG_FILE, config, training)


# -- vLLM's Medusa ------------------------------------------------------------------------------------


def node_state(node, target_name: str, hidden: int) -> tuple[dict[str, torch.Tensor], str]:
    """The checkpoint-layout state dict of the heads a ``medusa:`` node names, read from files (no target loaded),
    and how runs name them (as ``load_heads``'s ``LoadedHeads.part``)."""
    source = head_source(node, "medusa", target_name)
    if source == "hub":
        files = CheckpointFiles(node["path"], node.get("revision"))
        state = cached_then_hub(files, lambda cached: _read_checkpoint(files, cached), bool, "Medusa heads medusa")
        if state is None:
            raise ConfigError(f"'{node['path']}' holds no Medusa heads (looked for {', '.join(WEIGHT_FILES)})")
        return state, f"medusa:{node['path']}"
    if source == "trained":
        folder, manifest = part_kind("medusa").built(target_name)
        return read_tensors(folder / WEIGHT_FILES[0]), part_name("medusa", folder, manifest)
    seed = int(node.get("seed", 0))
    state = random_state(hidden, int(node.get("num_heads", 4)), int(node.get("num_layers", 1)), seed)
    return state, f"medusa:random(seed={seed})"


def output_embedding(target_path: str, revision: str | None) -> torch.Tensor:
    """The target's LM head weight [vocab, hidden] read from its checkpoint files (the input embedding when tied)."""
    files = CheckpointFiles(target_path, revision)
    for prefix in ("lm_head.", "model.embed_tokens."):
        try:
            found = bundled_tensors(files, prefix, cached_only=files.local)
        except OSError as error:  # a Hub target neither cached nor reachable
            raise ModelUnavailable(f"the target's checkpoint {target_path} cannot be read: {error}") from None
        if found and "weight" in found:
            return found["weight"]
    raise ConfigError(f"no lm_head.weight or model.embed_tokens.weight in the checkpoint {target_path}")


def vllm_state(state: dict[str, torch.Tensor], lm_head: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """A checkpoint-layout state dict in the names vLLM's Medusa model loads: residual layers as
    ``blocks.{k}.layers.{l}.weight|bias``, output layers as ``lm_heads.{k}.weight``; heads that share the target's LM
    head (``lm_head`` given) carry it once, as ``lm_heads.0.weight`` (read with ``original_lm_head``)."""
    renamed = {}
    for key, tensor in state.items():
        match = KEY_PATTERN.match(key)
        assert match is not None  # checked by checkpoint_layout
        head, layer, kind = match.groups()
        output = kind == "weight"
        renamed[f"lm_heads.{head}.weight" if output else f"blocks.{head}.layers.{layer}.{kind.split('.')[1]}"] = tensor
    if lm_head is not None:
        renamed["lm_heads.0.weight"] = lm_head.contiguous()
    return renamed


def vllm_checkpoint(node, target_name: str, target_path: str, revision: str | None) -> tuple[str, str]:
    """The heads a ``medusa:`` node names as a folder vLLM's ``medusa`` speculation loads (written once under
    ``$SPECBENCH_CACHE/vllm/medusa/``: config.json and model.safetensors, the residual layers with their biases), and
    how runs name them. vLLM drafts the top-1 token of each head: a chain."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(target_path, revision=revision)
    state, part = node_state(node, target_name, target.hidden_size)
    num_heads, num_layers, own_output = checkpoint_layout(state)
    folder = cache_root() / "vllm" / "medusa" / digest({"part": part, "target": target_path, "revision": revision})
    if (folder / "model.safetensors").is_file():
        return str(folder), part
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "num_heads": num_heads,
        "num_hidden_layers": num_layers,
        "hidden_size": target.hidden_size,
        "vocab_size": target.vocab_size,
        "medusa_fc_bias": True,  # the residual layers have biases (vLLM's default drops them)
        "original_lm_head": not own_output,  # one LM head, the target's, for every head
    }
    lm_head = None if own_output else output_embedding(target_path, revision)
    with atomic_dir(folder) as staging:
        save_file(vllm_state(state, lm_head), str(staging / "model.safetensors"))
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return str(folder), part
