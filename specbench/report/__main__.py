"""``python -m specbench.report RUN_DIR [RUN_DIR...] [--csv OUT.csv] [--divergences] [--by category]
[--merge-repeats] [--view runs|steps]``: the report table of stored runs, with speedup against AR."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from specbench.cli import user_errors
from specbench.report.compare import divergences, provenance_warning
from specbench.report.read import load
from specbench.report.view import VIEWS, divergence_text, format_table, report_table


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m specbench.report``."""
    parser = argparse.ArgumentParser(prog="python -m specbench.report", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="RUN_DIR", help="run directories, or folders to search for them")
    parser.add_argument("--csv", metavar="OUT.csv", help="also write the table (full precision)")
    parser.add_argument(
        "--divergences", action="store_true", help="also list the samples that differ from AR and where"
    )
    parser.add_argument(
        "--by", metavar="FIELD", help="one row per run and value of a sample field, e.g. --by category (MT-Bench)"
    )
    parser.add_argument(
        "--merge-repeats",
        action="store_true",
        help="one row per setting: its repeats (e.g. benchmark rounds) read as one run",
    )
    parser.add_argument(
        "--view",
        choices=sorted(VIEWS),
        default="runs",
        help="columns: runs (throughput, acceptance) or steps (where step time goes)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Print the report table of the given runs; exit 2 with a message when they cannot be read."""
    args = _parser().parse_args(argv)
    with user_errors(argv):
        runs, samples = load(args.paths, args.by, args.merge_repeats)
    report = report_table(runs, samples, args.view)
    warning = provenance_warning(runs)
    if warning:
        print(warning, file=sys.stderr)
    print(format_table(report))
    if args.csv:
        report.to_csv(args.csv, index=False)
    if args.divergences:
        print()
        print(divergence_text(divergences(runs, samples)))


if __name__ == "__main__":
    main()
