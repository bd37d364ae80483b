"""Spec-Bench (Xia et al. 2024): 480 questions in 6 task groups, scored per group on its leaderboard.

``spec_bench.jsonl`` is Spec-Bench's ``data/spec_bench/question.jsonl`` (``hemingkx/Spec-Bench`` on
GitHub; not on the Hugging Face Hub, so it needs a local copy). Question ids 81-160 are MT-Bench
(8 fine categories, two turns), then 80 single-turn questions each of ``translation`` (161-240),
``summarization`` (241-320), ``qa`` (321-400), ``math_reasoning`` (401-480) and ``rag`` (481-560).
A sample's ``category`` is its task group (``mt_bench`` for the MT-Bench questions), as in the
leaderboard's columns; ``meta["fine_category"]`` keeps the file's own category.
"""

from __future__ import annotations

from specbench.data.base import Sample
from specbench.data.mt_bench import MT_BENCH_CATEGORIES, MTBench

TASK_GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def task_group(category: str) -> str:
    """Spec-Bench's task group of a file category: the 8 MT-Bench categories form ``mt_bench``."""
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


class SpecBench(MTBench):
    """Spec-Bench's question file: MT-Bench records (multi-turn) plus five single-turn task groups."""

    local_file = "spec_bench.jsonl"
    hub_id = ""
    origin = (
        "download data/spec_bench/question.jsonl from https://github.com/hemingkx/Spec-Bench "
        "and save it as spec_bench.jsonl"
    )

    def to_sample(self, index: int, record: dict) -> Sample:
        """An MT-Bench-style sample whose category is the task group; the fine category goes to meta."""
        sample = super().to_sample(index, record)
        assert sample.category is not None  # every Spec-Bench record has a category (a required field)
        sample.meta["fine_category"] = sample.category
        sample.category = task_group(sample.category)
        return sample
