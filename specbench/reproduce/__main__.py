"""``python -m specbench.reproduce``: run a scale's experiments, then build its tables and figures.

    python -m specbench.reproduce [all|run|build|list] [--scale smoke|paper] [--only NAME ...]
                                  [--results-root DIR] [OVERRIDE ...]

``run`` runs the plan's experiments (resuming: complete runs are not repeated) and latency profiles,
``build`` writes the tables (Markdown, LaTeX, CSV) and figures (PNG, PDF) from the stored results,
``all`` does both (what ``make reproduce-tables`` calls), ``list`` shows the plan. Trailing Hydra
overrides (``device=cuda``, ``dtype=bfloat16``, ...) go to every experiment.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from specbench.errors import UserError
from specbench.reproduce.plan import load_plan, run_plan, scales

ACTIONS = ("all", "run", "build", "list")


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m specbench.reproduce``."""
    parser = argparse.ArgumentParser(prog="python -m specbench.reproduce",
                                     description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("action", nargs="?", default="all", choices=ACTIONS)
    parser.add_argument("--scale", default="smoke", help=f"one of {scales()} (default smoke)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these experiments of the plan")
    parser.add_argument("--results-root", type=Path, metavar="DIR",
                        help="runs folder instead of the plan's (e.g. to measure this machine beside the stored runs)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every experiment")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Run the chosen action; exit 2 with a one-line message on a user error."""
    args = _parser().parse_args(argv)
    try:
        plan = load_plan(args.scale)
        if args.results_root:
            plan = replace(plan, results_root=args.results_root.resolve())
        if args.action == "list":
            print("\n".join(plan.experiments))
            return
        if args.action in ("all", "run"):
            seconds = run_plan(plan, args.only, args.overrides)
            print(f"[reproduce] {len(seconds)} step(s) in {sum(seconds.values()) / 60:.1f} min")
        if args.action in ("all", "build"):
            from specbench.reproduce.build import build

            build(plan)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
