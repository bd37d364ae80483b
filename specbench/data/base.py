"""The dataset interface every benchmark plugs into, and the shared source resolution.

A dataset yields ``Sample``s: an id, an optional category, one or more user turns and an optional
reference. Where the records come from is resolved once, here, for every dataset:
``data_dir`` (or ``SPECBENCH_DATA_DIR``) -> a local JSONL copy; otherwise the Hugging Face Hub
through ``datasets.load_dataset``. Offline without a local copy, ``DataUnavailable`` says which
Hub id is needed and how to point at a local copy instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.data.prompts import conversation, render, resolve_format
from specbench.errors import ConfigError, DataUnavailable
from specbench.hub import hub_reachable

PROMPT_FORMATS = ("auto", "chat", "raw")


@dataclass
class Sample:
    """One benchmark item; ``turns`` are the user messages, asked in order (multi-turn ready)."""

    sample_id: str
    turns: list[str]
    category: str | None = None
    reference: Any = None
    meta: dict = field(default_factory=dict)


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON Lines file, skipping blank lines."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


class Dataset:
    """Base class: resolves the source, converts records to samples, applies ``limit``.

    Subclasses set ``local_file`` (name of the JSONL copy in ``data_dir``), ``hub_id`` /
    ``hub_config`` / ``hub_split`` and implement ``to_sample``; they may override ``builtin_records``
    for a copy that ships with an installed package.
    """

    local_file: str = ""
    hub_id: str = ""
    hub_config: str | None = None
    hub_split: str = "test"

    def __init__(self, name: str, prompt_format: str = "auto", system_prompt: str | None = None,
                 source: str = "auto", data_dir: str | None = None):
        if prompt_format not in PROMPT_FORMATS:
            raise ConfigError(f"dataset.prompt_format must be one of {PROMPT_FORMATS}; got {prompt_format!r}")
        self.name = name
        self.prompt_format = prompt_format
        self.system_prompt = system_prompt
        self.source = source
        self.data_dir = Path(data_dir).expanduser() if data_dir else None
        self.resolved_source: str | None = None

    def prompt_ids(self, tokenizer, sample: Sample, answers: list[str]) -> list[int]:
        """Token ids of the prompt for turn ``len(answers)``, after the model's earlier ``answers``.

        Default: the conversation so far in the configured ``prompt_format``; datasets with their
        papers' prompt templates (few-shot, instruction wrappers) override this.
        """
        messages = conversation(self.system_prompt, sample.turns[: len(answers) + 1], answers)
        return render(tokenizer, messages, self.prompt_format)

    def format_used(self, tokenizer) -> str:
        """The prompt format actually used with ``tokenizer`` (recorded in the run summary)."""
        return resolve_format(tokenizer, self.prompt_format)

    def to_sample(self, index: int, record: dict) -> Sample:
        """Convert one source record into a Sample."""
        raise NotImplementedError

    def builtin_records(self) -> list[dict] | None:
        """Records shipped with an installed package, if any (checked after data_dir)."""
        return None

    def samples(self, limit: int | None = None) -> list[Sample]:
        """The dataset's samples in canonical order, the first ``limit`` of them when given."""
        records = self.records()
        samples = [self.to_sample(i, r) for i, r in enumerate(records)]
        return samples[:limit] if limit is not None else samples

    def records(self) -> list[dict]:
        """Raw records from the configured source (``auto``: data_dir, then package copy, then Hub)."""
        if self.source not in ("auto", "local", "package", "hub"):
            raise ConfigError(f"dataset.source must be auto, local, package or hub; got {self.source!r}")
        if self.source in ("auto", "local") and self.data_dir is not None:
            return self._local_records()
        if self.source == "local":
            raise DataUnavailable(self._advice("source=local needs data_dir (or SPECBENCH_DATA_DIR)"))
        if self.source in ("auto", "package"):
            builtin = self.builtin_records()
            if builtin is not None:
                self.resolved_source = "package"
                return builtin
        return self._hub_records()

    def _local_records(self) -> list[dict]:
        path = self.data_dir / self.local_file
        if not path.is_file():
            raise DataUnavailable(self._advice(f"{path} does not exist"))
        self.resolved_source = f"local:{path}"
        return read_jsonl(path)

    def _hub_records(self) -> list[dict]:
        if not hub_reachable():
            raise DataUnavailable(self._advice("the Hugging Face Hub cannot be reached"))
        import datasets

        self.resolved_source = f"hub:{self.hub_id}"
        return list(datasets.load_dataset(self.hub_id, self.hub_config, split=self.hub_split))

    def _advice(self, problem: str) -> str:
        config = f", config '{self.hub_config}'" if self.hub_config else ""
        return (f"Dataset '{self.name}' is unavailable: {problem}. It loads from the Hub as "
                f"'{self.hub_id}'{config}, split '{self.hub_split}'; offline, put '{self.local_file}' "
                f"in a folder and pass data_dir=FOLDER (or set SPECBENCH_DATA_DIR=FOLDER).")
