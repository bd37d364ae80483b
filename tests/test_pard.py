"""PARD: the draft's one-forward chain, losslessness on tiny models, the parallel-draft training layout against its
definition, and a tiny end-to-end adaptation that the method then loads."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.core.rules import acceptance_rule
from specbench.drafters.draft_model import DraftLM
from specbench.drafters.pard import Pard
from specbench.engines import build_engine
from specbench.errors import ConfigError
from specbench.models.loading import load_model
from specbench.train import pard as pard_train
from tests.test_loop import ar_greedy

SELF = {"source": "target"}


def test_one_forward_reads_the_masks_and_leaves_only_committed_rows(tiny):
    """The logits after the root and after each mask equal a plain forward over the same tokens; the cache then
    holds the committed tokens only, and the next sync feeds just the new ones."""
    lm = DraftLM(tiny, 97)
    tokens, masks = [5, 9, 2, 7], [96, 96, 96]
    rows = lm.sync_with_tail(tokens, masks)
    with torch.no_grad():
        plain = tiny(torch.tensor([tokens + masks])).logits[0, -4:].float()
    torch.testing.assert_close(rows, plain, rtol=1e-4, atol=1e-4)
    assert lm.tokens == tokens and lm.cache_length == len(tokens)
    assert lm.forwards == 1 and lm.fed == 7
    lm.sync_with_tail([*tokens, 3], masks[:1])
    assert lm.fed == 7 + 2 and lm.cache_length == 5  # the new token and one mask; the mask's row left again


def pard(**knobs) -> Pard:
    """PARD with the target as its own (unadapted) draft and the last id as its mask token."""
    return Pard(draft=OmegaConf.create(SELF), mask_token=96, **knobs)


@pytest.mark.parametrize("draft_tokens", [1, 3, 8])
def test_greedy_pard_equals_ar(tiny, draft_tokens):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    drafter = pard(num_draft_tokens=draft_tokens)
    drafter.setup(tiny, None)
    with torch.inference_mode():
        gen = Decoder(tiny, drafter, frozenset(), Sampling()).generate(prompt, 30)
    assert gen.output_ids == ar_greedy(tiny, prompt, 30).output_ids
    assert max(gen.draft_tokens) <= draft_tokens and drafter.lm is not None
    assert drafter.lm.forwards == sum(1 for n in gen.draft_tokens if n)  # one draft forward per drafting step, any K


def test_sampled_drafts_record_each_row_they_were_drawn_from(tiny):
    drafter = pard(num_draft_tokens=4)
    drafter.setup(tiny, None)
    trees = []
    propose = drafter.propose
    drafter.propose = lambda ctx: trees.append(propose(ctx)) or trees[-1]  # type: ignore[method-assign]
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        Decoder(tiny, drafter, frozenset(), Sampling(0.7), acceptance_rule("speculative")).generate(
            [2, 7, 1, 8], 20, generator
        )
    drafted = [tree for tree in trees if tree.num_drafted]
    assert drafted and all(tree.draft_probs is not None for tree in drafted)
    for tree in drafted:
        assert tree.draft_probs is not None
        for node in range(1, len(tree)):
            assert tree.draft_probs[node - 1, tree.tokens[node]] > 0


def test_a_draft_without_a_mask_token_is_refused_with_the_way_out(tiny):
    drafter = Pard(draft=OmegaConf.create(SELF), target_name="tiny")
    with pytest.raises(ConfigError, match="python -m specbench.train pard model=tiny"):
        drafter.setup(tiny, None)
    with pytest.raises(ConfigError, match="outside the draft"):
        Pard(draft=OmegaConf.create(SELF), mask_token=500).setup(tiny, None)


def allowed_by_definition(copy: list[int], position: list[int], i: int, j: int) -> bool:
    """The authors' visibility, from its definition: a row of copy a at position t sees the real tokens at positions
    up to t - a and the rows (a - d, t - d) for d = 0 .. a - 1 (itself included)."""
    a, t, b, s = copy[i], position[i], copy[j], position[j]
    if b == 0:
        return s <= t - a
    return 1 <= b <= a and a - b == t - s


@pytest.mark.parametrize("seed", [None, 0, 1])
def test_the_training_layout_is_the_parallel_draft_visibility(seed):
    """Every pair of kept rows sees each other exactly as the definition says, and a kept mask row's whole diagonal
    (its parents in the earlier copies) is kept too (COD drops a row only with its descendants)."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    layout = pard_train.Layout.of(12, 4, [1.0, 0.7, 0.49, 0.343], generator)
    copy, position = layout.copy.tolist(), layout.position.tolist()
    for i in range(len(copy)):
        for j in range(len(copy)):
            assert bool(layout.allowed[i, j]) == allowed_by_definition(copy, position, i, j), (i, j)
    kept = set(zip(copy, position))
    assert all((a - 1, t - 1) in kept for a, t in kept if a >= 1)
    if seed is None:
        assert len(kept) == 12 + 11 + 10 + 9
    else:
        assert len([a for a in copy if a == 1]) == int(12 * 0.7)


def test_adapting_a_tiny_draft_end_to_end_and_running_it(training_cache, shared_data):
    """`python -m specbench.train pard` on the tiny model (its random draft, a new mask token appended): a saved
    draft with config.pard_token and held-out tokens per step; method=pard then loads it (source: trained) and stays
    lossless."""
    overrides = [
        "model=tiny_llama",
        f"data_dir={shared_data}",
        "device=cpu",
        "dtype=float32",
        "progress=false",
        "prompts.sources=[mbpp_train]",
        "prompts.max_prompts=10",
        "prompts.max_new_tokens=12",
        "pard.copies=3",
        "train.steps=3",
        "train.eval_sequences=2",
        "train.batch_size=2",
    ]
    folder = pard_train.main(overrides)
    record = json.loads((folder / "training.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    cfg = compose_config(
        "model=tiny_llama", "method=pard", "model.pard.source=trained", "method.drafter.num_draft_tokens=3"
    )
    lm = load_model(cfg.model, torch.device("cpu"), torch.float32)
    vocab = lm.model.get_input_embeddings().weight.shape[0]
    assert config["pard_token"] == record["mask_token"] == vocab  # a new id after the target's
    assert record["training"]["steps_done"] == 3 and record["heldout"]["after_training"]["tokens_per_step"] >= 1
    engine = build_engine(cfg.method, lm, Sampling())
    prompt = [5, 6, 7, 8, 9]
    with torch.inference_mode():
        gen = engine.generate(prompt, 20)
    assert gen.output_ids == ar_greedy(lm.model, prompt, 20, lm.eos_ids).output_ids
    assert any(part.startswith("pard:") for part in engine.artefacts())


def test_pard_settings_are_checked_before_anything_loads():
    with pytest.raises(ConfigError, match="pard.copies must be >= 2"):
        pard_train.main(["model=tiny_llama", "pard.copies=1"])
