"""Score a run's outputs with its dataset's quality metric, without a model or a tokenizer.

A dataset class names its metric in ``Dataset.quality``; ``SCORERS`` holds one function per metric.
``score_run`` rebuilds the run's samples (and their references) from the run's ``config.yaml`` with
``build_dataset`` (no tokenizer: only prompts need one, and the samples are read before rendering) and
scores the complete samples of ``samples.jsonl``. The references of the scored datasets answer the
first turn, so only records of turn 0 are scored; records of later turns are counted as ``skipped_turns``.
A dataset without a metric gives a report with ``metric=None`` and a ``note`` saying so, not an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from specbench.data.base import Dataset, Sample, build_dataset
from specbench.errors import ConfigError, DataError
from specbench.quality.answers import answer_accuracy
from specbench.quality.code import DEFAULT_TIMEOUT_S, PASSED, check_sandbox, program_for, run_program
from specbench.quality.summaries import rouge
from specbench.store import CONFIG, RunStore

DATA_DIR_ENV = "SPECBENCH_DATA_DIR"


@dataclass(frozen=True)
class SampleScore:
    """One scored record: its sample id, its score(s) in [0, 1] by name, and what decided them."""

    sample_id: str
    scores: dict[str, float]
    detail: str = ""


@dataclass
class QualityReport:
    """A run's quality: the metric, one SampleScore per scored record, the run means."""

    dataset: str
    metric: str | None
    samples: list[SampleScore] = field(default_factory=list)
    skipped_turns: int = 0
    note: str | None = None
    run_dir: str | None = None

    @property
    def n_scored(self) -> int:
        """How many records were scored."""
        return len(self.samples)

    @property
    def means(self) -> dict[str, float]:
        """The mean of each score over the scored records (empty when none was scored)."""
        names = self.samples[0].scores if self.samples else {}
        return {name: sum(s.scores[name] for s in self.samples) / len(self.samples) for name in names}

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view: the fields, ``n_scored`` and ``means``."""
        return {**asdict(self), "n_scored": self.n_scored, "means": self.means}


Pairs = Sequence[tuple[Sample, str]]
"""(sample, output text) of the records to score."""


def score_pass_at_1(pairs: Pairs, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[SampleScore]:
    """pass@1 (one output per problem): 1.0 when the output's program passes its tests within ``timeout_s``."""
    check_sandbox(timeout_s)
    scores = []
    for sample, output in pairs:
        outcome = run_program(program_for(sample.turns[0], output, sample.reference), timeout_s)
        scores.append(SampleScore(sample.sample_id, {"pass@1": float(outcome == PASSED)}, outcome))
    return scores


def score_answer_accuracy(pairs: Pairs, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[SampleScore]:
    """Answer accuracy: 1.0 when the output's last number equals the reference's ``#### N``."""
    scores = []
    for sample, output in pairs:
        value, detail = answer_accuracy(output, sample.reference)
        scores.append(SampleScore(sample.sample_id, {"answer_accuracy": value}, detail))
    return scores


def score_rouge(pairs: Pairs, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[SampleScore]:
    """ROUGE-1/2/L F1 of each output against its reference summary."""
    return [SampleScore(sample.sample_id, rouge(output, sample.reference)) for sample, output in pairs]


SCORERS: dict[str, Callable[[Pairs, float], list[SampleScore]]] = {
    "pass@1": score_pass_at_1,
    "answer_accuracy": score_answer_accuracy,
    "rouge": score_rouge,
}
"""One scoring function per metric named by ``Dataset.quality``."""


def no_metric(dataset: str) -> str:
    """The note of a report on a dataset that declares no quality metric."""
    return f"no quality metric for dataset {dataset!r}"


def scored_pairs(samples_by_id: Mapping[str, Sample], records: Sequence[Mapping[str, Any]]) -> Pairs:
    """(sample, output text) of each record, or a DataError naming a record without a referenced sample."""
    pairs = []
    for record in records:
        sample = samples_by_id.get(record["sample_id"])
        if sample is None or sample.reference is None:
            problem = "is not in the rebuilt dataset" if sample is None else "has no reference"
            raise DataError(f"sample {record['sample_id']!r} {problem}; its output cannot be scored")
        pairs.append((sample, record["output_text"]))
    return pairs


def score_records(
    metric: str | None,
    samples_by_id: Mapping[str, Sample],
    records: Iterable[Mapping[str, Any]],
    *,
    dataset: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> QualityReport:
    """Score the turn-0 records with ``metric`` against their samples' references (None: a note, no scores)."""
    if metric is None:
        return QualityReport(dataset, None, note=no_metric(dataset))
    if metric not in SCORERS:
        raise ConfigError(f"unknown quality metric {metric!r}; choose one of {', '.join(SCORERS)}")
    records = list(records)
    first_turns = [record for record in records if record["turn"] == 0]
    scores = SCORERS[metric](scored_pairs(samples_by_id, first_turns), timeout_s)
    return QualityReport(dataset, metric, scores, skipped_turns=len(records) - len(first_turns))


def run_records(run_dir: Path) -> list[dict]:
    """The records of a run folder's complete samples (read only; torn or unfinished lines left out)."""
    return RunStore(run_dir, "", force=True).records  # force: reading, whichever config wrote the folder


def run_dataset(run_dir: Path, data_dir: str | None = None) -> Dataset:
    """The run's dataset, rebuilt from its ``config.yaml`` (``data_dir`` overrides the stored folder)."""
    path = run_dir / CONFIG
    if not path.is_file():
        raise DataError(f"{run_dir} holds no {CONFIG}; it is not a run folder (or it never started)")
    cfg = OmegaConf.load(path)
    return build_dataset(cfg.dataset, data_dir or data_folder(cfg.get("data_dir")))


def data_folder(stored: str | None) -> str | None:
    """The run's data folder if it exists here, else ``SPECBENCH_DATA_DIR`` (None when the run used none)."""
    if stored is None or Path(stored).expanduser().is_dir():
        return stored
    return os.environ.get(DATA_DIR_ENV, stored)


def score_run(
    run_dir: Path | str, *, data_dir: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> QualityReport:
    """Score a run folder's outputs with its dataset's quality metric (``data_dir``: where the data is now)."""
    run_dir = Path(run_dir)
    dataset = run_dataset(run_dir, data_dir)
    if dataset.quality is None:
        return QualityReport(dataset.name, None, note=no_metric(dataset.name), run_dir=str(run_dir))
    samples_by_id = {sample.sample_id: sample for sample in dataset.samples()}
    records = run_records(run_dir)
    report = score_records(dataset.quality, samples_by_id, records, dataset=dataset.name, timeout_s=timeout_s)
    report.run_dir = str(run_dir)
    return report
