"""Your own prompts from a file: ``dataset=jsonl dataset.path=FILE`` (JSON Lines, or plain text).

- JSON Lines (``.jsonl`` / ``.json``): one object per line with the prompt under ``prompt_field``
  (a string: one turn) or ``turns`` (a list of strings: a multi-turn conversation, each later turn
  asked after the model's own answer, as for MT-Bench); optional ``id``, ``category`` and
  ``reference`` (any JSON value, kept in the record for quality checks).
- Plain text (any other suffix): one prompt per non-empty line; ids are the line numbers.

Every record is checked when the file is read (a DataError names the file and line); the file's
sha256 goes into the run summary (``dataset_info.sha256``) so a run says exactly which prompts it ran.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from specbench.data.base import Dataset, Sample, read_jsonl
from specbench.errors import ConfigError, DataError

FORMATS = ("auto", "jsonl", "text")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


class PromptFile(Dataset):
    """Prompts from a local JSONL or text file; never the Hub."""

    origin = "your own file (dataset.path)"

    def __init__(
        self,
        name: str,
        path: str | None = None,
        file_format: str = "auto",
        prompt_field: str = "prompt",
        id_field: str = "id",
        category_field: str = "category",
        reference_field: str = "reference",
        **kwargs,
    ):
        if not path:
            raise ConfigError("dataset=jsonl needs the file: add dataset.path=FILE (JSON Lines or one prompt per line)")
        if file_format not in FORMATS:
            raise ConfigError(f"dataset.file_format must be one of {FORMATS}; got {file_format!r}")
        super().__init__(name, **kwargs)
        self.path = Path(path).expanduser()
        self.file_format = file_format
        self.prompt_field = prompt_field
        self.id_field = id_field
        self.category_field = category_field
        self.reference_field = reference_field

    def format_of_file(self) -> str:
        """``jsonl`` or ``text``: as configured, else by the file's suffix."""
        if self.file_format != "auto":
            return self.file_format
        return "jsonl" if self.path.suffix.lower() in JSONL_SUFFIXES else "text"

    def _load_records(self) -> list[dict]:
        """The file's records, each checked; the data_dir / Hub resolution of built-in datasets does not apply."""
        if not self.path.is_file():
            raise DataError(f"dataset.path={self.path}: no such file; give a JSON Lines file or a text file")
        self.resolved_source = f"local:{self.path}"
        if self.format_of_file() == "text":
            return self._text_records()
        records = read_jsonl(self.path, ((self.prompt_field, "turns"),))
        for number, record in enumerate(records, 1):
            self._check(record, number)
        return records

    def _text_records(self) -> list[dict]:
        """One record per non-empty line: {id: line number, prompt: the line}; a UTF-8 byte-order mark is skipped."""
        try:
            lines = self.path.read_text(encoding="utf-8-sig").splitlines()
        except UnicodeDecodeError as error:
            raise DataError(f"{self.path}: not UTF-8 text (byte {error.start}); save the file as UTF-8") from None
        records = [{self.id_field: str(n), self.prompt_field: line} for n, line in enumerate(lines, 1) if line.strip()]
        if not records:
            raise DataError(f"{self.path} holds no prompts; write one prompt per line")
        return records

    def _check(self, record: dict, number: int) -> None:
        """A DataError unless the record's prompt is a non-empty string or its turns non-empty strings."""
        where = f"{self.path}: record {number}"
        turns = record.get("turns", record.get(self.prompt_field))
        as_list = turns if isinstance(turns, list) else [turns]
        if not as_list or not all(isinstance(turn, str) and turn.strip() for turn in as_list):
            raise DataError(
                f"{where}: '{self.prompt_field}' must be a non-empty string (or 'turns' a list of them), got {turns!r}"
            )
        category = record.get(self.category_field)
        if category is not None and not isinstance(category, str):
            raise DataError(f"{where}: '{self.category_field}' must be a string, got {category!r}")

    def to_sample(self, index: int, record: dict) -> Sample:
        """One sample: id (the record's, else its line number), turns, category, reference."""
        turns = record.get("turns", record.get(self.prompt_field))  # checked on reading: str or list of str
        return Sample(
            sample_id=str(record.get(self.id_field, index + 1)),
            turns=[str(turn) for turn in (turns if isinstance(turns, list) else [turns])],
            category=record.get(self.category_field),
            reference=record.get(self.reference_field),
        )

    def describe(self) -> dict:
        """The base description plus the file's format and sha256."""
        return {
            **super().describe(),
            "file_format": self.format_of_file(),
            "sha256": hashlib.sha256(self.path.read_bytes()).hexdigest(),
        }
