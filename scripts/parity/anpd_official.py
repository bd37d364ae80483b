"""Run the official ANPD n-gram classes (oujieww/ANPD ``base_ngram.py`` at the pinned commit) on given token streams.

Runs inside the side env ``.venv-parity-anpd`` (numpy 1.23.5, the release's pin; the classes need only
numpy and the standard library, so ``python -m specbench.parity anpd`` also runs it with specbench's
numpy to show how the tie order moves with the numpy build). Called with a job file; prints one JSON
object:

    job    = {"source", "max_ngram_size", "draft_len", "variants": ["released" | "once+first_tie+...", ...],
              "streams": [{"key", "prompt", "output"}]}
    output = {"versions", "patches", "drafts": {variant: {key: [draft after p output tokens, p = 1..len(output)-1]}}}

The release has no decoding loop, so the script follows the paper's Algorithm 1 as far as the classes
go: ``MultiLevelNgram(" ".join(prompt ids), max_n=N)``, ``update(str(token))`` for each committed token,
and K iterated greedy ``forward(tail, topk=1)`` queries on the last N-1 committed tokens plus the draft
so far. A draft is always K tokens: a miss is the official dummy id 1. Variants switch one release
artifact off each, by run-time patches (see ``PATCHES``): ``once``, ``first_tie``, ``id1_token``.
"""

from __future__ import annotations

import ast
import json
import platform
import random
import sys
from collections import defaultdict, deque
from pathlib import Path

PATCHES = [
    "loading: base_ngram.py imports, at module level, modules the release lacks (modeling_llama, "
    "modeling_opt, modeling_chatglm, decoding_ml_ngram) and deepspeed; the script reads the file from "
    "the checkout and executes only its class definitions (`NGramModel`, `MultiLevelNgram`), with the "
    "names they use (defaultdict, deque, numpy as np, random) bound beforehand",
    "protocol (no official loop to run): `MultiLevelNgram(' '.join(prompt ids), max_n=N)`; "
    "`update(str(token))` for each committed token; after each, K iterated "
    "`forward(tail, method='greedy', topk=1)` queries on the last N-1 committed tokens plus the draft "
    "so far (paper Alg. 1); the returned strings are read back as token ids",
    "variant `once`: the levels are the official `NGramModel(text, n)` objects alone (each constructor "
    "reads the prompt once), without `MultiLevelNgram._process_text`, which feeds the prompt to every "
    "level a second time",
    "variant `first_tie`: the classes' `np` is a stand-in whose `argsort` orders equal counts in reverse "
    "insertion order, so `argsort(counts)[-1]` is the first-seen most frequent successor",
    "variant `id1_token`: each level's `default_token_id` is a string no token id can be, so a predicted "
    "token 1 is a prediction, not a miss; a miss still drafts the dummy id 1",
]

FLAGS = ("once", "first_tie", "id1_token")
MISS = "miss"
"""The ``default_token_id`` of variant ``id1_token``: no whitespace-split id string equals it."""


class FirstTieNumpy:
    """Stands in for numpy in the official classes: ``argsort`` puts equal counts in reverse insertion order."""

    @staticmethod
    def argsort(values: list[int]) -> list[int]:
        return sorted(range(len(values)), key=lambda i: (values[i], -i))


def official_classes(source: str, numpy_module) -> dict:
    """``NGramModel`` and ``MultiLevelNgram`` of ``base_ngram.py`` (class definitions only), ``np`` bound as given."""
    tree = ast.parse(Path(source, "base_ngram.py").read_text())
    tree.body = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    namespace = {"defaultdict": defaultdict, "deque": deque, "np": numpy_module, "random": random}
    exec(compile(tree, "base_ngram.py", "exec"), namespace)
    return namespace


def parse_variant(name: str) -> frozenset[str]:
    """``released`` (no flag) or flags joined by ``+``."""
    flags = frozenset() if name == "released" else frozenset(name.split("+"))
    if not flags <= set(FLAGS):
        raise SystemExit(f"unknown variant {name!r}: released or a '+'-joined subset of {FLAGS}")
    return flags


def build(classes: dict, prompt: list[int], max_n: int, flags: frozenset[str]):
    """The official MLN over ``prompt`` as released, or with the variant's flags."""
    text = " ".join(map(str, prompt))
    mln_class, level_class = classes["MultiLevelNgram"], classes["NGramModel"]
    if "once" in flags:
        mln = mln_class.__new__(mln_class)
        mln.models = [level_class(text, n=n) for n in range(2, max_n + 1)]
        mln.max_n = max_n
    else:
        mln = mln_class(text, max_n=max_n)
    if "id1_token" in flags:
        for level in mln.models:
            level.default_token_id = MISS
    return mln


def drafts(mln, prompt: list[int], output: list[int], max_n: int, k: int) -> list[list[int]]:
    """The K-token draft after each committed prefix ``output[:p]``, p = 1..len(output)-1."""
    committed = [str(t) for t in prompt]
    result = []
    for token in output[:-1]:
        mln.update(str(token))
        committed.append(str(token))
        tail = committed[-(max_n - 1) :]
        draft = []
        for _ in range(k):
            word = mln.forward(tail, method="greedy", topk=1)[0]
            word = "1" if word == MISS else word  # a miss drafts the dummy id, as released
            tail.append(word)
            draft.append(int(word))
        result.append(draft)
    return result


def main(job_path: str) -> int:
    import numpy

    with open(job_path) as f:
        job = json.load(f)
    max_n, k = job["max_ngram_size"], job["draft_len"]
    classes = {False: official_classes(job["source"], numpy), True: official_classes(job["source"], FirstTieNumpy)}
    result: dict[str, dict] = {}
    for variant in job["variants"]:
        flags = parse_variant(variant)
        chosen = classes["first_tie" in flags]
        result[variant] = {
            s["key"]: drafts(build(chosen, s["prompt"], max_n, flags), s["prompt"], s["output"], max_n, k)
            for s in job["streams"]
        }
        print(f"[official:{variant}] {len(job['streams'])} streams", file=sys.stderr, flush=True)
    versions = {"numpy": numpy.__version__, "python": platform.python_version()}
    print(json.dumps({"versions": versions, "patches": PATCHES, "drafts": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
