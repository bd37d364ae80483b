"""LADE and Self-Draft: aux-row layouts as the papers draw them, and greedy output == AR token for token."""

import random

import pytest
import torch

from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.core.tree import DraftTree, flatten
from specbench.core.verify import cache_length, new_cache, prefill, prefill_with_tail
from specbench.drafters.jacobi import random_prompt_tokens
from specbench.drafters.lade import Lade, window_layout
from specbench.drafters.self_draft import SelfDraft, branch_layout, pad_predictions
from specbench.errors import ConfigError
from specbench.structures.corpus_cache import CorpusCache
from tests.test_loop import ar_greedy

VOCAB = 97


def repetitive_prompt(seed: int, period: int = 6, repeats: int = 4) -> list[int]:
    """A prompt that repeats one random phrase, so the tiny model's output tends to loop too."""
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(period)] * repeats


@pytest.fixture(scope="module")
def tiny_corpus():
    """A corpus cache over tiny-vocabulary token streams (no tokenizer, no files)."""
    rng = random.Random(5)
    streams = [[rng.randrange(VOCAB) for _ in range(5)] * 8 for _ in range(20)]
    return CorpusCache.build(streams, max_key_len=4, continuation_len=4, top_k=20, min_count=1)


def self_draft(corpus_cache, **kwargs) -> SelfDraft:
    """A Self-Draft drafter wired to an in-memory corpus cache."""
    drafter = SelfDraft(**kwargs)
    drafter.corpus_cache = corpus_cache if drafter.use_corpus else None
    return drafter


_TRUTH: dict[tuple[int, int], list[int]] = {}


def tiny_truth(tiny, seed: int, max_new_tokens: int) -> list[int]:
    """AR greedy output of the ``tiny`` model after ``repetitive_prompt(seed)`` (computed once per test run)."""
    key = (seed, max_new_tokens)
    if key not in _TRUTH:
        _TRUTH[key] = ar_greedy(tiny, repetitive_prompt(seed), max_new_tokens).output_ids
    return _TRUTH[key]


GREEDY = Sampling()


def run(model, drafter, prompt, max_new_tokens, eos_ids=frozenset(), sampling=GREEDY, seed=0):
    """One generation through the shared loop with a seeded RNG."""
    drafter.setup(model, None)
    with torch.inference_mode():
        return Decoder(model, drafter, eos_ids, sampling).generate(
            prompt, max_new_tokens, torch.Generator().manual_seed(seed)
        )


# -- aux-row layouts ------------------------------------------------------------------------------


def test_lade_window_mask_is_the_2d_lookahead_window():
    """3 columns x 3 levels: level 0 is a chain from x; level l column j sees level 0 up to j + its column."""
    offsets, mask = window_layout(3, 3)
    # rows: L0c1 L0c2 | L1c0 L1c1 L1c2 | L2c0 L2c1 L2c2   (L0c0 is the root x)
    assert offsets.tolist() == [1, 2, 1, 2, 3, 2, 3, 4]
    expected = [
        [1, 0, 0, 0, 0, 0, 0, 0],  # L0c1: x, itself
        [1, 1, 0, 0, 0, 0, 0, 0],  # L0c2: x, L0c1, itself
        [0, 0, 1, 0, 0, 0, 0, 0],  # L1c0: x, itself
        [1, 0, 0, 1, 0, 0, 0, 0],  # L1c1: L0c1, itself
        [1, 1, 0, 0, 1, 0, 0, 0],  # L1c2: L0c1, L0c2, itself
        [0, 0, 1, 0, 0, 1, 0, 0],  # L2c0: L1c0, itself
        [1, 0, 0, 1, 0, 0, 1, 0],  # L2c1: L0c1, L1c1, itself
        [1, 1, 0, 0, 1, 0, 0, 1],  # L2c2: L0c1, L0c2, L1c2, itself
    ]
    assert mask.int().tolist() == expected


def test_self_draft_mask_is_block_diagonal_causal():
    offsets, mask = branch_layout((2, 3, 1))
    assert offsets.tolist() == [1, 2, 1, 2, 3, 1]
    expected = torch.zeros(6, 6, dtype=torch.long)
    expected[0:2, 0:2] = torch.ones(2, 2).tril()
    expected[2:5, 2:5] = torch.ones(3, 3).tril()
    expected[5, 5] = 1
    assert torch.equal(mask.long(), expected)


def test_aux_rows_are_isolated_from_candidates_in_the_flat_pass():
    """Flattened: candidates never see aux rows, aux rows see the root and their own block only."""
    drafter = Lade(window_size=3, ngram_size=3, guess_set_size=2, official_step_cap=False)  # whole candidates
    drafter.reset([1, 2, 3])
    drafter.levels = [[4, 5], [6, 7, 8]]  # a steady-state window: 3 columns x 2 levels
    drafter.pool.insert(9, (10, 11))
    tree = drafter.propose(type("Ctx", (), {"root": 9, "tokens": [1, 2, 3, 9], "generator": None})())
    assert tree.tokens == [9, 10, 11] and len(tree.aux) == 5
    flat = flatten(tree, past_len=4, dtype=torch.float32, device=torch.device("cpu"))
    allowed = flat.attention_mask[0, 0, :, 4:] == 0  # [8, 8] over the new rows
    assert not allowed[:3, 3:].any()  # tree rows never see aux rows
    assert allowed[3:, 0].all() and not allowed[3:, 1:3].any()  # aux rows see x, not the candidates
    assert flat.position_ids[0].tolist() == [4, 5, 6, 5, 6, 5, 6, 7]


# -- greedy == AR on the tiny model ---------------------------------------------------------------

LADE_SETTINGS = [
    dict(window_size=15, ngram_size=5, guess_set_size=15),
    dict(window_size=4, ngram_size=3, guess_set_size=4),
    dict(window_size=1, ngram_size=2, guess_set_size=3, official_step_cap=False),
    dict(window_size=5, ngram_size=7, guess_set_size=7),
    dict(window_size=5, ngram_size=4, guess_set_size=5, pool_from_prompt=True),
    dict(
        window_size=5, ngram_size=5, guess_set_size=5, official_step_cap=False, prefill_window=False, window_eos="keep"
    ),
]


def lade_warmup_steps(settings: dict) -> int:
    """Drafting-only steps: N-3 with the window started in the prefill (N >= 3), else N-2."""
    n = settings["ngram_size"]
    return n - 3 if settings.get("prefill_window", True) and n >= 3 else n - 2


@pytest.mark.parametrize("settings", LADE_SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_lade_greedy_equals_ar_tiny(tiny, settings):
    drafter = Lade(**settings)
    multi = 0
    for seed in range(2):
        prompt = repetitive_prompt(seed)
        gen = run(tiny, drafter, prompt, 48, seed=seed)
        assert gen.output_ids == tiny_truth(tiny, seed, 48)
        capped = settings.get("official_step_cap", True)
        assert max(gen.accept_lengths) <= settings["ngram_size"] - capped
        multi += sum(n > 1 for n in gen.accept_lengths)
        stats = drafter.stats()
        assert stats["warmup_steps"] == min(lade_warmup_steps(settings), stats["steps"])
    assert multi > 0  # candidates were accepted


def test_lade_official_cap_limits_steps_to_n_minus_1(tiny):
    drafter = Lade(window_size=5, ngram_size=4, guess_set_size=5)  # the cap is the default (official loop)
    gen = run(tiny, drafter, repetitive_prompt(1), 48)
    assert gen.output_ids == tiny_truth(tiny, 1, 48)
    assert max(gen.accept_lengths) == 3
    # the lookahead window rides in every verify forward: at least one level of W = 5 aux rows per step
    assert min(rows - drafted - 1 for rows, drafted in zip(gen.verify_tokens, gen.draft_tokens, strict=True)) >= 5
    uncapped = run(
        tiny, Lade(window_size=5, ngram_size=4, guess_set_size=5, official_step_cap=False), repetitive_prompt(1), 48
    )
    assert uncapped.output_ids == gen.output_ids and max(uncapped.accept_lengths) == 4
    with pytest.raises(ConfigError, match="official_step_cap=false"):
        Lade(ngram_size=2)


class SpyLade(Lade):
    """Records the first decode step's window (level sizes and contents)."""

    def propose(self, ctx):
        tree = super().propose(ctx)
        if not hasattr(self, "first_levels"):
            self.first_levels = [list(level) for level in self.levels]
        return tree


def test_lade_window_starts_in_the_prefill_like_the_official_code(tiny):
    """Level 0 rides after the prompt in the prefill; its argmax there is level 1 at the first decode step."""
    prompt, w, n = repetitive_prompt(3), 4, 5
    drafter = SpyLade(window_size=w, ngram_size=n, guess_set_size=4)
    gen = run(tiny, drafter, prompt, 24, seed=7)
    assert gen.output_ids == tiny_truth(tiny, 3, 24)
    tail = random_prompt_tokens(prompt, w + n - 3, torch.Generator().manual_seed(7))  # the same draws
    with torch.inference_mode():
        logits = tiny(input_ids=torch.tensor([prompt + tail])).logits[0, -len(tail) :]
    assert drafter.first_levels == [tail[1:], logits.argmax(-1).tolist()]
    assert drafter.stats()["warmup_steps"] == n - 3
    late = SpyLade(window_size=w, ngram_size=n, guess_set_size=4, prefill_window=False)
    run(tiny, late, prompt, 24, seed=7)
    assert late.first_levels == [tail] and late.stats()["warmup_steps"] == n - 2


def test_prefill_tail_leaves_the_cache_and_first_token_as_a_plain_prefill(tiny):
    prompt = repetitive_prompt(2)
    plain, tailed = new_cache(tiny, 64), new_cache(tiny, 64)
    with torch.inference_mode():
        first = prefill(tiny, plain, torch.tensor(prompt))
        first_tailed, tail_logits = prefill_with_tail(tiny, tailed, torch.tensor(prompt), torch.tensor([5, 6, 7]))
        alone = tiny(input_ids=torch.tensor([prompt + [5, 6, 7]])).logits[0, -3:]
    assert cache_length(tailed) == cache_length(plain) == len(prompt)
    assert first_tailed.argmax() == first.argmax() and torch.allclose(first_tailed, first, atol=1e-5)
    assert torch.allclose(tail_logits, alone, atol=1e-4)
    for a, b in zip(plain.layers, tailed.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)


def test_lade_window_eos_replace_or_keep():
    drafter = Lade(window_size=3, ngram_size=3, guess_set_size=3)
    drafter.eos_ids = frozenset({0})
    drafter.reset([7, 8, 9])
    drafter.generator = torch.Generator().manual_seed(0)
    level = [0, 5, 0]
    drafter._replace_eos(level)
    assert 0 not in level and set(level) <= {5, 7, 8, 9}
    keep = Lade(window_size=3, ngram_size=3, guess_set_size=3, window_eos="keep")
    keep.eos_ids = frozenset({0})
    level = [0, 5, 0]
    keep._replace_eos(level)
    assert level == [0, 5, 0]
    with pytest.raises(ConfigError, match="window_eos"):
        Lade(window_eos="drop")


SELF_DRAFT_SETTINGS = [
    dict(),
    dict(branch_len=4, branch_num=3),
    dict(branch_len=2, branch_num=2),
    dict(branch_len=8, branch_num=3, use_corpus_cache=False),
    dict(use_context_cache=False),
]


@pytest.mark.parametrize("settings", SELF_DRAFT_SETTINGS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_self_draft_greedy_equals_ar_tiny(tiny, tiny_corpus, settings):
    drafter = self_draft(tiny_corpus, **settings)
    multi = 0
    for seed in range(2):
        prompt = repetitive_prompt(seed)
        gen = run(tiny, drafter, prompt, 48, seed=seed)
        assert gen.output_ids == tiny_truth(tiny, seed, 48)
        multi += sum(n > 1 for n in gen.accept_lengths)
    assert multi > 0
    stats = drafter.stats()
    assert stats["warmup_steps"] == drafter.branch_len - 2
    assert stats["conversations"] == 2
    if not drafter.use_context:
        assert stats["context_tuples"] == 0 and stats["accepted_from_context"] == 0


def test_self_draft_official_cap_limits_steps_to_g(tiny, tiny_corpus):
    drafter = self_draft(tiny_corpus, official_step_cap=True)
    gen = run(tiny, drafter, repetitive_prompt(0), 48)
    assert gen.output_ids == tiny_truth(tiny, 0, 48)
    assert max(gen.accept_lengths) == 4


def test_self_draft_context_cache_persists_and_flushes(tiny, tiny_corpus):
    drafter = self_draft(tiny_corpus, flush_interval=2, keep_num=1)
    first = repetitive_prompt(0)
    run(tiny, drafter, first, 24)
    tuples = drafter.stats()["context_tuples"]
    assert tuples > 0
    run(tiny, drafter, first + [3, 4, 5], 24)  # a later turn extends the prompt: same conversation
    assert drafter.stats()["conversations"] == 1 and drafter.stats()["context_tuples"] >= tuples
    run(tiny, drafter, repetitive_prompt(1), 24)  # conversation 2: no flush yet
    assert drafter.stats()["flushes"] == 0
    before = drafter.pool.num_tuples
    drafter.reset(repetitive_prompt(2))  # conversation 3 starts after 2 finished: keep 1 tuple per key
    assert drafter.stats()["flushes"] == 1
    assert drafter.pool.num_tuples == len(drafter.pool) < before


def test_self_draft_replayed_prompt_leaves_no_trace(tiny, tiny_corpus):
    """A warm-up generation repeated on the same prompt must not feed the timed one its own n-grams."""
    drafter = self_draft(tiny_corpus)
    run(tiny, drafter, repetitive_prompt(0), 24)
    first = run(tiny, drafter, repetitive_prompt(1), 32)
    tuples = drafter.stats()["context_tuples"]
    again = run(tiny, drafter, repetitive_prompt(1), 32)
    assert again.accept_lengths == first.accept_lengths
    assert drafter.stats()["context_tuples"] == tuples and drafter.stats()["conversations"] == 2


@pytest.mark.parametrize("make", ["lade", "self_draft"])
def test_eos_inside_a_step_and_budget_cuts(tiny, tiny_corpus, make):
    def drafter():
        return Lade(window_size=5, ngram_size=4, guess_set_size=5) if make == "lade" else self_draft(tiny_corpus)

    prompt = repetitive_prompt(4)
    truth = tiny_truth(tiny, 4, 40)
    eos_inside_step = 0
    for eos in [token for token in dict.fromkeys(truth[5:13]) if truth.index(token) >= 5]:  # after warm-up
        gen = run(tiny, drafter(), prompt, 40, eos_ids=frozenset({eos}))
        cut = truth.index(eos) + 1
        assert gen.output_ids == truth[:cut] and gen.stop_reason == "eos"
        eos_inside_step += gen.accept_lengths[-1] > 1
    assert eos_inside_step > 0  # some EOS was emitted as a non-first token of a multi-token step
    for budget in (3, 11):
        gen = run(tiny, drafter(), prompt, budget)
        assert gen.output_ids == truth[:budget] and gen.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("make", ["lade", "self_draft"])
def test_sampling_runs_through_the_loop_reproducibly(tiny, tiny_corpus, make):
    def sample(seed):
        drafter = Lade(window_size=5, ngram_size=4, guess_set_size=5) if make == "lade" else self_draft(tiny_corpus)
        return run(tiny, drafter, repetitive_prompt(3), 24, sampling=Sampling(temperature=0.7), seed=seed)

    gen = sample(1)
    assert len(gen.output_ids) == 24 and sum(gen.accept_lengths) == 23
    assert sample(1).output_ids == gen.output_ids
    assert sample(2).output_ids != gen.output_ids


def test_bad_settings_name_the_key():
    with pytest.raises(ConfigError, match="window_size"):
        Lade(window_size=0)
    with pytest.raises(ConfigError, match="ngram_size"):
        Lade(ngram_size=1)
    with pytest.raises(ConfigError, match="branch_len"):
        SelfDraft(branch_len=1, use_corpus_cache=False)
    with pytest.raises(ConfigError, match="both false"):
        SelfDraft(use_context_cache=False, use_corpus_cache=False)
    with pytest.raises(ConfigError, match="drafter.corpus"):
        SelfDraft().setup(None, None)


def test_root_only_tree_during_warm_up():
    drafter = Lade(window_size=4, ngram_size=5, guess_set_size=4)
    drafter.reset([1, 2, 3, 4])
    ctx = type("Ctx", (), {"root": 4, "tokens": [1, 2, 3, 4], "generator": torch.Generator().manual_seed(0)})()
    tree = drafter.propose(ctx)
    assert isinstance(tree, DraftTree) and tree.tokens == [4]
    assert len(tree.aux) == 4 + 5 - 3  # level 0 starts with W+N-3 random prompt tokens
    assert set(tree.aux.tokens.tolist()) <= {1, 2, 3, 4}


# -- Self-Draft's official rules (the options specbench.parity.self_draft switches on) --------------

OFFICIAL_RULES = dict(
    branch_filling="diagonal",
    official_context_update=True,
    official_step_cap=True,
    official_flush=True,
    official_corpus_lookup=True,
)


@pytest.mark.parametrize(
    "settings",
    [
        dict(branch_filling="diagonal"),
        dict(branch_filling="diagonal", branch_len=3, branch_num=2, use_corpus_cache=False),
        dict(official_context_update=True),
        dict(official_context_update=True, branch_len=4, branch_num=3, gram_len=2),
        dict(official_corpus_lookup=True),
        dict(official_flush=True, flush_interval=1, keep_num=1),
        OFFICIAL_RULES,
    ],
    ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()),
)
def test_self_draft_official_rules_greedy_equals_ar_tiny(tiny, tiny_corpus, settings):
    drafter = self_draft(tiny_corpus, **settings)
    multi = 0
    for seed in range(2):
        gen = run(tiny, drafter, repetitive_prompt(seed), 48, seed=seed)
        assert gen.output_ids == tiny_truth(tiny, seed, 48)
        multi += sum(n > 1 for n in gen.accept_lengths)
    assert multi > 0
    diagonal = drafter.branch_filling == "diagonal"
    stats = drafter.stats()
    assert stats["warmup_steps"] == drafter.branch_len - 2 - diagonal and stats["pad_forwards"] == diagonal


class SpySelfDraft(SelfDraft):
    """Records the branch lengths and caps each step proposes with."""

    def propose(self, ctx):
        tree = super().propose(ctx)
        self.shapes.append(([len(branch) for branch in self.branches], list(self.caps)))
        return tree


def test_diagonal_filling_drops_one_branch_per_start_up_step(tiny):
    """L=5, N_b=3: N_b+L-3 = 5 branches (the first L-2 pads one token), one fewer per step, then N_b full ones."""
    drafter = SpySelfDraft(branch_filling="diagonal", branch_len=5, branch_num=3, use_corpus_cache=False)
    drafter.shapes = []
    gen = run(tiny, drafter, repetitive_prompt(2), 16)
    assert gen.output_ids == tiny_truth(tiny, 2, 16)
    lengths, caps = zip(*drafter.shapes)
    assert [len(step) for step in lengths[:4]] == [5, 4, 3, 3]
    assert lengths[0][:3] == [1, 2, 2] and all(pad in (1, 2) for pad in (caps[0][3] - 3, caps[0][4] - 3))
    assert [step[0] for step in lengths[:4]] == [1, 2, 3, 3] and {step[0] for step in caps} == {3}
    assert all(length == cap for step, cap_step in zip(lengths[2:], caps[2:]) for length, cap in zip(step, cap_step))
    assert drafter.stats()["warmup_steps"] == 2


def test_pad_predictions_are_the_official_prefill_rows(tiny):
    """Each pad runs after the cached prompt alone: the same token as a plain forward over prompt + pad."""
    prompt, pads = repetitive_prompt(1), [[3], [5, 7], [11, 13], [17]]
    cache = new_cache(tiny)
    with torch.inference_mode():
        prefill(tiny, cache, torch.tensor(prompt))
        preds = pad_predictions(tiny, cache, len(prompt), pads)
        plain = [int(tiny(input_ids=torch.tensor([prompt + pad])).logits[0, -1].argmax()) for pad in pads]
    assert preds == plain and cache_length(cache) == len(prompt)


class InsertLog:
    """Stands in for the context cache: the (key, tuple) inserts in order."""

    def __init__(self):
        self.log = []

    def insert(self, key, value):
        self.log.append((key, value))


def context_inserts(official: bool) -> list:
    """One steady-state update: L=4, G=2; branch 0 [40, 41], branch 1 pad 1 [50 | 51, 52], branch 2 pad 2."""
    drafter = SelfDraft(
        branch_len=4, branch_num=3, gram_len=2, use_corpus_cache=False, official_context_update=official
    )
    drafter.branches, drafter.caps = [[40, 41], [50, 51, 52], [60, 61, 62, 63]], [2, 3, 4]
    drafter.pool = InsertLog()
    preds = [[140, 141], [150, 151, 152], [160, 161, 162, 163]]  # the prediction after each branch token
    drafter._update_context_cache([1, 2, 3, 4, 5, 6], 7, preds)  # x = 6, its next token 7, first update
    return drafter.pool.log


def test_official_context_update_order_and_slip():
    padded = [(50, (51, 151)), (51, (52, 152)), (60, (61, 161)), (61, (62, 162)), (62, (63, 163))]
    text = [(1, (2, 3)), (2, (3, 4)), (3, (4, 5)), (4, (5, 6)), (5, (6, 7)), (6, (40, 140)), (40, (41, 141))]
    assert context_inserts(False) == padded + text
    level_major = [padded[2], padded[0], padded[3], padded[1], padded[4]]  # rows aligned at the branch ends
    slipped = [*text[:4], (5, (6, 150)), *text[5:]]  # the n-gram ending at x takes branch 1's pad prediction
    assert context_inserts(True) == level_major + slipped + [(6, (40, 140)), (5, (6, 7))]


def test_official_flush_counts_turns_plus_one():
    def flushes(official: bool, prompts: list[list[int]]) -> list[int]:
        drafter = SelfDraft(use_corpus_cache=False, official_flush=official)  # flush_interval 2
        counts = []
        for prompt in prompts:
            drafter.reset(prompt)
            counts.append(drafter.flushes)
        return counts

    single = [[i] for i in range(1, 7)]  # six single-turn conversations
    assert flushes(False, single) == [0, 0, 1, 1, 2, 2]  # when conversations 3 and 5 start
    assert flushes(True, single) == [0, 1, 1, 2, 2, 3]  # after conversations 1, 3, 5 (official)
    two_turn = [prompt for i in range(1, 5) for prompt in ([i], [i, 0, i])]
    assert flushes(False, two_turn) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert flushes(True, two_turn) == [0] * 8  # turns + 1 is odd after every two-turn conversation


def test_official_rule_settings_name_the_key():
    with pytest.raises(ConfigError, match="branch_filling"):
        SelfDraft(branch_filling="prefill", use_corpus_cache=False)
    with pytest.raises(ConfigError, match="branch_filling=diagonal needs branch_len"):
        SelfDraft(branch_filling="diagonal", branch_len=2, use_corpus_cache=False)
    with pytest.raises(ConfigError, match="official_context_update needs branch_num"):
        SelfDraft(official_context_update=True, branch_num=1, use_corpus_cache=False)


# -- the embedded model -----------------------------------------------------------------------------


def chat_prompt(lm, question: str) -> list[int]:
    """The model's chat template around one user question."""
    return lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )["input_ids"]


QUESTIONS = [
    "Repeat this line three times: the quick brown fox jumps over the lazy dog.",
    "Write a Python function that returns the squares of the numbers 1 to 10 as a list.",
]


@pytest.mark.slow
def test_greedy_equals_ar_embedded(embedded, tmp_path, monkeypatch):
    """LADE (paper defaults) and Self-Draft (corpus cache built from temp text files) on real prompts."""
    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text(
        "the quick brown fox jumps over the lazy dog. " * 40 + "def square(x):\n    return x * x\n" * 20
    )
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    corpus = dict(
        source="files",
        files=str(text),
        hub={},
        max_tokens=None,
        max_key_len=4,
        continuation_len=4,
        top_k=20,
        min_count=5,
    )
    model, eos = embedded.model, embedded.eos_ids
    lade = Lade()
    sd = SelfDraft(corpus=corpus)
    sd.setup(model, embedded.tokenizer)
    assert len(sd.corpus_cache) > 0 and (tmp_path / "cache" / "corpus").is_dir()
    lade.setup(model, embedded.tokenizer)
    longest = {}
    for question in QUESTIONS:
        prompt = chat_prompt(embedded, question)
        truth = ar_greedy(model, prompt, 40, eos).output_ids
        for drafter in (lade, sd):
            with torch.inference_mode():
                gen = Decoder(model, drafter, eos, Sampling()).generate(prompt, 40, torch.Generator().manual_seed(0))
            assert gen.output_ids == truth, type(drafter).__name__
            name = type(drafter).__name__
            longest[name] = max(longest.get(name, 1), *gen.accept_lengths)
    assert set(longest) == {"Lade", "SelfDraft"} and min(longest.values()) > 1, longest  # each drafted somewhere
