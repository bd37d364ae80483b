"""The dataset interface every benchmark plugs into, and the shared source resolution and subsampling.

A dataset yields ``Sample``s: an id, an optional category, one or more user turns and an optional
reference. Where the records come from is resolved once, here, for every dataset:
``data_dir`` (or ``SPECBENCH_DATA_DIR``) -> a local JSONL copy; otherwise the Hugging Face Hub
through ``datasets.load_dataset``. Offline without a local copy, ``DataUnavailable`` says which
Hub id is needed and how to point at a local copy instead.

Which records are evaluated is resolved here too: a dataset's ``pool`` (its test split) is
subsampled to ``sample_size`` records with ``sample_seed`` by one of the papers' samplers
(``SAMPLERS``), and ``describe()`` says how, for the run summary.
"""

from __future__ import annotations

import codecs
import itertools
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from specbench.config import instantiate_checked
from specbench.data.prompts import (
    PROMPT_FORMATS,
    check_format,
    conversation,
    encode,
    prompt_text,
    raw_text,
    resolve_format,
)
from specbench.errors import ConfigError, DataError, DataUnavailable
from specbench.hub import hub_reachable
from specbench.settings import constructor_problems, value_problems

__all__ = ["PROMPT_FORMATS", "SAMPLERS", "Dataset", "Sample", "build_dataset", "read_jsonl"]


@dataclass
class Sample:
    """One benchmark item; ``turns`` are the user messages, asked in order (multi-turn ready)."""

    sample_id: str
    turns: list[str]
    category: str | None = None
    reference: Any = None
    meta: dict = field(default_factory=dict)


def read_jsonl(
    path: Path, required: Sequence[Sequence[str]] = (), types: Mapping[str, Any] | None = None
) -> list[dict]:
    """Records of a JSON Lines file (blank lines skipped), each checked: a JSON object holding, for every
    entry of ``required``, at least one of its field names, and every field ``types`` names (when present) of its
    type (a specbench.settings type hint); a DataError names the file, the line and the field. A UTF-8 byte-order
    mark (which Windows editors write) is skipped."""
    records = []
    for number, raw in enumerate(path.read_bytes().removeprefix(codecs.BOM_UTF8).splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(f"{path}:{number}: not UTF-8 text (byte {error.start}); save the file as UTF-8") from None
        if line.strip():
            records.append(checked_record(path, number, line, required, types or {}))
    if not records:
        raise DataError(f"{path} holds no records; put the dataset's JSON Lines there or remove the file")
    return records


def checked_sample(sample: Sample, source: str | None, index: int) -> Sample:
    """The sample, or a DataError when a record gave it a turn that is not text (a number, null, a list)."""
    if not sample.turns or not all(isinstance(turn, str) for turn in sample.turns):
        raise DataError(
            f"{source or 'the dataset'}: record {index + 1} (sample {sample.sample_id!r}) gives the prompt "
            f"{sample.turns!r}: each turn must be text; fix or remove the record"
        )
    return sample


def checked_record(
    path: Path, number: int, line: str, required: Sequence[Sequence[str]], types: Mapping[str, Any]
) -> dict:
    """One parsed line of a JSONL file, or a DataError saying which line is wrong and how."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(
            f"{path}:{number}: not a JSON record ({error.msg.removesuffix(' at')}, column {error.colno}); "
            f"fix or remove the line"
        ) from None
    if not isinstance(record, dict):
        raise DataError(f"{path}:{number}: a record must be a JSON object, got {type(record).__name__}")
    missing = [" or ".join(names) for names in required if not any(name in record for name in names)]
    if missing:
        raise DataError(f"{path}:{number}: the record lacks the field(s) {missing} this dataset needs")
    wrong = [
        problem
        for name, hint in types.items()
        if name in record
        for problem in value_problems(record[name], hint, name)
    ]
    if wrong:
        raise DataError(f"{path}:{number}: the record's field {'; '.join(wrong)}; fix or remove the record")
    return record


def check_unique_ids(chosen: list[tuple[int, Sample]], source: str | None) -> None:
    """A DataError when two evaluated records give one sample id: resumes and the report key on it, so the two
    would count as one sample (``chosen``: (record index, sample) pairs)."""
    seen: set[str] = set()
    for index, sample in chosen:
        if sample.sample_id in seen:
            raise DataError(
                f"{source or 'the dataset'}: record {index + 1} repeats the id {sample.sample_id!r}; ids must be unique"
            )
        seen.add(sample.sample_id)


def random_sample(pool: list[int], n_records: int, size: int, seed: int) -> list[int]:
    """Python's ``random.seed(seed); random.sample(pool, size)`` (Self-Draft's GSM-100 / MBPP-100)."""
    if size > len(pool):
        raise ConfigError(f"dataset.sample_size={size} exceeds the {len(pool)} records available")
    return random.Random(seed).sample(pool, size)


def hf_shuffle(pool: list[int], n_records: int, size: int, seed: int) -> list[int]:
    """``datasets``' ``shuffle(seed=seed).select(range(size))`` over all records (ANPD), kept to the pool.

    ``Dataset.shuffle(seed)`` orders rows by ``np.random.default_rng(seed).permutation(n)``; records
    outside the pool (a few-shot example) are skipped, so the result equals the paper's selection
    whenever none of them falls within its first ``size`` rows.
    """
    members = set(pool)
    order = np.random.default_rng(seed).permutation(n_records).tolist()
    return [i for i in order if i in members][:size]


def prefix(pool: list[int], n_records: int, size: int, seed: int) -> list[int]:
    """The first ``size`` records of the pool in source order (local copies that are a prefix)."""
    return pool[:size]


SAMPLERS: dict[str, Callable[[list[int], int, int, int], list[int]]] = {
    "random.sample": random_sample,
    "shuffle": hf_shuffle,
    "prefix": prefix,
}


ORDERS = ("canonical", "round_robin")


def round_robin(samples: list[Sample]) -> list[Sample]:
    """One sample per category in turn (categories in order of first appearance), so a small limit
    still covers every category (e.g. MT-Bench's 8 at limit=8)."""
    by_category: dict[str | None, list[Sample]] = {}
    for sample in samples:
        by_category.setdefault(sample.category, []).append(sample)
    columns = itertools.zip_longest(*by_category.values())
    return [sample for column in columns for sample in column if sample is not None]


def build_dataset(dataset_cfg, data_dir: str | None) -> Dataset:
    """Instantiate a ``conf/dataset`` node once its settings are of the types its class's constructor declares; a
    constructor's UserError surfaces as itself (one-line error)."""
    from hydra.utils import get_class

    problems = constructor_problems(dataset_cfg, get_class(dataset_cfg._target_), "dataset.")
    if problems:
        raise ConfigError("invalid dataset settings: " + "; ".join(problems))
    return instantiate_checked(dataset_cfg, data_dir=data_dir)


class Dataset:
    """Base class: resolves the source, selects the evaluated records, renders their prompts.

    Subclasses set ``local_file`` (name of the JSONL copy in ``data_dir``), ``hub_id`` /
    ``hub_config`` / ``hub_split`` and implement ``to_sample``; they may override ``pool`` (the
    split evaluated), ``sampler``, ``completion_prompt`` (the raw prompt for base models) and
    ``builtin_records`` (a copy that ships with an installed package). ``quality`` names the metric
    ``specbench.quality`` scores the outputs with (``pass@1``, ``answer_accuracy``, ``rouge``), or None
    where the dataset has no reference to score against.
    """

    local_file: str = ""
    hub_id: str = ""
    hub_config: str | None = None
    hub_split: str = "test"
    origin: str = ""  # where to get the file when it is not on the Hub (for the advice)
    sampler: str = "random.sample"  # the SAMPLERS key that draws sample_size records from the pool
    variant: str | None = None  # which version of the data (e.g. MBPP full / sanitized), for describe()
    quality: ClassVar[str | None] = None  # the specbench.quality metric of the outputs (None: none)

    def __init__(
        self,
        name: str,
        prompt_format: str = "auto",
        system_prompt: str | None = None,
        source: str = "auto",
        data_dir: str | None = None,
        sample_size: int | None = None,
        sample_seed: int = 0,
        order: str = "canonical",
        categories: list[str] | None = None,
    ):
        check_format(prompt_format)
        if order not in ORDERS:
            raise ConfigError(f"dataset.order must be one of {ORDERS}; got {order!r}")
        self.order = order
        self.name = name
        self.prompt_format = prompt_format
        self.system_prompt = system_prompt
        self.source = source
        self.data_dir = Path(data_dir).expanduser() if data_dir else None
        self.sample_size = sample_size
        self.sample_seed = sample_seed
        self.categories = list(categories) if categories is not None else None  # None: every category
        self.resolved_source: str | None = None
        self._records: list[dict] | None = None

    # --- prompts -------------------------------------------------------------------------------

    def messages(self, sample: Sample, answers: list[str]) -> list[dict]:
        """Chat messages for turn ``len(answers)``: system prompt, user turns, the model's answers."""
        return conversation(self.system_prompt, sample.turns[: len(answers) + 1], answers)

    def completion_prompt(self, sample: Sample, answers: list[str]) -> str:
        """The ``raw`` prompt for base models; datasets with a paper's completion template override it."""
        return raw_text(self.messages(sample, answers))

    def prompt(self, tokenizer, sample: Sample, answers: list[str]) -> str:
        """The prompt text for turn ``len(answers)`` in the format used with ``tokenizer``."""
        fmt = self.format_used(tokenizer)
        if fmt == "raw":
            return self.completion_prompt(sample, answers)
        return prompt_text(tokenizer, self.messages(sample, answers), fmt)

    def prompt_ids(self, tokenizer, sample: Sample, answers: list[str]) -> list[int]:
        """Token ids of the prompt for turn ``len(answers)``, after the model's earlier ``answers``."""
        return encode(tokenizer, self.prompt(tokenizer, sample, answers), self.format_used(tokenizer))

    def format_used(self, tokenizer) -> str:
        """The prompt format actually used with ``tokenizer`` (recorded in the run summary)."""
        return resolve_format(tokenizer, self.prompt_format)

    # --- samples -------------------------------------------------------------------------------

    def to_sample(self, index: int, record: dict) -> Sample:
        """Convert one source record (at ``index`` in source order) into a Sample."""
        raise NotImplementedError

    def pool(self, records: list[dict]) -> list[int]:
        """Indices of the records that may be evaluated (the test split); default: all of them."""
        return list(range(len(records)))

    def sampler_used(self) -> str:
        """The ``SAMPLERS`` key that draws ``sample_size`` records (may depend on the source)."""
        return self.sampler

    def in_categories(self, records: list[dict], pool: list[int]) -> list[int]:
        """The pool's records whose sample is in ``categories`` (e.g. Medusa's writing and roleplay questions); a
        category no pool record has is a ConfigError that lists the ones there are."""
        if self.categories is None:
            return pool
        category = {i: self.to_sample(i, records[i]).category for i in pool}
        present = sorted({c for c in category.values() if c is not None})
        unknown = sorted(set(self.categories) - set(present))
        if unknown or not self.categories:
            raise ConfigError(
                f"dataset.categories: {unknown or '[]'} {'are not categories' if unknown else 'selects nothing'} of "
                f"dataset {self.name}; its categories: {present or 'none (an uncategorized dataset)'}"
            )
        return [i for i in pool if category[i] in self.categories]

    def selection(self) -> list[int]:
        """Indices of the evaluated records, in evaluation order: the pool (within ``categories`` when given),
        subsampled if configured."""
        records = self.records()
        pool = self.in_categories(records, self.pool(records))
        if self.sample_size is None:
            return pool
        if self.sample_size < 1:
            raise ConfigError(f"dataset.sample_size must be >= 1 or null (got {self.sample_size})")
        return SAMPLERS[self.sampler_used()](pool, len(records), self.sample_size, self.sample_seed)

    def samples(self, limit: int | None = None) -> list[Sample]:
        """The evaluated samples in ``order``, the first ``limit`` of them when given."""
        records = self.records()
        indexed = [
            (i, checked_sample(self.to_sample(i, records[i]), self.resolved_source, i)) for i in self.selection()
        ]
        check_unique_ids(indexed, self.resolved_source)
        chosen = [sample for _, sample in indexed]
        if self.order == "round_robin":
            chosen = round_robin(chosen)
        return chosen[:limit] if limit is not None else chosen

    def describe(self) -> dict:
        """Where the evaluated records came from and how they were chosen (for the run summary)."""
        selection = self.selection()
        subsampled = self.sample_size is not None
        return {
            "source": self.resolved_source,
            "variant": self.variant,
            "n_total": len(self.pool(self.records())),
            "categories": self.categories,
            "n_selected": len(selection),
            "sampler": self.sampler_used() if subsampled else None,
            "sample_size": self.sample_size,
            "sample_seed": self.sample_seed if subsampled else None,
            "order": self.order,
        }

    # --- sources -------------------------------------------------------------------------------

    def builtin_records(self) -> list[dict] | None:
        """Records shipped with an installed package, if any (checked after data_dir)."""
        return None

    def records(self) -> list[dict]:
        """Raw records from the configured source (``auto``: data_dir, then package copy, then Hub)."""
        if self._records is None:
            self._records = self._load_records()
        return self._records

    def _load_records(self) -> list[dict]:
        """Read the records once from the source that ``source`` resolves to."""
        if self.source not in ("auto", "local", "package", "hub"):
            raise ConfigError(f"dataset.source must be auto, local, package or hub; got {self.source!r}")
        if self.source in ("auto", "local") and self.data_dir is not None:
            return self._local_records(self.data_dir)
        if self.source == "local":
            raise DataUnavailable(self._advice("source=local needs data_dir (or SPECBENCH_DATA_DIR)"))
        if self.source in ("auto", "package"):
            builtin = self.builtin_records()
            if builtin is not None:
                self.resolved_source = "package"
                return builtin
        return self._hub_records()

    def is_local(self) -> bool:
        """Whether the records came from a local JSONL copy (known once they are loaded)."""
        return (self.resolved_source or "").startswith("local:")

    def required_fields(self) -> tuple[tuple[str, ...], ...]:
        """The fields ``to_sample`` reads: each entry lists alternative names, one of which must be present."""
        return ()

    def field_types(self) -> dict[str, Any]:
        """The type of each field this dataset reads, checked in every local record that has it (a
        specbench.settings type hint: ``str``, ``int``, ``list[str]``...)."""
        return {}

    def _local_records(self, data_dir: Path) -> list[dict]:
        """The JSONL copy ``data_dir/local_file``, every record checked for the fields this dataset reads."""
        path = data_dir / self.local_file
        if not path.is_file():
            raise DataUnavailable(self._advice(f"{path} does not exist"))
        self.resolved_source = f"local:{path}"
        return read_jsonl(path, self.required_fields(), self.field_types())

    def _hub_records(self) -> list[dict]:
        """The Hub split through ``datasets.load_dataset``, after a quick reachability probe."""
        if not self.hub_id:
            raise DataUnavailable(self._advice("no local copy was given"))
        if not hub_reachable():
            raise DataUnavailable(self._advice("the Hugging Face Hub cannot be reached"))
        import datasets

        self.resolved_source = f"hub:{self.hub_id}" + (f":{self.hub_config}" if self.hub_config else "")
        return list(datasets.load_dataset(self.hub_id, self.hub_config, split=self.hub_split))

    def _advice(self, problem: str) -> str:
        """A DataUnavailable message: the problem, the remote source, and how to use a local copy."""
        config = f", config '{self.hub_config}'" if self.hub_config else ""
        remote = (
            f"It loads from the Hub as '{self.hub_id}'{config}, split '{self.hub_split}' (dataset.source=hub)"
            if self.hub_id
            else f"It is not on the Hugging Face Hub ({self.origin})"
        )
        return (
            f"Dataset '{self.name}' is unavailable: {problem}. {remote}; offline, put "
            f"'{self.local_file}' in a folder and pass data_dir=FOLDER (or set SPECBENCH_DATA_DIR=FOLDER; unset, a "
            f"source checkout reads ../shared/datasets beside it)."
        )
