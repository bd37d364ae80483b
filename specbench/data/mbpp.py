"""MBPP (Austin et al. 2021) test split and MBPP-100, Self-Draft's seeded 100-problem sample.

Two variants (``split_variant``):

- ``full``: the original 974 problems; test = task_id 11-510 (500). Local ``mbpp.jsonl`` (all splits,
  filtered here) or Hub ``google-research-datasets/mbpp`` config ``full``, split ``test``. Fields
  ``text``, ``code``, ``test_list``, ``test_setup_code``, ``challenge_test_list``.
- ``sanitized``: the hand-verified subset the Self-Draft paper sampled from
  (docs/methods/self_draft.md#evaluation-protocol-of-the-paper);
  Hub config ``sanitized``, split ``test`` (257); fields ``prompt`` (instead of ``text``), ``code``,
  ``test_list``, ``test_imports``. Offline from a local ``mbpp_sanitized.jsonl`` (all splits, in the Hub's fields;
  the shared offline folder holds one), else the Hub.

The user turn (``template``): ``task``, the MBPP paper's zero-shot task wording "You are an expert Python
programmer, and here is your task: {text} Your code should pass these tests:\\n\\n{tests}" (one assert per
line); or ``statement``, the problem text alone, as Self-Draft's evaluation asks it (``self_draft/utils.py`` at
38bf7fe: ``load_mbpp_eval`` returns ``load_dataset(file_path, 'sanitized')['test']['prompt']``, and
``extract_question`` passes an MBPP question on unchanged).
"""

from __future__ import annotations

from typing import Any

from specbench.data.base import Dataset, Sample
from specbench.errors import ConfigError

TEST_TASK_IDS = range(11, 511)
VARIANT_FILES = {"full": "mbpp.jsonl", "sanitized": "mbpp_sanitized.jsonl"}
TEMPLATES = {
    "task": "You are an expert Python programmer, and here is your task: {text} Your code should pass these tests:\n\n"
    "{tests}",
    "statement": "{text}",
}
"""The user turn of a problem: the MBPP paper's task wording, or the statement alone (Self-Draft's evaluation)."""


def task_text(record: dict) -> str:
    """The problem statement (``text`` in the full variant, ``prompt`` in the sanitized one)."""
    return record["text"] if "text" in record else record["prompt"]


class MBPP(Dataset):
    """Python programming problems: the statement plus its asserts; reference = code and tests; quality = pass@1."""

    quality = "pass@1"
    hub_id = "google-research-datasets/mbpp"
    hub_split = "test"

    def __init__(self, name: str, split_variant: str = "full", template: str = "task", **kwargs):
        if split_variant not in VARIANT_FILES:
            raise ConfigError(f"dataset.split_variant must be one of {tuple(VARIANT_FILES)}; got {split_variant!r}")
        if template not in TEMPLATES:
            raise ConfigError(f"dataset.template must be one of {tuple(TEMPLATES)}; got {template!r}")
        super().__init__(name, **kwargs)
        self.template = TEMPLATES[template]
        self.variant = split_variant
        self.local_file = VARIANT_FILES[split_variant]
        self.hub_config = split_variant

    def pool(self, records: list[dict]) -> list[int]:
        """The test split: task_id 11-510 (the local full file also holds the other splits)."""
        return [i for i, record in enumerate(records) if record["task_id"] in TEST_TASK_IDS]

    def required_fields(self) -> tuple[tuple[str, ...], ...]:
        """MBPP records (full or sanitized): task id, the problem text, tests and code."""
        return ("task_id",), ("text", "prompt"), ("test_list",), ("code",)

    def field_types(self) -> dict[str, Any]:
        """The integer task id, text problem and code, the asserts as a list of lines."""
        return {
            "task_id": int,
            "text": str,
            "prompt": str,
            "code": str,
            "test_list": list[str],
            "test_setup_code": str,
            "test_imports": list[str],
        }

    def to_sample(self, index: int, record: dict) -> Sample:
        """One problem, worded as in the MBPP paper; the id is its task_id."""
        tests = "\n".join(record["test_list"])
        return Sample(
            sample_id=f"mbpp/{record['task_id']}",
            turns=[self.template.format(text=task_text(record), tests=tests)],
            reference={
                "code": record["code"],
                "test_list": record["test_list"],
                **{key: record[key] for key in ("test_setup_code", "test_imports") if record.get(key)},
            },
        )
