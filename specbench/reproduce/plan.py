"""A reproduction plan (``conf/reproduce/<scale>.yaml``): which experiments run, in what order, and where.

Each experiment is one measuring session (``python -m specbench.reproduce.session``, ``specbench.reproduce.session``)
run in a child process: its sweep's jobs (``sweep_jobs``, the Cartesian product Hydra's sweeper would run) and the
AR partner of each group of them (``with_partners``), on one loaded model, prompts interleaved. Runs that are
already complete in ``results_root`` are resumed (nothing pending: no generation), so rerunning a plan only does the
missing work.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from specbench.config import CONF_DIR, compose_config, find_config, is_group
from specbench.errors import ConfigError, UserError
from specbench.paths import workspace

PLANS_DIR = CONF_DIR / "reproduce"
EXPERIMENTS_DIR = CONF_DIR / "experiment"


class ExperimentFailed(UserError):
    """A child process of the plan exited with an error (its own message is above)."""


@dataclass(frozen=True)
class Plan:
    """One scale's experiments, latency profiles and output folders (paths relative to the project root)."""

    scale: str
    experiments: tuple[str, ...]
    profile_models: tuple[str, ...]
    profile_overrides: tuple[str, ...]
    stand_in_model: str | None
    sequential: tuple[str, ...]
    results_root: Path
    tables_dir: Path
    figures_dir: Path

    @property
    def profile_root(self) -> Path:
        """Where the latency profiles of this scale go (one folder per model)."""
        return self.results_root / "profile"


def scales() -> list[str]:
    """The plans in conf/reproduce/, sorted."""
    return sorted(path.stem for path in PLANS_DIR.glob("*.yaml"))


def experiment_names(scale: str) -> list[str]:
    """The experiment configs of one scale (conf/experiment/<scale>/*.yaml), sorted."""
    return sorted(path.stem for path in (EXPERIMENTS_DIR / scale).glob("*.yaml"))


def load_plan(scale: str, root: Path | None = None) -> Plan:
    """conf/reproduce/<scale>.yaml as a Plan, or a ConfigError naming the scales / unknown experiments."""
    path = PLANS_DIR / f"{scale}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown scale {scale!r}; choose one of {scales()}")
    spec = OmegaConf.load(path)
    root = workspace() if root is None else root
    unknown = sorted(set(spec.experiments) - set(experiment_names(scale)))
    if unknown:
        raise ConfigError(f"{path}: no experiment config for {unknown} in conf/experiment/{scale}/")
    return Plan(
        scale,
        tuple(spec.experiments),
        tuple(spec.profile.models),
        tuple(spec.profile.overrides),
        spec.stand_in_model,
        tuple(spec.get("sequential") or ()),
        root / spec.results_root,
        root / spec.tables_dir,
        root / spec.figures_dir,
    )


def select(plan: Plan, only: list[str] | None) -> list[str]:
    """The plan's experiments, or the named subset (in plan order); ConfigError for a name not in it."""
    if not only:
        return list(plan.experiments)
    missing = sorted(set(only) - set(plan.experiments))
    if missing:
        raise ConfigError(f"not in the {plan.scale} plan: {missing}; choose from {list(plan.experiments)}")
    return [name for name in plan.experiments if name in only]


def experiment_command(plan: Plan, name: str, overrides: list[str]) -> list[str]:
    """The command line that runs one experiment as a measuring session (``specbench.reproduce.session``)."""
    order = ["--sequential"] if name in plan.sequential else []
    return [
        sys.executable,
        "-m",
        "specbench.reproduce.session",
        f"{plan.scale}/{name}",
        *order,
        f"results_root={plan.results_root}",
        *overrides,
    ]


def profile_command(plan: Plan, model: str, overrides: list[str]) -> list[str]:
    """The command line of one latency profile of the plan."""
    return [
        sys.executable,
        "-m",
        "specbench.profile",
        f"model={model}",
        f"output_dir={plan.profile_root / model}",
        *plan.profile_overrides,
        *overrides,
    ]


def run_child(command: list[str], label: str) -> float:
    """Run one child process in the project root; its wall time, or ExperimentFailed."""
    print(f"[reproduce] {label}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    code = subprocess.call(command, cwd=workspace())
    if code != 0:
        raise ExperimentFailed(f"{label} failed (exit {code}); finished runs are kept, rerun to resume")
    seconds = time.perf_counter() - start
    print(f"[reproduce] {label}: done in {seconds:.0f} s", flush=True)
    return seconds


def run_plan(
    plan: Plan,
    only: list[str] | None = None,
    overrides: list[str] | None = None,
    profile: bool = True,
    complete: Collection[str] = (),
) -> dict[str, float]:
    """Run the selected experiments but the ``complete`` ones (every run stored: no child started), then the
    latency profiles; seconds per step."""
    overrides = list(overrides or [])
    seconds = {}
    for name in select(plan, only):
        if name in complete:
            print(f"[reproduce] {name}: every run complete in {plan.results_root}, skipped", flush=True)
        else:
            seconds[name] = run_child(experiment_command(plan, name, overrides), name)
    if profile and not only:
        for model in plan.profile_models:
            if any((plan.profile_root / model).glob("latency_*.csv")):
                print(f"[reproduce] profile {model}: already in {plan.profile_root / model}, skipped")
                continue
            profile_overrides = [o for o in overrides if o.startswith(("device=", "dtype="))]
            seconds[f"profile:{model}"] = run_child(profile_command(plan, model, profile_overrides), f"profile {model}")
    return seconds


def sweep_jobs(scale: str, name: str) -> list[list[str]]:
    """The override list of every job of one experiment's sweep (the Cartesian product Hydra runs)."""
    return [list(job) for job in _sweep(scale, name)]


@cache
def _sweep(scale: str, name: str) -> tuple[tuple[str, ...], ...]:
    """``sweep_jobs``, composed once per process (the experiment's config is read once, like ``coverage._composed``)."""
    cfg = compose_config(f"+experiment={scale}/{name}", hydra_node=True)
    params = cfg.hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{key}={value}" for key, value in params.items()])
    axes = [
        [f"{o.get_key_element()}={value}" for value in o.sweep_string_iterator()]
        if o.is_sweep_override()
        else [f"{o.get_key_element()}={o.get_value_element_as_str()}"]
        for o in parsed
    ]
    return tuple((f"+experiment={scale}/{name}", *job) for job in itertools.product(*axes))


AR_OVERRIDES = ("method=ar",)
"""What an AR partner job sets instead of its group's method overrides."""
METHOD_KEYS = ("method", "budget")
"""Overrides that choose or size the method (``method=...``, ``method.drafter.nodes=...``, ``budget=...``)."""


def sets_method(override: str) -> bool:
    """Whether a job override chooses or configures the method: ``method``/``budget`` keys and their sub-keys, and
    a group whose options are packaged into the method node (``+self_draft_cache=both``: ``# @package method...``)."""
    parsed = OverridesParser.create().parse_override(override)
    key = parsed.key_or_group
    if key in METHOD_KEYS or key.startswith(tuple(f"{k}." for k in METHOD_KEYS)):
        return True
    if not is_group(key):
        return False
    path = find_config(key, str(parsed.value()))
    first = path.read_text().splitlines()[0] if path else ""
    return first.startswith("# @package method")


def partner_job(job: list[str]) -> list[str]:
    """The AR partner of a job: the same experiment, model, dataset, temperature, repeat and the rest of the run
    settings, with AR for the method (what a speedup divides by, timed in the same session)."""
    return [override for override in job if not sets_method(override)] + list(AR_OVERRIDES)


def with_partners(jobs: list[list[str]]) -> list[list[str]]:
    """The jobs and, after them, the AR partner of every group of jobs (``partner_job``) that does not hold its AR
    job already, once each: every speedup of an experiment then divides times of its own session."""
    present = {tuple(sorted(job)) for job in jobs}
    partners: dict[tuple[str, ...], list[str]] = {}
    for job in jobs:
        partner = partner_job(job)
        key = tuple(sorted(partner))
        if key not in present:
            partners.setdefault(key, partner)
    return [*jobs, *partners.values()]


def experiment_jobs(scale: str, name: str) -> list[list[str]]:
    """Every job one experiment's session runs: its sweep and the AR partners it needs."""
    return with_partners(sweep_jobs(scale, name))
