"""REST: retrieval-based speculative decoding (He et al., NAACL 2024), on the shared loop.

A datastore (``specbench.structures.datastore``: a suffix array over a corpus tokenised with the target's
tokenizer) is built once per (tokenizer, corpus) and cached under ``$SPECBENCH_CACHE/datastore/``. Each step:

1. the longest suffix of the committed tokens (``n_max`` down to ``n_min`` tokens) that occurs in the corpus
   followed by a token is found by binary search;
2. the ``m``-token continuations of its first ``k`` occurrences are retrieved; sorted as the suffix array
   lists them they are the trie of the continuations, each node weighted by how many continuations pass it;
3. the ``c`` heaviest nodes (a subtree: a parent weighs at least as much as its children) are verified as
   one draft tree by the shared loop.

Drafts are deterministic (one-hot), so ``match`` keeps decoding exact at any temperature. Symbols, defaults
and the differences from the official code: docs/methods/rest.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from specbench.core.drafter import DecodeContext, Drafter, knob_choice, knob_int
from specbench.core.tree import DraftTree
from specbench.errors import ConfigError
from specbench.paths import cache_root
from specbench.structures.datastore import FORMAT_VERSION, SuffixDatastore, draft_nodes

if TYPE_CHECKING:
    from specbench.corpus import CorpusSpec

DATASTORE_KEYS = ("source", "files", "hub", "max_tokens")
"""The keys of ``method.drafter.datastore``: the text source, resolved as a ``corpus`` node's (conf/corpus/)."""

_UNUSED_CACHE_SETTINGS = dict(max_key_len=1, continuation_len=1, top_k=1, min_count=0)
"""Self-Draft's corpus-cache settings, which ``CorpusSpec`` validates and the datastore never reads."""


def datastore_spec(node: Mapping | DictConfig | None) -> CorpusSpec | None:
    """The validated text source of ``method.drafter.datastore`` (None when no node is given)."""
    if node is None:
        return None
    from specbench.corpus import CorpusSpec

    cfg = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    assert isinstance(cfg, dict)
    unknown = sorted(set(cfg) - set(DATASTORE_KEYS))
    if unknown:
        raise ConfigError(
            f"method.drafter.datastore has unknown key(s) {', '.join(map(str, unknown))}; "
            f"valid keys: {', '.join(DATASTORE_KEYS)}"
        )
    try:
        return CorpusSpec.from_cfg({**cfg, **_UNUSED_CACHE_SETTINGS})
    except ConfigError as error:  # its messages name the corpus node's keys, which this node shares
        raise ConfigError(f"method.drafter.datastore: {error}") from None


def datastore_identity(tokenizer, spec: CorpusSpec) -> dict:
    """The header sections a stored datastore must match: the tokenizer and the text source."""
    from specbench.corpus import tokenizer_identity

    return {"tokenizer": tokenizer_identity(tokenizer), "source": spec.identity()}


def datastore_path(spec: CorpusSpec, identity: dict) -> Path:
    """``$SPECBENCH_CACHE/datastore/<source>-v<vocab size>-<digest>.npz``; the digest covers the identity
    and the file format, so models sharing a tokenizer share a datastore and any corpus change builds anew."""
    keyed = {**identity, "format_version": FORMAT_VERSION}
    digest = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "datastore" / f"{spec.label()}-v{identity['tokenizer']['vocab_size']}-{digest}.npz"


def build_datastore(tokenizer, spec: CorpusSpec, identity: dict, progress: bool = True) -> SuffixDatastore:
    """Tokenize the source (with a progress bar, as the corpus cache does) and index it."""
    from tqdm import tqdm

    from specbench.corpus import token_streams, tokenizer_name

    provenance = {
        "tokenizer": {"name": tokenizer_name(tokenizer), **identity["tokenizer"]},
        "source": {**identity["source"], "location": spec.location()},
    }
    texts = spec.texts()
    if progress:
        print(f"[specbench] building the REST datastore once from {spec.location()}", file=sys.stderr)
    total = spec.max_tokens if spec.source == "hub" else None
    with tqdm(total=total, unit="tok", unit_scale=True, desc=f"datastore {spec.label()}", disable=not progress) as bar:
        streams = token_streams(tokenizer, texts, spec.max_tokens, bar.update)
        return SuffixDatastore.build(streams, provenance=provenance)


def datastore_for(tokenizer, spec: CorpusSpec, progress: bool = True, rebuild: bool = False) -> SuffixDatastore:
    """Load the datastore of (tokenizer, source) from the cache (once per process), or build and store it."""
    identity = datastore_identity(tokenizer, spec)
    path = datastore_path(spec, identity)
    if path.is_file() and not rebuild:
        stat = path.stat()
        store = _load(str(path), stat.st_mtime_ns, stat.st_size, json.dumps(identity, sort_keys=True))
    else:
        store = build_datastore(tokenizer, spec, identity, progress)
        store.save(path)
    store.part = f"datastore:{path.stem}"
    return store


@functools.lru_cache(maxsize=2)
def _load(path: str, mtime_ns: int, size: int, expect: str) -> SuffixDatastore:
    """One stored datastore, read once per process (the warm-up and the timed engine share it; it is read-only)."""
    return SuffixDatastore.load(path, expect=json.loads(expect))


class Rest(Drafter):
    """REST drafter: the heaviest nodes of the trie of continuations retrieved for the longest matching suffix."""

    COUNTERS = ("steps", "hits", "suffix_tokens", "retrieved", "nodes_proposed", "depth_proposed")

    def __init__(
        self,
        max_suffix_len: int = 16,
        min_suffix_len: int = 2,
        num_retrieved: int = 5000,
        continuation_len: int = 10,
        num_draft: int = 64,
        official_cut: bool = False,
        datastore: Mapping | DictConfig | None = None,
    ):
        super().__init__()
        self.n_max = knob_int("max_suffix_len", max_suffix_len, 1, "n_max")
        self.n_min = knob_int("min_suffix_len", min_suffix_len, 1, "n_min")
        if self.n_min > self.n_max:
            raise ConfigError(
                f"method.drafter.min_suffix_len (n_min = {self.n_min}) must not exceed "
                f"method.drafter.max_suffix_len (n_max = {self.n_max})"
            )
        self.k = knob_int("num_retrieved", num_retrieved, 1, "k")
        self.m = knob_int("continuation_len", continuation_len, 1, "m")
        self.c = knob_int("num_draft", num_draft, 1, "c")
        self.official_cut = knob_choice("official_cut", official_cut, (False, True))
        self.spec = datastore_spec(datastore)
        self.datastore: SuffixDatastore | None = None  # loaded (or built) by setup; tests may set it directly

    # -- Drafter interface -------------------------------------------------------------------------

    def setup(self, target, tokenizer) -> None:
        """Load (or build once) the datastore for the target's tokenizer and check its ids fit the target."""
        if self.datastore is None:
            if self.spec is None:
                raise ConfigError("method.drafter.datastore (the corpus REST retrieves from) is missing")
            if tokenizer is None:
                warnings.warn(
                    "REST: the target has no tokenizer, so no datastore can be built from text; REST drafts nothing",
                    stacklevel=2,
                )
                self.datastore = SuffixDatastore.build([])
            else:
                self.datastore = datastore_for(tokenizer, self.spec)
        embeddings = target.get_input_embeddings() if target is not None else None
        largest = int(self.datastore.info.get("max_token_id", -1))
        if embeddings is not None and largest >= embeddings.num_embeddings:
            raise ConfigError(
                f"the REST datastore holds token id {largest}, but the target's vocabulary has "
                f"{embeddings.num_embeddings} tokens (was it built with another tokenizer?)"
            )

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """The ``c`` heaviest trie nodes of the continuations of the longest matching context suffix."""
        assert self.datastore is not None, "Rest.setup loads the datastore"
        depth = min(self.m, ctx.remaining - 1)  # deeper nodes could never be emitted
        self.books.add(steps=1)
        if depth < 1:
            return DraftTree.root_only(ctx.root)
        with self.books.timed("retrieve"):
            found = self.datastore.search(ctx.tokens, self.n_max, self.n_min, self.k, depth)
            tokens, parents = draft_nodes(found.rows, self.c, self.official_cut)
        tree = DraftTree([ctx.root, *tokens], [-1, *(parent + 1 for parent in parents)])
        if tokens:
            self.books.add(
                hits=1,
                suffix_tokens=found.suffix_len,
                retrieved=len(found.rows),
                nodes_proposed=len(tokens),
                depth_proposed=tree.depth,
            )
        return tree

    def stats(self) -> dict[str, Any]:
        """The books, the datastore's size, and per-step / per-hit rates."""
        books = self.books
        corpus = (self.datastore.info.get("corpus") if self.datastore is not None else None) or {}
        return {
            **books.report(),
            "datastore_tokens": corpus.get("tokens", 0),
            "datastore_documents": corpus.get("documents", 0),
            "hit_rate": books.per("hits", "steps"),
            "suffix_len_per_hit": books.per("suffix_tokens", "hits"),
            "retrieved_per_hit": books.per("retrieved", "hits"),
            "nodes_per_step": books.per("nodes_proposed", "steps"),
            "depth_per_step": books.per("depth_proposed", "steps"),
        }

    def artefacts(self) -> list[str]:
        """The datastore (``datastore:<source>-v<vocab>-<digest>``), when one was loaded from the cache."""
        return [self.datastore.part] if self.datastore is not None and self.datastore.part else []
