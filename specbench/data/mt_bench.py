"""MT-Bench (Zheng et al. 2023): 80 two-turn questions, 8 categories x 10 (Self-Draft, Medusa, OPT-Tree).

Local copy ``mt_bench.jsonl`` = FastChat's ``question.jsonl`` (fields ``question_id`` 81-160,
``category``, ``turns``, ``reference``); the Hub copy ``HuggingFaceH4/mt_bench_prompts`` renames
``turns`` to ``prompt`` and replaces ``question_id`` by a hash (``prompt_id``), keeping FastChat's
order, so there a record's question id is ``81 + its row``. The second turn is asked on the
conversation that holds the model's own first answer (the runner passes it back).
"""

from __future__ import annotations

from typing import Any

from specbench.data.base import Dataset, Sample

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
FIRST_QUESTION_ID = 81


def question_turns(record: dict) -> list[str]:
    """The user turns of an MT-Bench-style record (``turns`` locally, ``prompt`` on the Hub)."""
    return list(record["turns"] if "turns" in record else record["prompt"])


class MTBench(Dataset):
    """MT-Bench: one sample per question, both turns; per-turn records come from the runner."""

    local_file = "mt_bench.jsonl"
    hub_id = "HuggingFaceH4/mt_bench_prompts"
    hub_split = "train"

    def required_fields(self) -> tuple[tuple[str, ...], ...]:
        """MT-Bench records: the turns (``turns`` or ``prompt``) and the category."""
        return ("turns", "prompt"), ("category",)

    def field_types(self) -> dict[str, Any]:
        """The turns a list of text (``turns`` or ``prompt``), an integer question id, a text category."""
        return {"turns": list[str], "prompt": list[str], "question_id": int, "category": str}

    def to_sample(self, index: int, record: dict) -> Sample:
        """Normalize local (``question_id``, ``turns``) and Hub (row order, ``prompt``) records."""
        question_id = record.get("question_id", FIRST_QUESTION_ID + index)
        return Sample(
            sample_id=str(question_id),
            turns=question_turns(record),
            category=record["category"],
            reference=record.get("reference") or None,
        )
