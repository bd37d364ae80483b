"""Diagnose greedy divergences from AR: floating-point noise or a real bug?

    python scripts/diagnose_divergence.py RUN_DIR... [--max-samples N] [--gap G]

Give it method runs and their AR run (as stored by ``python -m specbench``). For each sample whose
output differs from AR (first differing turn only: later turns see different histories), it
1. measures, in the run's dtype, the logit gap between AR's token and the method's token at the
   first divergence, given the common prefix (a tiny gap = two nearly tied candidates);
2. reruns that turn with the method and with AR in float64 and checks that they agree.
A divergence counts as numeric only when the float64 rerun agrees AND the gap is a near tie: below
``--gap`` if given, else below the larger of 1e-4 and 16 rounding steps of the run's dtype at the logit's
magnitude (1e-4 in float32; ~0.06 for a logit of 5 in float16, ~0.5 in bfloat16: a 16-bit forward cannot
order two candidates closer than that). Anything else is reported as a bug to investigate. Exit code 1 if
any. Models load once per (model, device, dtype) and AR's float64 rerun of a turn is shared by every method.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

from specbench.core.acceptance import Sampling
from specbench.data.base import build_dataset
from specbench.engines import build_engine
from specbench.models.loading import load_model, resolve_device, resolve_dtype
from specbench.report.compare import divergences
from specbench.report.read import load
from specbench.runner import sample_generator
from specbench.store import CONFIG


def first_divergent_turns(runs: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Per (method run, sample): the first turn whose output differs from AR."""
    diverged = divergences(runs, samples)
    diverged = diverged[~diverged["exact_match"]].sort_values(["run_dir", "sample_id", "turn"])
    return diverged.drop_duplicates(["run_dir", "sample_id"]).reset_index(drop=True)


def turn_prompt(dataset, tokenizer, samples: pd.DataFrame, run_dir: str, sample_id: str, turn: int):
    """The prompt ids of ``turn``: earlier turns (identical to AR's) come from the stored outputs."""
    sample = next(s for s in dataset.samples(None) if s.sample_id == sample_id)
    mine = samples[(samples["run_dir"] == run_dir) & (samples["sample_id"] == sample_id)]
    answers = [mine.loc[mine["turn"] == t, "output_text"].iloc[0] for t in range(turn)]
    return dataset.prompt_ids(tokenizer, sample, answers)


def logit_gap(model, prompt_ids: list[int], prefix: list[int], ar_token: int, other: int) -> tuple[float, float]:
    """logit(AR's token) - logit(the method's token) after prompt + common prefix, one forward; and AR's logit."""
    ids = torch.tensor([prompt_ids + prefix], device=model.device)  # [1, len]
    with torch.inference_mode():
        logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1].double()  # [vocab]
    return float(logits[ar_token] - logits[other]), float(logits[ar_token])


def near_tie(dtype: torch.dtype, logit: float) -> float:
    """The largest gap a ``dtype`` forward may get wrong: 16 rounding steps at ``logit``'s magnitude, >= 1e-4."""
    step = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(max(abs(logit), 1.0)))
    return max(1e-4, 16 * step)


def rerun(cfg, lm, prompt_ids: list[int], sample_id: str, method_cfg) -> list[int]:
    """One greedy generation of ``prompt_ids`` with ``method_cfg`` on ``lm``."""
    engine = build_engine(method_cfg, lm, Sampling(cfg.temperature, cfg.top_p))
    with torch.inference_mode():
        return engine.generate(prompt_ids, cfg.max_new_tokens, sample_generator(cfg.seed, sample_id)).output_ids


def diagnose(run_dirs: list[Path], max_samples: int, gap_limit: float | None) -> pd.DataFrame:
    """One row per divergent (run, sample): index, gap, float64 agreement and the verdict."""
    runs, samples = load(run_dirs)
    todo = first_divergent_turns(runs, samples)
    models: dict[tuple, object] = {}
    ar_reruns: dict[tuple, list[int]] = {}

    def model(cfg, dtype: torch.dtype):
        """The run's model in ``dtype``, loaded once per (model, device, dtype)."""
        device = resolve_device(cfg.device)
        key = (OmegaConf.to_yaml(cfg.model), str(device), dtype)
        if key not in models:
            models[key] = load_model(cfg.model, device, dtype)
        return models[key]

    def stored(run_dir: str, sample_id: str, turn: int) -> list[int]:
        """The output ids one run stored for one turn."""
        mine = (samples["run_dir"] == run_dir) & (samples["sample_id"] == sample_id) & (samples["turn"] == turn)
        return samples[mine]["output_ids"].iloc[0]

    rows = []
    for run_dir, group in todo.groupby("run_dir", sort=False):
        cfg = OmegaConf.load(Path(run_dir) / CONFIG)
        ar_cfg = OmegaConf.load(Path(group["ar_run_dir"].iloc[0]) / CONFIG)
        device = resolve_device(cfg.device)
        dtype = resolve_dtype(cfg.dtype, device)
        lm, lm64 = model(cfg, dtype), model(cfg, torch.float64)
        dataset = build_dataset(cfg.dataset, cfg.data_dir)
        for row in group.head(max_samples).itertuples():
            prompt = turn_prompt(dataset, lm.tokenizer, samples, run_dir, row.sample_id, row.turn)
            own, ar = stored(run_dir, row.sample_id, row.turn), stored(row.ar_run_dir, row.sample_id, row.turn)
            k = row.first_divergence
            compared = k < min(len(own), len(ar))  # else one output is a prefix of the other
            gap, logit = logit_gap(lm.model, prompt, ar[:k], ar[k], own[k]) if compared else (None, 0.0)
            ar_key = (row.ar_run_dir, row.sample_id, row.turn)
            if ar_key not in ar_reruns:
                ar_reruns[ar_key] = rerun(cfg, lm64, prompt, row.sample_id, ar_cfg.method)
            agree64 = rerun(cfg, lm64, prompt, row.sample_id, cfg.method) == ar_reruns[ar_key]
            limit = gap_limit if gap_limit is not None else near_tie(dtype, logit)
            numeric = agree64 and gap is not None and abs(gap) < limit
            rows.append(
                {
                    "run": Path(run_dir).name,
                    "method": cfg.method.name,
                    "sample_id": row.sample_id,
                    "turn": row.turn,
                    "first_divergence": k,
                    "logit_gap": gap,
                    "near_tie": limit,
                    "float64_agrees": agree64,
                    "verdict": "numeric" if numeric else "BUG",
                }
            )
    columns = ["run", "method", "sample_id", "turn", "first_divergence", "logit_gap", "near_tie", "float64_agrees"]
    return pd.DataFrame(rows, columns=[*columns, "verdict"])


def main(argv: list[str] | None = None) -> int:
    """Print the diagnosis table; exit 1 when a divergence is not explained by numerics."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="method run(s) and their AR run")
    parser.add_argument("--max-samples", type=int, default=20, help="divergent samples checked per run")
    parser.add_argument(
        "--gap", type=float, help="largest logit gap counted as a near tie (default: by the run's dtype, above)"
    )
    args = parser.parse_args(argv)
    table = diagnose(args.run_dirs, args.max_samples, args.gap)
    if table.empty:
        print("no divergences from AR: every compared sample matches token for token")
        return 0
    print(table.to_string(index=False, float_format="{:.2e}".format))
    return int((table["verdict"] == "BUG").any())


if __name__ == "__main__":
    sys.exit(main())
