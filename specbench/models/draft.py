"""Draft models for the draft-model methods (SpeDe, OPT-Tree, fixed trees, HF assisted generation).

``load_draft`` loads the draft a model config's ``draft`` node names (``conf/model/*.yaml``) onto the
target's device and dtype and checks that it shares the target's tokenizer (``check_vocab``). The
drafters that run it live in ``specbench/drafters/draft_model.py``; HF assisted generation
(``specbench/engines.py``) loads it here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specbench.errors import ConfigError, ModelUnavailable
from specbench.manifest import finished_manifest, part_name
from specbench.models.loading import build_tiny_llama, load_pretrained
from specbench.models.parts import part_kind

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DRAFT_SOURCES = ("hub", "tiny", "target")
"""Where a draft node's model may come from besides its part kind's own (the distilled draft, the PARD draft)."""


@dataclass
class LoadedDraft:
    """A draft model ready to run beside its target."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None  # None when the draft ships no tokenizer (tiny random drafts)
    path: str  # where the weights came from (recorded in stats)
    part: str = ""  # how runs name this draft (distilled: its weights digest; else where it came from)

    def __post_init__(self) -> None:
        self.part = self.part or f"draft:{self.path}"


def vocab_width(model) -> int:
    """Number of logits the model produces per position."""
    return model.get_output_embeddings().weight.shape[0]


def distilled_dir(target_name: str, kind: str = "draft") -> tuple[Path, str]:
    """The folder of the draft part ``kind`` (``draft``: the distilled draft; ``pard``: the PARD draft) built for
    ``target_name`` and its part name, or a ModelUnavailable saying how to build it (also when its manifest does not
    say training finished)."""
    part = part_kind(kind)
    directory, command = part.folder(target_name), part.command_line(target_name)
    if not directory.is_dir():
        raise ModelUnavailable(
            f"no {part.title} for {target_name} at {directory}; train it once with "
            f"`{command}` or set model.{part.node}.path=<Hub id or dir>"
        )
    return directory, part_name(kind, directory, finished_manifest(directory, part.title, command))


def draft_location(cfg, target_name: str, target_path: str, kind: str = "draft") -> tuple[str, str]:
    """Where the draft a ``model.draft`` node (or the node of another draft part ``kind``: ``model.pard``) names lives
    (a folder or Hub id) and how runs name it, for a draft kept in files (a path, the part built here, or the target
    itself); a ConfigError for one that is not."""
    built = part_kind(kind).built_source
    sources = (*DRAFT_SOURCES, built)
    source = cfg.get("source", "hub") if cfg is not None else "hub"
    path = cfg.get("path") if cfg is not None else None
    if source not in sources:
        raise ConfigError(f"model.{kind}.source must be one of {sources}; got {source!r}")
    if path:
        location = os.path.expanduser(str(path))
        revision = cfg.get("revision")
        return location, f"{kind}:{location}" + (f"@{revision}" if revision else "")
    if source == built:
        directory, part = distilled_dir(target_name, kind)
        return str(directory), part
    if source == "target":
        return target_path, "draft:target"
    if source == "tiny":
        raise ConfigError(
            "a tiny random draft exists only in memory; set model.draft.path=<folder> to run it from files"
        )
    raise ConfigError(
        f"this method needs a draft model but model {target_name} names none: set "
        f"model.draft.path=<Hub id or local dir> (a causal LM sharing the target's tokenizer)"
    )


def load_draft(cfg, target_name: str, target, tokenizer, kind: str = "draft") -> LoadedDraft:
    """The draft described by a ``model.draft`` node (or a ``kind`` part's node), on the target's device/dtype,
    tokenizer-checked.

    ``path`` (a Hub id or a local directory) wins over ``source`` whenever it is set, so any
    checkpoint can be tried with ``model.draft.path=...``.
    """
    source = cfg.get("source", "hub") if cfg is not None else "hub"
    if source == "target" and not (cfg.get("path") if cfg is not None else None):
        return LoadedDraft(target, tokenizer, "target")
    if source == "tiny" and not cfg.get("path"):
        tiny = dict(cfg.tiny)
        model = build_tiny_llama(vocab_width(target), device=target.device, dtype=target.dtype, **tiny)
        draft_tokenizer = None
        location, part = f"tiny-random-llama(seed={tiny.get('seed')})", ""
    else:
        location, part = draft_location(cfg, target_name, "", kind)
        revision = cfg.get("revision") if cfg.get("path") else None
        model, draft_tokenizer = load_pretrained(location, target.dtype, revision)
    model = model.to(device=target.device, dtype=target.dtype).eval()
    check_vocab(model, draft_tokenizer, target, tokenizer, location)
    return LoadedDraft(model, draft_tokenizer, location, part)


def check_vocab(draft, draft_tokenizer, target, tokenizer, location: str) -> None:
    """Refuse a draft whose token ids do not mean what the target's mean.

    With both tokenizers at hand every id the two vocabularies share must map to the same token
    (Llama-68M's 32000 ids inside CodeLlama's 32016 pass); without a draft tokenizer the sizes
    must be equal.
    """
    v_draft, v_target = vocab_width(draft), vocab_width(target)
    if draft_tokenizer is None or tokenizer is None:
        if v_draft != v_target:
            raise ConfigError(
                f"draft {location} has {v_draft} token ids but the target has {v_target}, and "
                f"no tokenizer shows they agree; a draft must share the target's tokenizer"
            )
        return
    shared = min(v_draft, v_target)
    target_vocab = tokenizer.get_vocab()
    bad = [
        (token, i) for token, i in draft_tokenizer.get_vocab().items() if i < shared and target_vocab.get(token) != i
    ]
    if bad:
        token, i = bad[0]
        raise ConfigError(
            f"draft {location} does not share the target's tokenizer: {len(bad)} of its ids "
            f"below {shared} mean other tokens (e.g. id {i} is {token!r} in the draft, "
            f"id {target_vocab.get(token)} in the target)"
        )
