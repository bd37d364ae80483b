"""GSM8K test split (Cobbe et al. 2021) and GSM-100, Self-Draft's seeded 100-question sample.

Self-Draft (AAAI-25): "We randomly sampled 100 questions from the test set and constructed GSM100";
its code draws them with Python's ``random.sample`` seeded with 10
(docs/methods/self_draft.md#evaluation-protocol-of-the-paper): the ``random.sample`` sampler with
``sample_seed=10``, ``sample_size=100`` (conf/dataset/gsm100.yaml).
The user turn is the question as written; the reference is the worked answer (ends in ``#### N``).
``dev_answers()`` returns the worked answers of the TRAIN split (data_dir/gsm8k_train.jsonl, else the Hub):
the Lookahead (PIA) README warms its trie up with the data that is not evaluated.
"""

from __future__ import annotations

import copy
from typing import Any

from specbench.data.base import Dataset, Sample


class GSM8K(Dataset):
    """Grade-school math word problems; one question per sample, in test-file order unless sampled;
    quality = answer accuracy (the output's last number against the reference's ``#### N``)."""

    quality = "answer_accuracy"
    local_file = "gsm8k_test.jsonl"
    hub_id = "openai/gsm8k"
    hub_config = "main"
    hub_split = "test"
    train_file = "gsm8k_train.jsonl"

    def dev_answers(self) -> list[str]:
        """The train split's worked answers (7,473 on the Hub), to warm up Lookahead's trie."""
        train = copy.copy(self)
        train.local_file, train.hub_split, train._records = self.train_file, "train", None
        return [record["answer"] for record in train.records()]

    def required_fields(self) -> tuple[tuple[str, ...], ...]:
        """GSM8K records: question and answer."""
        return ("question",), ("answer",)

    def field_types(self) -> dict[str, Any]:
        """The question and its worked answer are text."""
        return {"question": str, "answer": str}

    def to_sample(self, index: int, record: dict) -> Sample:
        """The question is the only turn; the id is the row in the test split."""
        return Sample(sample_id=f"gsm8k/{index}", turns=[record["question"]], reference=record["answer"])
