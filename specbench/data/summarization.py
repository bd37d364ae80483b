"""CNN/DailyMail and XSum test splits with ANPD's prompts (Ou et al.; from Draft&Verify's helpers).

Samples: ANPD evaluated 1,000 records chosen by ``datasets``' ``shuffle(seed=42).select(range(1000))``
on the full Hub test split: the ``shuffle`` sampler with ``sample_seed=42``, ``sample_size=1000``.
The local copies are only a prefix (CNN/DM, 200 rows) or a subset (XSum, 1,000 rows) of that split,
so with a local copy the records are taken in file order (sampler ``prefix``, shown by
``describe()``), and ``n_selected`` may be below ``sample_size``.

Prompts (docs/methods/anpd.md#evaluation-protocol-of-the-paper):

- ``raw`` (base models, ANPD's 1-shot setting): ``Article: {shot}\\nSummary: {shot summary}\\n``
  followed by ``Article: {document}\\nSummary:``. The 1-shot example (``shot_split``) is, as in
  Draft&Verify's evaluation whose prompts ANPD reuses, the first record of the *train* split shuffled with
  ``shot_seed`` (``train``: ``data_dir/<shot_file>`` when given, else the Hub), or a test
  record named by ``shot_id`` and removed from the pool (``test``). Its summary is put on one line (CNN/DM
  highlights are one line per point). ``shot_split: null`` gives the zero-shot ``Article: {document}\\nSummary:``.
- ``chat`` / ``vicuna`` / ``llama2`` (instruction-tuned models, ANPD's zero-shot setting): one user
  turn, ``{instruction}\\n\\n{document}``, with ANPD's instruction "Summarize the following articles."
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from specbench.data.base import Dataset, Sample, read_jsonl
from specbench.errors import ConfigError, DataUnavailable
from specbench.hub import hub_reachable

INSTRUCTION = "Summarize the following articles."
SHOT_SPLITS = ("train", "test")
"""Where the 1-shot example comes from: the shuffled train split's first record (Draft&Verify's), or a test record."""


def one_line(text: str) -> str:
    """The text with its line breaks replaced by spaces."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


class Summarization(Dataset):
    """A news summarization test split: document -> summary, with a 1-shot raw prompt for base models;
    quality = ROUGE-1/2/L F1 against the reference summary."""

    quality = "rouge"
    document_field = ""
    summary_field = ""
    shot_file = ""  # a one-record JSONL in data_dir holding the train split's shot (train_shot)
    hub_split = "test"

    def __init__(
        self,
        name: str,
        shot_split: str | None = "train",
        shot_seed: int = 42,
        shot_id: str | None = None,
        instruction: str = INSTRUCTION,
        **kwargs,
    ):
        if shot_split is not None and shot_split not in SHOT_SPLITS:
            raise ConfigError(
                f"dataset.shot_split must be one of {SHOT_SPLITS} or null (zero-shot); got {shot_split!r}"
            )
        if shot_split == "test" and shot_id is None:
            raise ConfigError("dataset.shot_split=test needs dataset.shot_id (the test record that is the example)")
        super().__init__(name, **kwargs)
        self.shot_split = shot_split
        self.shot_seed = shot_seed
        self.shot_id = shot_id if shot_split == "test" else None
        self.instruction = instruction

    def sampler_used(self) -> str:
        """ANPD's seeded shuffle on the full Hub split; file order for a local copy (a prefix/subset)."""
        return "prefix" if self.is_local() else "shuffle"

    def pool(self, records: list[dict]) -> list[int]:
        """Every record except the 1-shot example when it is a test record (``shot_split=test``)."""
        return [i for i, record in enumerate(records) if record["id"] != self.shot_id]

    @cached_property
    def shot(self) -> str:
        """The 1-shot example block (empty for zero-shot), read once (a train shot shuffles the whole train split)."""
        if self.shot_split is None:
            return ""
        record = self.train_shot() if self.shot_split == "train" else self.test_shot()
        return f"Article: {record[self.document_field]}\nSummary: {one_line(record[self.summary_field])}\n"

    def test_shot(self) -> dict:
        """The test record named by ``shot_id``."""
        for record in self.records():
            if record["id"] == self.shot_id:
                return record
        raise ConfigError(f"dataset.shot_id={self.shot_id!r} is not in {self.resolved_source}")

    def train_shot(self) -> dict:
        """The train split's first record after ``datasets``' ``shuffle(seed=shot_seed)`` (Draft&Verify's
        ``shots``): from ``data_dir/<shot_file>`` when it exists, else the Hub."""
        name = self.shot_file
        path = self.data_dir / name if self.data_dir else None
        if path is not None and path.is_file():
            return read_jsonl(path, self.required_fields(), self.field_types())[0]
        if not hub_reachable():
            raise DataUnavailable(
                f"dataset {self.name}: the 1-shot example is the train split's first record after shuffle(seed="
                f"{self.shot_seed}) (dataset.shot_split=train, Draft&Verify's), which needs the Hub ('{self.hub_id}', "
                f"split 'train') or a one-record '{name}' in data_dir; or give dataset.shot_split=null (zero-shot)"
            )
        import datasets

        return dict(datasets.load_dataset(self.hub_id, self.hub_config, split="train").shuffle(seed=self.shot_seed)[0])

    def completion_prompt(self, sample: Sample, answers: list[str]) -> str:
        """ANPD's 1-shot completion prompt: the example, then ``Article: ...\\nSummary:``."""
        return f"{self.shot}Article: {sample.meta['document']}\nSummary:"

    def required_fields(self) -> tuple[tuple[str, ...], ...]:
        """Summarization records: id, the article and its reference summary (field names per dataset)."""
        return ("id",), (self.document_field,), (self.summary_field,)

    def field_types(self) -> dict[str, Any]:
        """The id, the article and its summary are text."""
        return dict.fromkeys(("id", self.document_field, self.summary_field), str)

    def to_sample(self, index: int, record: dict) -> Sample:
        """The instruction + document as the user turn; the reference summary; the document in meta."""
        document = record[self.document_field]
        return Sample(
            sample_id=str(record["id"]),
            turns=[f"{self.instruction}\n\n{document}"],
            reference=record[self.summary_field],
            meta={"document": document},
        )

    def describe(self) -> dict:
        """The base description plus where the 1-shot example comes from."""
        return super().describe() | {
            "shot_split": self.shot_split,
            "shot_seed": self.shot_seed,
            "shot_id": self.shot_id,
        }


class CNNDailyMail(Summarization):
    """CNN/DailyMail 3.0.0 test (11,490 articles; summaries = the highlights)."""

    local_file = "cnn_dailymail_test.jsonl"
    shot_file = "cnn_dailymail_train_shot.jsonl"
    hub_id = "abisee/cnn_dailymail"
    hub_config = "3.0.0"
    document_field = "article"
    summary_field = "highlights"


class XSum(Summarization):
    """XSum test (11,334 BBC articles; one-sentence summaries)."""

    local_file = "xsum_test.jsonl"
    shot_file = "xsum_train_shot.jsonl"
    hub_id = "EdinburghNLP/xsum"
    document_field = "document"
    summary_field = "summary"
