"""``python -m specbench.train sequoia``: measure Sequoia's positional acceptance vector for a target and its draft.

Sequoia (Chen et al., 2024) builds its static tree from p = (p_1 .. p_k), p_r = P(the target's greedy token is the
draft's rank-r token). It is measured teacher-forced over the first ``calibration.limit`` texts of
``calibration.dataset`` (C4's English validation split, as the paper, or MBPP's train split or Dolly's dev split,
never an evaluation prompt), each cut to ``calibration.max_length`` tokens: every position counts once. The result
(p, the rank hits, the positions, the texts' digest) is stored where the drafter looks for it
(``FixedTree.calibration_file``); an existing one is kept and reported.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch

from specbench.drafters.draft_model import DraftLM, DraftModelDrafter
from specbench.drafters.opt_tree import AcceptanceCalibration, FixedTree
from specbench.engines import check_method
from specbench.errors import ConfigError, DataUnavailable
from specbench.files import write_atomic
from specbench.manifest import digest
from specbench.structures.sequoia_tree import rank_hits
from specbench.train.common import compose_train, load_target
from specbench.train.sources import SOURCES

C4_FILE = "c4_validation.jsonl"
"""A local copy of C4 (``text`` per record, in the Hub's order) that ``calibration.dataset=c4`` reads from data_dir."""
C4_HUB = ("allenai/c4", "en", "validation")
"""C4 on the Hub (id, config, split): the English validation split, read as a stream up to ``limit`` documents."""


def calibration_texts(settings: AcceptanceCalibration) -> list[str]:
    """The first ``limit`` texts of the calibration source."""
    if settings.dataset == "c4":
        return c4_texts(settings.limit, settings.data_dir)
    return SOURCES[settings.dataset](None, settings.data_dir)[: settings.limit]


def c4_texts(limit: int, data_dir: str | None) -> list[str]:
    """The first ``limit`` documents of C4's English validation split: ``data_dir/c4_validation.jsonl`` when it is
    there, else a stream from the Hub (only those documents are read)."""
    from specbench.data.base import read_jsonl
    from specbench.hub import hub_reachable

    local = Path(data_dir).expanduser() / C4_FILE if data_dir else None
    if local is not None and local.is_file():
        return [record["text"] for record in read_jsonl(local, required=[["text"]])[:limit]]
    if not hub_reachable():
        raise DataUnavailable(
            f"method.drafter.calibration.dataset=c4 reads C4 from the Hugging Face Hub ({C4_HUB[0]}, {C4_HUB[1]}, "
            f"{C4_HUB[2]}) or from {C4_FILE} in data_dir, and neither is at hand; measure on an offline source "
            f"(method.drafter.calibration.dataset=mbpp_train|dolly_dev) or give method.drafter.acceptance_vector=[...]"
        )
    import datasets

    hub_id, config, split = C4_HUB
    stream = datasets.load_dataset(hub_id, config, split=split, streaming=True)
    return [record["text"] for record in itertools.islice(stream, limit)]


def calibration_token_ids(settings: AcceptanceCalibration, tokenizer) -> list[list[int]]:
    """The calibration texts as target token ids (special tokens as the tokenizer adds them), cut to ``max_length``;
    texts of fewer than two tokens are left out."""
    if tokenizer is None:
        raise ConfigError("measuring the acceptance vector needs the model's tokenizer")
    ids = [list(tokenizer(text).input_ids)[: settings.max_length] for text in calibration_texts(settings)]
    ids = [seq for seq in ids if len(seq) >= 2]
    if not ids:
        raise ConfigError(f"method.drafter.calibration.dataset={settings.dataset}: no calibration text to measure on")
    return ids


@torch.no_grad()
def measure_rank_hits(target, lm: DraftLM, token_lists: list[list[int]], top_k: int) -> tuple[list[int], int]:
    """Teacher-forced over each token list, greedy: at how many positions the target's next token is the draft's
    rank-r token (r < top_k), and the number of positions (every token of every list)."""
    hits = torch.zeros(top_k, dtype=torch.long)
    positions = 0
    for ids in token_lists:
        greedy = target(input_ids=torch.tensor([ids], device=target.device), use_cache=False).logits[0].argmax(-1)
        hits += rank_hits(greedy, lm.teacher_forced(ids), top_k)
        positions += len(ids)
    return hits.tolist(), positions


def measure(drafter: FixedTree, target, tokenizer) -> Path:
    """Load the drafter's draft as a run loads it, then measure and store the acceptance vector for this target, draft
    and calibration, unless one is stored already; the file."""
    assert drafter.calibration is not None  # a sequoia tree without a given vector
    DraftModelDrafter.setup(drafter, target, tokenizer)  # the draft alone: no tree without p
    path = drafter.calibration_file(target)
    if path.is_file():
        print(f"[specbench] already measured for these settings: {path}")
        return path
    assert drafter.lm is not None  # loaded above
    token_lists = calibration_token_ids(drafter.calibration, tokenizer)
    hits, positions = measure_rank_hits(target, drafter.lm, token_lists, drafter.calibration.top_k)
    vector = [h / positions for h in hits]
    record = {
        "key": drafter.calibration_key(target),
        "acceptance_vector": vector,
        "rank_hits": hits,
        "positions": positions,
        "texts": len(token_lists),
        "texts_digest": digest(token_lists),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    print(
        f"[specbench] p = {[round(p, 4) for p in vector]} over {positions} positions of "
        f"{len(token_lists)} texts; saved to {path}"
    )
    return path


def main(overrides: list[str]) -> Path | None:
    """Measure and store the acceptance vector of the composed sequoia_tree method's draft on the composed model
    (None: the method gives its vector, nothing to measure); a vector stored for the same key is kept."""
    cfg = compose_train("sequoia", overrides)
    drafter = check_method(cfg.method)
    if not isinstance(drafter, FixedTree) or drafter.shape_settings[0] != "sequoia":
        raise ConfigError(f"method {cfg.method.name} measures no Sequoia acceptance vector (its tree is not sequoia)")
    if drafter.calibration is None:
        print(f"[specbench] method {cfg.method.name} gives its acceptance vector: nothing to measure")
        return None
    lm = load_target(cfg)
    return measure(drafter, lm.model, lm.tokenizer)
