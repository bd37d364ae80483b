"""``python -m specbench.train layer_skip``: search Draft&Verify's skipped sub-layers for a target that has none given.

The search maximises the measured greedy tokens/s of self-speculative decoding over the first ``search.prompts``
calibration prompts (``search.source``: MBPP's train split or Dolly's dev split, never an evaluation prompt) by
Bayesian optimisation over the 2L skip bits (``specbench.structures.bayes_opt``), from two starting points, within
``search.iterations`` proposals and ``search.max_minutes``. The result (the best set, its speed and every point
tried) is stored where the drafter looks for it (``DraftVerify.searched_file``): keyed by the target, its device,
the search settings and the drafting knobs; an existing result is kept and reported.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, open_dict
from tqdm import tqdm

from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.drafters.draft_verify import DraftVerify, SearchSettings
from specbench.engines import check_method
from specbench.errors import ConfigError
from specbench.files import write_atomic
from specbench.manifest import digest
from specbench.models.layer_skip import SkipSet
from specbench.models.loading import LoadedModel
from specbench.structures.bayes_opt import BinarySearch, maximise
from specbench.train.common import compose_train, load_target
from specbench.train.sources import SOURCES


def starting_points(layers: int) -> list[tuple[int, ...]]:
    """The search's first points: the attention of the upper half skipped; attention and MLP of every second
    layer of the upper half skipped (the last layer always kept)."""
    upper = range(layers // 2, layers - 1)
    attention_only = SkipSet(tuple(upper), ())
    alternate = SkipSet(tuple(upper[::2]), tuple(upper[::2]))
    return [tuple(attention_only.bits(layers)), tuple(alternate.bits(layers))]


def calibration_prompts(lm: LoadedModel, settings: SearchSettings) -> list[list[int]]:
    """The first ``settings.prompts`` prompts of the configured source as token ids (never evaluation prompts)."""
    if lm.tokenizer is None:
        raise ConfigError("searching the skipped layers needs the model's tokenizer to encode calibration prompts")
    texts = SOURCES[settings.source](None, settings.data_dir)[: settings.prompts]
    return [lm.tokenizer(text).input_ids for text in texts]


def search(drafter: DraftVerify, lm: LoadedModel, prompts: list[list[int]], settings: SearchSettings) -> dict:
    """Bayesian optimisation of greedy tokens/s over the 2L skip bits, within the iteration and time caps; the
    ``drafter`` is set up on ``lm`` with any set (each point puts its own in)."""
    assert drafter.skipper is not None  # bound by setup
    skipper, layers = drafter.skipper, drafter.skipper.num_layers
    decoder = Decoder(lm.model, drafter, lm.eos_ids, Sampling(), step_breakdown=False)
    history: list[dict] = []
    bar = tqdm(total=settings.iterations + 2, desc="layer-skip search", unit="point")

    def speed(bits: tuple[int, ...]) -> float:
        """Greedy tokens/s of self-speculative decoding over the calibration prompts with ``bits`` skipped."""
        skip = SkipSet.from_bits(list(bits), layers)
        skipper.use(skip)
        drafter.forget()  # every point starts at gamma_0
        start, emitted = time.perf_counter(), 0
        with torch.inference_mode():
            for prompt in prompts:
                emitted += len(decoder.generate(prompt, settings.max_new_tokens).output_ids)
        score = emitted / (time.perf_counter() - start)
        history.append({**skip.as_dict(), "tokens_per_s": round(score, 3)})
        bar.update()
        bar.set_postfix(best=f"{max(h['tokens_per_s'] for h in history):.1f} tok/s")
        return score

    deadline = time.monotonic() + 60 * settings.max_minutes if settings.max_minutes is not None else None
    started = time.monotonic()
    best = maximise(
        speed,
        BinarySearch(2 * layers, settings.seed),
        settings.iterations,
        keep_going=lambda: deadline is None or time.monotonic() < deadline,
        starts=starting_points(layers),
    )
    bar.close()
    return {
        "best": SkipSet.from_bits(list(best.bits), layers).as_dict(),
        "best_score": round(best.score, 3),
        "seconds": round(time.monotonic() - started, 1),
        "history": history,
    }


def with_empty_set(method_cfg: DictConfig) -> DictConfig:
    """The method node with an empty skipped set given, so that its drafter sets up without a searched one."""
    method = copy.deepcopy(method_cfg)
    with open_dict(method):
        method.drafter.layers = {"attention": [], "mlp": []}
    return method


def main(overrides: list[str]) -> Path | None:
    """Search and store the skipped set of the composed method on the composed model (None: the model config gives
    one, nothing to search); a set stored for the same key is kept."""
    cfg = compose_train("layer_skip", overrides)
    drafter = check_method(cfg.method)
    if not isinstance(drafter, DraftVerify):
        raise ConfigError(f"method {cfg.method.name} searches no skipped set (its drafter is {type(drafter).__name__})")
    if drafter.search_settings is None:
        print(f"[specbench] model {cfg.model.name} gives its skipped set (layer_skip): nothing to search")
        return None
    lm = load_target(cfg)
    path = drafter.searched_file(lm.model)
    if path.is_file():
        print(f"[specbench] already searched for these settings: {path}")
        return path
    searcher = check_method(with_empty_set(cfg.method))  # drafts with each point's set, put in by search()
    assert isinstance(searcher, DraftVerify)
    searcher.setup(lm.model, lm.tokenizer)
    prompts = calibration_prompts(lm, drafter.search_settings)
    record = {
        "key": drafter.search_key(lm.model),
        "prompts_digest": digest(prompts),
        **search(searcher, lm, prompts, drafter.search_settings),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    best = record["best"]
    print(
        f"[specbench] skipped attention {best['attention']}, MLP {best['mlp']}: {record['best_score']} tok/s over "
        f"{len(record['history'])} points in {record['seconds']} s; saved to {path}"
    )
    return path
