"""Dolly (databricks-dolly-15k) with the Lookahead paper's split (Zhao et al., KDD'24).

Split (``split``): Lookahead's preprocessing takes the first ``test_size`` = 1,000 records in file
order as the test set; the remaining records are the dev set whose answers warm up the trie before
the test queries (``dev_records()`` / ``dev_answers()``). The Hub split ``train`` has 15,011 records
(14,011 dev; the paper's Table 2 lists 13,850); the local ``dolly.jsonl`` holds the first 1,017 (the
test set and the first 17 dev records) in the original release's text.

Prompts:

- ``raw`` (base models): Lookahead's Table 9 template (Alpaca-style; the paper's text lost its line
  breaks, which are restored here as in the Alpaca template it cites):
  ``Below is an instruction that describes a task, paired with an input that provides further
  context. Write a response that appropriately completes the request.\\n\\n### Instruction:\\n
  {instruction}\\n\\n### Input:\\n{context}\\n\\n### Response:``; records without a context drop the
  Input block and read "Below is an instruction that describes a task. Write a response ...".
- ``chat`` / ``vicuna`` / ``llama2``: one user turn, the instruction, then a blank line and the
  context when the record has one.
"""

from __future__ import annotations

from typing import Any

from specbench.data.base import Dataset, Sample
from specbench.errors import ConfigError

SPLITS = ("test", "dev")
WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides "
    "further context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{context}\n\n### Response:"
)
WITHOUT_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:"
)


class Dolly(Dataset):
    """Open-domain instructions (8 categories); test = the first ``test_size`` records, dev = the rest."""

    local_file = "dolly.jsonl"
    hub_id = "databricks/databricks-dolly-15k"
    hub_split = "train"

    def __init__(self, name: str, split: str = "test", test_size: int = 1000, **kwargs):
        if split not in SPLITS:
            raise ConfigError(f"dataset.split must be one of {SPLITS}; got {split!r}")
        super().__init__(name, **kwargs)
        self.split = split
        self.test_size = test_size
        self.variant = split

    def split_indices(self, split: str, n_records: int) -> list[int]:
        """Record indices of ``split``: the first ``test_size`` records, or the ones after them."""
        if split == "test":
            return list(range(min(self.test_size, n_records)))
        return list(range(self.test_size, n_records))

    def pool(self, records: list[dict]) -> list[int]:
        """The configured split."""
        return self.split_indices(self.split, len(records))

    def dev_records(self) -> list[dict]:
        """The dev split's records (Lookahead's warm-up set)."""
        records = self.records()
        return [records[i] for i in self.split_indices("dev", len(records))]

    def dev_answers(self) -> list[str]:
        """The dev split's reference responses, to warm the Lookahead trie before the test queries."""
        return [record["response"] for record in self.dev_records()]

    def completion_prompt(self, sample: Sample, answers: list[str]) -> str:
        """Lookahead's Table 9 template for base models (with or without the Input block)."""
        context = sample.meta["context"]
        template = WITH_INPUT if context else WITHOUT_INPUT
        return template.format(instruction=sample.meta["instruction"], context=context)

    def required_fields(self) -> tuple[tuple[str, ...], ...]:
        """Dolly records: instruction, context, category, response."""
        return ("instruction",), ("context",), ("category",), ("response",)

    def field_types(self) -> dict[str, Any]:
        """Every Dolly field is text."""
        return dict.fromkeys(("instruction", "context", "category", "response"), str)

    def to_sample(self, index: int, record: dict) -> Sample:
        """Instruction (+ blank line + context) as the user turn; the reference response."""
        instruction, context = record["instruction"], record["context"]
        turn = f"{instruction}\n\n{context}" if context else instruction
        return Sample(
            sample_id=f"dolly/{index}",
            turns=[turn],
            category=record["category"],
            reference=record["response"],
            meta={"instruction": instruction, "context": context},
        )
