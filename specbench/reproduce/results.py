"""Stored runs as one frame for the table and figure builders: identity, recomputed metrics, pairing
with AR, the knobs each run changed from its method's defaults, repeats and the hardware stamp.

Everything comes from the run folders (``samples.jsonl`` + ``summary.json``) through the report's
loaders, so a table's number is the report's number for the same runs.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from specbench.config import compose_config
from specbench.report.compare import match_ar, paired_samples, rate_intervals, speedup_statistics
from specbench.report.read import Run, find_run_dirs, read_run, runs_frame, samples_frame, split_by
from specbench.runner import without_locations

STAMP_FIELDS = ("device_name", "cpu", "torch", "transformers", "dtype")


@dataclass(frozen=True)
class Results:
    """All runs under one results root: ``runs`` (one row per configuration and repeat: the earliest session of the
    plan where several sessions measured one), ``samples`` (one row per record) and the sample ``pairs`` with AR;
    ``partners``: every run, duplicates of other sessions included (the AR partners each run's numbers rest on)."""

    runs: pd.DataFrame
    samples: pd.DataFrame
    pairs: pd.DataFrame
    partners: pd.DataFrame | None = None

    @property
    def every_run(self) -> pd.DataFrame:
        """Every run, each session's own (where a run's AR partner and its provenance are looked up)."""
        return self.runs if self.partners is None else self.partners


def flatten(node, prefix: str = "") -> dict:
    """{dotted.key: leaf} of a nested dict; lists become tuples so they compare and hash."""
    if isinstance(node, dict):
        return {key: value for name, child in node.items() for key, value in flatten(child, f"{prefix}{name}.").items()}
    return {prefix[:-1]: tuple(node) if isinstance(node, list) else node}


@cache
def default_knobs(method: str, model: str, temperature: float, top_p: float) -> dict:
    """The flattened resolved method node of ``method`` at its defaults; {} when no config of that name exists."""
    try:
        cfg = compose_config(f"method={method}", f"model={model}", f"temperature={temperature}", f"top_p={top_p}")
    except MissingConfigException:
        return {}
    return flatten(OmegaConf.to_container(cfg.method, resolve=True), "method.")


def changed_knobs(summary: dict) -> dict:
    """The method knobs a run set away from the method's defaults: {"method.drafter.nodes": 10, ...}."""
    sampling = summary["sampling"]
    knobs = flatten(without_locations(summary["hyperparameters"]), "method.")
    for key in ("temperature", "top_p"):  # older runs: the run's sampling, interpolated into the drafter's node
        if f"method.drafter.{key}" in knobs and knobs[f"method.drafter.{key}"] == sampling[key]:
            knobs.pop(f"method.drafter.{key}")
    defaults = default_knobs(summary["method"], summary["model"], sampling["temperature"], sampling["top_p"])
    return {key: value for key, value in knobs.items() if key not in defaults or defaults[key] != value}


def setting_text(knobs: dict) -> str:
    """Canonical ``key=value;key=value`` text of changed knobs (sorted), the way paper rows write them."""
    return ";".join(f"{key}={format_value(value)}" for key, value in sorted(knobs.items()))


def format_value(value) -> str:
    """A knob value as Hydra would write it (lists as [a,b], floats without trailing noise)."""
    if isinstance(value, tuple):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "null"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _extra_columns(run_dir: Path) -> dict:
    """Columns the report does not carry: changed knobs, peak memory, experiment and stamp."""
    summary = json.loads((run_dir / "summary.json").read_text())
    environment = summary["environment"]
    knobs = changed_knobs(summary)
    memory = summary.get("peak_memory") or {}
    return {
        "experiment": summary.get("experiment"),
        "config_digest": summary.get("config_digest") or str(run_dir),
        "measured_on": (summary.get("started_at") or "")[:10],
        "setting": setting_text(knobs),
        **{f"hp.{key[len('method.') :]}": v for key, v in knobs.items()},
        "peak_memory_gib": memory["bytes"] / 2**30 if memory else np.nan,
        "peak_memory_kind": memory.get("kind"),
        **{f"env.{field}": environment.get(field) for field in STAMP_FIELDS},
    }


def _extras_frame(run_dirs: pd.Series) -> pd.DataFrame:
    """The extra columns of each run, read once per run folder (``RUN#part`` rows of a split share their run's)."""
    folders = run_dirs.str.split("#").str[0]
    extras = {folder: _extra_columns(Path(folder)) for folder in folders.unique()}
    return pd.DataFrame([{"run_dir": run_dir, **extras[folder]} for run_dir, folder in zip(run_dirs, folders)])


def measured_runs(root: Path | str) -> list[Path]:
    """The run folders under ``root`` with samples, one per configuration and repeat.

    Two folders of one configuration in one session (or of no session: runs stored before experiments ran as
    sessions) are one measurement: the one with the most samples is kept (then the first by path), so averages and
    repeat statistics never count a run twice. Runs of one configuration in two sessions are all kept: each is the
    AR partner, or the partnered run, of its own session (``results_of`` then shows one of them). Folders that failed
    before their first sample are left out. Both cases are reported with a warning.
    """
    kept: dict[tuple, tuple[int, Path]] = {}
    left_out = []
    for run_dir in sorted(find_run_dirs([root])):
        summary = json.loads((run_dir / "summary.json").read_text())
        key = (summary["config_digest"], summary.get("repeat", 0), (summary.get("bench") or {}).get("session", ""))
        if not (run_dir / "samples.jsonl").is_file():
            left_out.append(f"{run_dir.name} (no samples, {summary.get('status')})")
        elif key in kept and kept[key][0] >= summary["n_samples"]:
            left_out.append(f"{run_dir.name} (= {kept[key][1].name})")
        else:
            kept[key] = (summary["n_samples"], run_dir)
    if left_out:
        warnings.warn(f"{root}: {len(left_out)} run folder(s) left out: {'; '.join(left_out)}", stacklevel=2)
    return [run_dir for _, run_dir in kept.values()]


def read_measured(root: Path | str) -> list[Run]:
    """The measured runs under ``root`` as read from disk (see ``measured_runs``)."""
    return [read_run(run_dir) for run_dir in measured_runs(root)]


def load_results(root: Path | str, by: str | None = None, order: Sequence[str] = ()) -> Results:
    """Every measured run under ``root`` (optionally split by a record field such as ``category``), paired with AR."""
    runs = read_measured(root)
    return results_of(runs if by is None else split_by(runs, by), order)


def results_of(runs: list[Run], order: Sequence[str] = ()) -> Results:
    """Runs already read (whole or split), with metrics, AR pairing, extra columns and speedup statistics.

    Every speedup divides times of one measuring session (``match_ar(same_session=True)``): a run whose AR partner
    was timed in another session, or on another machine, gets no speedup nor overhead, and ``pairing`` says why.
    Each run carries its AR partner's provenance (``ar.*``: commit, dirty flag, date, sessions) for the footers.
    Where sessions measured one configuration and repeat more than once, ``runs`` keeps the run of the session
    first in ``order`` (the plan's experiments; then by path), ``partners`` all of them."""
    frame, samples = runs_frame(runs), samples_frame(runs)
    matched = match_ar(frame, samples, same_session=True).merge(_extras_frame(frame["run_dir"]), on="run_dir")
    matched = with_partner_provenance(matched.assign(sessions=matched["run_dir"].map(sessions_of(samples))))
    pairs = paired_samples(matched, samples, same_session=True)
    every = matched.merge(speedup_statistics(pairs), left_on="run_dir", right_index=True, how="left").merge(
        rate_intervals(samples), left_on="run_dir", right_index=True, how="left"
    )
    return Results(one_per_configuration(every, order), samples, pairs, every)


def one_per_configuration(runs: pd.DataFrame, order: Sequence[str]) -> pd.DataFrame:
    """One run per configuration (digest, split part) and repeat: the one whose session comes first in ``order``
    (sessions not in it after), then the first by path; in the frame's order."""
    rank = runs["session"].map({name: index for index, name in enumerate(order)}).fillna(len(order))
    part = runs["run_dir"].str.partition("#")[2]
    keys = pd.DataFrame({"digest": runs["config_digest"], "part": part, "repeat": runs["repeat"]})
    chosen = keys.assign(rank=rank, path=runs["run_dir"]).sort_values(["rank", "path"])
    kept = chosen.drop_duplicates(["digest", "part", "repeat"]).index
    return runs.loc[runs.index.isin(kept)].reset_index(drop=True)


PROVENANCE = ("env.git_commit", "env.git_dirty", "measured_on", "sessions")
"""The columns that say which code measured a run, when and in which sessions (copied as ``ar.*`` to its runs)."""


def sessions_of(samples: pd.DataFrame) -> pd.Series:
    """run_dir -> the distinct measuring sessions of its records, sorted and joined ("" when none was recorded)."""
    if samples.empty:
        return pd.Series(dtype=str)
    return samples.groupby("run_dir")["measuring_session"].agg(lambda values: " ".join(sorted(set(values.dropna()))))


def with_partner_provenance(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with each one's AR partner's ``PROVENANCE`` columns as ``ar.<column>`` (NaN without a partner)."""
    partner = runs.set_index("run_dir")
    return runs.assign(**{f"ar.{column}": runs["ar_run_dir"].map(partner[column]) for column in PROVENANCE})


def stamp(runs: pd.DataFrame) -> str:
    """One line naming the hardware and software the runs were measured on (every distinct one)."""
    columns = [f"env.{field}" for field in STAMP_FIELDS]
    distinct = runs[columns].drop_duplicates().fillna("?")
    return " | ".join(
        ", ".join(f"{field}={row[f'env.{field}']}" for field in STAMP_FIELDS) for _, row in distinct.iterrows()
    )


def knob(runs: pd.DataFrame, key: str) -> pd.Series:
    """The effective value of a method knob per run (``drafter.branch_len``): the changed value, else the default."""
    column = f"hp.{key}"
    changed = runs[column] if column in runs else pd.Series(np.nan, index=runs.index, dtype=object)

    def effective(row: pd.Series):
        value = changed[row.name]
        if not (isinstance(value, float) and np.isnan(value)):
            return value
        defaults = default_knobs(row["method"], row["model"], row["temperature"], row["top_p"])
        return defaults.get(f"method.{key}")

    return runs.apply(effective, axis=1) if len(runs) else changed
