"""Which job of a plan fills which published number: the coverage check of ``paper_values/*.csv``.

Every job of a plan (every point of every experiment's sweep) is composed here without running it,
and reduced to what a table matches a paper row on: model, dataset, method, temperature and the
knobs the job sets away from its method's defaults (``setting``, the same text the stored runs get
from ``results.changed_knobs``). A row is *filled* when at least one job matches it (and, for
speedup and overhead, an AR job of the same experiment, i.e. timed in the same session, with the same model,
dataset, temperature, budget and repeat exists to pair with); otherwise it must carry a reason in its
``unfillable`` column (private data, a model
nobody published, a method this harness does not implement, ...). ``python -m specbench.reproduce
list --scale paper --coverage`` prints the list; tests/test_reproduce_coverage.py requires that no
row is left without a job or a reason, and that no filled row keeps a stale reason.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache

import pandas as pd
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from specbench.config import CONF_DIR, compiled_suffix, compose_config, suffix
from specbench.reproduce.plan import Plan, experiment_jobs
from specbench.reproduce.results import default_knobs, flatten, setting_text
from specbench.reproduce.tables import CATEGORY_KEY, MEASURED_METRICS, draft_measured, parse_setting
from specbench.runner import config_digest, without_locations

PAIRED_METRICS = ("speedup", "overhead")
"""Metrics that need the AR run of the same session (experiment), model, dataset, temperature, budget and repeat."""
STATUSES = ("filled", "unfillable", "missing", "stale reason")


@dataclass(frozen=True)
class Job:
    """One job of a plan, reduced to what tables match and what the cost estimate needs."""

    experiment: str
    overrides: tuple[str, ...]
    model: str
    dataset: str
    method: str
    temperature: float
    top_p: float
    max_new_tokens: int
    repeat: int
    limit: int | None
    warmup: int
    setting: str
    sample_size: int | None  # the dataset config's subsample (None: its whole evaluated split)
    lossless: bool
    changes_target: str | None  # the model a fine-tuned checkpoint (Medusa-2) changes, if any
    folder: str  # the run folder under results_root (experiment/model/dataset/T<T>-n<tokens>/<swept overrides>)
    digest: str  # the run's configuration digest (as the runner computes it, on a CPU in float32)
    categories: tuple[str, ...] = ()  # the dataset categories the job keeps (dataset.categories; empty: all)


@cache
def _composed(groups: tuple[str, ...]) -> DictConfig:
    """The config of a job's group-selecting overrides (experiment, model, method, dataset, +groups), cached."""
    return compose_config(*groups)


def job_config(job: list[str]) -> DictConfig:
    """A job's composed config: its config-group overrides composed (cached), its value overrides set."""
    overrides = OverridesParser.create().parse_overrides(job)
    groups = tuple(o.input_line for o in overrides if (CONF_DIR / o.key_or_group).is_dir())
    cfg = copy.deepcopy(_composed(groups))
    with open_dict(cfg):
        for override in overrides:
            if not (CONF_DIR / override.key_or_group).is_dir():
                OmegaConf.update(cfg, override.key_or_group, override.value(), merge=False)
    return cfg


def run_folder(cfg: DictConfig, overrides: list[str]) -> str:
    """``<experiment>/<model>/<dataset>[@<protocol>]/T<temperature>-n<max_new_tokens>[-compiled]/<override dirname>``,
    as the scales' output_dir."""
    excluded = set(
        OmegaConf.select(cfg, "hydra.job.config.override_dirname.exclude_keys", default=None) or _scale_exclude_keys()
    )
    parsed = OverridesParser.create().parse_overrides(overrides)
    dirname = ",".join(sorted(str(o.input_line) for o in parsed if o.key_or_group not in excluded))
    protocol = suffix("@", cfg.get("protocol"))
    budget = f"T{cfg.temperature}-n{cfg.max_new_tokens}{compiled_suffix(cfg.compile, cfg.device)}"
    return f"{cfg.experiment}/{cfg.model.name}/{cfg.dataset.name}{protocol}/{budget}/{dirname}"


@cache
def _scale_exclude_keys() -> tuple[str, ...]:
    """The keys the scales leave out of a run folder's name (conf/scale/paper.yaml; the smoke scale's are the same)."""
    return tuple(OmegaConf.load(CONF_DIR / "scale" / "paper.yaml").hydra.job.config.override_dirname.exclude_keys)


def job_of(experiment: str, overrides: list[str]) -> Job:
    """The Job of one sweep point (``experiment`` names its folder when its overrides compose no experiment)."""
    cfg = job_config(overrides)
    with open_dict(cfg):
        cfg.experiment = cfg.get("experiment") or experiment
        cfg.output_dir = run_folder(cfg, overrides)  # the hydra resolver of the scales' output_dir is not there
    folder = cfg.output_dir
    digest = config_digest(cfg, torch.device("cpu"), torch.float32)
    method = flatten(without_locations(OmegaConf.to_container(cfg.method, resolve=True)), "method.")
    defaults = default_knobs(cfg.method.name, cfg.model.name, float(cfg.temperature), float(cfg.top_p))
    changed = {key: value for key, value in method.items() if key not in defaults or defaults[key] != value}
    return Job(
        experiment,
        tuple(overrides),
        cfg.model.name,
        cfg.dataset.name,
        cfg.method.name,
        float(cfg.temperature),
        float(cfg.top_p),
        int(cfg.max_new_tokens),
        int(cfg.repeat),
        cfg.limit,
        int(cfg.warmup),
        setting_text(changed),
        cfg.dataset.get("sample_size"),
        bool(cfg.method.lossless),
        cfg.model.get("changes_target"),
        folder,
        digest,
        tuple(cfg.dataset.get("categories") or ()),
    )


def plan_jobs(plan: Plan, only: list[str] | None = None) -> list[Job]:
    """Every job of the plan's experiments (or of ``only``), their AR partners included (``experiment_jobs``), in
    plan order."""
    names = [name for name in plan.experiments if not only or name in only]
    return [job_of(name, overrides) for name in names for overrides in experiment_jobs(plan.scale, name)]


def folder_conflicts(jobs: list[Job]) -> dict[str, list[str]]:
    """Run folders that two jobs of the plan would fill with different configurations ({folder: experiments}):
    the second would stop on the runner's digest check."""
    seen: dict[str, dict[str, list[str]]] = {}
    for job in jobs:
        seen.setdefault(job.folder, {}).setdefault(job.digest, []).append(job.experiment)
    return {
        folder: sorted({name for names in digests.values() for name in names})
        for folder, digests in seen.items()
        if len(digests) > 1
    }


def jobs_frame(jobs: list[Job]) -> pd.DataFrame:
    """One row per job (the Job fields as columns)."""
    return pd.DataFrame([job.__dict__ for job in jobs], columns=list(Job.__dataclass_fields__))


def row_jobs(row: pd.Series, jobs: pd.DataFrame, stand_in: str | None = None) -> pd.DataFrame:
    """The jobs that fill one paper row (empty when the row cannot be measured by any of them)."""
    model = stand_in or row["model"]
    if (
        not (model and row["method"] and row["dataset"])
        or row["metric"] not in MEASURED_METRICS
        or not draft_measured(row, stand_in)
    ):
        return jobs.iloc[0:0]
    wanted = parse_setting(row["setting"])
    wanted.pop(CATEGORY_KEY, None)  # categories are split from the whole dataset's runs when tables are built
    same = jobs[
        (jobs["model"] == model)
        & (jobs["dataset"] == row["dataset"])
        & (jobs["method"] == row["method"])
        & (jobs["temperature"] - float(row["temperature"] or 0)).abs().lt(1e-9)
        & (jobs["setting"] == setting_text(wanted))
    ]
    if row["metric"] in PAIRED_METRICS and len(same):
        ar = jobs[jobs["method"] == "ar"]
        keys = ["experiment", "model", "dataset", "temperature", "top_p", "max_new_tokens", "repeat"]  # one session
        same = same.merge(ar[keys].drop_duplicates(), on=keys)
    return same


def coverage(values: pd.DataFrame, jobs: list[Job] | pd.DataFrame, stand_in: str | None = None) -> pd.DataFrame:
    """The paper rows with ``status`` (filled / unfillable / missing / stale reason), ``experiments``,
    ``jobs`` (how many jobs fill the row) and ``lossy`` (the jobs' model changes the paper's target, as the
    Medusa-2 checkpoints do: ``changes_target`` in the model config)."""
    frame = jobs if isinstance(jobs, pd.DataFrame) else jobs_frame(jobs)
    rows = []
    for _, row in values.iterrows():
        found = row_jobs(row, frame, stand_in)
        reason = str(row.get("unfillable", "") or "").strip()
        status = ("stale reason" if reason else "filled") if len(found) else ("unfillable" if reason else "missing")
        changed = sorted(set(found["changes_target"].dropna()))
        rows.append(
            {
                **row.to_dict(),
                "status": status,
                "jobs": len(found),
                "experiments": " ".join(dict.fromkeys(found["experiment"])),
                "lossy": f"lossy: fine-tunes {', '.join(changed)}" if changed else "",
            }
        )
    return pd.DataFrame(rows)


def coverage_text(covered: pd.DataFrame) -> str:
    """The coverage list as plain text: one line per paper row, grouped by paper and table, then a summary."""
    lines = []
    for (paper, table), group in covered.groupby(["paper", "table"], sort=False):
        lines.append(f"{paper} {table}")
        for _, row in group.iterrows():
            what = " ".join(
                part
                for part in (
                    row["paper_model"],
                    row["draft"] and f"[{row['draft']}]",
                    row["dataset"],
                    row["paper_method"],
                    row["setting"],
                    f"T={row['temperature']:g}" if row["temperature"] else "",
                    row["metric"],
                )
                if part
            )
            if row["status"] == "filled":
                status = f"job: {row['experiments']} ({row['jobs']})" + (f" [{row['lossy']}]" if row["lossy"] else "")
            elif row["status"] == "unfillable":
                status = f"unfillable: {row['unfillable']}"
            elif row["status"] == "stale reason":
                status = f"STALE REASON (filled by {row['experiments']}): {row['unfillable']}"
            else:
                status = "MISSING: no job and no reason"
            lines.append(f"  {what}: {status}")
    counts = covered["status"].value_counts()
    lines.append("")
    lines.append(f"{len(covered)} paper rows: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES))
    return "\n".join(lines) + "\n"
