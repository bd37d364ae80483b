"""Draft&Verify: layer skipping, the adaptive threshold, the Bayesian search, greedy == AR, the searched set."""

import json

import pytest
import torch

from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.core.verify import new_cache, prefill
from specbench.drafters.draft_verify import DraftVerify, SearchSettings, skip_set_from
from specbench.engines import check_method
from specbench.errors import ConfigError, ModelUnavailable
from specbench.models.layer_skip import LayerSkip, SkipSet
from specbench.models.loading import load_model
from specbench.structures.bayes_opt import BinarySearch, maximise
from specbench.train import layer_skip
from tests.test_anpd_pld import decode, embedded_multi_token_steps, repetitive_prompt
from tests.test_loop import ar_greedy

GIVEN = {"attention": [1], "mlp": [0]}


def search_node(**changes) -> dict:
    """A complete ``method.drafter.search`` node (small) with ``changes``."""
    node = {
        "source": "mbpp_train",
        "prompts": 2,
        "max_new_tokens": 8,
        "iterations": 2,
        "max_minutes": None,
        "seed": 0,
        "data_dir": None,
    }
    return {**node, **changes}


# ----------------------------------------------------------------------------------- layer skipping


def hand_forward(model, ids: torch.Tensor, skip: SkipSet) -> torch.Tensor:
    """Last-row logits of ``model`` on ``ids`` [1, n] with the skipped sub-layers' residual updates left out."""
    inner = model.model
    hidden = inner.embed_tokens(ids)  # [1, n, hidden]
    positions = torch.arange(ids.shape[1])[None]
    rotary = inner.rotary_emb(hidden, positions)
    mask = torch.full((ids.shape[1], ids.shape[1]), float("-inf")).triu(1)[None, None]  # [1, 1, n, n] causal
    for i, layer in enumerate(inner.layers):
        if i not in skip.attention:
            update, _ = layer.self_attn(layer.input_layernorm(hidden), position_embeddings=rotary, attention_mask=mask)
            hidden = hidden + update
        if i not in skip.mlp:
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.lm_head(inner.norm(hidden))[0, -1]


@pytest.mark.parametrize("skip", [SkipSet((1,), (0,)), SkipSet((0,), ()), SkipSet((0, 1), (0, 1)), SkipSet()])
def test_the_skipped_forward_equals_the_forward_written_out_by_hand(tiny, skip):
    ids = torch.tensor([repetitive_prompt(0)])
    skipper = LayerSkip(tiny, skip)
    with torch.inference_mode():
        with skipper.drafting():
            logits = tiny(input_ids=ids).logits[0, -1]
        expected = hand_forward(tiny, ids, skip)
        full = tiny(input_ids=ids).logits[0, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert skip == SkipSet() or not torch.allclose(logits, full)  # the originals are back after the block
    assert type(tiny.model.layers[0].self_attn).__name__ == "LlamaAttention"


def test_a_skipped_attention_keeps_every_cache_layer_the_same_length(tiny):
    prompt = repetitive_prompt(1)
    cache = new_cache(tiny, 64)
    with torch.inference_mode():
        prefill(tiny, cache, torch.tensor(prompt))
        with LayerSkip(tiny, SkipSet((0,), (1,))).drafting():
            tiny(input_ids=torch.tensor([[3, 4]]), past_key_values=cache, use_cache=True)
    assert [layer.keys.shape[-2] for layer in cache.layers] == [len(prompt) + 2] * 2
    assert not cache.layers[0].keys[..., len(prompt) :, :].any()  # the skipped layer wrote zero rows


def test_skip_sets_are_checked_against_the_model(tiny):
    with pytest.raises(ConfigError, match=r"layer_skip.attention .*\[0, 1\].*got \[2\]"):
        LayerSkip(tiny, SkipSet((2,), ()))
    with pytest.raises(ConfigError, match="layer_skip.mlp"):
        LayerSkip(tiny, SkipSet((), (1, 1)))
    with pytest.raises(ConfigError, match="exactly the keys attention and mlp"):
        skip_set_from({"attention": [1]})
    with pytest.raises(ConfigError, match="list of layer indices"):
        skip_set_from({"attention": ["1"], "mlp": []})
    assert skip_set_from({"attention": [3, 1], "mlp": None}) == SkipSet((1, 3), ())
    assert SkipSet.from_bits(SkipSet((1,), (0, 2)).bits(3), 3) == SkipSet((1,), (0, 2))


# ----------------------------------------------------------------------------------- the drafter


def test_greedy_equals_ar_on_tiny_and_the_draft_rows_are_cropped(tiny):
    for seed in range(3):
        prompt = repetitive_prompt(seed)
        drafter = DraftVerify(layers=GIVEN)
        drafter.setup(tiny, None)
        gen = decode(tiny, drafter, prompt, 40)  # the loop refuses a step that leaves draft rows behind
        assert gen.output_ids == ar_greedy(tiny, prompt, 40).output_ids
        stats = drafter.stats()
        assert stats["drafted"] > 0 and stats["draft_forwards"] == stats["drafted"]
        assert stats["skipped_attention"] == [1] and stats["skipped_fraction"] == 0.5


def test_nothing_skipped_drafts_the_target_itself_and_every_draft_is_accepted(tiny):
    drafter = DraftVerify(layers={"attention": [], "mlp": []}, threshold=0.0, adaptive_threshold=False, max_draft=4)
    drafter.setup(tiny, None)
    gen = decode(tiny, drafter, repetitive_prompt(0), 21)
    assert gen.accept_lengths == [5] * 4  # K drafts + 1 per step: the draft is the target
    assert drafter.stats()["draft_hit_ratio"] == 1.0


def test_sampled_drafts_carry_the_law_they_were_drawn_from(tiny):
    drafter = DraftVerify(layers=GIVEN)
    drafter.setup(tiny, None)
    trees = []
    propose = drafter.propose
    drafter.propose = lambda ctx: trees.append(propose(ctx)) or trees[-1]  # type: ignore[method-assign]
    gen = decode(tiny, drafter, repetitive_prompt(2), 30, sampling=Sampling(0.7, 0.9), generator=torch.Generator())
    assert len(gen.output_ids) == 30  # the chi-square check of the output law is the conformance suite's
    drafted = [tree for tree in trees if tree.num_drafted]
    assert drafted
    for tree in drafted:
        assert tree.draft_probs is not None and tree.draft_probs.shape == (len(tree), 97)
        for node in range(1, len(tree)):  # each drafted token was drawn from its parent's row
            assert tree.draft_probs[node - 1, tree.tokens[node]] > 0
        torch.testing.assert_close(tree.draft_probs[:-1].sum(-1), torch.ones(tree.num_drafted))


def test_the_threshold_follows_the_papers_update():
    drafter = DraftVerify(layers=GIVEN)
    drafter.adapt_threshold(0.5, full=False)  # smoothed rate 0.25 < alpha: gamma~ = gamma + eps
    assert drafter.smoothed_acceptance == pytest.approx(0.25)
    assert drafter.threshold == pytest.approx(0.9 * 0.6 + 0.1 * 0.61)
    drafter.smoothed_acceptance = 0.95
    before = drafter.threshold
    drafter.adapt_threshold(1.0, full=True)  # rate above alpha but the chain reached K: gamma~ = gamma
    assert drafter.threshold == pytest.approx(before)
    drafter.adapt_threshold(1.0, full=False)  # rate above alpha: gamma~ = gamma - eps
    assert drafter.threshold == pytest.approx(before - 0.1 * 0.01)


def test_gamma_carries_across_generations_and_the_rate_restarts(tiny):
    drafter = DraftVerify(layers=GIVEN)
    drafter.setup(tiny, None)
    decode(tiny, drafter, repetitive_prompt(0), 30)
    moved = drafter.threshold
    assert moved != 0.6
    drafter.start(repetitive_prompt(1))
    assert drafter.threshold == moved and drafter.smoothed_acceptance == 0.0


def test_bad_knobs_name_the_key():
    for kwargs, key in [
        ({"max_draft": 0}, "max_draft"),
        ({"threshold": 1.5}, "threshold"),
        ({"adaptive_threshold": "yes"}, "adaptive_threshold"),
        ({"target_acceptance": -1}, "target_acceptance"),
    ]:
        with pytest.raises(ConfigError, match=key):
            DraftVerify(layers=GIVEN, **kwargs)
    with pytest.raises(ConfigError, match="search must have the keys"):
        DraftVerify(layers=None, search={"prompts": 8})
    with pytest.raises(ConfigError, match="search.prompts"):
        DraftVerify(layers=None, search=search_node(prompts=0))
    assert SearchSettings.from_node(search_node()).identity()["iterations"] == 2


def test_greedy_equals_ar_on_the_embedded_model(embedded):
    layers = embedded.model.config.num_hidden_layers
    upper = list(range(layers // 2, layers - 1))
    drafter = DraftVerify(layers={"attention": upper[::2], "mlp": upper[::2]})
    assert embedded_multi_token_steps(embedded, drafter, 32) > 0


# ----------------------------------------------------------------------------------- the search


def test_the_bayesian_search_finds_the_best_point_of_a_smooth_score():
    target = (1, 0, 1, 1, 0, 0, 1, 0)

    def score(bits):
        return -sum(b != t for b, t in zip(bits, target)) + 0.01 * sum(bits)

    search = BinarySearch(len(target), seed=3)
    best = maximise(score, search, iterations=40, starts=[(0,) * 8])
    assert best.bits == target
    assert len(search.observations) <= 41 and len({s.bits for s in search.observations}) == len(search.observations)


def test_the_search_stops_when_told_and_needs_one_point():
    search = BinarySearch(4)
    best = maximise(lambda bits: 1.0, search, iterations=10, keep_going=iter([True, True, False]).__next__)
    assert len(search.observations) == 2 and best.score == 1.0
    with pytest.raises(ValueError, match="no point"):
        maximise(lambda bits: 1.0, BinarySearch(4), iterations=0)


SEARCH_OVERRIDES = [
    "method.drafter.search.prompts=2",
    "method.drafter.search.max_new_tokens=4",
    "method.drafter.search.iterations=1",
    "method.drafter.search.max_minutes=null",
]


def test_the_layer_skip_trainer_searches_once_and_runs_read_its_set(training_cache, shared_data, monkeypatch):
    """Without a given set a run refuses, naming the trainer; the trainer searches (two starting points and one
    proposal) and stores the set where a run of the same method settings finds it; a second search keeps it; other
    drafting knobs are another setting, not searched yet."""
    overrides = ["model=smollm2_135m", f"data_dir={shared_data}", "device=cpu", "dtype=float32", *SEARCH_OVERRIDES]
    run = compose_config(*overrides, "method=draft_verify")
    run_method = run.method
    embedded = load_model(run.model, torch.device("cpu"), torch.float32)  # as a run loads it (the key names it)
    with pytest.raises(ModelUnavailable, match="python -m specbench.train layer_skip model=smollm2_135m"):
        check_method(run_method).setup(embedded.model, embedded.tokenizer)
    path = layer_skip.main([*overrides, "progress=false"])
    assert path is not None
    record = json.loads(path.read_text())
    assert len(record["history"]) == 3  # two starting points, one proposal
    assert record["best_score"] == max(point["tokens_per_s"] for point in record["history"])
    drafter = check_method(run_method)
    drafter.setup(embedded.model, embedded.tokenizer)
    assert drafter.skipper is not None and drafter.skipper.skip.as_dict() == record["best"]
    assert drafter.stats()["layer_search"]["points"] == 3 and drafter.artefacts()[0].startswith("layer_skip:")
    written = path.stat().st_mtime_ns
    monkeypatch.setattr(layer_skip, "search", lambda *args: pytest.fail("searched again"))
    assert layer_skip.main([*overrides, "progress=false"]) == path and path.stat().st_mtime_ns == written
    other = check_method(compose_config(*overrides, "method=draft_verify", "method.drafter.max_draft=4").method)
    with pytest.raises(ModelUnavailable, match="No searched Draft&Verify skipped set"):
        other.setup(embedded.model, embedded.tokenizer)


def test_the_layer_skip_trainer_refuses_a_method_without_a_search():
    with pytest.raises(ConfigError, match="searches no skipped set"):
        layer_skip.main(["method=pld"])


def early_exit_argmax(model, tokens: list[int], exit_layer: int) -> int:
    """The next token of ``model`` run through its first ``exit_layer`` layers only, as transformers' early exit runs
    its draft (``num_hidden_layers`` lowered for the forward)."""
    base = model.get_decoder()
    layers = base.config.num_hidden_layers
    base.config.num_hidden_layers = exit_layer
    try:
        with torch.no_grad():
            return int(model(torch.tensor([tokens])).logits[0, -1].argmax())
    finally:
        base.config.num_hidden_layers = layers


def test_layerskip_drafts_what_transformers_early_exit_drafts_and_stays_lossless(tiny):
    """method=layerskip's drafter (exit_layer E) skips every sub-layer from E on: its first draft of a step is the
    early exit's argmax, its output AR's, and transformers' own generate(assistant_early_exit=E) gives the same."""
    from specbench.engines import HFGenerate

    drafter = DraftVerify(exit_layer=1, max_draft=4, threshold=0.0, adaptive_threshold=False)
    drafter.setup(tiny, None)
    assert drafter.skipper is not None and drafter.skipper.skip == SkipSet((1,), (1,))  # the tiny model has 2 layers
    trees, propose = [], drafter.propose
    drafter.propose = lambda ctx: trees.append((list(ctx.tokens), propose(ctx))) or trees[-1][1]  # type: ignore
    prompt = repetitive_prompt(1)
    gen = decode(tiny, drafter, prompt, 24)
    assert gen.output_ids == ar_greedy(tiny, prompt, 24).output_ids
    for context, tree in trees:
        if tree.num_drafted:
            assert tree.tokens[1] == early_exit_argmax(tiny, context, 1)
    settings = {"assistant_early_exit": 1, "num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant"}
    reference = HFGenerate(tiny, frozenset(), Sampling(), {**settings, "assistant_confidence_threshold": 0.0})
    assert reference.generate(prompt, 24).output_ids == gen.output_ids
    with pytest.raises(ConfigError, match="set one"):
        DraftVerify(exit_layer=1, layers=GIVEN)
    with pytest.raises(ConfigError, match="must be below the target's 2 layers"):
        DraftVerify(exit_layer=2).setup(tiny, None)
