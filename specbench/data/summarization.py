"""CNN/DailyMail and XSum test splits with ANPD's prompts (Ou et al.; from Draft&Verify's helpers).

Samples: ANPD evaluated 1,000 records chosen by ``datasets``' ``shuffle(seed=42).select(range(1000))``
on the full Hub test split: the ``shuffle`` sampler with ``sample_seed=42``, ``sample_size=1000``.
The local copies are only a prefix (CNN/DM, 200 rows) or a subset (XSum, 1,000 rows) of that split,
so with a local copy the records are taken in file order (sampler ``prefix``, shown by
``describe()``), and ``n_selected`` may be below ``sample_size``.

Prompts (docs/methods/anpd.md#evaluation-protocol-of-the-paper):

- ``raw`` (base models, ANPD's 1-shot setting): ``Article: {shot}\\nSummary: {shot summary}\\n``
  followed by ``Article: {document}\\nSummary:``. The 1-shot example is a fixed record named by
  ``shot_id``, chosen short and outside ANPD's 1,000-record sample; it is removed from the pool, so
  it is never evaluated. Its summary is put on one line (CNN/DM highlights are one line per point).
  ``shot_id: null`` gives the zero-shot ``Article: {document}\\nSummary:``.
- ``chat`` / ``vicuna`` / ``llama2`` (instruction-tuned models, ANPD's zero-shot setting): one user
  turn, ``{instruction}\\n\\n{document}``, with ANPD's instruction "Summarize the following articles."
"""

from __future__ import annotations

from typing import Any

from specbench.data.base import Dataset, Sample
from specbench.errors import ConfigError

INSTRUCTION = "Summarize the following articles."


def one_line(text: str) -> str:
    """The text with its line breaks replaced by spaces."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


class Summarization(Dataset):
    """A news summarization test split: document -> summary, with a 1-shot raw prompt for base models;
    quality = ROUGE-1/2/L F1 against the reference summary."""

    quality = "rouge"
    document_field = ""
    summary_field = ""
    hub_split = "test"

    def __init__(self, name: str, shot_id: str | None = None, instruction: str = INSTRUCTION, **kwargs):
        super().__init__(name, **kwargs)
        self.shot_id = shot_id
        self.instruction = instruction

    def sampler_used(self) -> str:
        """ANPD's seeded shuffle on the full Hub split; file order for a local copy (a prefix/subset)."""
        return "prefix" if self.is_local() else "shuffle"

    def pool(self, records: list[dict]) -> list[int]:
        """Every record except the 1-shot example."""
        return [i for i, record in enumerate(records) if record["id"] != self.shot_id]

    def shot(self) -> str:
        """The 1-shot example block (empty for zero-shot), from the record named by ``shot_id``."""
        if self.shot_id is None:
            return ""
        for record in self.records():
            if record["id"] == self.shot_id:
                summary = one_line(record[self.summary_field])
                return f"Article: {record[self.document_field]}\nSummary: {summary}\n"
        raise ConfigError(f"dataset.shot_id={self.shot_id!r} is not in {self.resolved_source}")

    def completion_prompt(self, sample: Sample, answers: list[str]) -> str:
        """ANPD's 1-shot completion prompt: the example, then ``Article: ...\\nSummary:``."""
        return f"{self.shot()}Article: {sample.meta['document']}\nSummary:"

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
        """The base description plus the 1-shot example's id."""
        return super().describe() | {"shot_id": self.shot_id}


class CNNDailyMail(Summarization):
    """CNN/DailyMail 3.0.0 test (11,490 articles; summaries = the highlights)."""

    local_file = "cnn_dailymail_test.jsonl"
    hub_id = "abisee/cnn_dailymail"
    hub_config = "3.0.0"
    document_field = "article"
    summary_field = "highlights"


class XSum(Summarization):
    """XSum test (11,334 BBC articles; one-sentence summaries)."""

    local_file = "xsum_test.jsonl"
    hub_id = "EdinburghNLP/xsum"
    document_field = "document"
    summary_field = "summary"
