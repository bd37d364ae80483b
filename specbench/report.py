"""The report: load result folders into pandas, join every run with its AR baseline, print tables.

Every comparison between runs (speedup three ways, overhead, exact match, first divergence, the
bootstrap interval) is computed here and nowhere else; per-run aggregates come from
``specbench.metrics.aggregate``. The benchmark suites (``specbench.bench``) print this module's
``steps`` view of their run folders.

Everything is derived from the raw ``samples.jsonl`` records (docs/design.md#results-on-disk): metrics are
recomputed with ``specbench.metrics.aggregate`` instead of being read from ``summary.json``, and
speedup and exact match are computed against the matching AR run on the (sample_id, turn) keys that
both runs have, since runs can stop at different limits.

Usage: ``python -m specbench.report RUN_DIR [RUN_DIR...] [--csv OUT.csv] [--divergences] [--by category]
[--merge-repeats] [--view runs|steps]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.cli import user_errors
from specbench.dependencies import dependency_label
from specbench.errors import UserError
from specbench.metrics import aggregate
from specbench.schema import SAMPLE_FIELDS, upgrade_record, validate_record

PathLike = str | Path

AR_METHOD = "ar"
RUN_COLUMNS = [
    "run_dir",
    "model",
    "method",
    "dataset",
    "temperature",
    "top_p",
    "seed",
    "max_new_tokens",
    "device_name",
    "dtype",
    "repeat",
    "lossless",
    "status",
    "n_samples",
    "session",
    "entry",
    "baseline_entry",
    "entry_index",
    "prompt_format",
    "target",
    "artefacts",
    "env.git_commit",
    "env.git_dirty",
    "env.dependencies",
]
# What a run must share with its AR baseline for a speedup to mean anything (docs/design.md#fair-comparisons):
# the same target (weights, revision, chat template, dtype) answering prompts of the same format; ``session``
# keeps the runs of one benchmark-suite session together ("" for ordinary runs). Per sample, the prompts'
# token digests must agree too (``_pair_with``).
MATCH_KEYS = [
    "model",
    "dataset",
    "temperature",
    "top_p",
    "max_new_tokens",
    "device_name",
    "dtype",
    "repeat",
    "session",
    "prompt_format",
    "target",
]
# A record's key within its run; ``repeat`` tells apart the repeats that ``merge_repeats`` puts in one run.
SAMPLE_KEY = ["sample_id", "turn", "repeat"]
BOOTSTRAP_SAMPLES = 1000
AR_SIDE = ["run_dir", "new_tokens", "wall_s", "output_ids", "prompt_sha"]
TABLE_COLUMNS = [
    "run_dir",
    "model",
    "method",
    "dataset",
    "temperature",
    "n_samples",
    "throughput_total",
    "throughput_mean",
    "tokens_per_step",
    "accepted_per_step",
    "draft_efficiency",
    "step_latency_s",
    "outside_forward_share",
    "n_common",
    "overhead",
    "speedup",
    "speedup_mean",
    "exact_match_rate",
]
# The benchmark-suite view: one row per entry, where each step's time goes.
STEP_COLUMNS = [
    "entry",
    "method",
    "lossless",
    "n_samples",
    "tokens_per_step",
    "throughput_total",
    "speedup",
    "overhead",
    "exact_match_rate",
    "step_latency_s",
    "outside_forward_s",
    "outside_forward_share",
    "draft_share",
    "accept_share",
    "update_share",
]
VIEWS = {"runs": TABLE_COLUMNS, "steps": STEP_COLUMNS}
MILLISECONDS = ("step_latency_s", "outside_forward_s")
SHARES = ("outside_forward_share", "draft_share", "verify_share", "accept_share", "update_share")
DIVERGENCE_COLUMNS = [
    "run_dir",
    "ar_run_dir",
    "method",
    "dataset",
    "sample_id",
    "turn",
    "new_tokens",
    "ar_new_tokens",
    "exact_match",
    "first_divergence",
]
# Short headers so a full table fits a terminal; the CSV keeps the full column names.
DISPLAY_NAMES = {
    "run_dir": "run",
    "ar_run_dir": "ar_run",
    "temperature": "temp",
    "n_samples": "n",
    "throughput_total": "tok/s",
    "throughput_mean": "tok/s_mean",
    "tokens_per_step": "tok/step",
    "accepted_per_step": "acc/step",
    "draft_efficiency": "draft_eff",
    "step_latency_s": "step_ms",
    "outside_forward_s": "outside_ms",
    "outside_forward_share": "outside_fwd",
    "draft_share": "draft",
    "accept_share": "accept",
    "update_share": "update",
    "exact_match_rate": "exact",
    "first_divergence": "diverges_at",
}


class ReportError(UserError):
    """A results path the report cannot read: no runs, no samples.jsonl, or a corrupt record."""


@dataclass(frozen=True)
class Run:
    """One run directory as read from disk: its identity columns and its raw sample records."""

    identity: dict
    records: list[dict]


def find_run_dirs(paths: Iterable[PathLike]) -> list[Path]:
    """Run directories at or under the given paths, each once, so a parent folder lists its runs."""
    found: dict[Path, Path] = {}
    for path in map(Path, paths):
        for run_dir in _runs_under(path):
            found.setdefault(run_dir.resolve(), run_dir)
    if not found:
        raise ReportError("no run directories given")
    return list(found.values())


def _runs_under(path: Path) -> list[Path]:
    """The run directories (folders holding a summary.json) at or below one path; error if none."""
    if (path / "summary.json").is_file():
        return [path]
    runs = sorted(summary.parent for summary in path.rglob("summary.json"))
    if not runs:
        raise ReportError(f"{path}: no runs found (no summary.json at or below it)")
    return runs


def read_records(run_dir: Path) -> list[dict]:
    """The sample records of a run; a malformed last line (an interrupted write) is skipped."""
    path = run_dir / "samples.jsonl"
    if not path.is_file():
        raise ReportError(f"{run_dir}: no samples.jsonl")
    lines = enumerate(path.read_text().splitlines(), 1)
    numbered = [(n, line) for n, line in lines if line.strip()]
    last = numbered[-1][0] if numbered else 0
    parsed = (_parse_line(path, n, line, n == last) for n, line in numbered)
    return [record for record in parsed if record is not None]


def _parse_line(path: Path, number: int, line: str, is_last: bool) -> dict | None:
    """One record; None with a warning for a broken last line, ReportError for one elsewhere."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        if not is_last:
            raise ReportError(f"{path}:{number}: malformed record ({error})") from error
        warnings.warn(f"{path}:{number}: skipping truncated last line (interrupted run?)", stacklevel=2)
        return None
    try:
        validate_record(record)
    except ValueError as error:
        raise ReportError(f"{path}:{number}: {error}") from error
    return upgrade_record(record)


def _identity(run_dir: Path, summary: dict) -> dict:
    """The identity columns of a run (what ran, on which data, how, on what hardware, in which bench session)."""
    try:
        sampling, environment = summary["sampling"], summary["environment"]
        bench = summary.get("bench") or {}
        return {
            "run_dir": str(run_dir),
            "model": summary["model"],
            "method": summary["method"],
            "dataset": summary["dataset"],
            "temperature": sampling["temperature"],
            "top_p": sampling["top_p"],
            "seed": sampling["seed"],
            "max_new_tokens": summary["max_new_tokens"],
            "device_name": environment["device_name"],
            "dtype": environment["dtype"],
            "repeat": summary.get("repeat", 0),
            "lossless": summary["lossless"],
            "status": summary["status"],
            "n_samples": summary["n_samples"],
            "session": bench.get("session", ""),
            "entry": bench.get("entry", ""),
            "baseline_entry": bench.get("baseline", ""),
            "entry_index": bench.get("index", -1),
            "prompt_format": summary.get("prompt_format") or "",
            "target": summary.get("target") or "",
            "artefacts": ";".join(summary.get("artefacts") or []),
            # provenance: the code and the dependency set that measured the run (``provenance_warning``)
            "env.git_commit": environment.get("git_commit"),
            "env.git_dirty": environment.get("git_dirty"),
            "env.dependencies": dependency_label(environment),
        }
    except KeyError as error:
        raise ReportError(f"{run_dir}/summary.json: missing field {error}") from error


def read_run(run_dir: Path) -> Run:
    """Read one run directory: identity from summary.json, raw records from samples.jsonl."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return Run(_identity(run_dir, summary), read_records(run_dir))


def read_runs(paths: Iterable[PathLike]) -> list[Run]:
    """Read every run directory at or under the given paths."""
    return [read_run(run_dir) for run_dir in find_run_dirs(paths)]


def runs_frame(runs: list[Run]) -> pd.DataFrame:
    """One row per run: identity columns plus metrics recomputed from its raw records."""
    frame = pd.DataFrame([{**run.identity, **aggregate(run.records)} for run in runs])
    metrics = [column for column in frame.columns if column not in RUN_COLUMNS]
    frame[metrics] = frame[metrics].apply(pd.to_numeric)  # None (no drafts, no steps) -> NaN
    return frame


def samples_frame(runs: list[Run]) -> pd.DataFrame:
    """One row per record, each carrying the identity columns of its run."""
    rows = [{**run.identity, **record} for run in runs for record in run.records]
    return pd.DataFrame(rows, columns=None if rows else [*RUN_COLUMNS, *SAMPLE_FIELDS])


def load_runs(paths: Iterable[PathLike]) -> pd.DataFrame:
    """One row per run directory: identity and metrics recomputed from samples.jsonl."""
    return runs_frame(read_runs(paths))


def load_samples(paths: Iterable[PathLike]) -> pd.DataFrame:
    """One row per samples.jsonl record, with the run_dir and identity columns of its run."""
    return samples_frame(read_runs(paths))


def split_by(runs: list[Run], field: str) -> list[Run]:
    """One part per value of a record field (e.g. MT-Bench ``category``), as if each were a run.

    The value is appended to ``run_dir`` (``RUN#value``) and to ``dataset`` (``dataset/value``), so
    each part pairs with the same part of its AR baseline through the usual match keys.
    """
    parts = []
    for run in runs:
        for value in sorted({str(record.get(field)) for record in run.records}):
            records = [record for record in run.records if str(record.get(field)) == value]
            identity = {
                **run.identity,
                "run_dir": f"{run.identity['run_dir']}#{value}",
                "dataset": f"{run.identity['dataset']}/{value}",
                "n_samples": len({record["sample_id"] for record in records}),
            }
            parts.append(Run(identity, records))
    return parts


REPEAT_FREE = ("run_dir", "repeat", "status", "n_samples")
"""Identity columns in which the repeats of one setting may differ."""


def merge_repeats(runs: list[Run]) -> list[Run]:
    """One run per setting: the repeats of a setting (runs equal but for REPEAT_FREE) read as one.

    Each record keeps its repeat (so it pairs with the same repeat of its baseline); the merged run's
    ``repeat`` is ``"all"``, its ``run_dir`` names the repeats' folders (``_folder_set``), ``n_samples`` the
    distinct samples, ``status`` complete only if every repeat is.
    """
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        key = tuple(sorted((k, str(v)) for k, v in run.identity.items() if k not in REPEAT_FREE))
        groups.setdefault(key, []).append(run)
    merged = []
    for group in groups.values():
        records = [{**record, "repeat": run.identity["repeat"]} for run in group for record in run.records]
        statuses = {run.identity["status"] for run in group}
        folders = [run.identity["run_dir"] for run in group]
        identity = {
            **group[0].identity,
            "repeat": "all",
            "run_dir": _folder_set(folders),
            "n_samples": len({record["sample_id"] for record in records}),
            "status": "complete" if statuses == {"complete"} else sorted(statuses - {"complete"})[0],
        }
        merged.append(Run(identity, records))
    return merged


def _folder_set(folders: list[str]) -> str:
    """One name for several run folders: ``parent/{a,b}`` (shell brace style), or the folder if just one."""
    if len(folders) == 1:
        return folders[0]
    parent = os.path.commonpath(folders)
    return f"{parent}/{{{','.join(sorted(os.path.relpath(folder, parent) for folder in folders))}}}"


def load(paths: Iterable[PathLike], by: str | None = None, repeats: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both frames (runs, samples) from one read of the run directories: split ``by`` a record field,
    and with ``repeats`` the repeats of each setting merged into one run."""
    runs = read_runs(paths)
    if repeats:
        runs = merge_repeats(runs)
    if by is not None:
        runs = split_by(runs, by)
    return runs_frame(runs), samples_frame(runs)


def first_divergence(output: Sequence[int], reference: Sequence[int]) -> int:
    """Index of the first differing token: -1 if equal, the shorter length if one is a prefix."""
    for index, (token, expected) in enumerate(zip(output, reference)):
        if token != expected:
            return index
    return -1 if len(output) == len(reference) else min(len(output), len(reference))


def _ar_partners(runs: pd.DataFrame) -> pd.Series:
    """run_dir -> run_dir of its AR baseline (an AR run sharing MATCH_KEYS).

    Preference: the bench session's baseline entry, then the run itself if it is AR, then the same
    seed, then the run with most records.
    """
    ar = runs.loc[runs["method"] == AR_METHOD, [*MATCH_KEYS, "run_dir", "seed", "n_records", "entry"]]
    own = runs[["run_dir", "seed", "baseline_entry", *MATCH_KEYS]]
    pairs = own.merge(ar, on=MATCH_KEYS, suffixes=("", "_ar"))
    is_baseline = (pairs["baseline_entry"] != "") & (pairs["entry"] == pairs["baseline_entry"])
    preference = pd.DataFrame(
        {
            "run_dir": pairs["run_dir"],
            "ar_run_dir": pairs["run_dir_ar"],
            "not_baseline": ~is_baseline,
            "other_run": pairs["run_dir"] != pairs["run_dir_ar"],
            "other_seed": pairs["seed"] != pairs["seed_ar"],
            "fewer": -pairs["n_records"],
        }
    )
    best = preference.sort_values(["run_dir", "not_baseline", "other_run", "other_seed", "fewer", "ar_run_dir"])
    return best.drop_duplicates("run_dir").set_index("run_dir")["ar_run_dir"]


def _pair_with(samples: pd.DataFrame, partners: pd.Series) -> pd.DataFrame:
    """Each (run, sample_id, turn) its AR baseline also has, beside the AR values, compared."""
    own = samples[samples["run_dir"].isin(partners.index)]
    own = own.assign(ar_run_dir=own["run_dir"].map(partners))
    ar = samples[[*SAMPLE_KEY, *AR_SIDE]].rename(columns={c: f"ar_{c}" for c in AR_SIDE})
    pairs = own.merge(ar, on=["ar_run_dir", *SAMPLE_KEY])
    pairs = _same_prompts(pairs)
    divergence = [first_divergence(out, ref) for out, ref in zip(pairs["output_ids"], pairs["ar_output_ids"])]
    return pairs.assign(first_divergence=divergence, exact_match=[d == -1 for d in divergence])


def _same_prompts(pairs: pd.DataFrame) -> pd.DataFrame:
    """The pairs whose two samples answered the same prompt tokens (a missing digest, from older runs, passes);
    the others are left out with a warning naming the runs."""
    differ = (
        pairs["prompt_sha"].notna() & pairs["ar_prompt_sha"].notna() & (pairs["prompt_sha"] != pairs["ar_prompt_sha"])
    )
    if differ.any():
        for run_dir, count in pairs[differ].groupby("run_dir").size().items():
            warnings.warn(
                f"{run_dir}: {count} sample(s) answered other prompt tokens than the same samples of its AR "
                f"baseline; they are left out of speedup and exact match",
                stacklevel=3,
            )
    return pairs[~differ]


def _agreement(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per run, over the common samples: speedup (total and mean rate) and the exact-match rate."""
    rates = pairs.assign(
        rate=pairs["new_tokens"] / pairs["wall_s"], ar_rate=pairs["ar_new_tokens"] / pairs["ar_wall_s"]
    )
    grouped = rates.groupby("run_dir")
    sums = grouped[["new_tokens", "wall_s", "ar_new_tokens", "ar_wall_s"]].sum()
    means = grouped[["rate", "ar_rate", "exact_match"]].mean()
    return pd.DataFrame(
        {
            "n_common": grouped.size(),
            "speedup": (sums["new_tokens"] / sums["wall_s"]) / (sums["ar_new_tokens"] / sums["ar_wall_s"]),
            "speedup_mean": means["rate"] / means["ar_rate"],
            "exact_match_rate": means["exact_match"].astype(float),
        }
    )


def _samples_of(runs: pd.DataFrame, samples: pd.DataFrame | None) -> pd.DataFrame:
    """The given samples frame, or the samples of the runs' directories read from disk."""
    return load_samples(runs["run_dir"]) if samples is None else samples


def match_ar(runs: pd.DataFrame, samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """Runs plus ar_run_dir, overhead, n_common, speedup, speedup_mean, exact_match_rate vs AR (NaN: none).

    Overhead (Medusa's term) = step latency / the AR run's step latency, so speedup ~ tokens per
    step / overhead.
    """
    partners = _ar_partners(runs)
    pairs = _pair_with(_samples_of(runs, samples), partners)
    ar_step = runs.set_index("run_dir")["step_latency_s"]
    matched = runs.assign(ar_run_dir=runs["run_dir"].map(partners))
    matched = matched.assign(overhead=matched["step_latency_s"] / matched["ar_run_dir"].map(ar_step))
    matched = matched.merge(_agreement(pairs), left_on="run_dir", right_index=True, how="left")
    return matched.fillna({"n_common": 0}).astype({"n_common": int})


def paired_samples(runs: pd.DataFrame, samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each sample of each run beside the same sample of its AR baseline (AR self-pairs included)."""
    return _pair_with(_samples_of(runs, samples), _ar_partners(runs))


def divergences(runs: pd.DataFrame, samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per sample compared with its AR baseline (AR self-pairs left out), for inspection."""
    pairs = paired_samples(runs, samples)
    compared = pairs[pairs["run_dir"] != pairs["ar_run_dir"]]
    return compared[DIVERGENCE_COLUMNS].reset_index(drop=True)


def speedup_statistics(pairs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per run: mean of per-sample speedups and a 95 % bootstrap interval of the total/total speedup."""
    rows = {}
    rng = np.random.default_rng(seed)
    for run_dir, group in pairs.groupby("run_dir"):
        tokens, wall = group["new_tokens"].to_numpy(float), group["wall_s"].to_numpy(float)
        ar_tokens, ar_wall = group["ar_new_tokens"].to_numpy(float), group["ar_wall_s"].to_numpy(float)
        per_sample = (tokens / wall) / (ar_tokens / ar_wall)
        draws = rng.integers(len(group), size=(BOOTSTRAP_SAMPLES, len(group)))  # [B, n] resampled indices
        boot = (tokens[draws].sum(1) / wall[draws].sum(1)) / (ar_tokens[draws].sum(1) / ar_wall[draws].sum(1))
        rows[run_dir] = {
            "speedup_per_sample": per_sample.mean(),
            "speedup_ci_low": np.quantile(boot, 0.025),
            "speedup_ci_high": np.quantile(boot, 0.975),
        }
    return pd.DataFrame.from_dict(
        rows, orient="index", columns=["speedup_per_sample", "speedup_ci_low", "speedup_ci_high"]
    )


SHORT_COMMIT = 7


def commit_counts(runs: pd.DataFrame) -> pd.Series:
    """Runs per measuring commit (short hash, ``+dirty`` when the tree had uncommitted changes), most runs first."""
    commits = runs["env.git_commit"].fillna("unknown").astype(str).str[:SHORT_COMMIT]
    dirty = runs["env.git_dirty"].eq(True).to_numpy()
    labels = commits.where(~dirty, commits + "+dirty")
    return _most_first(labels)


def _most_first(labels: pd.Series) -> pd.Series:
    """Counts of each label, most first (ties in label order)."""
    return labels.value_counts().sort_index(kind="stable").sort_values(ascending=False, kind="stable")


def _counted(counts: pd.Series) -> str:
    """``a (3 runs), b (1 run)``."""
    return ", ".join(f"{label} ({count} run{'s' if count != 1 else ''})" for label, count in counts.items())


def commit_text(runs: pd.DataFrame) -> str:
    """``measured by commit 7b9bda1 (30 runs)`` (every commit of the runs, with its run count)."""
    counts = commit_counts(runs)
    return f"measured by commit{'s' if len(counts) > 1 else ''} {_counted(counts)}"


def provenance_warning(runs: pd.DataFrame) -> str | None:
    """A warning when the runs were measured by different commits, from a dirty tree, or with different
    dependency sets (docs/environment.md#drift); None when they share one clean commit and one set."""
    counts = commit_counts(runs)
    problems = []
    if len(counts) > 1:
        problems.append(f"compares runs of {len(counts)} different commits")
    if any(commit.endswith("+dirty") for commit in counts.index):
        problems.append("includes runs measured from a tree with uncommitted changes")
    if any(commit.startswith("unknown") for commit in counts.index):
        problems.append("includes runs that recorded no commit")
    details = [commit_text(runs)] if problems else []
    dependency_sets = _most_first(runs["env.dependencies"].astype(str))
    if len(dependency_sets) > 1:
        problems.append(f"compares runs of {len(dependency_sets)} different dependency sets")
        details.append(f"dependency sets {_counted(dependency_sets)}")
    return f"WARNING: {' and '.join(problems)} ({'; '.join(details)})" if problems else None


def _report_table(runs: pd.DataFrame, samples: pd.DataFrame, view: str = "runs") -> pd.DataFrame:
    """One view's table from loaded frames: bench entries in suite order, other runs by model and dataset."""
    order = ["session", "entry_index", "model", "dataset", "temperature", "method", "run_dir"]
    report = match_ar(runs, samples).sort_values(order)
    return report[VIEWS[view]].reset_index(drop=True)


def table(paths: Iterable[PathLike], by: str | None = None, repeats: bool = False, view: str = "runs") -> pd.DataFrame:
    """The report: recomputed metrics, speedup, overhead and exact-match rate vs the AR baseline.

    ``view`` picks the columns (``runs``: throughput and acceptance; ``steps``: the bench view of
    where step time goes); ``repeats`` merges the repeats of each setting (see ``merge_repeats``).
    """
    return _report_table(*load(paths, by, repeats), view)


def _for_display(frame: pd.DataFrame) -> pd.DataFrame:
    """Run folder names instead of paths, times in ms, shares in %, short headers, to fit a terminal."""
    shown = frame.copy()
    for column in {"run_dir", "ar_run_dir"} & set(shown.columns):
        shown[column] = shown[column].map(lambda path: Path(path).name, na_action="ignore")
    for column in set(MILLISECONDS) & set(shown.columns):
        shown[column] = shown[column] * 1000
    for column in set(SHARES) & set(shown.columns):
        shown[column] = shown[column].map(lambda share: "-" if pd.isna(share) else f"{share:.1%}")
    return shown.rename(columns=DISPLAY_NAMES)


def format_table(frame: pd.DataFrame) -> str:
    """Fixed-width text of a report frame: floats to 2 decimals, '-' where a value is missing."""
    return _for_display(frame).to_string(index=False, float_format="{:.2f}".format, na_rep="-")


def _divergence_text(compared: pd.DataFrame) -> str:
    """The first-divergence table of the samples that differ from AR, or a line saying none do."""
    differing = compared[~compared["exact_match"]]
    if differing.empty:
        return "no compared sample differs from its AR baseline"
    return format_table(differing.drop(columns="exact_match"))


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
    report = _report_table(runs, samples, args.view)
    warning = provenance_warning(runs)
    if warning:
        print(warning, file=sys.stderr)
    print(format_table(report))
    if args.csv:
        report.to_csv(args.csv, index=False)
    if args.divergences:
        print()
        print(_divergence_text(divergences(runs, samples)))


if __name__ == "__main__":
    main()
