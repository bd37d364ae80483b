"""Why a greedy output differs from AR's: floating-point noise at a near tie, or a bug?

For each run and sample whose output differs from its AR partner's (the first differing turn only: later turns see
other histories), ``diagnose``
1. measures, in the run's dtype, the logit gap between AR's token and the run's token at the first divergence,
   given the common prefix (a tiny gap: two nearly tied candidates);
2. reruns that turn with the method and with AR in float64 and checks that they agree.
A divergence is ``numeric`` only when the float64 reruns agree AND the gap is a near tie: below ``gap_limit`` when
given, else below the larger of 1e-4 and 16 rounding steps of the run's dtype at the logit's magnitude (1e-4 in
float32; ~0.06 for a logit of 5 in float16, ~0.5 in bfloat16: a 16-bit forward cannot order two candidates closer
than that); anything else is a ``BUG`` to investigate. Models load once per (model, device, dtype), and AR's float64
rerun of a turn serves every method. ``python -m specbench.report RUN... --divergences --diagnose`` adds these
columns to the divergence table and exits 1 on a ``BUG``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from specbench.core.acceptance import Sampling
from specbench.data.base import build_dataset
from specbench.engines import build_engine
from specbench.models.loading import LoadedModel, load_model, resolve_device, resolve_dtype
from specbench.report.compare import divergences
from specbench.runner import sample_generator
from specbench.store import CONFIG

DIAGNOSIS_COLUMNS = ["logit_gap", "near_tie", "float64_agrees", "verdict"]
"""What ``diagnose`` adds to a divergence row."""
MAX_SAMPLES = 20
"""Divergent samples judged per run unless the caller says (``report --max-samples``' default)."""
"""Divergent samples diagnosed per run by default (each costs two float64 generations)."""


def first_divergent_turns(runs: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Per (run, sample): the divergence row (``compare.divergences``) of the first turn that differs from AR."""
    diverged = divergences(runs, samples)
    diverged = diverged[~diverged["exact_match"]].sort_values(["run_dir", "sample_id", "turn"])
    return diverged.drop_duplicates(["run_dir", "sample_id"]).reset_index(drop=True)


def turn_prompt(dataset, tokenizer, samples: pd.DataFrame, run_dir: str, sample_id: str, turn: int) -> list[int]:
    """The prompt ids of ``turn``: earlier turns (identical to AR's) come from the stored outputs."""
    sample = next(s for s in dataset.samples(None) if s.sample_id == sample_id)
    mine = samples[(samples["run_dir"] == run_dir) & (samples["sample_id"] == sample_id)]
    answers = [mine.loc[mine["turn"] == t, "output_text"].iloc[0] for t in range(turn)]
    return dataset.prompt_ids(tokenizer, sample, answers)


def logit_gap(model, prompt_ids: list[int], prefix: list[int], ar_token: int, other: int) -> tuple[float, float]:
    """logit(AR's token) - logit(the run's token) after prompt + common prefix, one forward; and AR's logit."""
    ids = torch.tensor([prompt_ids + prefix], device=model.device)  # [1, len]
    with torch.inference_mode():
        logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1].double()  # [vocab]
    return float(logits[ar_token] - logits[other]), float(logits[ar_token])


def near_tie(dtype: torch.dtype, logit: float) -> float:
    """The largest gap a ``dtype`` forward may get wrong: 16 rounding steps at ``logit``'s magnitude, >= 1e-4."""
    step = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(max(abs(logit), 1.0)))
    return max(1e-4, 16 * step)


def rerun(cfg: DictConfig, lm: LoadedModel, prompt_ids: list[int], sample_id: str, method_cfg) -> list[int]:
    """One greedy generation of ``prompt_ids`` with ``method_cfg`` on ``lm``."""
    engine = build_engine(method_cfg, lm, Sampling(cfg.temperature, cfg.top_p))
    with torch.inference_mode():
        return engine.generate(prompt_ids, cfg.max_new_tokens, sample_generator(cfg.seed, sample_id)).output_ids


class Models:
    """Target models loaded once per (model config, device, dtype)."""

    def __init__(self) -> None:
        self.loaded: dict[tuple, LoadedModel] = {}

    def __call__(self, cfg: DictConfig, dtype: torch.dtype) -> LoadedModel:
        """The run's model in ``dtype``."""
        device = resolve_device(cfg.device)
        key = (OmegaConf.to_yaml(cfg.model), str(device), dtype)
        if key not in self.loaded:
            self.loaded[key] = load_model(cfg.model, device, dtype)
        return self.loaded[key]


def stored_output(samples: pd.DataFrame, run_dir: str, sample_id: str, turn: int) -> list[int]:
    """The output ids one run stored for one turn."""
    mine = (samples["run_dir"] == run_dir) & (samples["sample_id"] == sample_id) & (samples["turn"] == turn)
    return samples[mine]["output_ids"].iloc[0]


def diagnose(
    runs: pd.DataFrame, samples: pd.DataFrame, max_samples: int = MAX_SAMPLES, gap_limit: float | None = None
) -> pd.DataFrame:
    """The first divergent turn of each (run, sample), at most ``max_samples`` per run, with DIAGNOSIS_COLUMNS."""
    todo = first_divergent_turns(runs, samples)
    models = Models()
    ar_reruns: dict[tuple, list[int]] = {}
    rows = []
    for run_dir, group in todo.groupby("run_dir", sort=False):
        cfg = OmegaConf.load(Path(run_dir) / CONFIG)
        ar_cfg = OmegaConf.load(Path(group["ar_run_dir"].iloc[0]) / CONFIG)
        dtype = resolve_dtype(cfg.dtype, resolve_device(cfg.device))
        lm, lm64 = models(cfg, dtype), models(cfg, torch.float64)
        dataset = build_dataset(cfg.dataset, cfg.data_dir)
        for _, row in group.head(max_samples).iterrows():
            prompt = turn_prompt(dataset, lm.tokenizer, samples, run_dir, row["sample_id"], row["turn"])
            own = stored_output(samples, run_dir, row["sample_id"], row["turn"])
            ar = stored_output(samples, row["ar_run_dir"], row["sample_id"], row["turn"])
            k = row["first_divergence"]
            compared = k < min(len(own), len(ar))  # else one output is a prefix of the other
            gap, logit = logit_gap(lm.model, prompt, ar[:k], ar[k], own[k]) if compared else (None, 0.0)
            ar_key = (row["ar_run_dir"], row["sample_id"], row["turn"])
            if ar_key not in ar_reruns:
                ar_reruns[ar_key] = rerun(cfg, lm64, prompt, row["sample_id"], ar_cfg.method)
            agree64 = rerun(cfg, lm64, prompt, row["sample_id"], cfg.method) == ar_reruns[ar_key]
            limit = gap_limit if gap_limit is not None else near_tie(dtype, logit)
            numeric = agree64 and gap is not None and abs(gap) < limit
            judged = {"logit_gap": gap, "near_tie": limit, "float64_agrees": agree64}
            rows.append({**row.to_dict(), **judged, "verdict": "numeric" if numeric else "BUG"})
    return pd.DataFrame(rows, columns=[*todo.columns, *DIAGNOSIS_COLUMNS])
