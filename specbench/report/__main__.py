"""``python -m specbench.report RUN_DIR [RUN_DIR...] [--csv OUT.csv] [--divergences [--diagnose]] [--by category]
[--merge-repeats] [--view runs|steps|latency|cost|acceptance|drafting|batch|length|crosscheck|crosscheck_prompts]
[--ar same|eager|compiled] [--plot OUT.png] [--quality] [--reprice CURVE]``:
the report table of stored runs, with speedup against AR."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from specbench.cli import ArgumentParser, user_errors
from specbench.errors import StorageError
from specbench.report.budgets import curves_in, reprice_table
from specbench.report.compare import AR_BASELINES, divergences, provenance_warning
from specbench.report.plot import FIGURES, save_figure
from specbench.report.quality import quality_table
from specbench.report.read import load
from specbench.report.view import (
    VIEWS,
    diagnosis_text,
    divergence_text,
    format_table,
    quality_text,
    report_table,
    reprice_text,
)

FIGURE_TITLES = {
    "acceptance": "acceptance by draft depth",
    "batch": "speedup and tokens per step against batch size",
    "length": "speedup, tokens per step and step latency against input length",
}


def _parser() -> ArgumentParser:
    """The command line of ``python -m specbench.report``."""
    parser = ArgumentParser(prog="python -m specbench.report", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="RUN_DIR", help="run directories, or folders to search for them")
    parser.add_argument("--csv", metavar="OUT.csv", help="also write the table (full precision)")
    parser.add_argument(
        "--divergences", action="store_true", help="also list the samples that differ from AR and where"
    )
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="with --divergences: judge each run's first divergent turns (at most --max-samples per run): the logit "
        "gap at the divergence and float64 reruns of the method and AR, numeric (a near tie) or BUG; exit 1 on a BUG "
        "(loads the runs' models)",
    )
    parser.add_argument(
        "--max-samples", type=int, default=20, help="with --diagnose: divergent samples judged per run (default 20)"
    )
    parser.add_argument(
        "--gap",
        type=float,
        help="with --diagnose: the largest logit gap counted as a near tie (default: 16 rounding steps of the run's "
        "dtype at the logit's magnitude, at least 1e-4)",
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
        help="runs (throughput, acceptance, speedup), steps (where step time goes), latency (TTFT, time per "
        "output token and step latency percentiles, energy per token), cost (ideal, predicted and achieved "
        "speedup: the cost model beside the measurement), acceptance (by draft depth: joint, conditional and "
        "marginal rates, the histogram), drafting (acceptance per drafting step and per request, the share of steps "
        "that drafted, the oracle bound of perfect drafting), batch (engines and batch "
        "sizes, speedup over the AR of the same engine and batch size), crosscheck (a method in specbench's loop "
        "beside the same method in vLLM: tokens per step, drafting, acceptance, outputs) or crosscheck_prompts "
        "(the same, per prompt)",
    )
    parser.add_argument(
        "--ar",
        choices=AR_BASELINES,
        default="same",
        help="the AR run each run is compared with: the one on its own path (same: eager with eager, compiled with "
        "compiled), or the eager or the compiled AR run for every run",
    )
    parser.add_argument(
        "--quality",
        action="store_true",
        help="also score each run's outputs with its dataset's quality metric (pass@1, answer accuracy, ROUGE) "
        "beside its AR baseline's, with a 95 %% interval of the difference",
    )
    parser.add_argument(
        "--reprice",
        metavar="CURVE",
        help="also the budget=auto runs' calibrations priced on another latency curve (a profile CSV, a cached "
        "curve or a budget.json): the budget each would choose there by ideal speedup, beside here",
    )
    parser.add_argument(
        "--plot",
        metavar="OUT.png",
        help="with --view acceptance: also draw the acceptance by depth of each run; with --view batch: speedup and "
        "tokens per step against the batch size; with --view length: speedup, tokens per step and step latency against "
        "the input length",
    )
    return parser


@contextmanager
def written(option: str, path: str) -> Iterator[None]:
    """Writing the file an option names: an OSError (no such folder, no permission) is one StorageError."""
    try:
        yield
    except OSError as error:
        raise StorageError(f"{option} {path}: cannot write it ({error.strerror or error})") from None


def main(argv: Sequence[str] | None = None) -> None:
    """Print the report table of the given runs; exit 2 with a message when they cannot be read, 1 when
    ``--diagnose`` finds a divergence that numerics do not explain."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.plot and args.view not in FIGURES:
        parser.error(f"--plot draws the views {sorted(FIGURES)}: add --view " + " or --view ".join(sorted(FIGURES)))
    if args.quality and args.merge_repeats:
        parser.error("--quality scores single runs: leave out --merge-repeats")
    if args.diagnose and not args.divergences:
        parser.error("--diagnose judges the divergences: add --divergences")
    if args.max_samples < 1:
        parser.error(f"--max-samples must be >= 1 (got {args.max_samples})")
    bug = False
    with user_errors(argv):
        curves = curves_in(Path(args.reprice)) if args.reprice else []
        runs, samples = load(args.paths, args.by, args.merge_repeats)
    report = report_table(runs, samples, args.view, args.ar)
    warning = provenance_warning(runs)
    if warning:
        print(warning, file=sys.stderr)
    print(format_table(report))
    if args.csv:
        with user_errors(argv), written("--csv", args.csv):
            report.to_csv(args.csv, index=False)
    if args.plot and report.empty:
        print(
            "no figure: the view's table is empty (acceptance: no run drafted, or its records carry no per-step "
            "acceptance)",
            file=sys.stderr,
        )
    elif args.plot:
        with user_errors(argv), written("--plot", args.plot):
            print(f"wrote {save_figure(args.view, report, Path(args.plot), FIGURE_TITLES[args.view])}")
    if args.divergences and args.diagnose:
        print()
        with user_errors(argv):
            from specbench.diagnosis import diagnose  # loads models: only the --diagnose command line needs it

            judged = diagnose(runs, samples, args.max_samples, args.gap)
        print(diagnosis_text(judged))
        bug = bool((judged["verdict"] == "BUG").any())
    elif args.divergences:
        print()
        print(divergence_text(divergences(runs, samples)))
    if args.quality:
        print()
        with user_errors(argv):
            print(quality_text(quality_table(runs, samples)))
    if args.reprice:
        print()
        with user_errors(argv):
            print(reprice_text(reprice_table(runs, curves)))
    if bug:
        sys.exit(1)


if __name__ == "__main__":
    main()
