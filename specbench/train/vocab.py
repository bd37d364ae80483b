"""``python -m specbench.train vocab``: count the target's tokens in its self-distilled answers (draft vocabulary).

The counts rank the target's tokens for ``method.drafter.draft_vocab`` (``specbench.models.vocab``). They are
taken from the same self-distilled answers the heads and the distilled draft train on, never from evaluation
prompts; the file records the data's digest, and runs name the ranking by it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from specbench.files import write_atomic
from specbench.manifest import digest
from specbench.models.parts import part_kind
from specbench.models.vocab import RANKING_FILE, most_frequent
from specbench.train.common import compose_train, load_target, model_identity
from specbench.train.selfdistill import data_summary, self_distilled, validate

COVERAGE_SIZES = (1024, 2048, 4096, 8192, 16384)  # draft vocabulary sizes whose coverage the command prints


def coverage(counts: Counter, vocab: int) -> dict[int, float]:
    """Share of the answers' tokens that the ``N`` most frequent tokens cover, for each size in COVERAGE_SIZES."""
    total = sum(counts.values())
    shares = {}
    for size in (n for n in COVERAGE_SIZES if n < vocab):
        kept = most_frequent(counts, size, vocab)
        assert kept is not None  # size < vocab
        shares[size] = round(sum(counts[token] for token in kept.tolist()) / total, 4) if total else 0.0
    return shares


def main(overrides: list[str]) -> Path:
    """Count the answers' tokens and save ``ranking.json`` for the model; print how much each size covers."""
    cfg = compose_train("vocab", overrides)
    validate(cfg.prompts)
    lm = load_target(cfg)
    data = self_distilled(lm, cfg.prompts, cfg.data_dir, progress=cfg.progress)
    counts = Counter(token for item in data for token in item.output_ids)
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    settings = {"model": model_identity(lm), "data": digest([[d.prompt_ids, d.output_ids] for d in data])}
    record = {
        "digest": digest(settings),
        **settings,
        "data_summary": data_summary(data),
        "vocab": vocab,
        "coverage": coverage(counts, vocab),
        "counts": sorted(counts.items(), key=lambda item: (-item[1], item[0])),  # [[token, count], ...] by rank
    }
    path = part_kind("vocab").folder(lm.name) / RANKING_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record))
    shares = ", ".join(f"{size}: {share:.1%}" for size, share in record["coverage"].items())
    print(
        f"[specbench] {len(counts)} distinct tokens in {sum(counts.values())} answer tokens; share of them "
        f"in the N most frequent ({shares}); saved to {path}"
    )
    return path
