"""Self-Draft's corpus cache for a target tokenizer: text -> tokens -> n-gram continuations, built once.

The cache file lives under ``$SPECBENCH_CACHE/corpus/``; its name holds a digest of the tokenizer
(vocabulary size + a fingerprint of its full definition), the text source and the build settings, so
models sharing a tokenizer share a cache and any change builds a new one. The text comes from local
``.txt`` files or a Hugging Face Hub dataset (never from an evaluation set: that leaks test text).

    python -m specbench.corpus build model=smollm2_135m [corpus.source=files corpus.files=DIR] \\
        [corpus.top_k=20] [force=true]
    python -m specbench.corpus show model=smollm2_135m
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specbench.cli import ArgumentParser, user_errors
from specbench.config import compose_config
from specbench.errors import ConfigError, DataUnavailable, UserError
from specbench.hub import hub_reachable
from specbench.paths import cache_root
from specbench.structures.corpus_cache import SETTINGS, CorpusCache, check_settings, read_header

SOURCES = ("auto", "files", "hub")
HUB_FIELDS = ("path", "name", "split", "text_field")
KEYS = ("source", "files", "hub", "max_tokens", *SETTINGS)  # the corpus node (conf/corpus/default.yaml)
BATCH_CHARS = 1 << 20  # characters per tokenizer call (keeps the fast tokenizer's threads busy)
BATCH_TEXTS = 1024


@dataclass(frozen=True)
class CorpusSpec:
    """A validated ``corpus`` config node: where the text comes from and how the cache is built."""

    source: str  # files | hub (auto already resolved)
    files: str | None
    hub: dict
    max_tokens: int | None
    settings: dict  # max_key_len, continuation_len, top_k, min_count

    @classmethod
    def from_cfg(cls, cfg) -> CorpusSpec:
        """Validate a config node (DictConfig or dict); ``source: auto`` = files when set, else hub."""
        if isinstance(cfg, CorpusSpec):
            return cfg
        cfg = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
        unknown = sorted(set(cfg) - set(KEYS))
        if unknown:
            raise ConfigError(f"unknown corpus key(s) {', '.join(unknown)}; valid keys: {', '.join(KEYS)}")
        source, files = cfg.get("source", "auto"), cfg.get("files")
        if source not in SOURCES:
            raise ConfigError(f"corpus.source must be one of {', '.join(SOURCES)}; got {source!r}")
        if source == "auto":
            source = "files" if files else "hub"
        if source == "files" and not files:
            raise ConfigError(
                "corpus.source=files needs corpus.files=DIR (a folder of .txt files, one file or a "
                "glob), or set SPECBENCH_CORPUS_DIR=DIR"
            )
        hub = dict(cfg.get("hub") or {})
        if source == "hub" and any(not hub.get(field) for field in ("path", "split", "text_field")):
            raise ConfigError(f"corpus.source=hub needs corpus.hub.path, .split and .text_field; got {hub}")
        max_tokens = cfg.get("max_tokens")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise ConfigError(f"corpus.max_tokens must be an integer >= 1 or null (no cap); got {max_tokens!r}")
        settings = check_settings(**{name: cfg.get(name) for name in SETTINGS})
        return cls(source, files, {field: hub.get(field) for field in HUB_FIELDS}, max_tokens, settings)

    def files_path(self) -> Path:
        """``files`` with ``~`` expanded (a files source always has it: ``from_cfg`` checks)."""
        assert self.files is not None, "a Hub corpus source has no files"
        return Path(self.files).expanduser()

    def file_paths(self) -> list[Path]:
        """The .txt files of ``files`` (a folder, searched recursively; one file; or a glob), sorted."""
        pattern = str(self.files_path())
        if Path(pattern).is_dir():
            paths = sorted(Path(pattern).rglob("*.txt"))
        else:
            paths = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
        if not paths:
            raise DataUnavailable(
                f"corpus.files={self.files!r} matches no .txt files (give a folder of .txt "
                f"files, one file, or a glob such as 'DIR/**/*.txt')"
            )
        return paths

    def identity(self) -> dict:
        """What the cache content depends on besides the tokenizer (files: their bytes, not their path)."""
        if self.source == "hub":
            return {"kind": "hub", **self.hub, "max_tokens": self.max_tokens}
        digest, total = hashlib.sha256(), 0
        paths = self.file_paths()
        for path in paths:
            data = path.read_bytes()
            digest.update(len(data).to_bytes(8, "little") + data)
            total += len(data)
        return {
            "kind": "files",
            "files": len(paths),
            "bytes": total,
            "sha256": digest.hexdigest()[:16],
            "max_tokens": self.max_tokens,
        }

    def location(self) -> str:
        """Where the text comes from, for people (a path or a Hub dataset id)."""
        if self.source == "files":
            return str(self.files_path().resolve())
        name = f" ({self.hub['name']})" if self.hub["name"] else ""
        return f"hub:{self.hub['path']}{name} split={self.hub['split']} field={self.hub['text_field']}"

    def label(self) -> str:
        """A short file-name-safe name of the source (the folder of the files, or the Hub config)."""
        if self.source == "hub":
            raw = self.hub["name"] or self.hub["path"]
        else:
            path = self.files_path()
            while glob.has_magic(str(path)):
                path = path.parent
            raw = path.stem
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw) or "corpus"

    def texts(self) -> Iterator[str]:
        """The corpus documents in a fixed order: one per file, or one per Hub row (Hub probed now)."""
        if self.source == "files":
            return (path.read_text(encoding="utf-8", errors="replace") for path in self.file_paths())
        if not hub_reachable():
            raise DataUnavailable(
                f"The corpus source is {self.location()}, but the Hugging Face Hub cannot be reached. Offline, "
                f"build from local text files: corpus.source=files corpus.files=DIR (a folder of .txt files; "
                f"method.drafter.corpus.files in a run), or set SPECBENCH_CORPUS_DIR=DIR."
            )
        return self._hub_texts()

    def _hub_texts(self) -> Iterator[str]:
        """Stream the Hub split row by row (only what ``max_tokens`` needs is read)."""
        import datasets

        rows = datasets.load_dataset(self.hub["path"], self.hub["name"], split=self.hub["split"], streaming=True)
        field = self.hub["text_field"]
        for row in rows:
            if field not in row:
                raise ConfigError(
                    f"corpus.hub.text_field={field!r} is not a column of {self.hub['path']}; columns: {', '.join(row)}"
                )
            yield row[field]


def tokenizer_identity(tokenizer) -> dict:
    """Vocabulary size and a fingerprint of the tokenizer's full definition (equal ones share a cache)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    definition = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return {"vocab_size": len(tokenizer), "fingerprint": hashlib.sha256(definition.encode()).hexdigest()[:16]}


def tokenizer_name(tokenizer) -> str:
    """A readable tokenizer name: the last part of its Hub id or folder."""
    return Path(str(getattr(tokenizer, "name_or_path", "") or "tokenizer")).name


def cache_identity(tokenizer, spec: CorpusSpec) -> dict:
    """The header sections a stored cache must match: tokenizer, source and build settings."""
    return {"tokenizer": tokenizer_identity(tokenizer), "source": spec.identity(), "settings": spec.settings}


def cache_dir() -> Path:
    """Where corpus caches are stored: ``$SPECBENCH_CACHE/corpus``."""
    return cache_root() / "corpus"


def cache_path(spec: CorpusSpec, identity: dict) -> Path:
    """``<source>-v<vocab size>-<digest>.npz``; the digest covers every field of ``identity``.

    NOTE: no model name in it, so models with identical tokenizers share one cache.
    """
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{spec.label()}-v{identity['tokenizer']['vocab_size']}-{digest}.npz"


def batches(texts: Iterable[str]) -> Iterator[list[str]]:
    """Non-blank texts grouped into tokenizer calls of about BATCH_CHARS characters."""
    batch, chars = [], 0
    for text in texts:
        if not text.strip():
            continue
        batch.append(text)
        chars += len(text)
        if chars >= BATCH_CHARS or len(batch) >= BATCH_TEXTS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def token_streams(
    tokenizer, texts: Iterable[str], max_tokens: int | None, on_tokens: Callable[[int], object] = lambda n: None
) -> Iterator[list[int]]:
    """Each text's token ids (no special tokens), batch-tokenized; the last one cut at ``max_tokens``."""
    remaining = max_tokens
    for batch in batches(texts):
        encoded = tokenizer(batch, add_special_tokens=False, return_attention_mask=False, verbose=False)
        for ids in encoded["input_ids"]:
            if remaining is not None:
                ids = ids[:remaining]
                remaining -= len(ids)
            on_tokens(len(ids))
            yield ids
            if remaining == 0:
                return


def build_corpus_cache(tokenizer, spec: CorpusSpec, identity: dict, progress: bool = True) -> CorpusCache:
    """Tokenize the source (with a progress bar) and count its n-gram continuations."""
    provenance = {
        "tokenizer": {"name": tokenizer_name(tokenizer), **identity["tokenizer"]},
        "source": {**identity["source"], "location": spec.location()},
    }
    texts = spec.texts()
    if progress:
        print(f"[specbench] building the corpus cache once from {spec.location()}", file=sys.stderr)
    total = spec.max_tokens if spec.source == "hub" else None  # a file corpus's size in tokens is unknown
    with tqdm(total=total, unit="tok", unit_scale=True, desc=f"corpus {spec.label()}", disable=not progress) as bar:
        streams = token_streams(tokenizer, texts, spec.max_tokens, bar.update)
        return CorpusCache.build(streams, **spec.settings, provenance=provenance)


def corpus_cache_for(tokenizer, corpus_cfg, progress: bool = True, rebuild: bool = False) -> CorpusCache:
    """Load the cache for (tokenizer, source, build settings) from $SPECBENCH_CACHE/corpus/..., or build
    and store it once (with a progress bar) when missing or when ``rebuild``.

    ``corpus_cfg``: a ``corpus`` config node (conf/corpus/default.yaml shape) or a ``CorpusSpec``.
    """
    spec = CorpusSpec.from_cfg(corpus_cfg)
    identity = cache_identity(tokenizer, spec)
    path = cache_path(spec, identity)
    if path.is_file() and not rebuild:
        cache = CorpusCache.load(path, expect=identity)
    else:
        cache = build_corpus_cache(tokenizer, spec, identity, progress)
        cache.save(path)
    cache.part = f"corpus:{path.stem}"
    return cache


# --- command line ---------------------------------------------------------------------------------


def compose_corpus_config(overrides: list[str]) -> DictConfig:
    """``conf/corpus.yaml`` (model + corpus node) with Hydra overrides."""
    return compose_config(*overrides, config_name="corpus")


def build_command(cfg: DictConfig) -> None:
    """Build (or, unless ``force``, load) the configured cache and print its description."""
    spec = CorpusSpec.from_cfg(cfg.corpus)  # config errors before torch/transformers load
    from specbench.models.loading import load_tokenizer

    cache = corpus_cache_for(load_tokenizer(cfg.model), spec, progress=cfg.progress, rebuild=cfg.force)
    print(json.dumps(cache.describe(), indent=2))


def cache_listing_line(path: Path) -> str:
    """One stored cache: file, tokenizer, source, keys, continuations, size."""
    try:
        header = read_header(path)
    except (UserError, OSError, ValueError, KeyError) as error:
        return f"{path.name}: unreadable ({error})"
    source = header.get("source", {})
    return (
        f"{path.name}: tokenizer {header['tokenizer'].get('name')} (vocab {header['tokenizer'].get('vocab_size')}), "
        f"{source.get('location', source.get('kind'))}, {header['keys']} keys, {header['continuations']} "
        f"continuations, {header['settings']}, {path.stat().st_size / 1e3:,.0f} kB"
    )


def show_command(cfg: DictConfig) -> None:
    """Say whether the configured cache is built (and describe it), then list every stored cache."""
    spec = CorpusSpec.from_cfg(cfg.corpus)
    from specbench.models.loading import load_tokenizer

    tokenizer = load_tokenizer(cfg.model)
    identity = cache_identity(tokenizer, spec)
    path = cache_path(spec, identity)
    if path.is_file():
        print(f"configured cache (model {cfg.model.name}): {path}")
        print(json.dumps(CorpusCache.load(path, expect=identity).describe(), indent=2))
    else:
        print(
            f"configured cache (model {cfg.model.name}) is not built yet: {path}\n"
            f"build it with: python -m specbench.corpus build model={cfg.model.name} [corpus.* overrides]"
        )
    stored = sorted(cache_dir().glob("*.npz"))
    print(f"\n{len(stored)} stored in {cache_dir()}")
    for stored_path in stored:
        print(f"  {cache_listing_line(stored_path)}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """``build`` / ``show`` plus Hydra overrides."""
    parser = ArgumentParser(prog="python -m specbench.corpus", description=__doc__.splitlines()[0])
    parser.add_argument(
        "command", choices=("build", "show"), help="build: make (or load) the configured cache; show: what is cached"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides, e.g. model=smollm2_135m corpus.source=files corpus.files=DIR force=true",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one command; user and config errors are printed in one line (exit status 2)."""
    args = parse_args(argv)
    with user_errors(argv):
        cfg = compose_corpus_config(args.overrides)
        (build_command if args.command == "build" else show_command)(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
