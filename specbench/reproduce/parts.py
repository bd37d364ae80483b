"""Train the parts a plan still needs (distilled drafts, Medusa, EAGLE, EAGLE-3 and Hydra heads, Draft&Verify's
searched skipped sets), and only those.

A job needs a part when its method reads the model's part node (``${oc.select:model.draft,null}`` and
the like in the method config) and that node says the part is ours to train (its ``source`` is the one
``specbench.models.parts`` names for that kind, ``distilled`` or ``trained``, and it gives no ``path``), or when the
kind's ``needed_by`` says the job's configuration needs it (a part its method's settings key: the trainer takes the
job's method overrides and returns at once when that part is stored, so such a part is never counted as built
here, where no model is loaded). Only jobs
that are still pending count: a job whose run folder holds a complete run of its configuration with at least its
samples is done. A part whose folder holds a finished ``manifest.json`` (``specbench.manifest``) is trained
already. So a fully stored plan trains nothing and loads no model; a plan with pending Medusa jobs
trains the Medusa heads once (``python -m specbench.train medusa model=<model>``) before it runs. The same test
spares the plan a child process for each experiment whose runs are all done (``complete_experiments``).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from specbench.manifest import read_manifest
from specbench.models.parts import PART_KINDS, PartKind, part_kind
from specbench.reproduce.coverage import Job, job_config
from specbench.reproduce.plan import run_child

SETTING_OVERRIDES = ("model.", "method", "device=", "dtype=", "data_dir=")
"""The job overrides a part its method's settings key is built with (a model config's keys, the method's, where)."""


@dataclass(frozen=True, order=True)
class Part:
    """One trained part of one model: its kind (draft, medusa, ..., layer_skip), the model config and, for a part its
    method's settings key, the job's overrides that decide those settings."""

    node: str
    model: str
    overrides: tuple[str, ...] = ()

    @property
    def folder(self) -> Path:
        """Where ``python -m specbench.train <node> model=<model>`` writes it."""
        return part_kind(self.node).folder(self.model)

    @property
    def command(self) -> list[str]:
        """The command line that trains it."""
        return [sys.executable, "-m", "specbench.train", self.node, f"model={self.model}", *self.overrides]


def trained_kinds() -> list[PartKind]:
    """The part kinds a model config names by a node (the ones a job can need trained)."""
    return [kind for kind in PART_KINDS.values() if kind.node is not None]


def is_done(job: Job, root: Path) -> bool:
    """Whether ``root`` holds the job's run complete: same configuration digest, at least the job's samples."""
    path = Path(root) / job.folder / "summary.json"
    if not path.is_file():
        return False
    summary = json.loads(path.read_text())
    limit = summary.get("limit")
    enough = limit is None or (job.limit is not None and limit >= job.limit)
    return summary.get("status") == "complete" and summary.get("config_digest") == job.digest and enough


def parts_of(job: Job) -> set[Part]:
    """The trained parts a job's method reads (its method node interpolates ``model.<node>``), and the parts its
    configuration needs by a kind's ``needed_by``."""
    cfg = job_config(list(job.overrides))
    method = OmegaConf.to_yaml(cfg.method)  # unresolved: the interpolations show which model nodes it reads
    parts = set()
    for kind in trained_kinds():
        part = OmegaConf.select(cfg, f"model.{kind.node}")
        reads = re.search(rf"model\.{kind.node}\b", method) is not None  # model.eagle is not model.eagle3
        if reads and part is not None and part.get("source") == kind.built_source and not part.get("path"):
            parts.add(Part(kind.command, cfg.model.name))
    settings = tuple(override for override in job.overrides if override.lstrip("+~").startswith(SETTING_OVERRIDES))
    for kind in PART_KINDS.values():
        if kind.needed_by is not None and kind.needed_by(cfg):
            parts.add(Part(kind.command, cfg.model.name, settings))
    return parts


def is_trained(part: Part) -> bool:
    """Whether the part's folder holds a finished manifest (training ended and every file was written); a part its
    method's settings key never counts as built here (its trainer knows, and returns at once)."""
    if part_kind(part.node).needed_by is not None:
        return False
    manifest = read_manifest(part.folder)
    return bool(manifest and manifest.get("finished"))


def needed_parts(jobs: list[Job], root: Path) -> dict[Part, int]:
    """The untrained parts the pending jobs need, with how many pending jobs need each."""
    counts: dict[Part, int] = {}
    for job in jobs:
        if not is_done(job, root):
            for part in parts_of(job):
                counts[part] = counts.get(part, 0) + 1
    return {part: counts[part] for part in sorted(counts) if not is_trained(part)}


def complete_experiments(jobs: list[Job], root: Path) -> set[str]:
    """The experiments every job of which ``root`` holds complete (``is_done``): nothing for their child to run."""
    pending = {job.experiment for job in jobs if not is_done(job, root)}
    return {job.experiment for job in jobs} - pending


def train_needed(jobs: list[Job], root: Path) -> dict[str, float]:
    """Train every part the pending ``jobs`` need and nobody trained yet; seconds per part trained."""
    needed = needed_parts(jobs, root)
    if not needed:
        print("[reproduce] no pending job needs an untrained draft or heads: nothing to train")
    return {
        f"train {part.node}": run_child(part.command, f"train {part.node} ({count} pending job(s) need it)")
        for part, count in needed.items()
    }
