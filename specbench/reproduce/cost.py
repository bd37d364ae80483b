"""What a reproduction plan costs before it runs: jobs, samples, generated tokens, forwards and GPU-hours.

Per job: samples = the job's ``limit``, else its dataset's subsample (``sample_size``), else the whole
evaluated split (``SPLIT_SIZES``; of its categories alone when ``dataset.categories`` names some); generated
tokens = samples x turns x ``max_new_tokens``, an UPPER BOUND (every turn runs to its budget; answers that stop at
EOS cost less), plus the runner's untimed warm-up generations. Forwards = tokens / tokens per step, where a method's
tokens per step is the mean of its papers' published ``tokens_per_step`` values, else of their ``speedup`` x the
verify overhead, else 1 (as AR). GPU-hours = forwards x the AR time per token of the job's model size x (the verify
overhead for a speculative step) x the GPUs a job of that size holds. Draft-model forwards and prefill are left
out.

The time per token comes from a latency profile measured on the named GPU when one is stored under
``<results_root>/profile/<model>/latency_*.csv`` (``python -m specbench.profile``; its device name must
contain the GPU's name), else from the GPU's assumption file ``conf/reproduce/gpus/<gpu>.yaml``, which
points at the AR throughput a paper published for a model of that size on that GPU (never a number of
ours). The printed table says which source each model used.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from specbench.config import CONF_DIR
from specbench.errors import ConfigError
from specbench.reproduce.coverage import Job, jobs_frame
from specbench.reproduce.tables import paper_values

GPUS_DIR = CONF_DIR / "reproduce" / "gpus"
SPLIT_SIZES = {  # evaluated samples of a dataset config when neither limit nor sample_size cut it, and turns each
    "mt_bench": (80, 2),
    "humaneval": (164, 1),
    "gsm8k": (1319, 1),
    "dolly": (1000, 1),
    "mbpp100": (500, 1),
    "gsm100": (1319, 1),
    "cnndm": (11490, 1),
    "xsum": (11334, 1),
    "spec_bench": (480, 1),
}
"""Test splits: MT-Bench 80 two-turn questions, HumanEval 164, GSM8K 1,319, Dolly's test 1,000 (Lookahead's
split), MBPP's test 500 (task ids 11-510), CNN/DM 11,490 and XSum 11,334 test articles, Spec-Bench 480."""
CATEGORY_SIZES = {"mt_bench": 10}
"""Samples per category of the datasets a job may cut to some categories (``dataset.categories``): MT-Bench's 8
categories hold 10 questions each."""
VERIFY_PASS_TOKENS = 64  # tokens per verify forward read from a measured profile for the overhead (Medusa's tree)
COLUMNS = ["experiment", "jobs", "samples", "generated_tokens", "forwards", "gpu_hours"]


def gpus() -> list[str]:
    """The GPUs with a cost assumption file (``conf/reproduce/gpus/*.yaml``)."""
    return sorted(path.stem for path in GPUS_DIR.glob("*.yaml"))


def model_size(model: str) -> int | None:
    """Billions of parameters from a model config name (``llama2_13b_chat`` -> 13); None when it has none."""
    match = re.search(r"(?:^|_)(\d+)b(?:_|$)", model)
    return int(match.group(1)) if match else None


def paper_number(values: pd.DataFrame, spec) -> float:
    """The single paper value a cost assumption names (paper, table, model, dataset, metric)."""
    keys = {key: spec[key] for key in ("paper", "table", "model", "dataset", "metric") if key in spec}
    rows = values
    for key, wanted in keys.items():
        rows = rows[rows[key] == wanted]
    if rows.empty:
        raise ConfigError(f"no paper_values row {keys} for the cost assumption")
    return float(rows["value"].iloc[0])


@dataclass(frozen=True)
class Latency:
    """AR seconds per token of one model, the GPUs a job holds, the verify overhead, and where they came from."""

    seconds_per_token: float
    gpus: int
    overhead: float
    source: str


class LatencyModel:
    """Per-model latency: a measured profile of the named GPU when stored, else the GPU's paper-based assumption."""

    def __init__(self, gpu: str = "a100", profile_root: Path | None = None):
        path = GPUS_DIR / f"{gpu.lower()}.yaml"
        if not path.is_file():
            raise ConfigError(
                f"no cost assumptions for GPU {gpu!r}; choose one of {gpus()} "
                f"(or add conf/reproduce/gpus/{gpu.lower()}.yaml)"
            )
        spec = OmegaConf.to_container(OmegaConf.load(path))
        if not isinstance(spec, dict):
            raise ConfigError(f"{path} must be a mapping (gpu, verify_overhead, sizes)")
        self.spec: dict[str, Any] = {str(key): value for key, value in spec.items()}
        self.gpu = self.spec["gpu"]
        self.profile_root = profile_root
        values = paper_values()
        self.overhead = paper_number(values, self.spec["verify_overhead"])
        self.sizes = {
            int(size): (
                1.0 / paper_number(values, spec),
                int(spec.get("gpus", 1)),
                f"assumed: the AR throughput of {spec['model']} in {spec['paper']} {spec['table']} "
                f"({spec.get('gpus', 1)} x {self.gpu})",
            )
            for size, spec in self.spec["sizes"].items()
        }

    def measured(self, model: str) -> Latency | None:
        """The latency of a stored profile of ``model`` measured on this GPU, if any."""
        if self.profile_root is None:
            return None
        for csv in sorted((self.profile_root / model).glob("latency_*.csv")):
            profile = pd.read_csv(csv)
            profile = profile[
                profile["device_name"].str.contains(self.gpu, case=False, na=False) & (profile["mask"] == "tree")
            ]
            if profile.empty:
                continue
            one = profile[profile["num_tokens"] == 1]["median_ms"].median()
            wide = profile[profile["num_tokens"] >= VERIFY_PASS_TOKENS]
            wide = wide[wide["num_tokens"] == wide["num_tokens"].min()]["median_ms"].median()
            size = model_size(model)
            jobs_gpus = self.sizes[size][1] if size in self.sizes else 1
            return Latency(
                one / 1000, jobs_gpus, wide / one if not math.isnan(wide) else self.overhead, f"measured: {csv}"
            )
        return None

    def of(self, model: str) -> Latency | None:
        """The latency of ``model``: measured on this GPU if stored, else the assumption of its size (None: no size)."""
        measured = self.measured(model)
        if measured:
            return measured
        size = model_size(model)
        if size not in self.sizes:
            return None
        seconds, count, source = self.sizes[size]
        return Latency(seconds, count, self.overhead, source)


def method_tokens_per_step(values: pd.DataFrame, overhead: float) -> dict[str, float]:
    """Tokens per step per method config from the papers' numbers (tokens_per_step, else speedup x overhead)."""
    rows = values[values["method"] != ""]
    steps = rows[rows["metric"] == "tokens_per_step"].groupby("method")["value"].mean()
    speedups = rows[rows["metric"] == "speedup"].groupby("method")["value"].mean() * overhead
    return {**speedups.to_dict(), **steps.to_dict(), "ar": 1.0}


def job_samples(job: pd.Series) -> tuple[int, int]:
    """(samples, turns per sample) of one job at its scale, cut to its categories when it names some."""
    split, turns = SPLIT_SIZES.get(job["dataset"], (0, 1))
    if job["categories"] and job["dataset"] in CATEGORY_SIZES:
        split = min(split, len(job["categories"]) * CATEGORY_SIZES[job["dataset"]])
    available = int(job["sample_size"]) if pd.notna(job["sample_size"]) else split
    samples = min(int(job["limit"]), available) if pd.notna(job["limit"]) else available
    return samples, turns


def estimate(jobs: list[Job], latency: LatencyModel) -> pd.DataFrame:
    """One row per job: samples, generated tokens, forwards, GPU-hours and the latency source."""
    frame = jobs_frame(jobs)
    per_step = method_tokens_per_step(paper_values(), latency.overhead)
    rows = []
    for _, job in frame.iterrows():
        samples, turns = job_samples(job)
        tokens = (samples + job["warmup"]) * turns * job["max_new_tokens"]  # warm-up: one sample, untimed
        step = max(per_step.get(job["method"], 1.0), 1.0)
        forwards = tokens / step
        timing = latency.of(job["model"])
        hours = math.nan
        if timing is not None:
            factor = 1.0 if job["method"] == "ar" else timing.overhead
            hours = forwards * timing.seconds_per_token * factor * timing.gpus / 3600
        rows.append(
            {
                "experiment": job["experiment"],
                "model": job["model"],
                "samples": samples * turns,
                "generated_tokens": tokens,
                "forwards": forwards,
                "gpu_hours": hours,
                "latency_source": timing.source if timing else "no size: not estimated",
            }
        )
    return pd.DataFrame(rows)


def cost_table(per_job: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Per experiment (in plan order): jobs, samples (turns), generated tokens, forwards, GPU-hours; then a total."""
    grouped = per_job.groupby("experiment", sort=False)
    table = pd.DataFrame(
        {
            "jobs": grouped.size(),
            "samples": grouped["samples"].sum(),
            "generated_tokens": grouped["generated_tokens"].sum(),
            "forwards": grouped["forwards"].sum(),
            "gpu_hours": grouped["gpu_hours"].sum(min_count=1),
        }
    )
    return with_total(table, order, COLUMNS)


def with_total(per_experiment: pd.DataFrame, order: list[str], columns: list[str]) -> pd.DataFrame:
    """``per_experiment`` (indexed by experiment) in plan order, then a total row over ``columns[1:]``."""
    table = per_experiment.reindex(order).reset_index()
    total = {"experiment": "total", **{column: table[column].sum(min_count=1) for column in columns[1:]}}
    return pd.concat([table, pd.DataFrame([total])], ignore_index=True)[columns]


def cost_text(per_job: pd.DataFrame, table: pd.DataFrame, latency: LatencyModel) -> str:
    """The cost table as Markdown, with the latency source of each model and the assumptions."""

    def number(value, digits=0) -> str:
        return "–" if pd.isna(value) else f"{value:,.{digits}f}"

    lines = [
        f"| experiment | jobs | samples | generated tokens (upper bound) | est. forwards | GPU-hours ({latency.gpu}) |",
        "|---|---|---|---|---|---|",
    ]
    for _, row in table.iterrows():
        lines.append(
            f"| {row['experiment']} | {number(row['jobs'])} | {number(row['samples'])} | "
            f"{number(row['generated_tokens'])} | {number(row['forwards'])} | {number(row['gpu_hours'], 1)} |"
        )
    sources = per_job.groupby("model", sort=True)["latency_source"].first()
    lines += ["", "Time per token by model:"]
    lines += [f"- {model}: {source}" for model, source in sources.items()]
    lines += [
        "",
        "Samples count turns (MT-Bench: 2 per question). Generated tokens: every turn runs to",
        "max_new_tokens (an upper bound), warm-up generations included. Forwards: tokens / the papers' mean",
        "tokens per step of the method (1 when none is published). GPU-hours: forwards x AR time per token",
        f"x {latency.overhead:g} (verify overhead, speculative steps only) x GPUs per job; draft models and "
        "prefill left out.",
    ]
    return "\n".join(lines) + "\n"
