"""Self-Draft's corpus cache: counting, top-k / threshold, longest-suffix lookup, storage, caching, CLI."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter, defaultdict

import numpy as np
import pytest

from specbench import corpus
from specbench.corpus import CorpusSpec, corpus_cache_for
from specbench.errors import ConfigError, DataUnavailable
from specbench.structures.corpus_cache import CorpusCache, CorpusCacheMismatch
from tests.conftest import ROOT

SENTENCES = [
    "The president spoke to the Congress about the state of the union.",
    "We must work together for the future of our children.",
    "The state of the union is strong, and the future is bright.",
]


def brute_force(streams, max_key_len, continuation_len, top_k, min_count):
    """Reference table from a Counter over every (key, continuation) window inside each stream."""
    seen = Counter()
    for stream in streams:
        for key_len in range(1, max_key_len + 1):
            for i in range(len(stream) - key_len - continuation_len + 1):
                seen[tuple(stream[i : i + key_len]), tuple(stream[i + key_len : i + key_len + continuation_len])] += 1
    table = defaultdict(list)
    for (key, cont), count in seen.items():
        if count > min_count:
            table[key].append((cont, count))
    return {key: sorted(pairs, key=lambda pair: (-pair[1], pair[0]))[:top_k] for key, pairs in table.items()}


def stored(cache: CorpusCache) -> dict:
    """Every key's (continuation, count) pairs."""
    return {key: cache.continuations(key) for key in cache._continuations}


@pytest.mark.parametrize("seed", range(30))
def test_build_matches_brute_force(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 40, 200_000, 2**31])  # 1 to 3 tokens per packed uint64 word
    alphabet = [rng.randrange(vocab) for _ in range(rng.choice([2, 3, 4]))]
    streams = [[rng.choice(alphabet) for _ in range(rng.randrange(0, 50))] for _ in range(rng.randrange(0, 5))]
    settings = dict(
        max_key_len=rng.randint(1, 4),
        continuation_len=rng.randint(1, 4),
        top_k=rng.randint(1, 5),
        min_count=rng.randint(0, 3),
    )
    cache = CorpusCache.build(streams, **settings)
    assert stored(cache) == brute_force(streams, **settings)
    assert cache.describe()["corpus"] == {"tokens": sum(map(len, streams)), "documents": sum(1 for s in streams if s)}


def counted_streams():
    """Key (1,) followed by (2,3) x4, (4,5) x3, (6,7) x2, (8,8) x1, each in its own stream."""
    return [[1, 2, 3]] * 4 + [[1, 4, 5]] * 3 + [[1, 6, 7]] * 2 + [[1, 8, 8]]


def test_top_k_keeps_the_most_frequent():
    cache = CorpusCache.build(counted_streams(), max_key_len=2, continuation_len=2, top_k=2, min_count=1)
    assert cache.continuations([1]) == [((2, 3), 4), ((4, 5), 3)]
    assert len(cache) == 1 and cache.num_continuations() == 2


def test_min_count_is_a_strict_threshold():
    cache = CorpusCache.build(counted_streams(), max_key_len=2, continuation_len=2, top_k=10, min_count=1)
    assert cache.continuations([1]) == [((2, 3), 4), ((4, 5), 3), ((6, 7), 2)]  # (8, 8) seen once: not > 1
    cache = CorpusCache.build(counted_streams(), max_key_len=2, continuation_len=2, top_k=10, min_count=2)
    assert cache.continuations([1]) == [((2, 3), 4), ((4, 5), 3)]


def test_equal_counts_tie_by_tokens_and_streams_are_not_joined():
    cache = CorpusCache.build(
        [[1, 9], [1, 5], [1, 7], [1, 5], [1, 9]], max_key_len=1, continuation_len=1, top_k=5, min_count=0
    )
    assert cache.continuations([1]) == [((5,), 2), ((9,), 2), ((7,), 1)]
    assert cache.continuations([9]) == [] and cache.continuations([5]) == []  # 9 then 1 crosses a stream end


@pytest.fixture
def suffix_cache():
    """Key (5, 1) -> (9, 9) x2; key (1,) -> (2, 3) x4 and (9, 9) x2 (from the same windows)."""
    streams = [[1, 2, 3]] * 4 + [[5, 1, 9, 9]] * 2
    return CorpusCache.build(streams, max_key_len=2, continuation_len=2, top_k=10, min_count=1)


def test_lookup_prefers_the_longest_suffix_then_count(suffix_cache):
    assert suffix_cache.continuations([5, 1]) == [((9, 9), 2)]
    assert suffix_cache.lookup([7, 5, 1], limit=5) == [(9, 9), (2, 3)]  # (9, 9) once: duplicates skipped
    assert suffix_cache.lookup([7, 4, 1], limit=5) == [(2, 3), (9, 9)]  # only the 1-token key matches
    assert suffix_cache.lookup([1], limit=5) == [(2, 3), (9, 9)]  # context shorter than max_key_len


def test_lookup_exclude_and_limit(suffix_cache):
    assert suffix_cache.lookup([5, 1], limit=5, exclude=[(9, 9)]) == [(2, 3)]
    assert suffix_cache.lookup([5, 1], limit=5, exclude=[(2, 3)]) == [(9, 9)]
    assert suffix_cache.lookup([5, 1], limit=1) == [(9, 9)]
    assert suffix_cache.lookup([5, 1], limit=0) == []
    assert suffix_cache.lookup([4], limit=3) == [] and suffix_cache.lookup([], limit=3) == []


def test_lookup_without_refill_is_the_official_rule(suffix_cache):
    """refill=False: of each key only the first (limit - found) continuations are tried, none replaced."""
    assert list(suffix_cache) == [(1,), (5,), (5, 1)]
    assert suffix_cache.lookup([1], limit=1, exclude=[(2, 3)]) == [(9, 9)]  # refilled from the same key
    assert suffix_cache.lookup([1], limit=1, exclude=[(2, 3)], refill=False) == []  # (2, 3) skipped, not replaced
    assert suffix_cache.lookup([7, 5, 1], limit=2, refill=False) == [(9, 9), (2, 3)]  # 1 from each key
    assert suffix_cache.lookup([5, 1], limit=5, refill=False) == [(9, 9), (2, 3)]  # (9, 9) once


def test_invalid_settings_name_the_key():
    with pytest.raises(ConfigError, match="top_k"):
        CorpusCache.build([[1, 2, 3]], top_k=0)
    with pytest.raises(ConfigError, match="min_count"):
        CorpusCache.build([[1, 2, 3]], min_count=-1)


PROVENANCE = {"tokenizer": {"name": "toy", "vocab_size": 10, "fingerprint": "abc"}, "source": {"kind": "files"}}


def test_save_load_round_trip(tmp_path, suffix_cache):
    cache = CorpusCache.build(
        counted_streams(), max_key_len=2, continuation_len=2, top_k=3, min_count=0, provenance=PROVENANCE
    )
    path = tmp_path / "sub" / "cache.npz"
    cache.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["cache.npz"]  # the temp file was renamed
    loaded = CorpusCache.load(
        path, expect={"tokenizer": {"vocab_size": 10, "fingerprint": "abc"}, "settings": cache.settings}
    )
    assert stored(loaded) == stored(cache) and loaded.settings == cache.settings
    assert loaded.describe() == cache.describe()
    assert loaded.lookup([5, 1], 4) == cache.lookup([5, 1], 4)
    with np.load(path, allow_pickle=False) as npz:  # plain arrays + a JSON header, no pickle
        assert json.loads(str(npz["header"]))["tokenizer"]["name"] == "toy"


def test_load_rejects_another_tokenizer_or_settings(tmp_path):
    path = tmp_path / "cache.npz"
    CorpusCache.build(counted_streams(), provenance=PROVENANCE).save(path)
    with pytest.raises(CorpusCacheMismatch, match="tokenizer.vocab_size: file has 10, expected 11"):
        CorpusCache.load(path, expect={"tokenizer": {"vocab_size": 11, "fingerprint": "abc"}})
    with pytest.raises(CorpusCacheMismatch, match="settings.top_k"):
        CorpusCache.load(path, expect={"settings": {"top_k": 3}})
    with pytest.raises(ConfigError, match="not a readable corpus cache"):
        (tmp_path / "junk.npz").write_text("not a zip")
        CorpusCache.load(tmp_path / "junk.npz")
    np.savez(
        tmp_path / "old.npz", header=np.array(json.dumps({"format": "specbench-corpus-cache", "format_version": 0}))
    )
    with pytest.raises(CorpusCacheMismatch, match="v1"):
        CorpusCache.load(tmp_path / "old.npz")


# --- building from text with a real tokenizer ----------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    """The embedded model's tokenizer (loaded before any test points SPECBENCH_CACHE elsewhere)."""
    from transformers import AutoTokenizer

    from specbench.models.embedded import embedded_checkpoint

    return AutoTokenizer.from_pretrained(embedded_checkpoint())


@pytest.fixture
def text_dir(tmp_path):
    """Three small .txt files (one nested) and a non-.txt file the corpus must ignore."""
    folder = tmp_path / "texts"
    (folder / "more").mkdir(parents=True)
    for i, name in enumerate(["a.txt", "b.txt", "more/c.txt"]):
        (folder / name).write_text(" ".join(SENTENCES[i:] + SENTENCES[:i]) * 4)
    (folder / "metadata.csv").write_text("year,president\n" * 50)
    return folder


def corpus_cfg(folder, **settings) -> dict:
    """A ``corpus`` node over local files."""
    return {
        "source": "files",
        "files": None if folder is None else str(folder),
        "hub": {},
        "max_tokens": None,
        "max_key_len": 4,
        "continuation_len": 4,
        "top_k": 20,
        "min_count": 1,
        **settings,
    }


def test_corpus_cache_for_builds_once_then_loads(tokenizer, text_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    built = corpus_cache_for(tokenizer, corpus_cfg(text_dir), progress=False)
    files = list((tmp_path / "cache" / "corpus").glob("*.npz"))
    assert len(files) == 1 and built.info["path"] == str(files[0])
    info = built.describe()
    assert info["corpus"]["documents"] == 3 and info["keys"] > 10
    assert info["tokenizer"]["vocab_size"] == len(tokenizer) and info["source"]["files"] == 3

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the stored cache should have been loaded")

    monkeypatch.setattr(CorpusCache, "build", no_rebuild)
    loaded = corpus_cache_for(tokenizer, corpus_cfg(text_dir), progress=False)
    assert stored(loaded) == stored(built)
    context = tokenizer("We must work together for the", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(loaded.lookup(context, 1)[0]).startswith(" future")


def test_cache_name_follows_content_and_settings(tokenizer, text_dir):
    paths = {}
    for label, cfg in [
        ("base", corpus_cfg(text_dir)),
        ("top_k", corpus_cfg(text_dir, top_k=5)),
        ("cap", corpus_cfg(text_dir, max_tokens=100)),
    ]:
        spec = CorpusSpec.from_cfg(cfg)
        paths[label] = corpus.cache_path(spec, corpus.cache_identity(tokenizer, spec))
    (text_dir / "a.txt").write_text("changed")
    spec = CorpusSpec.from_cfg(corpus_cfg(text_dir))
    paths["edited"] = corpus.cache_path(spec, corpus.cache_identity(tokenizer, spec))
    assert len(set(paths.values())) == 4
    assert paths["base"].name.startswith(f"texts-v{len(tokenizer)}-")


def test_max_tokens_caps_the_corpus(tokenizer, text_dir):
    spec = CorpusSpec.from_cfg(corpus_cfg(text_dir, max_tokens=50))
    cache = corpus.build_corpus_cache(tokenizer, spec, corpus.cache_identity(tokenizer, spec), progress=False)
    assert cache.describe()["corpus"] == {"tokens": 50, "documents": 1}


def test_bad_corpus_config_is_explained(text_dir):
    with pytest.raises(ConfigError, match="corpus.source must be one of"):
        CorpusSpec.from_cfg(corpus_cfg(text_dir, source="oanc"))
    with pytest.raises(ConfigError, match="corpus.files"):
        CorpusSpec.from_cfg(corpus_cfg(None))
    with pytest.raises(DataUnavailable, match="matches no .txt files"):
        CorpusSpec.from_cfg(corpus_cfg(text_dir / "nothing_here")).identity()
    with pytest.raises(ConfigError, match="max_tokens"):
        CorpusSpec.from_cfg(corpus_cfg(text_dir, max_tokens=0))
    with pytest.raises(ConfigError, match="unknown corpus key.*topk"):
        CorpusSpec.from_cfg({**corpus_cfg(text_dir), "topk": 3})
    assert CorpusSpec.from_cfg({**corpus_cfg(text_dir), "source": "auto"}).source == "files"


HUB = {"path": "Salesforce/wikitext", "name": "wikitext-103-raw-v1", "split": "train", "text_field": "text"}


def test_hub_source_offline_fails_fast_with_advice(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    cfg = {**corpus_cfg(None), "source": "auto", "hub": HUB}
    with pytest.raises(DataUnavailable, match="corpus.source=files corpus.files=DIR"):
        corpus_cache_for(tokenizer, cfg, progress=False)
    assert not list(tmp_path.rglob("*.npz"))


def test_hub_source_streams_the_text_field(tokenizer, monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name, split, streaming):
        calls.append((path, name, split, streaming))
        return iter([{"text": SENTENCES[0], "id": 1}, {"text": "   "}, {"text": SENTENCES[1] * 5}] * 3)

    monkeypatch.setattr(corpus, "hub_reachable", lambda: True)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    spec = CorpusSpec.from_cfg({**corpus_cfg(None, max_tokens=40), "source": "hub", "hub": HUB})
    cache = corpus.build_corpus_cache(tokenizer, spec, corpus.cache_identity(tokenizer, spec), progress=False)
    assert calls == [("Salesforce/wikitext", "wikitext-103-raw-v1", "train", True)]
    assert cache.describe()["corpus"]["tokens"] == 40
    assert cache.describe()["source"]["location"].startswith("hub:Salesforce/wikitext")
    bad = CorpusSpec.from_cfg({**corpus_cfg(None), "source": "hub", "hub": {**HUB, "text_field": "body"}})
    with pytest.raises(ConfigError, match="columns: text, id"):
        list(bad.texts())


# --- command line --------------------------------------------------------------------------------


def cli_overrides(tokenizer, text_dir) -> list[str]:
    """Overrides pointing the CLI at a local tokenizer folder and the test texts."""
    return [
        "model.source=hub",
        f"model.path={tokenizer.name_or_path}",
        "corpus.source=files",
        f"corpus.files={text_dir}",
        "corpus.min_count=1",
        "progress=false",
    ]


def test_cli_build_then_show(tokenizer, text_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    assert corpus.main(["build", *cli_overrides(tokenizer, text_dir)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["keys"] > 10 and info["source"]["files"] == 3 and info["settings"]["min_count"] == 1
    assert corpus.main(["show", *cli_overrides(tokenizer, text_dir)]) == 0
    out = capsys.readouterr().out
    assert f"configured cache (model smollm2_135m): {info['path']}" in out and "1 stored in" in out


def test_cli_module_reports_config_errors(tmp_path):
    env = {**os.environ, "SPECBENCH_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "specbench.corpus", "build", "corpus.source=oanc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2 and "error: corpus.source must be one of auto, files, hub" in proc.stderr
    assert not list(tmp_path.iterdir())  # failed before loading the tokenizer or writing anything
