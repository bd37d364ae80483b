"""The report's tables: the ``runs`` and ``steps`` views of loaded runs, formatted for a terminal (the
benchmark suites print the ``steps`` view of their sessions)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from specbench.metrics import PERCENTILES, REQUEST_PERCENTILES, acceptance_by_depth
from specbench.report.compare import (
    CROSS_COLUMNS,
    CROSS_DEPTHS,
    CROSS_PROMPT_COLUMNS,
    cross_check,
    cross_check_prompts,
    match_ar,
)
from specbench.report.read import PathLike, load

TABLE_COLUMNS = [
    "run_dir",
    "model",
    "method",
    "dataset",
    "temperature",
    "n_samples",
    "throughput_total",
    "throughput_mean",
    "bandwidth_share",
    "tokens_per_step",
    "accepted_per_step",
    "draft_efficiency",
    "step_latency_s",
    "outside_forward_share",
    "side_branch_share",
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
    "compiled",
    "n_samples",
    "tokens_per_step",
    "throughput_total",
    "bandwidth_share",
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
# Where time goes per request and per step, and the energy per token.
LATENCY_COLUMNS = [
    "run",
    "method",
    "n_samples",
    "throughput_total",
    *(f"ttft_p{q}_s" for q in PERCENTILES),
    "tpot_s",
    *(f"tpot_p{q}_s" for q in PERCENTILES),
    *(f"step_p{q}_s" for q in PERCENTILES),
    "joules_per_token",
]
# The cost model beside the measurement: tokens/step priced with the run's latency curve (ideal), the run's own
# steps priced with their measured overhead (modelled), the speedup budget=auto predicted from its calibration,
# and the speedup achieved against AR (docs/metrics.md#cost-model).
COST_COLUMNS = [
    "run",
    "method",
    "budget",
    "tokens_per_step",
    "verify_ms",
    "outside_forward_s",
    "floor_ms_per_token",
    "tpot_s",
    "ideal_speedup",
    "modelled_speedup",
    "predicted_speedup",
    "speedup",
    "achieved_over_modelled",
    "achieved_over_predicted",
]
# One row per run and draft depth (report.view.acceptance_table).
ACCEPTANCE_COLUMNS = ["run", "method", "depth", "steps", "exactly", "joint", "conditional", "marginal", "share"]
# Acceptance per drafting step and per request, and how far each run is from perfect drafting at its budget
# (metrics.drafting_metrics, docs/metrics.md#acceptance-per-step-and-per-request).
DRAFTING_COLUMNS = [
    "run",
    "method",
    "n_samples",
    "tokens_per_step",
    "acceptance_length",
    "acceptance_length_per_request",
    *(f"acceptance_length_request_p{q}" for q in REQUEST_PERCENTILES),
    "drafting_share",
    "draft_efficiency",
    "accepted_per_draft_forward",
    "oracle_tokens_per_step",
    "oracle_share",
    "draft_length_bound",
    "exact_match_rate",
]
# Engines and batch sizes: the same prompts through each engine at each batch size, speedup over the AR of the same
# engine and batch size.
BATCH_COLUMNS = [
    "run",
    "method",
    "engine",
    "batch_size",
    "concurrency",
    "n_samples",
    "tokens_per_step",
    "throughput_total",
    "throughput_mean",
    "speedup",
    "exact_match_rate",
    "ttft_p50_s",
    "tpot_s",
]
# Input length: each run at its mean prompt length, speedup over the AR of the same length, and where a step's time
# goes as the KV cache grows (the verify forward reads all of it).
LENGTH_COLUMNS = [
    "run",
    "method",
    "prompt_tokens_mean",
    "n_samples",
    "tokens_per_step",
    "throughput_total",
    "speedup",
    "exact_match_rate",
    "ttft_p50_s",
    "step_latency_s",
    "draft_share",
    "verify_share",
]
VIEWS = {
    "runs": TABLE_COLUMNS,
    "steps": STEP_COLUMNS,
    "latency": LATENCY_COLUMNS,
    "cost": COST_COLUMNS,
    "acceptance": ACCEPTANCE_COLUMNS,
    "drafting": DRAFTING_COLUMNS,
    "batch": BATCH_COLUMNS,
    "length": LENGTH_COLUMNS,
    "crosscheck": CROSS_COLUMNS,
    "crosscheck_prompts": CROSS_PROMPT_COLUMNS,
}
MILLISECONDS = (
    "step_latency_s",
    "outside_forward_s",
    "tpot_s",
    *(f"{name}_p{q}_s" for name in ("ttft", "tpot", "step") for q in PERCENTILES),
)
SHARES = (
    "bandwidth_share",
    "outside_forward_share",
    "draft_share",
    "verify_share",
    "accept_share",
    "update_share",
    "side_branch_share",
    "exactly",
    "joint",
    "conditional",
    "marginal",
    "share",
    "drafting_share",
    "oracle_share",
    "same_steps",
    "equal_to_ar",
    "drafted_share_hf",
    "drafted_share_vllm",
    *(f"joint{depth}_{engine}" for depth in CROSS_DEPTHS for engine in ("hf", "vllm")),
)
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
    "accepted_per_draft_forward": "acc/draft_fwd",
    "step_latency_s": "step_ms",
    "outside_forward_s": "outside_ms",
    "outside_forward_share": "outside_fwd",
    "draft_share": "draft",
    "accept_share": "accept",
    "update_share": "update",
    "exact_match_rate": "exact",
    "first_divergence": "diverges_at",
    "side_branch_share": "side_branch",
    "tpot_s": "tpot_ms",
    "joules_per_token": "J/tok",
    **{f"{name}_p{q}_s": f"{name}_p{q}_ms" for name in ("ttft", "tpot", "step") for q in PERCENTILES},
    "verify_ms": "T(k)_ms",
    "bandwidth_share": "bw_share",
    "floor_ms_per_token": "floor_ms/tok",
    "ideal_speedup": "ideal",
    "modelled_speedup": "modelled",
    "predicted_speedup": "predicted",
    "achieved_over_modelled": "achieved/model",
    "achieved_over_predicted": "achieved/pred",
    "batch_size": "batch",
    "prompt_tokens_mean": "prompt_tok",
    "tokens_per_step_hf": "tok/step_hf",
    "tokens_per_step_vllm": "tok/step_vllm",
    "drafted_share_hf": "drafted_hf",
    "drafted_share_vllm": "drafted_vllm",
    "vllm_run_dir": "vllm_run",
    "acceptance_length": "AL_drafting",
    "acceptance_length_per_request": "AL_request",
    **{f"acceptance_length_request_p{q}": f"AL_req_p{q}" for q in REQUEST_PERCENTILES},
    "drafting_share": "drafting",
    "oracle_tokens_per_step": "oracle",
    "oracle_share": "of_oracle",
    "draft_length_bound": "K_bound",
}


ORDER = ["session", "entry_index", "model", "dataset", "temperature", "method", "run_dir"]
"""Row order of every view: bench entries in suite order, other runs by model and dataset."""


def report_table(runs: pd.DataFrame, samples: pd.DataFrame, view: str = "runs", against: str = "same") -> pd.DataFrame:
    """One view's table from loaded frames (``acceptance``: one row per run and draft depth), each run compared with
    the AR run ``against`` names (``compare.AR_BASELINES``: on its own path, or eager, or compiled)."""
    if view == "acceptance":
        return acceptance_table(runs, samples)
    if view in ("crosscheck", "crosscheck_prompts"):
        checked = (cross_check if view == "crosscheck" else cross_check_prompts)(runs, samples)
        labels = {run["run_dir"]: run_label(run) for _, run in runs.iterrows()}
        return checked.replace({"run_dir": labels, "vllm_run_dir": labels})
    report = match_ar(runs, samples, against).sort_values(ORDER)
    report["run"] = [run_label(run) for _, run in report.iterrows()]
    report["achieved_over_modelled"] = report["speedup"] / report.get("modelled_speedup", float("nan"))
    report["achieved_over_predicted"] = report["speedup"] / report["predicted_speedup"]
    return report[VIEWS[view]].reset_index(drop=True)


def run_label(run: pd.Series) -> str:
    """A run's name in tables and figures: its bench entry, else its folder's name."""
    return run["entry"] if isinstance(run.get("entry"), str) and run["entry"] else Path(run["run_dir"]).name


def acceptance_table(runs: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Acceptance by draft depth (metrics.acceptance_by_depth) of every run that drafted."""
    rows = []
    for _, run in runs.sort_values(ORDER).iterrows():
        records = samples[samples["run_dir"] == run["run_dir"]].to_dict("records")
        for depth in acceptance_by_depth(records):
            rows.append({"run": run_label(run), "method": run["method"], **depth})
    return pd.DataFrame(rows, columns=ACCEPTANCE_COLUMNS)


def table(
    paths: Iterable[PathLike], by: str | None = None, repeats: bool = False, view: str = "runs", against: str = "same"
) -> pd.DataFrame:
    """The report: recomputed metrics, speedup, overhead and exact-match rate vs the AR baseline.

    ``view`` picks the columns (``runs``: throughput and acceptance; ``steps``: the bench view of
    where step time goes); ``repeats`` merges the repeats of each setting (see ``merge_repeats``); ``against``
    the AR baseline's path (``compare.AR_BASELINES``).
    """
    return report_table(*load(paths, by, repeats), view, against)


def _for_display(frame: pd.DataFrame) -> pd.DataFrame:
    """Run folder names instead of paths, times in ms, shares in %, short headers, to fit a terminal."""
    shown = frame.copy()
    for column in {"run_dir", "ar_run_dir", "vllm_run_dir"} & set(shown.columns):
        shown[column] = shown[column].map(lambda path: Path(path).name, na_action="ignore")
    for column in set(MILLISECONDS) & set(shown.columns):
        shown[column] = shown[column] * 1000
    for column in set(SHARES) & set(shown.columns):
        shown[column] = shown[column].map(lambda share: "-" if pd.isna(share) else f"{share:.1%}")
    return shown.rename(columns=DISPLAY_NAMES)


def format_table(frame: pd.DataFrame) -> str:
    """Fixed-width text of a report frame: floats to 2 decimals, '-' where a value is missing."""
    return _for_display(frame).to_string(index=False, float_format="{:.2f}".format, na_rep="-")


def quality_text(quality: pd.DataFrame) -> str:
    """The quality table, or a line saying that no run's dataset declares a quality metric."""
    if quality.empty:
        return (
            "no run's dataset has a quality metric (pass@1: HumanEval, MBPP; answer accuracy: GSM; ROUGE: CNN/DM, XSum)"
        )
    return format_table(quality)


def reprice_text(repriced: pd.DataFrame) -> str:
    """The re-priced budget table, or a line saying that no run's calibration can be re-priced."""
    if repriced.empty:
        return "no budget=auto run whose calibration recorded its forward shapes (runs before they were recorded)"
    return format_table(repriced)


def diagnosis_text(judged: pd.DataFrame) -> str:
    """The divergence table with each divergence's diagnosis (``specbench.diagnosis``; logit gaps in scientific
    notation: a near tie is far below 0.01), or a line saying none differs."""
    if judged.empty:
        return "no compared sample differs from its AR baseline"
    shown = _for_display(judged.drop(columns="exact_match"))
    return shown.to_string(index=False, float_format="{:.2e}".format, na_rep="-")


def divergence_text(compared: pd.DataFrame) -> str:
    """The first-divergence table of the samples that differ from AR, or a line saying none do."""
    differing = compared[~compared["exact_match"]]
    if differing.empty:
        return "no compared sample differs from its AR baseline"
    return format_table(differing.drop(columns="exact_match"))
