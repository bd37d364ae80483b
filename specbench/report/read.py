"""Reading runs: run folders into ``Run`` objects and pandas frames, split by a record field or merged over
repeats. Every metric is recomputed from the raw ``samples.jsonl`` records with ``specbench.metrics.aggregate``
(docs/design.md#results-on-disk); nothing is read back from ``summary.json`` but the run's identity, and the sample
count is the records' (a summary that disagrees is warned about)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from specbench.costmodel import LatencyCurve
from specbench.dependencies import dependency_label
from specbench.errors import UserError
from specbench.metrics import aggregate, cost_metrics, machine_seconds, traffic_metrics
from specbench.schema import SAMPLE_FIELDS, upgrade_record, validate_record
from specbench.settings import type_problems

PathLike = str | Path

RUN_COLUMNS = [
    "run_dir",
    "model",
    "method",
    "dataset",
    "categories",
    "temperature",
    "top_p",
    "seed",
    "max_new_tokens",
    "device_name",
    "dtype",
    "repeat",
    "engine",
    "batch_size",
    "concurrency",
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
    "budget",
    "compiled",
    "env.git_commit",
    "env.git_dirty",
    "env.dependencies",
]


class ReportError(UserError):
    """A results path the report cannot read: no runs, no samples.jsonl, or a corrupt record."""


@dataclass(frozen=True)
class Run:
    """One run directory as read from disk: its identity columns, its raw sample records and the latency curves its
    summary carries (what the ideal speedup is priced with)."""

    identity: dict
    records: list[dict]
    curves: tuple[LatencyCurve, ...] = ()
    traffic: dict | None = None  # the summary's memory_traffic (what the bandwidth share is computed from)


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
    try:
        lines = enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
    except UnicodeDecodeError as error:
        raise ReportError(f"{path}: not UTF-8 text at byte {error.start}; the run wrote JSON Lines") from None
    numbered = [(n, line) for n, line in lines if line.strip()]
    last = numbered[-1][0] if numbered else 0
    parsed = ((n, _parse_line(path, n, line, n == last)) for n, line in numbered)
    return _once_each(path, [(n, record) for n, record in parsed if record is not None])


def _once_each(path: Path, numbered: list[tuple[int, dict]]) -> list[dict]:
    """The records with each (sample, turn) once: a repeated identical line is dropped with a warning (it would
    count twice); two different records of one sample and turn are a ReportError naming both lines."""
    first: dict[tuple, tuple[int, dict]] = {}
    kept, repeated = [], []
    for number, record in numbered:
        key = (record["sample_id"], record["turn"])
        if key not in first:
            first[key] = (number, record)
            kept.append(record)
        elif record == first[key][1]:
            repeated.append(number)
        else:
            raise ReportError(
                f"{path}:{number}: sample {key[0]!r} turn {key[1]} was already recorded differently at line "
                f"{first[key][0]}; a run folder holds one generation per sample (remove one of the two lines)"
            )
    if repeated:
        warnings.warn(f"{path}: lines {repeated} repeat earlier records; each is counted once", stacklevel=3)
    return kept


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


@dataclass
class SummarySampling:
    """The types of a summary's ``sampling``."""

    temperature: float
    top_p: float
    seed: int


@dataclass
class SummaryEnvironment:
    """The types of the ``environment`` fields that identify a run's hardware (the others are shown as they are)."""

    device_name: str
    dtype: str


@dataclass
class SummaryBench:
    """The types of a bench run's ``bench`` record (the suite's session, the entry and its baseline)."""

    session: str = ""
    entry: str = ""
    baseline: str = ""
    index: int = -1


@dataclass
class SummaryEngine:
    """The types of a summary's ``engine`` record (which engine generated, at which batch size)."""

    name: str = "hf"
    batch_size: int = 1
    concurrency: int | None = None


@dataclass
class SummaryBudget:
    """The types of a summary's ``budget`` record (how the method's size knob was set)."""

    mode: str
    value: int
    predicted_speedup: float | None = None


@dataclass
class SummaryCompile:
    """The types of a summary's ``compile`` record (the compiled path) that the report reads."""

    compiled: bool


@dataclass
class SummaryTraffic:
    """The types of a summary's ``memory_traffic`` (what a step reads, the device's peak bandwidth)."""

    weight_bytes: int
    kv_bytes_per_token: int
    peak_bytes_per_s: float


@dataclass
class RunIdentity:
    """The types of the summary.json fields the report reads (a field with a default may be absent: older runs)."""

    model: str
    method: str
    dataset: str
    sampling: SummarySampling
    max_new_tokens: int
    environment: SummaryEnvironment
    lossless: bool
    status: str
    n_samples: int
    repeat: int = 0
    bench: SummaryBench | None = None
    prompt_format: str | None = None
    target: str | None = None
    artefacts: list[str] | None = None
    budget: SummaryBudget | None = None
    engine: SummaryEngine | None = None
    dataset_info: dict | None = None
    latency_curves: list[dict] | None = None
    compile: SummaryCompile | None = None
    memory_traffic: SummaryTraffic | None = None


def _identity(run_dir: Path, summary: dict) -> dict:
    """The identity columns of a run (what ran, on which data, how, on what hardware, in which bench session),
    once the summary's fields are of their RunIdentity types."""
    problems = type_problems(summary, RunIdentity)
    if problems:
        raise ReportError(f"{run_dir}/summary.json: {'; '.join(problems)}")
    sampling, environment = summary["sampling"], summary["environment"]
    bench = summary.get("bench") or {}
    engine = summary.get("engine") or {}
    return {
        "run_dir": str(run_dir),
        "model": summary["model"],
        "method": summary["method"],
        "dataset": summary["dataset"],
        "categories": ",".join((summary.get("dataset_info") or {}).get("categories") or []),  # "" = every one
        "temperature": sampling["temperature"],
        "top_p": sampling["top_p"],
        "seed": sampling["seed"],
        "max_new_tokens": summary["max_new_tokens"],
        "device_name": environment["device_name"],
        "dtype": environment["dtype"],
        "repeat": summary.get("repeat", 0),
        "engine": engine.get("name", "hf"),  # runs before engine= existed: specbench's own, one at a time
        "batch_size": engine.get("batch_size", 1),
        "concurrency": engine.get("concurrency") or 0,  # 0: offline (batches), as runs before concurrency= were
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
        "budget": budget_label(summary.get("budget")),
        "compiled": bool((summary.get("compile") or {}).get("compiled")),  # the compiled path (false: eager, or older)
        "predicted_speedup": (summary.get("budget") or {}).get("predicted_speedup"),
        # provenance: the code and the dependency set that measured the run (``provenance_warning``)
        "env.git_commit": environment.get("git_commit"),
        "env.git_dirty": environment.get("git_dirty"),
        "env.dependencies": dependency_label(environment),
    }


def budget_label(budget: dict | None) -> str:
    """How a run's size knob was set: '' (the method's default), 'N' (given) or 'auto:N' (chosen)."""
    if not budget:
        return ""
    return f"auto:{budget['value']}" if budget["mode"] == "auto" else str(budget["value"])


def summary_curves(run_dir: Path, summary: dict) -> tuple[LatencyCurve, ...]:
    """The latency curves a summary carries (none in summaries written before curves were kept)."""
    try:
        return tuple(LatencyCurve.from_dict(curve) for curve in summary.get("latency_curves") or [])
    except (KeyError, TypeError, ValueError) as error:
        raise ReportError(f"{run_dir}/summary.json: a latency curve that cannot be read ({error})") from error


def read_run(run_dir: Path) -> Run:
    """Read one run directory: identity from summary.json, raw records from samples.jsonl."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ReportError(
            f"{path} is not valid JSON ({error}): a torn write? Resuming the run rewrites it from its records"
        ) from None
    if not isinstance(summary, dict):
        raise ReportError(f"{path} must hold a JSON object, got {type(summary).__name__}")
    identity, records = _identity(run_dir, summary), read_records(run_dir)
    return Run(counted(identity, records), records, summary_curves(run_dir, summary), summary.get("memory_traffic"))


def counted(identity: dict, records: list[dict]) -> dict:
    """The identity with ``n_samples`` counted from the records (the samples whose records are on disk), with a
    warning when the summary's count disagrees (an emptied or cut samples.jsonl, a summary older than its records)."""
    samples = len({record["sample_id"] for record in records})
    if samples != identity["n_samples"]:
        warnings.warn(
            f"{identity['run_dir']}: summary.json counts {identity['n_samples']} samples but samples.jsonl holds "
            f"{samples}; the report counts the records",
            stacklevel=3,
        )
    return {**identity, "n_samples": samples}


def read_runs(paths: Iterable[PathLike]) -> list[Run]:
    """Read every run directory at or under the given paths."""
    return [read_run(run_dir) for run_dir in find_run_dirs(paths)]


def runs_frame(runs: list[Run]) -> pd.DataFrame:
    """One row per run: identity columns plus metrics recomputed from its raw records."""
    frame = pd.DataFrame(
        [
            {
                **run.identity,
                **aggregate(run.records),
                **cost_metrics(run.records, run.curves),
                **traffic_metrics(run.records, run.traffic),
            }
            for run in runs
        ]
    )
    metrics = [column for column in frame.columns if column not in RUN_COLUMNS]
    frame[metrics] = frame[metrics].apply(pd.to_numeric)  # None (no drafts, no steps) -> NaN
    return frame


def samples_frame(runs: list[Run]) -> pd.DataFrame:
    """One row per record, each carrying the identity columns of its run."""
    rows = [{**run.identity, **record, "machine_s": machine_seconds(record)} for run in runs for record in run.records]
    return pd.DataFrame(rows, columns=None if rows else [*RUN_COLUMNS, *SAMPLE_FIELDS, "machine_s"])


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
            parts.append(replace(run, identity=identity, records=records))
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
        merged.append(replace(group[0], identity=identity, records=records))
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
        if not runs:
            raise ReportError(f"--by {by}: the runs hold no records to split by it")
    return runs_frame(runs), samples_frame(runs)
