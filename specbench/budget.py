"""``budget=N`` and ``budget=auto``: a method's size knob set by hand, or chosen for the hardware at hand.

A method with a size knob names it in its config (``method.budget_knob``: the key under the method node
and the grid of values ``auto`` compares). ``budget=auto`` runs a short calibration before the timed run:
AR and every grid value (the method's default included) generate on a few held-out prompts of the
dataset (a seeded random draw outside the run's samples) with the step breakdown on; each setting's steps
are priced with the cached latency curve of the model on this device (``specbench.profile.cached_curve``)
and the value of the largest predicted speedup is chosen (``specbench.costmodel``). The choice, its
evidence and the curve's digest are stored with the run (``budget.json``, the summary's ``budget``), and a
resumed run reuses them.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specbench.config import CONF_DIR
from specbench.core.acceptance import Sampling
from specbench.core.loop import Generation
from specbench.costmodel import LatencyCurve, StepCosts, choose_budget, ideal_speedup, predicted_speedup, step_costs
from specbench.data.base import Dataset, Sample
from specbench.engines import build_engine
from specbench.models.loading import LoadedModel
from specbench.profile import cached_curve, context_bucket, stored_curve

KNOB_NODE = "budget_knob"
"""The method config node that names the size knob (``key``, relative to the method node) and its ``grid``."""
BUDGET_FILE = "budget.json"
"""Where a budget=auto run keeps its choice and evidence, so a resumed run reuses them."""
CALIBRATION_WARMUP_TOKENS = 16
"""Tokens of the untimed generation each calibrated engine runs first (allocator, draft caches, kernels)."""
CURVE_TOLERANCE = 0.10
"""How far the calibration's AR forwards may be from a cached curve's T(1) (relative) before the curve is measured
again: a curve cached on a busier or another machine would misprice every setting."""


def knobbed_methods(conf_dir: Path = CONF_DIR) -> list[str]:
    """The shipped methods that have a size knob (what an error lists)."""
    return sorted(path.stem for path in (conf_dir / "method").glob("*.yaml") if KNOB_NODE in OmegaConf.load(path))


def is_count(value: object) -> bool:
    """An integer >= 1 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def budget_problems(cfg: DictConfig) -> list[str]:
    """What is wrong with ``budget`` for this method (empty: fine), before anything loads."""
    budget = cfg.get("budget")
    if budget is None:
        return []
    if budget != "auto" and not is_count(budget):
        return [f"budget must be null (the method's default), auto or an integer >= 1 (got {budget!r})"]
    calibration = cfg.get("calibration") or {}
    prompts, tokens = calibration.get("prompts"), calibration.get("max_new_tokens")
    if budget == "auto" and not is_count(prompts):
        return [f"calibration.prompts must be an integer >= 1 (got {prompts!r})"]
    if budget == "auto" and tokens is not None and not is_count(tokens):
        return [f"calibration.max_new_tokens must be null or an integer >= 1 (got {tokens!r})"]
    margin = calibration.get("margin")
    if budget == "auto" and (isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin < 0):
        return [f"calibration.margin must be a number >= 0, a relative gain such as 0.05 (got {margin!r})"]
    if KNOB_NODE not in cfg.method:
        return [
            f"method {cfg.method.name} has no size knob for budget={budget}; methods with one: "
            f"{', '.join(knobbed_methods())}"
        ]
    return []


def knob_key(cfg: DictConfig) -> str:
    """The size knob's key under the method node (e.g. ``drafter.nodes``)."""
    return str(cfg.method[KNOB_NODE].key)


def with_budget(cfg: DictConfig, value: int) -> DictConfig:
    """A copy of the whole config with the method's size knob at ``value`` (whole, so that interpolations such as
    LADE's ``guess_set_size: ${.window_size}`` follow the knob)."""
    chosen = copy.deepcopy(cfg)
    OmegaConf.update(chosen.method, knob_key(cfg), value, merge=False)
    return chosen


def default_value(cfg: DictConfig) -> int:
    """The method's own value of its size knob (its paper's budget)."""
    return int(OmegaConf.select(cfg.method, knob_key(cfg)))


def grid(cfg: DictConfig) -> list[int]:
    """The values ``auto`` compares: the method's grid and its default, ascending."""
    return sorted({*map(int, cfg.method[KNOB_NODE].grid), default_value(cfg)})


def held_out(dataset: Dataset, run_samples: list[Sample], count: int, seed: int) -> tuple[list[Sample], bool]:
    """``count`` calibration prompts drawn at random (seeded) from the dataset's samples outside the run's, and
    whether the dataset was too small for that so some are run samples too.

    A random draw, not the dataset's last samples: datasets are ordered (HumanEval's late problems repeat less
    than its early ones), so a fixed end of the file biased every prediction the same way.
    """
    run_ids = {sample.sample_id for sample in run_samples}
    every = dataset.samples(None)
    outside = [sample for sample in every if sample.sample_id not in run_ids]
    overlaps = len(outside) < count
    pool = every if overlaps else outside
    return random.Random(seed).sample(pool, min(count, len(pool))), overlaps


def forward_ms(generations: list[Generation]) -> float:
    """The median measured verify forward (ms) over the steps of generations timed with the step breakdown."""
    return 1e3 * float(np.median([v for gen in generations for v in gen.verify_s or []]))


@dataclass(frozen=True)
class CurveCheck:
    """The curve's T(1) against AR's forwards measured in the calibration: a stale cached curve is measured again."""

    measured_ms: float  # median verify forward of AR's calibration steps
    curve_ms: float  # the pricing curve's T(1)
    remeasured: bool  # the pricing curve was measured during this calibration (not read from the cache)

    @property
    def stale(self) -> bool:
        """The curve was read from the cache and its T(1) is off the measured forwards by more than the tolerance."""
        return not self.remeasured and abs(self.curve_ms / self.measured_ms - 1) > CURVE_TOLERANCE


@dataclass
class Calibration:
    """What ``auto`` measured: the prompts, the curve that priced the steps, and every setting's costs."""

    prompts: list[list[int]]
    sample_ids: list[str]
    overlaps_run: bool
    max_new_tokens: int
    curve: LatencyCurve
    curve_check: CurveCheck
    ar: StepCosts
    candidates: dict[int, StepCosts]
    seconds: float
    margin: float  # the predicted gain over the default below which the default stays

    def record(self, key: str, default: int) -> dict:
        """The run's ``budget`` record (summary and budget.json): the choice and its evidence."""
        chosen = choose_budget(self.candidates, self.ar, default, self.margin)
        return {
            "mode": "auto",
            "key": key,
            "value": chosen,
            "default": default,
            "margin": self.margin,
            "predicted_speedup": predicted_speedup(self.candidates[chosen], self.ar),
            "candidates": {str(value): self.priced(costs) for value, costs in self.candidates.items()},
            "ar": vars(self.ar),
            "curve": self.curve.to_dict(),
            "curve_digest": self.curve.digest(),
            "curve_check": asdict(self.curve_check),
            "calibration": {
                "sample_ids": self.sample_ids,
                "overlaps_run": self.overlaps_run,
                "max_new_tokens": self.max_new_tokens,
                "seconds": round(self.seconds, 1),
            },
        }

    def priced(self, costs: StepCosts) -> dict:
        """One setting's measured costs with its ideal and predicted speedups."""
        return {
            **vars(costs),
            "ideal_speedup": ideal_speedup(costs, self.curve),
            "predicted_speedup": predicted_speedup(costs, self.ar),
        }


def generation_costs(generations: list[Generation], curve: LatencyCurve) -> StepCosts:
    """Price the steps of calibration generations (timed with the step breakdown on)."""
    steps = [gen for gen in generations if gen.accept_lengths]
    return step_costs(
        [n for gen in steps for n in gen.accept_lengths or []],
        [n for gen in steps for n in gen.draft_tokens or []],
        [d for gen in steps for d in gen.draft_depth or []],
        [w for gen in steps for w in gen.verify_tokens or []],
        [s - v for gen in steps for s, v in zip(gen.step_s or [], gen.verify_s or [], strict=True)],
        curve,
    )


def measure_setting(
    method_cfg: DictConfig,
    lm: LoadedModel,
    sampling: Sampling,
    prompts: list[list[int]],
    max_new_tokens: int,
    seed: int,
) -> list[Generation]:
    """One fresh engine of ``method_cfg``: an untimed short generation, then one per prompt (step breakdown on)."""
    engine = build_engine(method_cfg, lm, sampling, step_breakdown=True)
    with torch.inference_mode():
        engine.generate(prompts[0], min(CALIBRATION_WARMUP_TOKENS, max_new_tokens), torch.Generator().manual_seed(seed))
        return [
            engine.generate(prompt, max_new_tokens, torch.Generator().manual_seed(seed + index))
            for index, prompt in enumerate(prompts)
        ]


def ar_method() -> DictConfig:
    """The AR method node (conf/method/ar.yaml): the calibration's reference."""
    return OmegaConf.load(CONF_DIR / "method" / "ar.yaml")


def calibrate(
    cfg: DictConfig, lm: LoadedModel, device: torch.device, dataset: Dataset, run_samples: list[Sample]
) -> Calibration:
    """Measure AR and every grid value on held-out prompts; price their steps with the cached latency curve."""
    started = time.perf_counter()
    settings = cfg.calibration
    sampling = Sampling(cfg.temperature, cfg.top_p)
    samples, overlaps = held_out(dataset, run_samples, settings.prompts, cfg.seed)
    prompts = [dataset.prompt_ids(lm.tokenizer, sample, []) for sample in samples]
    max_new_tokens = min(settings.max_new_tokens or cfg.max_new_tokens, cfg.max_new_tokens)
    values = grid(cfg)
    # NOTE: the method's settings run first, so a missing part (heads, draft) is reported before AR or the
    # latency curve is measured; the steps are priced once every setting has run.
    with tqdm(total=len(values) + 1, desc=f"budget=auto: calibrating {cfg.method.name}", unit="setting") as bar:
        runs = {}
        for value in values:
            runs[value] = measure_setting(
                with_budget(cfg, value).method, lm, sampling, prompts, max_new_tokens, cfg.seed
            )
            bar.update()
        ar_runs = measure_setting(ar_method(), lm, sampling, prompts, max_new_tokens, cfg.seed)
        bar.update()
    mean_prompt = sum(map(len, prompts)) / len(prompts)
    bucket = context_bucket(mean_prompt + max_new_tokens / 2)
    stored = None if settings.remeasure else stored_curve(lm, device, bucket)
    curve = stored or cached_curve(lm, device, bucket, remeasure=True)
    check = CurveCheck(forward_ms(ar_runs), curve.step_ms, remeasured=stored is None)
    if check.stale:
        tqdm.write(
            f"budget=auto: the cached latency curve's T(1) is {check.curve_ms:.1f} ms but AR's forwards took "
            f"{check.measured_ms:.1f} ms here; measuring the curve again"
        )
        curve = cached_curve(lm, device, bucket, remeasure=True)
        check = replace(check, curve_ms=curve.step_ms, remeasured=True)
    ar = generation_costs(ar_runs, curve)
    candidates = {value: generation_costs(generations, curve) for value, generations in runs.items()}
    return Calibration(
        prompts,
        [sample.sample_id for sample in samples],
        overlaps,
        max_new_tokens,
        curve,
        check,
        ar,
        candidates,
        time.perf_counter() - started,
        settings.margin,
    )


def given_record(cfg: DictConfig) -> dict | None:
    """The ``budget`` record of a run whose budget was given (an integer); None for the default and for auto."""
    if not isinstance(cfg.get("budget"), int):
        return None
    return {"mode": "given", "key": knob_key(cfg), "value": int(cfg.budget), "default": default_value(cfg)}
