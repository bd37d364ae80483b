"""The one flow every head trainer follows (Medusa, Hydra, EAGLE, EAGLE-3); each fills in only what differs.

reuse -> split -> features -> build -> train -> evaluate -> save: a second run with the same settings (model,
self-distilled data, head node, ``train.*``) is a no-op unless ``force=true``; the held-out sequences are split off
before any feature is computed; the folder is built by one process at a time and replaced atomically. A trainer is
a ``HeadTrainer`` subclass (its settings schema and range checks, how it turns sequences into training examples,
builds, trains, evaluates and saves its head, and what it adds to the training record); its module's ``main`` is
``run_head_trainer(<its class>, overrides)``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from omegaconf import DictConfig

from specbench.errors import ConfigError
from specbench.files import building
from specbench.manifest import digest, finished_training
from specbench.models.loading import LoadedModel
from specbench.models.parts import part_kind
from specbench.train.common import (
    OptimizerSettings,
    check_types,
    compose_train,
    container,
    data_problems,
    head_training_checks,
    load_target,
    model_identity,
)
from specbench.train.selfdistill import SelfDistilled, data_summary, self_distilled
from specbench.train.selfdistill import validate as validate_prompts


@dataclass
class HeadOptimizerSettings(OptimizerSettings):
    """The types of the ``train.*`` keys every head trainer shares; each trainer's schema adds its own."""

    max_steps: int
    amp_dtype: str | None
    max_length: int
    eval_sequences: int
    eval_top_k: int
    seed: int


@dataclass
class HeadTraining:
    """What a head trainer starts from: its config, the target, the self-distilled data, the output folder, and
    the settings that define the head with their digest."""

    cfg: DictConfig
    lm: LoadedModel
    data: list[SelfDistilled]
    folder: Path
    settings: dict
    digest: str


Examples = TypeVar("Examples", bound=Sized)
"""What a trainer trains on: its features of a list of self-distilled sequences (positions or sequences)."""


class HeadTrainer(ABC, Generic[Examples]):
    """One head kind's part of the shared flow, bound to a loaded target and its composed settings."""

    command: ClassVar[str]  # the part kind's trainer subcommand (specbench.models.parts)
    name: ClassVar[str]  # the method's name in messages ("Medusa", "EAGLE-3")
    head_key: ClassVar[str]  # the config node of the head's settings: "head" or "heads"
    schema: ClassVar[type]  # the dataclass whose fields type every setting of the command
    soft_labels: ClassVar[bool]  # the trainer distils the target's recorded top-k laws
    table_rows: ClassVar[str] = "head"  # what a row of the accuracy table is: "head" or "depth"
    table_column: ClassVar[str] = "positions"  # the accuracy record's per-row list shown last

    def __init_subclass__(cls, *, command: str, name: str, head_key: str, schema: type, soft_labels: bool) -> None:
        """A trainer declares what it is in its class line: ``class X(HeadTrainer[...], command="x", ...)``."""
        super().__init_subclass__()
        cls.command, cls.name, cls.head_key, cls.schema, cls.soft_labels = command, name, head_key, schema, soft_labels

    def __init__(self, lm: LoadedModel, cfg: DictConfig) -> None:
        self.lm, self.cfg = lm, cfg

    @classmethod
    @abstractmethod
    def range_checks(cls, head: DictConfig, train: DictConfig) -> list[tuple[bool, str]]:
        """(holds, message) for the head node's keys and this trainer's own ``train.*`` keys, after the types
        passed."""

    @classmethod
    def validate(cls, cfg: DictConfig) -> None:
        """Reject impossible settings (types first, then ranges and what the data can give) with the key and its
        valid range, before anything loads."""
        check_types(cfg, cls.schema, f"{cls.name} training")
        checks = [*cls.range_checks(cfg[cls.head_key], cfg.train), *head_training_checks(cfg.train)]
        problems = [message for ok, message in checks if not ok] + data_problems(cfg, soft_labels=cls.soft_labels)
        if problems:
            raise ConfigError(f"invalid {cls.name} training settings: " + "; ".join(problems))
        validate_prompts(cfg.prompts)

    @abstractmethod
    def features(self, data: list[SelfDistilled]) -> Examples:
        """The training examples of ``data`` (the frozen target's features, computed once)."""

    @abstractmethod
    def build(self, train: Examples) -> str:
        """Build the untrained head on the target's device; say what is trained on what (one line)."""

    @abstractmethod
    def fit(self, train: Examples) -> dict:
        """Train the head; the optimiser's result (steps, seconds, what stopped it, losses)."""

    @abstractmethod
    def evaluate(self, held_out: Examples) -> dict:
        """The head's held-out accuracy (per head or per depth)."""

    @classmethod
    def accuracy_table(cls, result: dict) -> str:
        """The held-out accuracy as printable lines: top-1, top-k and one more column per head (or per depth)."""
        return accuracy_table(result, cls.table_rows, cls.table_column)

    @abstractmethod
    def save(self, folder: Path, record: dict) -> None:
        """Write the head and its training record into ``folder`` (atomically, manifest last)."""

    def record(self, train: Examples, accuracy: dict) -> dict:
        """What this trainer adds to the training record (sizes, its own diagnostics)."""
        return {}


def accuracy_table(result: dict, rows: str, column: str) -> str:
    """Per-row top-1 / top-k held-out accuracy and ``result[column]`` (positions, loss) as printable lines."""
    lines = [f"{rows:>5}  top-1   top-{result['top_k']}  {column}"]
    for k, (top1, topk, value) in enumerate(zip(result["top1"], result["topk"], result[column]), start=1):
        lines.append(f"{k:>5}  {top1:6.3f}  {topk:6.3f}  {value}")
    return "\n".join(lines)


def at_least_one(node: str, settings, keys: tuple[str, ...]) -> list[tuple[bool, str]]:
    """(holds, message) for counts of a head node that must be >= 1 (``heads.num_heads`` and the like)."""
    return [(settings[key] >= 1, f"{node}.{key} must be >= 1 (got {settings[key]})") for key in keys]


def head_training(trainer: type[HeadTrainer[Any]], overrides: list[str]) -> HeadTraining:
    """Compose and check ``python -m specbench.train <command>``, load the target and its self-distilled data;
    the settings digest covers the model, the data, the head node and every training key."""
    cfg = compose_train(trainer.command, overrides)
    trainer.validate(cfg)
    lm = load_target(cfg)
    data = self_distilled(lm, cfg.prompts, cfg.data_dir, cfg.progress, cfg.train.eval_sequences)
    folder = Path(cfg.output_dir) if cfg.output_dir else part_kind(trainer.command).folder(lm.name)
    settings = {
        "model": model_identity(lm),
        "data": digest([[d.prompt_ids, d.output_ids] for d in data]),
        trainer.head_key: container(cfg[trainer.head_key]),
        "train": container(cfg.train),
    }
    return HeadTraining(cfg, lm, data, folder, settings, digest(settings))


def split(data: list[SelfDistilled], eval_sequences: int, seed: int) -> tuple[list, list]:
    """(train, held-out) sequences after a seeded shuffle; the held-out ones are never trained on."""
    if eval_sequences >= len(data):
        raise ConfigError(
            f"train.eval_sequences ({eval_sequences}) must be below the number of "
            f"self-distilled sequences ({len(data)})"
        )
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
    return [data[i] for i in order[eval_sequences:]], [data[i] for i in order[:eval_sequences]]


def run_head_trainer(trainer_class: type[HeadTrainer[Any]], overrides: list[str]) -> Path:
    """Train (or reuse) one head kind for ``model``; print and save its held-out accuracy; the folder."""
    started = time.monotonic()
    job = head_training(trainer_class, overrides)
    cfg, folder, title = job.cfg, job.folder, part_kind(trainer_class.command).title
    previous = None if cfg.force else finished_training(folder, job.digest)
    if previous is not None:
        print(f"[specbench] {title} in {folder}: up to date (same settings; force=true retrains)")
        print(trainer_class.accuracy_table(previous["accuracy"]))
        return folder
    trainer = trainer_class(job.lm, cfg)
    with building(folder):  # one builder of this folder at a time
        train_data, eval_data = split(job.data, cfg.train.eval_sequences, cfg.train.seed)
        features_start = time.monotonic()
        train, held_out = trainer.features(train_data), trainer.features(eval_data)
        features_s = time.monotonic() - features_start
        torch.manual_seed(cfg.train.seed)
        print(f"[specbench] training {trainer.build(train)}; {len(held_out)} held-out examples")
        result = trainer.fit(train)
        accuracy = trainer.evaluate(held_out)
        print(trainer.accuracy_table(accuracy))
        record = {
            "digest": job.digest,
            **job.settings,
            "data_summary": data_summary(job.data),
            **trainer.record(train, accuracy),
            "features_seconds": round(features_s, 1),
            "result": result,
            "accuracy": accuracy,
            "total_seconds": round(time.monotonic() - started, 1),
        }
        trainer.save(folder, record)
    print(
        f"[specbench] {title} saved to {folder} ({result['steps']} steps, {result['seconds']} s of training, "
        f"stopped by {result['stopped_by']}; {record['total_seconds']} s in all)"
    )
    return folder
