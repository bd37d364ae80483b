"""Comparing runs: each run paired with the AR run of the same setting, speedup three ways with its
bootstrap interval, overhead, exact match and first divergence, and the provenance warning on mixed
commits or dependency sets. Every comparison between runs is computed here and nowhere else."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from specbench.metrics import RATIO_METRICS, acceptance_by_depth, aggregate, ratio_parts
from specbench.report.read import load_samples

AR_METHOD = "ar"
# What a run must share with its AR baseline for a speedup to mean anything (docs/design.md#fair-comparisons):
# the same target (weights, revision, chat template, dtype) answering prompts of the same format, in the same engine
# at the same batch size (a vLLM run never pairs with the shared loop's AR); ``session`` keeps the runs of one
# benchmark-suite session together ("" for ordinary runs); ``compiled``: the same path (eager or compiled) unless the
# report is asked for another baseline (``AR_BASELINES``). Per sample, the prompts'
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
    "engine",
    "batch_size",
    "concurrency",
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
AR_SIDE = ["run_dir", "new_tokens", "wall_s", "machine_s", "output_ids", "prompt_sha", "measuring_session"]
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


def in_one_session(pairs: pd.DataFrame) -> pd.Series:
    """Per sample pair: whether both records carry the same measuring session (one process, one machine, one
    sitting: ``environment.measuring_session``; records written before sessions were recorded carry none), or are
    one record (an AR run paired with itself)."""
    same = pairs["measuring_session"].notna() & (pairs["measuring_session"] == pairs["ar_measuring_session"])
    return same | (pairs["run_dir"] == pairs["ar_run_dir"])


def session_machine(session) -> str:
    """The machine part of a measuring session id (``<UTC start>-<machine>-<pid>``)."""
    parts = str(session).split("-")
    return parts[1] if len(parts) >= 3 else str(session)


def pairing_problems(runs: pd.DataFrame, pairs: pd.DataFrame) -> pd.Series:
    """Per run: why its speedup would divide times of two sessions or machines, "" when every sample pair with its AR
    partner (``pairs``, from ``_pair_with``) was timed in one session."""
    own, theirs = pairs["measuring_session"], pairs["ar_measuring_session"]
    apart = pairs.assign(
        apart=~in_one_session(pairs),
        unknown=own.isna() | theirs.isna(),
        machine=[session_machine(a) != session_machine(b) for a, b in zip(own, theirs)],
    )
    apart = apart.assign(machine=apart["machine"] & apart["apart"] & ~apart["unknown"])
    per_run = apart.groupby("run_dir")[["apart", "unknown", "machine"]].agg(["sum", "size"])
    problems = {}
    for run_dir, row in per_run.iterrows():
        count, total = int(row[("apart", "sum")]), int(row[("apart", "size")])
        if not count:
            problems[run_dir] = ""
        elif row[("unknown", "sum")] == total:
            problems[run_dir] = "no measuring session recorded (timed before sessions were recorded)"
        else:
            where = "on another machine" if row[("machine", "sum")] else "in another session"
            problems[run_dir] = f"{count} of {total} samples' AR partner timed {where}"
    missing = "no sample in common with an AR run of the same setting"
    return runs["run_dir"].map(problems).fillna(missing).astype(str)


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
    sums = grouped[["new_tokens", "machine_s", "ar_new_tokens", "ar_machine_s"]].sum()
    means = grouped[["rate", "ar_rate", "exact_match"]].mean()
    return pd.DataFrame(
        {
            "n_common": grouped.size(),
            "speedup": (sums["new_tokens"] / sums["machine_s"]) / (sums["ar_new_tokens"] / sums["ar_machine_s"]),
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


def match_ar(
    runs: pd.DataFrame, samples: pd.DataFrame | None = None, against: str = "same", same_session: bool = False
) -> pd.DataFrame:
    """Runs plus ar_run_dir, overhead, n_common, speedup, speedup_mean, exact_match_rate vs AR (NaN: none) and
    ``pairing`` (``pairing_problems``: "" when every sample pair was timed in one session).

    Overhead (Medusa's term) = step latency / the AR run's step latency, so speedup ~ tokens per
    step / overhead. With the cost model's columns (``metrics.cost_metrics``), also ``modelled_speedup``: the AR
    run's modelled ms per token over this run's (the speedup the cost model gives this run's own steps).
    ``against`` picks the AR baseline's path (``AR_BASELINES``). With ``same_session`` (the reproduction's rule),
    speedup and exact match count only the sample pairs timed in one session, and the run-level ratios (overhead,
    modelled speedup) only runs whose every pair was.
    """
    partners = _ar_partners(runs, against)
    pairs = _pair_with(_samples_of(runs, samples), partners)
    matched = runs.assign(ar_run_dir=runs["run_dir"].map(partners), pairing=pairing_problems(runs, pairs))
    apart = matched["pairing"].ne("") & same_session
    matched = matched.assign(overhead=_over_ar(matched, runs, "step_latency_s").mask(apart))
    if "modelled_ms_per_token" in runs:
        matched = matched.assign(modelled_speedup=(1 / _over_ar(matched, runs, "modelled_ms_per_token")).mask(apart))
    kept = pairs[in_one_session(pairs)] if same_session else pairs
    matched = matched.merge(_agreement(kept), left_on="run_dir", right_index=True, how="left")
    return matched.fillna({"n_common": 0}).astype({"n_common": int})


def paired_samples(runs: pd.DataFrame, samples: pd.DataFrame | None = None, same_session: bool = False) -> pd.DataFrame:
    """Each sample of each run beside the same sample of its AR baseline (AR self-pairs included); with
    ``same_session`` only the pairs timed in one measuring session (``in_one_session``)."""
    pairs = _pair_with(_samples_of(runs, samples), _ar_partners(runs))
    return pairs[in_one_session(pairs)] if same_session else pairs


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
        tokens, wall = group["new_tokens"].to_numpy(float), group["machine_s"].to_numpy(float)
        ar_tokens, ar_wall = group["ar_new_tokens"].to_numpy(float), group["ar_machine_s"].to_numpy(float)
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


CROSS_KEYS = ["model", "dataset", "method", "temperature", "top_p", "max_new_tokens", "device_name", "dtype", "target"]
"""What a run of specbench's own engine and a vLLM run must share to be cross-checked: the same method on the same
target and prompts (they come from different processes, so not the bench session)."""
CROSS_DEPTHS = (1, 2, 3)
"""Draft depths whose joint acceptance the cross-check sets side by side."""


def engine_pairs(runs: pd.DataFrame) -> pd.DataFrame:
    """Each vLLM run beside the run of specbench's own loop (batch 1) of the same method and setting: columns
    ``run_dir`` (hf) and ``vllm_run_dir``, the vLLM run's ``batch_size``, and each one's AR partner."""
    partners = _ar_partners(runs)
    own = runs[(runs["engine"] == "hf") & (runs["batch_size"] == 1)][["run_dir", *CROSS_KEYS]]  # the loop's runs
    served = runs[runs["engine"] == "vllm"][["run_dir", "batch_size", "concurrency", *CROSS_KEYS]].rename(
        columns={"run_dir": "vllm_run_dir"}
    )
    pairs = own.merge(served, on=CROSS_KEYS)
    return pairs.assign(ar_run_dir=pairs["run_dir"].map(partners), vllm_ar_run_dir=pairs["vllm_run_dir"].map(partners))


def cross_check_prompts(runs: pd.DataFrame, samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per prompt both engines answered, per cross-checked pair of runs: each engine's steps, whether they are
    equal, whether the two outputs are, and whether both equal both engines' AR outputs (``ars_equal``)."""
    samples = _samples_of(runs, samples)
    outputs = samples.set_index(["run_dir", *SAMPLE_KEY])["output_ids"]
    rows = []
    for pair in engine_pairs(runs).itertuples(index=False):
        own = samples[samples["run_dir"] == pair.run_dir]
        served = samples[samples["run_dir"] == pair.vllm_run_dir]
        both = own.merge(served, on=SAMPLE_KEY, suffixes=("", "_vllm"))
        unknown = both["prompt_sha"].isna() | both["prompt_sha_vllm"].isna()  # older records: no digest, pair as before
        both = both[unknown | (both["prompt_sha"] == both["prompt_sha_vllm"])]
        for record in both.to_dict("records"):
            key = tuple(record[k] for k in SAMPLE_KEY)
            references = [outputs.get((run, *key)) for run in (pair.ar_run_dir, pair.vllm_ar_run_dir)]
            rows.append(
                {
                    "method": pair.method,
                    "batch_size": pair.batch_size,
                    "run_dir": pair.run_dir,
                    "vllm_run_dir": pair.vllm_run_dir,
                    **dict(zip(SAMPLE_KEY, key, strict=True)),
                    "steps": record["target_forwards"],
                    "vllm_steps": record["target_forwards_vllm"],
                    "steps_equal": record["target_forwards"] == record["target_forwards_vllm"],
                    "outputs_equal": record["output_ids"] == record["output_ids_vllm"],
                    "ars_equal": all(
                        reference is not None and reference == output
                        for reference in references
                        for output in (record["output_ids"], record["output_ids_vllm"])
                    ),
                }
            )
    return pd.DataFrame(rows, columns=CROSS_PROMPT_COLUMNS)


CROSS_PROMPT_COLUMNS = [
    "method",
    "batch_size",
    "run_dir",
    "vllm_run_dir",
    *SAMPLE_KEY,
    "steps",
    "vllm_steps",
    "steps_equal",
    "outputs_equal",
    "ars_equal",
]


def cross_check(runs: pd.DataFrame, samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per cross-checked pair (a method in specbench's loop and in vLLM, on the same prompts): each engine's tokens
    per step, share of steps that drafted and joint acceptance at the first depths over the common prompts, and the
    shares of prompts with equal steps and with every output (both runs, both ARs) equal."""
    samples = _samples_of(runs, samples)
    prompts = cross_check_prompts(runs, samples)
    rows = []
    for (run_dir, vllm_run_dir), group in prompts.groupby(["run_dir", "vllm_run_dir"], sort=False):
        common = group[SAMPLE_KEY].apply(tuple, axis=1).tolist()
        row = {
            "method": group["method"].iloc[0],
            "batch_size": group["batch_size"].iloc[0],
            "n_common": len(group),
            "same_steps": group["steps_equal"].mean(),
            "equal_to_ar": group["ars_equal"].mean(),
        }
        for engine, run in (("hf", run_dir), ("vllm", vllm_run_dir)):
            records = [
                r
                for r in samples[samples["run_dir"] == run].to_dict("records")
                if tuple(r[k] for k in SAMPLE_KEY) in common
            ]
            row.update(engine_step_summary(records, engine))
        rows.append(row)
    return pd.DataFrame(rows, columns=CROSS_COLUMNS)


def engine_step_summary(records: list[dict], engine: str) -> dict:
    """One engine's side of a cross-check: tokens per step, share of steps that drafted, joint acceptance."""
    metrics = aggregate(records)
    steps = [drafted for record in records for drafted in record["draft_tokens"] or []]
    joint = {row["depth"]: row["joint"] for row in acceptance_by_depth(records)}
    return {
        f"tokens_per_step_{engine}": metrics["tokens_per_step"],
        f"drafted_share_{engine}": sum(d > 0 for d in steps) / len(steps) if steps else None,
        **{f"joint{depth}_{engine}": joint.get(depth) for depth in CROSS_DEPTHS},
    }


CROSS_COLUMNS = [
    "method",
    "batch_size",
    "n_common",
    "tokens_per_step_hf",
    "tokens_per_step_vllm",
    "same_steps",
    "equal_to_ar",
    "drafted_share_hf",
    "drafted_share_vllm",
    *(f"joint{depth}_{engine}" for depth in CROSS_DEPTHS for engine in ("hf", "vllm")),
]
