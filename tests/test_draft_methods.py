"""Draft-model methods (SpeDe, OPT-Tree, fixed trees, HF assisted): lossless, draft cache in sync, configs."""

import random

import pytest
import torch
from omegaconf import OmegaConf

from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.drafters.draft_model import DraftLM, common_prefix
from specbench.drafters.opt_tree import FixedTree, OptTree
from specbench.drafters.spede import SpeDe
from specbench.drafters.tree_fill import sample_without_replacement
from specbench.engines import HFGenerate, hf_assistant
from specbench.errors import ConfigError, ModelUnavailable
from specbench.models.draft import check_vocab, load_draft
from specbench.models.loading import LoadedModel
from tests.conftest import tiny_model
from tests.test_loop import ar_greedy

SELF = {"source": "target"}


def peaked(model: torch.nn.Module, scale: float = 6.0) -> torch.nn.Module:
    """Sharpen a random model's next-token distributions (so drafts agree often, like trained pairs)."""
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def pair():
    """A peaked tiny target and a peaked tiny draft of another seed (low agreement)."""
    return peaked(tiny_model(seed=0)), peaked(tiny_model(seed=7))


def drafters(draft):
    """One instance of every draft-model drafter, all reading ``draft`` as their draft node."""
    cfg = OmegaConf.create(draft)
    return {
        "spede": SpeDe(num_assistant_tokens=4, draft=cfg),
        "spede_constant": SpeDe(num_assistant_tokens=3, schedule="constant", draft=cfg),
        "opt_tree": OptTree(nodes=12, threshold=0.2, max_depth=6, draft=cfg),
        "static_tree": FixedTree(shape="static", rank_hits=[0.5, 0.2, 0.1, 0.05], draft=cfg),
        "binary_tree": FixedTree(shape="binary", nodes=14, draft=cfg),
    }


def decode(target, drafter, prompt, max_new_tokens, eos_ids=frozenset(), tokenizer=None):
    """Greedy generation with ``drafter`` set up on ``target``."""
    drafter.setup(target, tokenizer)
    with torch.inference_mode():
        return Decoder(target, drafter, eos_ids, Sampling()).generate(prompt, max_new_tokens)


def prompts(vocab: int, count: int = 2, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(3, 20))] for _ in range(count)]


@pytest.mark.parametrize("name", ["spede", "spede_constant", "opt_tree", "static_tree", "binary_tree"])
def test_greedy_equals_ar_with_good_and_bad_drafts(pair, name):
    target, other = pair
    for prompt in prompts(97):
        truth = ar_greedy(target, prompt, 40).output_ids
        good = decode(target, drafters(SELF)[name], prompt, 40)
        bad_drafter = drafters(SELF)[name]
        bad_drafter.setup(other, None)  # "target" source: the other model drafts for itself ...
        with torch.inference_mode():  # ... and we verify its drafts with the real target
            bad = Decoder(target, bad_drafter, frozenset(), Sampling()).generate(prompt, 40)
        assert good.output_ids == truth and bad.output_ids == truth
        assert good.target_forwards < bad.target_forwards
        assert bad_drafter.stats()["draft_hit_ratio"] < 0.5


def test_same_model_draft_is_fully_accepted(pair):
    target, _ = pair
    drafter = drafters(SELF)["spede_constant"]
    gen = decode(target, drafter, [3, 1, 4, 1, 5], 40)
    stats = drafter.stats()
    assert stats["draft_hit_ratio"] == 1.0
    assert gen.accept_lengths[:-1] == [4] * (len(gen.accept_lengths) - 1)


@pytest.mark.parametrize("name", ["spede", "opt_tree", "static_tree"])
def test_eos_inside_a_draft_and_budget_cut(pair, name):
    target, _ = pair
    prompt = [5, 6, 7]
    truth = ar_greedy(target, prompt, 30).output_ids
    eos = truth[12]
    gen = decode(target, drafters(SELF)[name], prompt, 30, frozenset({eos}))
    assert gen.output_ids == truth[: truth.index(eos) + 1] and gen.stop_reason == "eos"
    short = decode(target, drafters(SELF)[name], prompt, 7)
    assert short.output_ids == truth[:7] and short.stop_reason == "max_new_tokens"


class CacheChecked:
    """Wraps a drafter: after every observe, the draft cache must hold a prefix of the committed tokens
    (without the new root) whose KV gives the same next-token logits as a fresh forward."""

    def __init__(self, drafter):
        self.inner = drafter
        self.exact_rollbacks = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def observe(self, ctx, tree, verified, accepted):
        self.inner.observe(ctx, tree, verified, accepted)
        lm = self.inner.lm
        committed = ctx.tokens + accepted.emitted(tree)
        assert lm.cache_length == len(lm.tokens) <= len(committed) - 1
        assert lm.tokens == committed[: len(lm.tokens)]
        self.exact_rollbacks += len(lm.tokens) == len(committed) - 1
        fresh = lm.model(torch.tensor([committed])).logits[0, -1]
        torch.testing.assert_close(lm.sync(committed), fresh, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["spede", "opt_tree", "binary_tree"])
def test_draft_cache_rolls_back_to_the_committed_prefix(pair, name):
    target, other = pair
    drafter = drafters(SELF)[name]
    drafter.setup(other, None)
    checked = CacheChecked(drafter)
    truth = ar_greedy(target, [9, 8, 7, 6], 30).output_ids
    with torch.inference_mode():
        gen = Decoder(target, checked, frozenset(), Sampling()).generate([9, 8, 7, 6], 30)
    assert gen.output_ids == truth
    assert checked.exact_rollbacks > 0  # a rejected draft leaves exactly committed - 1 rows


def test_smaller_draft_vocabulary_is_padded(pair):
    """A draft that knows only the first 90 ids (CodeLlama's 32016 vs Llama-68M's 32000) stays lossless."""
    target, _ = pair
    small = peaked(tiny_model(vocab_size=90, seed=0))
    lm = DraftLM(small, target_vocab=97, oov_id=0)
    logits = lm.sync([1, 2, 95, 96])  # ids >= 90 are fed as the draft's unknown token
    assert logits.shape == (97,) and torch.isinf(logits[90:]).all()
    drafter = SpeDe(num_assistant_tokens=3, draft=OmegaConf.create(SELF))
    drafter.setup(target, None)
    drafter.lm = DraftLM(small, target_vocab=97)
    truth = ar_greedy(target, [95, 3, 96], 20).output_ids
    with torch.inference_mode():
        assert Decoder(target, drafter, frozenset(), Sampling()).generate([95, 3, 96], 20).output_ids == truth


def test_heuristic_schedule_follows_hf():
    drafter = SpeDe(num_assistant_tokens=5)
    assert drafter.gamma == 5
    for all_accepted, expected in [(True, 7), (False, 6), (False, 5), (True, 7)]:
        drafter.gamma = drafter.gamma + 2 if all_accepted else max(1, drafter.gamma - 1)
        assert drafter.gamma == expected
    with pytest.raises(ConfigError, match="num_assistant_tokens"):
        SpeDe(num_assistant_tokens=0)
    with pytest.raises(ConfigError, match="schedule"):
        SpeDe(schedule="fast")


def test_schedules_across_generations(pair):
    target, _ = pair
    persistent = decode(target, SpeDe(num_assistant_tokens=2, draft=OmegaConf.create(SELF)), [1, 2], 30)
    assert persistent.output_ids == ar_greedy(target, [1, 2], 30).output_ids
    heuristic = SpeDe(num_assistant_tokens=2, draft=OmegaConf.create(SELF))
    transient = SpeDe(num_assistant_tokens=2, schedule="heuristic_transient", draft=OmegaConf.create(SELF))
    for drafter in (heuristic, transient):
        decode(target, drafter, [1, 2], 30)
        drafter.reset([1, 2])
    assert heuristic.gamma > 2 and transient.gamma == 2  # HF "heuristic" keeps gamma for the next request


def test_common_prefix_and_sampling_helpers():
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [1, 5, 3]) == 1
    assert common_prefix([], [1]) == 0 and common_prefix([7] * 50 + [1], [7] * 50 + [2]) == 50
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    draws = sample_without_replacement(probs, 3, torch.Generator().manual_seed(0))
    assert sorted(draws) == [0, 1, 2]


def test_second_draw_without_replacement_has_the_right_law():
    """Draw 2 given draw 1 = probs without draw 1, renormalised (the speculative rule relies on it)."""
    probs = torch.tensor([0.6, 0.3, 0.1])
    generator = torch.Generator().manual_seed(3)
    trials = 6000
    counts = {}
    for _ in range(trials):
        pair_ = tuple(sample_without_replacement(probs, 2, generator))
        counts[pair_] = counts.get(pair_, 0) + 1
    for (a, b), count in counts.items():
        expected = float(probs[a] * probs[b] / (1 - probs[a]))
        assert abs(count / trials - expected) < 4 * (expected * (1 - expected) / trials) ** 0.5 + 1e-3


def test_draft_loading_errors(tmp_path, monkeypatch, pair):
    target, _ = pair
    with pytest.raises(ConfigError, match="model.draft.path"):
        load_draft(OmegaConf.create({"source": "hub", "path": None}), "hub", target, None)
    with pytest.raises(ConfigError, match="model.draft.path"):
        load_draft(None, "hub", target, None)
    with pytest.raises(ConfigError, match="source"):
        load_draft(OmegaConf.create({"source": "magic"}), "x", target, None)
    pytest.importorskip("specbench.train.draft")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(ModelUnavailable, match="python -m specbench.train draft model=smollm2_135m"):
        load_draft(OmegaConf.create({"source": "distilled", "path": None}), "smollm2_135m", target, None)


class FakeTokenizer:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_tokenizer_compatibility_check(pair):
    target, _ = pair
    target_tok = FakeTokenizer({f"t{i}": i for i in range(97)})
    check_vocab(tiny_model(vocab_size=90), FakeTokenizer({f"t{i}": i for i in range(90)}), target, target_tok, "ok")
    swapped = FakeTokenizer({**{f"t{i}": i for i in range(97)}, "t1": 2, "t2": 1})
    with pytest.raises(ConfigError, match="does not share the target's tokenizer"):
        check_vocab(tiny_model(), swapped, target, target_tok, "swapped")
    with pytest.raises(ConfigError, match="token ids"):
        check_vocab(tiny_model(vocab_size=50), None, target, None, "no tokenizer")


def test_tiny_draft_node_and_hf_assisted_equal_ar(pair):
    """conf/model/tiny_llama.yaml's draft node builds; HF assisted generation with it equals AR."""
    from specbench.config import compose_config

    target, _ = pair
    cfg = compose_config("model=tiny_llama", "method=hf_assisted")
    lm = LoadedModel(target, None, "tiny", "tiny", frozenset(), 512)
    kwargs, _ = hf_assistant(cfg.method.assistant, lm)
    assistant = kwargs["assistant_model"]
    assert assistant is not target and assistant.config.hidden_size == 32
    engine = HFGenerate(target, frozenset(), Sampling(), {}, kwargs)
    for prompt in prompts(97, count=2, seed=4):
        with torch.inference_mode():
            gen = engine.generate(prompt, 24)
        assert gen.output_ids == ar_greedy(target, prompt, 24).output_ids
    assert assistant.generation_config.num_assistant_tokens_schedule == "heuristic"
    assert assistant.generation_config.assistant_confidence_threshold == 0.0


def test_hf_assisted_with_the_target_as_its_own_assistant(pair):
    target, _ = pair
    lm = LoadedModel(target, None, "tiny", "tiny", frozenset(), 512)
    kwargs, _ = hf_assistant(
        OmegaConf.create(
            {
                "draft": SELF,
                "num_assistant_tokens": 4,
                "assistant_confidence_threshold": 0,
                "num_assistant_tokens_schedule": "constant",
            }
        ),
        lm,
    )
    engine = HFGenerate(target, frozenset(), Sampling(), {}, kwargs)
    with torch.inference_mode():
        gen = engine.generate([3, 1, 4], 25)
    assert gen.output_ids == ar_greedy(target, [3, 1, 4], 25).output_ids
    assert gen.target_forwards <= 7  # 4 drafted + 1 per forward, all accepted
    with pytest.raises(ConfigError, match="generation-config"):
        hf_assistant(OmegaConf.create({"draft": SELF, "no_such_key": 1}), lm)


@pytest.fixture(scope="module")
def embedded_case(embedded):
    """A chat prompt for the embedded model and its 24-token greedy AR continuation."""
    prompt = embedded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that adds two numbers."}],
        add_generation_prompt=True,
        tokenize=True,
    )["input_ids"]
    return prompt, ar_greedy(embedded.model, prompt, 24, embedded.eos_ids).output_ids


TINY_DRAFT = {
    "source": "tiny",
    "tiny": {
        "seed": 1,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 64,
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["spede", "opt_tree"])
@pytest.mark.parametrize("draft", ["tiny", "self"])
def test_embedded_greedy_equals_ar(embedded, embedded_case, name, draft):
    """The embedded model with a tiny random draft (never agrees) and with itself (always agrees)."""
    prompt, truth = embedded_case
    cfg = OmegaConf.create(TINY_DRAFT if draft == "tiny" else SELF)
    drafter = SpeDe(draft=cfg) if name == "spede" else OptTree(nodes=6, threshold=0.2, max_depth=5, draft=cfg)
    drafter.setup(embedded.model, embedded.tokenizer)
    with torch.inference_mode():
        gen = Decoder(embedded.model, drafter, embedded.eos_ids, Sampling()).generate(prompt, 24)
    assert gen.output_ids == truth
    if draft == "self":
        assert gen.target_forwards < len(truth) / 2


@pytest.mark.slow
def test_distilled_draft_loads_from_the_cache(embedded, tmp_path, monkeypatch):
    """The embedded model's default draft node (source: distilled) loads what `specbench.train draft` leaves in
    the cache and checks the tokenizer; a stand-in draft (tiny, the embedded vocabulary) takes the trained one's
    place."""
    from specbench.config import compose_config
    from specbench.manifest import write_manifest
    from specbench.models.loading import build_tiny_llama
    from specbench.models.parts import part_kind

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    folder = part_kind("draft").folder("smollm2_135m")
    vocab = embedded.model.get_output_embeddings().weight.shape[0]
    build_tiny_llama(
        vocab,
        seed=3,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    ).save_pretrained(folder)
    embedded.tokenizer.save_pretrained(folder)
    write_manifest(folder, "distilled draft", ["model.safetensors"], "settings", "data", 1, 1, "steps")
    cfg = compose_config("model=smollm2_135m", "method=spede")
    draft = load_draft(cfg.method.drafter.draft, cfg.method.drafter.target_name, embedded.model, embedded.tokenizer)
    assert draft.path == str(folder) and draft.tokenizer is not None and draft.part.startswith("draft:")
    assert draft.model.dtype == embedded.model.dtype and draft.model.config.hidden_size == 32
