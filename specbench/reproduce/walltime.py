"""Minutes a stand-in plan (smoke) takes on this machine, estimated from the wall times of stored runs.

Every experiment is one session with run folders of its own (its AR partners included), so each job is a run
(a job whose folder another job already fills only adds its extra samples). A run's time = (records + warm-up
records) x seconds per record; records = samples x turns (``cost.job_samples``). Seconds per record come from the
stored run of the same configuration (its folder below the experiment's, whatever its token budget and whichever
experiment stored it), else the median of the stored runs of the same method and dataset, else of the method,
else of every stored run; each is scaled by the job's ``max_new_tokens`` over the stored run's (a record's time
is nearly all decoding). Each experiment adds one model load (its session loads the model once: the median over
stored runs of their span, ``started_at`` to ``ended_at``, less their records and one warm-up record) and the
start of its child process (``PROCESS_START_S``).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pandas as pd

from specbench.reproduce.cost import job_samples, with_total
from specbench.reproduce.coverage import Job, jobs_frame

PROCESS_START_S = 5.0
"""Seconds from launching an experiment's session (``python -m specbench.reproduce.session``) to its first job."""
STORED_COLUMNS = ["setting", "method", "dataset", "records", "budget", "per_record", "session", "started", "ended"]
COLUMNS = ["experiment", "jobs", "new_runs", "records", "minutes"]


def without_budget(folder: str, experiment: str | None = None) -> str:
    """A run folder without its experiment and token budget (``<experiment>/<model>/<data>/T0.0-n64/...`` ->
    ``<model>/<data>/T0.0/...``): its configuration, whichever session measured it."""
    if experiment and folder.startswith(f"{experiment}/"):
        folder = folder[len(experiment) + 1 :]
    return re.sub(r"/(T[^/]*)-n\d+/", r"/\1/", folder)


def stored_timings(root: Path) -> pd.DataFrame:
    """One row per finished stored run under ``root``: configuration, method, dataset, records, token budget,
    seconds per record, the process that measured it (its measuring session; runs before sessions: the run itself)
    and when it started and ended."""
    rows = []
    for path in sorted(Path(root).rglob("summary.json")):
        summary = json.loads(path.read_text())
        metrics = summary.get("metrics") or {}
        if not metrics.get("n_records") or not summary.get("ended_at"):
            continue
        folder = str(path.parent.relative_to(root))
        rows.append(
            [
                without_budget(folder, summary.get("experiment")),
                summary["method"],
                summary["dataset"],
                metrics["n_records"],
                summary["max_new_tokens"],
                metrics["wall_s"] / metrics["n_records"],
                (summary.get("environment") or {}).get("measuring_session") or folder,  # one process, one sitting
                datetime.fromisoformat(summary["started_at"]),
                datetime.fromisoformat(summary["ended_at"]),
            ]
        )
    return pd.DataFrame(rows, columns=STORED_COLUMNS)


def per_record_seconds(job: pd.Series, stored: pd.DataFrame) -> float:
    """A job's seconds per record: its configuration's stored run, else the nearest group of stored runs."""
    for rows in (
        stored[stored["setting"] == without_budget(job["folder"], job["experiment"])],
        stored[(stored["method"] == job["method"]) & (stored["dataset"] == job["dataset"])],
        stored[stored["method"] == job["method"]],
        stored,
    ):
        if len(rows):
            return float((rows["per_record"] / rows["budget"]).median()) * int(job["max_new_tokens"])
    return float("nan")


def load_seconds(stored: pd.DataFrame) -> float:
    """The median model load of the stored processes (a session, or a run of its own): their span less their
    runs' records and one warm-up record each (>= 0)."""
    if stored.empty:
        return 0.0
    busy = stored.assign(busy=stored["per_record"] * (stored["records"] + 1)).groupby("session")
    span = (busy["ended"].max() - busy["started"].min()).dt.total_seconds()
    return max(float((span - busy["busy"].sum()).median()), 0.0)


def estimate_walltime(jobs: list[Job], stored: pd.DataFrame) -> pd.DataFrame:
    """One row per job: experiment, whether it is the first to reach its run folder, the records it adds to
    the folder and its seconds (the experiment's one model load on its first job with records)."""
    load, done, loaded = load_seconds(stored), dict[str, int](), set[str]()
    rows = []
    for _, job in jobs_frame(jobs).iterrows():
        samples, turns = job_samples(job)
        records = max(samples * turns - done.get(job["folder"], 0), 0)
        seconds = (records + int(job["warmup"])) * per_record_seconds(job, stored) if records else 0.0
        if records and job["experiment"] not in loaded:
            seconds += load
            loaded.add(job["experiment"])
        rows.append([job["experiment"], job["folder"] not in done, records, seconds])
        done[job["folder"]] = done.get(job["folder"], 0) + records
    return pd.DataFrame(rows, columns=["experiment", "new_run", "records", "seconds"])


def walltime_table(per_job: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Per experiment (in plan order): jobs, new run folders, records and minutes (process start included); a total."""
    grouped = per_job.groupby("experiment", sort=False)
    table = pd.DataFrame(
        {
            "jobs": grouped.size(),
            "new_runs": grouped["new_run"].sum(),
            "records": grouped["records"].sum(),
            "minutes": (grouped["seconds"].sum() + PROCESS_START_S) / 60,
        }
    )
    return with_total(table, order, COLUMNS)


def walltime_text(table: pd.DataFrame, root: Path, stored: pd.DataFrame) -> str:
    """The minutes table as Markdown, with where its timings came from."""
    lines = ["| experiment | jobs | new runs | records | minutes (est.) |", "|---|---|---|---|---|"]
    lines += [
        f"| {row['experiment']} | {row['jobs']} | {row['new_runs']} | {row['records']} | {row['minutes']:.1f} |"
        for _, row in table.iterrows()
    ]
    lines += [
        "",
        f"Estimated from the wall times of {len(stored)} stored runs under {root}: seconds per record of "
        "the same configuration, else of the same method and dataset, scaled to the job's max_new_tokens; "
        f"model load {load_seconds(stored):.1f} s and {PROCESS_START_S:g} s of process start per experiment (one "
        "session each, its AR partners included); records count turns (MT-Bench: 2 per question).",
    ]
    return "\n".join(lines) + "\n"
