"""The shared decode loop: AR equals HF generate; any drafts leave greedy output unchanged."""

import random

import pytest
import torch

from specbench.core.acceptance import Sampling
from specbench.core.drafter import Drafter, DrafterError
from specbench.core.loop import Decoder, clip_emitted
from specbench.core.tree import AuxBlock, DraftTree
from specbench.drafters.ar import NoDraft
from specbench.errors import ConfigError
from specbench.runner import step_record
from specbench.schema import STEP_FIELDS, step_problems
from tests.helpers import exact_joint, pearson_statistic, sampled_outputs


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
            top_k=None,
            top_p=None,
            temperature=None,
        )
    return out[0, len(prompt) :].tolist()


def ar_greedy(model, prompt, max_new_tokens, eos_ids=frozenset()):
    with torch.inference_mode():
        return Decoder(model, NoDraft(), eos_ids, Sampling()).generate(prompt, max_new_tokens)


class RandomTreeDrafter(Drafter):
    """Proposes random trees that sometimes contain the true continuation (to test losslessness)."""

    def __init__(self, truth: list[int], vocab: int, seed: int):
        super().__init__()
        self.truth, self.vocab, self.rng = truth, vocab, random.Random(seed)

    def propose(self, ctx):
        done = len(ctx.tokens) - ctx.prompt_len
        paths = []
        for _ in range(self.rng.randrange(1, 5)):
            length = self.rng.randrange(1, 6)
            good = self.rng.randrange(length + 1)
            path = self.truth[done : done + good] + [self.rng.randrange(self.vocab) for _ in range(length - good)]
            paths.append(path)
        return DraftTree.from_paths(ctx.root, paths)


@pytest.mark.parametrize("seed", range(4))
def test_ar_equals_hf_generate_tiny(tiny, seed):
    rng = random.Random(seed)
    prompt = [rng.randrange(tiny.config.vocab_size) for _ in range(rng.randrange(1, 30))]
    gen = ar_greedy(tiny, prompt, 40)
    assert gen.output_ids == hf_greedy(tiny, prompt, 40)
    assert gen.target_forwards == 39 and gen.accept_lengths == [1] * 39
    assert gen.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("seed", range(4))
def test_random_trees_are_lossless(tiny, seed):
    rng = random.Random(100 + seed)
    prompt = [rng.randrange(tiny.config.vocab_size) for _ in range(12)]
    truth = ar_greedy(tiny, prompt, 48).output_ids
    drafter = RandomTreeDrafter(truth, tiny.config.vocab_size, seed)
    with torch.inference_mode():
        gen = Decoder(tiny, drafter, frozenset(), Sampling()).generate(prompt, 48)
    assert gen.output_ids == truth
    assert sum(gen.accept_lengths) == 47 and gen.target_forwards < 47  # drafts were accepted


class SecondBranchDrafter(Drafter):
    """A wrong token as the root's first child, then the true two-token continuation as its second branch."""

    def __init__(self, truth: list[int], vocab: int):
        super().__init__()
        self.truth, self.vocab = truth, vocab

    def propose(self, ctx):
        done = len(ctx.tokens) - ctx.prompt_len
        right = self.truth[done : done + 2]
        return DraftTree.from_paths(ctx.root, [[(right[0] + 1) % self.vocab], right])


def test_the_loop_traces_tree_depth_and_side_branches(tiny):
    prompt = [3, 1, 4, 1, 5]
    truth = ar_greedy(tiny, prompt, 13).output_ids
    with torch.inference_mode():
        gen = Decoder(tiny, SecondBranchDrafter(truth, tiny.config.vocab_size), frozenset(), Sampling()).generate(
            prompt, 13
        )
    assert gen.output_ids == truth
    assert gen.accept_lengths == [3, 3, 3, 3]  # 1 + 12 tokens: every step takes the two-token second branch
    assert gen.draft_tokens == [3, 3, 3, 3] and gen.draft_depth == [2, 2, 2, 2]
    assert gen.verify_tokens == [4, 4, 4, 4]  # the root and three nodes, no aux rows
    assert gen.side_branch == [True, True, True, True]
    chain = ar_greedy(tiny, prompt, 5)
    assert chain.draft_depth == [0] * 4 and chain.side_branch == [False] * 4 and chain.verify_tokens == [1] * 4


@pytest.mark.parametrize("breakdown", [True, False])
def test_the_loop_fills_every_declared_step_trace_one_entry_per_step(tiny, breakdown):
    """The step record is declared once (schema.StepLists): the loop fills each trace (the phases only with the step
    breakdown on) with one entry per target forward, and the runner writes them under the same names."""
    prompt = [2, 7, 1, 8]
    truth = ar_greedy(tiny, prompt, 20).output_ids
    with torch.inference_mode():
        decoder = Decoder(tiny, RandomTreeDrafter(truth, 97, 2), frozenset(), Sampling(), step_breakdown=breakdown)
        gen = decoder.generate(prompt, 20)
    record = step_record(gen)
    assert list(record) == list(STEP_FIELDS)
    measured = {name for name, values in record.items() if values is not None}
    phases = {"draft_s", "verify_s", "accept_s", "update_s"}
    assert measured == (set(STEP_FIELDS) if breakdown else set(STEP_FIELDS) - phases)
    assert {len(record[name]) for name in measured} == {gen.target_forwards}
    facts = {"output_ids": gen.output_ids, "new_tokens": len(gen.output_ids), "target_forwards": gen.target_forwards}
    assert step_problems({**record, **facts}) == []


def test_eos_stops_inside_a_multi_token_step(tiny):
    prompt = [5, 6, 7]
    truth = ar_greedy(tiny, prompt, 30).output_ids
    eos = truth[10]
    first = truth.index(eos)
    with torch.inference_mode():
        gen = Decoder(tiny, RandomTreeDrafter(truth, 97, 0), frozenset({eos}), Sampling()).generate(prompt, 30)
    assert gen.output_ids == truth[: first + 1]
    assert gen.stop_reason == "eos"
    assert gen.output_ids == hf_greedy(tiny, prompt, 30, eos=eos)


def test_budget_cuts_a_multi_token_step(tiny):
    prompt = [1, 2, 3]
    truth = ar_greedy(tiny, prompt, 20).output_ids
    with torch.inference_mode():
        gen = Decoder(tiny, RandomTreeDrafter(truth, 97, 1), frozenset(), Sampling()).generate(prompt, 7)
    assert gen.output_ids == truth[:7] and gen.stop_reason == "max_new_tokens"


def test_clip_emitted():
    assert clip_emitted([1, 2, 3], frozenset({2}), 5) == ([1, 2], "eos")
    assert clip_emitted([1, 2, 3], frozenset(), 2) == ([1, 2], "max_new_tokens")
    assert clip_emitted([1, 2, 3], frozenset({3}), 2) == ([1, 2], "max_new_tokens")
    assert clip_emitted([1], frozenset(), 5) == ([1], None)


def test_one_token_budget_and_bad_inputs(tiny):
    gen = ar_greedy(tiny, [1, 2], 1)
    assert len(gen.output_ids) == 1 and gen.target_forwards == 0
    with pytest.raises(ConfigError, match="max_new_tokens"):
        ar_greedy(tiny, [1, 2], 0)
    with pytest.raises(ConfigError, match="empty prompt"):
        ar_greedy(tiny, [], 5)


def test_sampled_ar_is_reproducible_with_seed(tiny):
    def sample(seed):
        with torch.inference_mode():
            decoder = Decoder(tiny, NoDraft(), frozenset(), Sampling(temperature=0.8, top_p=0.9))
            return decoder.generate([3, 4, 5], 20, torch.Generator().manual_seed(seed)).output_ids

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


@pytest.mark.slow
def test_ar_equals_hf_generate_embedded(embedded):
    tok = embedded.tokenizer
    eos = min(embedded.eos_ids)
    for question in [
        "Write a Python function that reverses a string.",
        "Name three prime numbers.",
        "Explain what a hash map is in two sentences.",
    ]:
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
        )["input_ids"]
        gen = ar_greedy(embedded.model, prompt, 48, embedded.eos_ids)
        assert gen.output_ids == hf_greedy(embedded.model, prompt, 48, eos=eos)


@pytest.mark.parametrize("drafter", ["none", "random_trees"])
def test_sampled_loop_reproduces_target_distribution(drafter):
    """T > 0 through the whole loop (trees, acceptance, compaction): 3-token outputs follow the target."""
    from tests.conftest import tiny_model

    model = tiny_model(vocab_size=3, seed=5)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)  # peaked distributions: a 1.5 vs 1.2 temperature mix-up gives chi2 ~200
    sampling = Sampling(temperature=1.5)
    prompt = [0, 1, 2, 1]
    expected = exact_joint(model, prompt, 3, sampling)
    generator = torch.Generator().manual_seed(11)
    draft = NoDraft() if drafter == "none" else RandomTreeDrafter([], 3, seed=2)
    decoder = Decoder(model, draft, frozenset(), sampling)
    counts = sampled_outputs(decoder, prompt, 3, generator, trials=3000)
    assert pearson_statistic(counts, expected) < 54.05  # 99.9% quantile of chi-square with 26 degrees of freedom


class HandOver(Drafter):
    """Hands the loop one fixed (possibly broken) thing at its first step."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def propose(self, ctx):
        return self.make(ctx)


def mutated(tree: DraftTree, **changes) -> DraftTree:
    """``tree`` with some of its lists or fields replaced after construction (as a buggy drafter may)."""
    for name, value in changes.items():
        setattr(tree, name, value)
    return tree


BAD_PROPOSALS = {
    "not a tree": (lambda ctx: [ctx.root], "returned a list, not a DraftTree"),
    "token past the vocabulary": (lambda ctx: DraftTree.chain(ctx.root, [1, 10**6]), "token id 1000000 is outside"),
    "negative token": (lambda ctx: DraftTree.chain(ctx.root, [-3]), "token id -3 is outside"),
    "float token": (lambda ctx: DraftTree.chain(ctx.root, [2.0]), "token 2.0 is a float, not an int"),
    "forward parent": (
        lambda ctx: mutated(DraftTree.chain(ctx.root, [1, 2]), parents=[-1, 2, 0]),
        "node 1 has parent 2: parents must be earlier nodes",
    ),
    "parent list too short": (
        lambda ctx: mutated(DraftTree.chain(ctx.root, [1, 2]), parents=[-1, 0]),
        "one parent per token",
    ),
    "other root": (lambda ctx: DraftTree.chain(ctx.root + 1, [1]), "node 0 is token"),
    "aux token past the vocabulary": (
        lambda ctx: mutated(
            DraftTree.root_only(ctx.root),
            aux=AuxBlock(torch.tensor([5, 10**6]), torch.tensor([1, 2]), torch.eye(2, dtype=torch.bool)),
        ),
        "aux token id 1000000 is outside",
    ),
    "aux mask resized": (
        lambda ctx: mutated(
            DraftTree.root_only(ctx.root),
            aux=mutated(
                AuxBlock(torch.tensor([5, 6]), torch.tensor([1, 2]), torch.eye(2, dtype=torch.bool)),
                mask=torch.eye(3, dtype=torch.bool),
            ),
        ),
        "AuxBlock shapes disagree",
    ),
    "draft_probs rows": (
        lambda ctx: mutated(DraftTree.chain(ctx.root, [1, 2]), draft_probs=torch.ones(2, 8)),
        "draft_probs has shape (2, 8)",
    ),
}


@pytest.mark.parametrize("make, message", BAD_PROPOSALS.values(), ids=BAD_PROPOSALS)
def test_the_loop_refuses_a_bad_proposal_before_any_forward(tiny, make, message):
    """Whatever a drafter hands over is checked at the boundary: one DrafterError naming the drafter and what is
    wrong, raised before the verify forward runs (only the prefill has run)."""
    forwards = []
    hook = tiny.register_forward_hook(lambda *_: forwards.append(1))
    try:
        with pytest.raises(DrafterError, match="HandOver") as refused, torch.inference_mode():
            Decoder(tiny, HandOver(make), frozenset(), Sampling()).generate([1, 2, 3], 4)
    finally:
        hook.remove()
    assert message in str(refused.value) and len(forwards) == 1


def test_the_loop_refuses_a_cache_left_longer_or_shorter(tiny):
    """A drafter that runs the target on the context's cache must crop it back: rows left over, or rows removed,
    are one DrafterError naming the drafter."""
    from specbench.core.verify import compact_cache

    def leave(ctx):
        tiny(input_ids=torch.tensor([[ctx.root]]), past_key_values=ctx.cache, use_cache=True)
        return DraftTree.root_only(ctx.root)

    def remove(ctx):
        compact_cache(ctx.cache, ctx.position - 1, [])
        return DraftTree.root_only(ctx.root)

    for make, message in ((leave, "left 1 rows of its own in"), (remove, "removed rows from")):
        with pytest.raises(DrafterError, match=f"HandOver {message} the target's KV cache"), torch.inference_mode():
            Decoder(tiny, HandOver(make), frozenset(), Sampling()).generate([1, 2, 3], 4)
