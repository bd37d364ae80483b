"""``python -m specbench.reproduce``: run a scale's experiments, then build its tables and figures.

    python -m specbench.reproduce [all|run|build|list] [--scale smoke|paper] [--only NAME ...]
                                  [--results-root DIR] [--coverage] [--gpu a100] [OVERRIDE ...]

``run`` trains the drafts and heads that pending jobs need and nobody trained yet (``specbench.reproduce.parts``),
then runs the plan's experiments (resuming: complete runs are not repeated) and latency profiles,
``build`` writes the tables (Markdown, LaTeX, CSV) and figures (PNG, PDF) from the stored results,
``all`` does both (what ``make reproduce-tables`` calls), ``list`` shows the plan with its cost (jobs,
samples, generated tokens, forwards and GPU-hours per experiment; ``specbench.reproduce.cost``; for a stand-in
plan also its minutes estimated from the stored runs' wall times, ``specbench.reproduce.walltime``), and
``list --coverage`` which job fills each published number, or why none can (``specbench.reproduce.coverage``).
Trailing Hydra overrides (``device=cuda``, ``dtype=bfloat16``, ...) go to every experiment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from specbench.cli import ArgumentParser, user_errors
from specbench.reproduce.plan import load_plan, run_plan, scales, select

ACTIONS = ("all", "run", "build", "list")


def _parser() -> ArgumentParser:
    """The command line of ``python -m specbench.reproduce``."""
    parser = ArgumentParser(prog="python -m specbench.reproduce", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("action", nargs="?", default="all", choices=ACTIONS)
    parser.add_argument("--scale", default="smoke", help=f"one of {scales()} (default smoke)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these experiments of the plan")
    parser.add_argument(
        "--results-root",
        type=Path,
        metavar="DIR",
        help="runs folder instead of the plan's (e.g. to measure this machine beside the stored runs)",
    )
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="list: every paper_values row with the jobs that fill it or the reason none can",
    )
    parser.add_argument("--gpu", default="a100", help="list: the GPU of the cost estimate (conf/reproduce/gpus/)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every experiment")
    return parser


def list_text(plan, only: list[str] | None, coverage: bool, gpu: str) -> str:
    """``list``: the plan's cost table, or (``coverage``) the coverage of the published numbers."""
    from specbench.reproduce.cost import LatencyModel, cost_table, cost_text, estimate
    from specbench.reproduce.coverage import coverage as covered
    from specbench.reproduce.coverage import coverage_text, plan_jobs
    from specbench.reproduce.tables import paper_values

    names = select(plan, only)
    jobs = plan_jobs(plan, names)
    if coverage:
        subset = (
            (
                f"Only the jobs of {', '.join(names)} (--only): rows the plan's other experiments fill show as "
                "missing here.\n\n"
            )
            if only
            else ""
        )
        return subset + coverage_text(covered(paper_values(), jobs, plan.stand_in_model))
    latency = LatencyModel(gpu, plan.profile_root)
    per_job = estimate(jobs, latency)
    header = f"Plan `{plan.scale}`: {len(names)} experiments, {len(jobs)} jobs (conf/reproduce/{plan.scale}.yaml)\n\n"
    return header + cost_text(per_job, cost_table(per_job, names), latency) + walltime_section(plan, jobs, names)


def walltime_section(plan, jobs, names: list[str]) -> str:
    """For a stand-in (CPU) plan: its minutes on this machine, estimated from the stored runs' wall times."""
    from specbench.reproduce.walltime import estimate_walltime, stored_timings, walltime_table, walltime_text

    stored = stored_timings(plan.results_root) if plan.stand_in_model and plan.results_root.is_dir() else None
    if stored is None or stored.empty:
        return ""
    table = walltime_table(estimate_walltime(jobs, stored), names)
    return "\nWall time of the plan on the machine of the stored runs:\n\n" + walltime_text(
        table, plan.results_root, stored
    )


def warn_if_dirty() -> None:
    """Say before running that the runs will be stamped as measured from uncommitted code (the tables warn)."""
    from specbench.environment import git_state

    if git_state()["git_dirty"]:
        print(
            "[reproduce] WARNING: the checkout has uncommitted changes to tracked files: every run records "
            "git_dirty=true and the tables and figures will warn; commit first for results a reader can trust",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> None:
    """Run the chosen action; exit 2 with a one-line message on a user error."""
    args = _parser().parse_args(argv)
    with user_errors(argv):
        plan = load_plan(args.scale)
        if args.results_root:
            plan = replace(plan, results_root=args.results_root.resolve())
        if args.action == "list":
            print(list_text(plan, args.only, args.coverage, args.gpu), end="")
            return
        if args.action in ("all", "run"):
            from specbench.reproduce.coverage import plan_jobs
            from specbench.reproduce.parts import complete_experiments, train_needed

            warn_if_dirty()
            jobs = plan_jobs(plan, select(plan, args.only))
            # overrides (device=, force=true, ...) change what a run is: their children decide what is complete
            complete = set() if args.overrides else complete_experiments(jobs, plan.results_root)
            seconds = {
                **train_needed(jobs, plan.results_root),
                **run_plan(plan, args.only, args.overrides, complete=complete),
            }
            print(f"[reproduce] {len(seconds)} step(s) in {sum(seconds.values()) / 60:.1f} min")
        if args.action in ("all", "build"):
            from specbench.reproduce.build import build

            build(plan)


if __name__ == "__main__":
    main()
