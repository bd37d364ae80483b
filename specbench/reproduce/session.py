"""``python -m specbench.reproduce.session SCALE/NAME [--sequential] [OVERRIDE ...]``: one experiment of a
reproduction plan as one measuring session.

Every job of the experiment's sweep and the AR partner of each group of them (``plan.experiment_jobs``) runs in this
one process, so every speedup the tables and figures show divides times taken in one sitting on one machine: each
target model loads once, and the runs that answer the same samples go through them together, the order rotating from
prompt to prompt (``bench.run_phase``, as a benchmark suite does), so drift in the machine's speed hits a method and
its AR partner alike. Each run is an ordinary run folder (``<results_root>/<experiment>/...``,
``coverage.run_folder``) whose summary names the session (``bench``: suite ``reproduce/<scale>``, session = the
experiment, entry = the run's folder below it, baseline = its AR partner's) and whose records carry this process's
``measuring_session``. Complete runs are not touched, partial ones resume sample by sample (the samples of a
resumed sitting pair only with AR samples of that sitting). ``--sequential`` runs the jobs one after another
instead, each engine alone in the process (peak-memory experiments: an interleaved session holds every engine at
once), still in one session.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import open_dict
from tqdm import tqdm

from specbench.bench import run_phase
from specbench.cli import ArgumentParser, interrupted, user_errors
from specbench.config import compose_config
from specbench.environment import measuring_session
from specbench.errors import ConfigError
from specbench.reproduce.coverage import run_folder
from specbench.reproduce.plan import experiment_jobs, partner_job, scales
from specbench.runner import Runner, load_target, target_digest

SUITE = "reproduce/{scale}"
"""The ``bench.suite`` of a reproduction session's runs."""


def entry_label(folder: str) -> str:
    """A run's entry in its session: its folder below the experiment's (``<model>/<dataset>/T0.0-n48/method=ar``)."""
    return folder.split("/", 1)[1]


def session_runners(scale: str, name: str, overrides: list[str]) -> dict[str, Runner]:
    """One runner per job of the experiment (AR partners included), each checked and its folder read before any
    model loads; {entry label: runner}. ``overrides`` (``results_root=``, ``device=``...) go to every job."""
    runners: dict[str, Runner] = {}
    for index, job in enumerate(experiment_jobs(scale, name)):
        cfg = compose_config(*job, *overrides)
        label = entry_label(run_folder(cfg, [*job, *overrides]))
        partner = [*partner_job(job), *overrides]
        with open_dict(cfg):
            cfg.output_dir = str(Path(cfg.results_root) / cfg.experiment / label)
            cfg.progress = False
        bench = {
            "suite": SUITE.format(scale=scale),
            "session": name,
            "entry": label,
            "baseline": entry_label(run_folder(compose_config(*partner), partner)),
            "index": index,
        }
        if label in runners:
            raise ConfigError(f"experiment {name}: two jobs write the run folder {label} ({' '.join(job)})")
        runners[label] = Runner(cfg, bench=bench)
    return runners


def by_target(runners: dict[str, Runner]) -> list[dict[str, Runner]]:
    """The runners in groups that share one loaded target (model, device, dtype), in job order."""
    groups: dict[tuple, dict[str, Runner]] = {}
    for label, runner in runners.items():
        key = (target_digest(runner.cfg, runner.dtype), str(runner.device), runner.cfg.engine.name)
        groups.setdefault(key, {})[label] = runner
    return list(groups.values())


def by_samples(runners: dict[str, Runner], sequential: bool) -> list[dict[str, Runner]]:
    """The phases of one target's runners: those that answer the same samples (ids and turns: a phase hands every
    runner the same prompts) together (one phase each when ``sequential``)."""
    if sequential:
        return [{label: runner} for label, runner in runners.items()]
    phases: dict[tuple, dict[str, Runner]] = {}
    for label, runner in runners.items():
        phases.setdefault(tuple((sample.sample_id, *sample.turns) for sample in runner.samples), {})[label] = runner
    return list(phases.values())


def release(runners) -> None:
    """Drop the engines of finished runners (drafter state, caches) and return their memory, CUDA's included."""
    for runner in runners:
        runner.engine = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_session(scale: str, name: str, overrides: list[str], sequential: bool = False) -> None:
    """Run every pending job of one experiment in this process (one measuring session)."""
    runners = session_runners(scale, name, overrides)
    left = {label: runner for label, runner in runners.items() if not runner.done()}
    print(
        f"[session] {name}: {len(runners)} runs ({len(runners) - len(left)} complete), measuring session "
        f"{measuring_session()}, {'one after another' if sequential else 'prompts interleaved'}",
        flush=True,
    )
    total = sum(len(runner.samples) for runner in left.values())
    bar = tqdm(total=total, desc=name, unit="gen", file=sys.stderr)
    for group in by_target(left):
        first = next(iter(group.values()))
        lm = load_target(first.cfg, first.device, first.dtype)
        for runner in group.values():
            runner.lm = lm
        for phase in by_samples(group, sequential):
            run_phase(phase, bar, 0)
            release(phase.values())  # the next phase's peak memory starts without this one's engines
        for runner in group.values():  # the next target gets the memory
            runner.lm = None
        del lm
        gc.collect()
    bar.close()


def _parser() -> ArgumentParser:
    """The command line of ``python -m specbench.reproduce.session``."""
    parser = ArgumentParser(prog="python -m specbench.reproduce.session", description=__doc__.splitlines()[0])
    parser.add_argument("experiment", metavar="SCALE/NAME", help="an experiment of a plan, e.g. smoke/r3_tables")
    parser.add_argument("--sequential", action="store_true", help="the jobs one after another (peak memory)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every job (results_root=, device=, ...)")
    return parser


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, str, str]:
    """The arguments, the scale and the experiment name (a ConfigError for a malformed SCALE/NAME)."""
    args = _parser().parse_intermixed_args(argv)
    scale, _, name = args.experiment.partition("/")
    if scale not in scales() or not name:
        raise ConfigError(f"experiment {args.experiment!r}: give SCALE/NAME with SCALE one of {scales()}")
    return args, scale, name


def main(argv: Sequence[str] | None = None) -> None:
    """Run one experiment's session; exit 2 with a one-line message on a user error."""
    with user_errors(argv):
        args, scale, name = parse(argv)
        try:
            run_session(scale, name, list(args.overrides), args.sequential)
        except KeyboardInterrupt as stop:
            interrupted(stop, "finished samples are saved in their run folders; rerun the same command to resume")


if __name__ == "__main__":
    main()
