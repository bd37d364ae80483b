"""Comparing runs: each run paired with the AR run of the same setting, speedup three ways with its
bootstrap interval, overhead, exact match and first divergence, and the provenance warning on mixed
commits or dependency sets. Every comparison between runs is computed here and nowhere else."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from specbench.metrics import RATIO_METRICS, ratio_parts
from specbench.report.read import load_samples

AR_METHOD = "ar"
# What a run must share with its AR baseline for a speedup to mean anything (docs/design.md#fair-comparisons):
# the same target (weights, revision, chat template, dtype) answering prompts of the same format; ``session``
# keeps the runs of one benchmark-suite session together ("" for ordinary runs); ``compiled``: the same path
# (eager or compiled) unless the report is asked for another baseline (``AR_BASELINES``). Per sample, the prompts'
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
    "compiled",
]
AR_BASELINES = ("same", "eager", "compiled")
"""Which AR run a run is compared with: the one on its own path (eager or compiled), or the eager or compiled AR run
for every run (the speedup of a compiled method over eager AR, or of an eager one over compiled AR)."""
# A record's key within its run; ``repeat`` tells apart the repeats that ``merge_repeats`` puts in one run.
SAMPLE_KEY = ["sample_id", "turn", "repeat"]
BOOTSTRAP_SAMPLES = 1000
AR_SIDE = ["run_dir", "new_tokens", "wall_s", "output_ids", "prompt_sha"]
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


def first_divergence(output: Sequence[int], reference: Sequence[int]) -> int:
    """Index of the first differing token: -1 if equal, the shorter length if one is a prefix."""
    for index, (token, expected) in enumerate(zip(output, reference)):
        if token != expected:
            return index
    return -1 if len(output) == len(reference) else min(len(output), len(reference))


def _ar_partners(runs: pd.DataFrame, against: str = "same") -> pd.Series:
    """run_dir -> run_dir of its AR baseline (an AR run sharing MATCH_KEYS; with ``against`` eager or compiled, an AR
    run on that path sharing the other keys).

    Preference: the bench session's baseline entry, then the run itself if it is AR, then the same dataset
    categories (``dataset.categories``), then the same seed, then the run with most records.
    """
    if against not in AR_BASELINES:
        raise ValueError(f"the AR baseline must be one of {AR_BASELINES}, got {against!r}")
    ar = runs.loc[runs["method"] == AR_METHOD, [*MATCH_KEYS, "run_dir", "seed", "n_records", "entry", "categories"]]
    keys = MATCH_KEYS
    if against != "same":
        ar = ar[ar["compiled"] == (against == "compiled")]
        keys = [key for key in MATCH_KEYS if key != "compiled"]
    own = runs[["run_dir", "seed", "baseline_entry", "categories", *MATCH_KEYS]]
    pairs = own.merge(ar, on=keys, suffixes=("", "_ar"))
    is_baseline = (pairs["baseline_entry"] != "") & (pairs["entry"] == pairs["baseline_entry"])
    preference = pd.DataFrame(
        {
            "run_dir": pairs["run_dir"],
            "ar_run_dir": pairs["run_dir_ar"],
            "not_baseline": ~is_baseline,
            "other_run": pairs["run_dir"] != pairs["run_dir_ar"],
            "other_categories": pairs["categories"] != pairs["categories_ar"],
            "other_seed": pairs["seed"] != pairs["seed_ar"],
            "fewer": -pairs["n_records"],
        }
    )
    best = preference.sort_values(
        ["run_dir", "not_baseline", "other_run", "other_categories", "other_seed", "fewer", "ar_run_dir"]
    )
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


def _over_ar(matched: pd.DataFrame, runs: pd.DataFrame, column: str) -> pd.Series:
    """Each run's ``column`` over its AR partner's (NaN without a partner)."""
    values = pd.to_numeric(runs.set_index("run_dir")[column])
    return pd.to_numeric(matched[column]) / matched["ar_run_dir"].map(values)


def match_ar(runs: pd.DataFrame, samples: pd.DataFrame | None = None, against: str = "same") -> pd.DataFrame:
    """Runs plus ar_run_dir, overhead, n_common, speedup, speedup_mean, exact_match_rate vs AR (NaN: none).

    Overhead (Medusa's term) = step latency / the AR run's step latency, so speedup ~ tokens per
    step / overhead. With the cost model's columns (``metrics.cost_metrics``), also ``modelled_speedup``: the AR
    run's modelled ms per token over this run's (the speedup the cost model gives this run's own steps).
    ``against`` picks the AR baseline's path (``AR_BASELINES``).
    """
    partners = _ar_partners(runs, against)
    pairs = _pair_with(_samples_of(runs, samples), partners)
    matched = runs.assign(ar_run_dir=runs["run_dir"].map(partners))
    matched = matched.assign(overhead=_over_ar(matched, runs, "step_latency_s"))
    if "modelled_ms_per_token" in runs:
        matched = matched.assign(modelled_speedup=1 / _over_ar(matched, runs, "modelled_ms_per_token"))
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
    for run_dir, group in pairs.groupby("run_dir"):
        rng = np.random.default_rng(seed)  # per run: its interval depends on its own samples only
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


def rate_intervals(samples: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per run: a 95 % bootstrap interval over its samples of each total/total metric (``ratio_parts``: throughput,
    tokens per step), as ``<metric>_ci_low`` / ``<metric>_ci_high``, so a single run's point gets an interval."""
    columns = [f"{metric}_ci_{side}" for metric in RATIO_METRICS for side in ("low", "high")]
    rows = {}
    for run_dir, group in samples.groupby("run_dir"):
        rng = np.random.default_rng(seed)  # per run: its interval depends on its own samples only
        parts = [ratio_parts(record) for record in group.to_dict("records")]
        draws = rng.integers(len(parts), size=(BOOTSTRAP_SAMPLES, len(parts)))  # [B, n] resampled indices
        row = {}
        for metric in RATIO_METRICS:
            num, den = (np.array([p[metric][k] for p in parts], float) for k in (0, 1))
            with np.errstate(divide="ignore", invalid="ignore"):
                boot = num[draws].sum(1) / den[draws].sum(1)  # [B]
            boot = boot[np.isfinite(boot)]  # draws whose denominator summed to 0 (no steps) have no value
            low, high = np.quantile(boot, [0.025, 0.975]) if len(boot) else (np.nan, np.nan)
            row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = low, high
        rows[run_dir] = row
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns)


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
