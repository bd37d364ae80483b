"""The verifier: one tree forward equals sequential decoding; compaction equals recomputation."""

import random

import pytest
import torch

from specbench.core.tree import AuxBlock, DraftTree
from specbench.core.verify import cache_length, compact_cache, forward_tree, new_cache, prefill, warm_up_verify


def sequential_logits(model, tokens: list[int]) -> torch.Tensor:
    """Reference: logits of every position from a plain causal forward over ``tokens``."""
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0].float()  # [len, vocab]


def random_tree(rng: random.Random, root: int, size: int, vocab: int) -> DraftTree:
    parents = [-1] + [rng.randrange(i) for i in range(1, size)]
    return DraftTree([root] + [rng.randrange(vocab) for _ in range(size - 1)], parents)


@pytest.mark.parametrize("seed", range(6))
def test_tree_pass_logits_equal_sequential(tiny, seed):
    rng = random.Random(seed)
    vocab = tiny.config.vocab_size
    prompt = [rng.randrange(vocab) for _ in range(rng.randrange(3, 20))]
    tree = random_tree(rng, rng.randrange(vocab), rng.randrange(1, 24), vocab)
    with torch.inference_mode():
        cache = new_cache(tiny)
        prefill(tiny, cache, torch.tensor(prompt))
        out = forward_tree(tiny, cache, tree)
    for node in range(len(tree)):
        path_tokens = [tree.tokens[i] for i in tree.path_to(node)]
        expected = sequential_logits(tiny, prompt + path_tokens)[-1]
        torch.testing.assert_close(out.logits[node], expected, atol=1e-4, rtol=1e-4)


def test_aux_rows_do_not_disturb_tree_rows_and_see_root(tiny):
    vocab = tiny.config.vocab_size
    prompt, root = [3, 9, 27, 81], 5
    tree = DraftTree.from_paths(root, [[6, 7], [8]])
    aux = AuxBlock(torch.tensor([11, 12, 13]), torch.tensor([1, 2, 3]), torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    with torch.inference_mode():
        plain_cache, aux_cache = new_cache(tiny), new_cache(tiny)
        prefill(tiny, plain_cache, torch.tensor(prompt))
        prefill(tiny, aux_cache, torch.tensor(prompt))
        plain = forward_tree(tiny, plain_cache, tree)
        tree.aux = aux
        with_aux = forward_tree(tiny, aux_cache, tree)
    torch.testing.assert_close(with_aux.logits, plain.logits, atol=1e-5, rtol=1e-5)
    assert with_aux.aux_logits.shape == (3, vocab)
    expected_last = sequential_logits(tiny, prompt + [root, 11, 12, 13])[-1]  # aux chain anchored on root
    torch.testing.assert_close(with_aux.aux_logits[-1], expected_last, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kept", [[0], [0, 1, 2, 5], [0, 3, 4], [0, 3]])  # root paths
def test_compaction_equals_recomputation(tiny, kept):
    prompt = [4, 8, 15, 16, 23, 42]
    tree = DraftTree([7, 1, 2, 3, 4, 5], [-1, 0, 1, 0, 3, 2])
    next_token = 33
    with torch.inference_mode():
        cache = new_cache(tiny)
        prefill(tiny, cache, torch.tensor(prompt))
        forward_tree(tiny, cache, tree)
        compact_cache(cache, len(prompt), kept)
        assert cache_length(cache) == len(prompt) + len(kept)
        after = forward_tree(tiny, cache, DraftTree.root_only(next_token)).logits[0]
    committed = prompt + [tree.tokens[i] for i in kept] + [next_token]
    torch.testing.assert_close(after, sequential_logits(tiny, committed)[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("reserve", [0, 9, 400])
def test_reserved_cache_over_many_steps_equals_recomputation(tiny, reserve):
    """Tree steps with compaction, whether the buffer grows (small reserve) or never moves (large)."""
    rng = random.Random(reserve)
    vocab = tiny.config.vocab_size
    committed = [rng.randrange(vocab) for _ in range(7)]
    with torch.inference_mode():
        cache = new_cache(tiny, reserve)
        prefill(tiny, cache, torch.tensor(committed[:-1]))
        buffers = [layer.key_buffer.data_ptr() for layer in cache.layers]
        for _ in range(12):
            tree = random_tree(rng, committed[-1], rng.randrange(1, 16), vocab)
            out = forward_tree(tiny, cache, tree)
            torch.testing.assert_close(out.logits[0], sequential_logits(tiny, committed)[-1], atol=1e-4, rtol=1e-4)
            path = tree.path_to(rng.randrange(len(tree)))
            compact_cache(cache, len(committed) - 1, path)
            committed += [tree.tokens[i] for i in path[1:]] + [rng.randrange(vocab)]
            assert cache_length(cache) == len(committed) - 1
        moved = [layer.key_buffer.data_ptr() for layer in cache.layers] != buffers
    assert moved == (reserve < len(committed) + 16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tree_pass_half_precision_sanity(dtype):
    """Half precision: tree-pass logits stay close to sequential ones (the papers run fp16)."""
    from tests.conftest import tiny_model

    model = tiny_model(seed=3).to(dtype)
    rng = random.Random(7)
    prompt = [rng.randrange(97) for _ in range(10)]
    tree = random_tree(rng, 5, 12, 97)
    with torch.inference_mode():
        cache = new_cache(model)
        prefill(model, cache, torch.tensor(prompt))
        out = forward_tree(model, cache, tree)
    for node in range(len(tree)):
        expected = sequential_logits(model, prompt + [tree.tokens[i] for i in tree.path_to(node)])[-1]
        torch.testing.assert_close(out.logits[node], expected, atol=5e-2, rtol=5e-2)


def test_hidden_states_are_the_lm_head_inputs(tiny):
    """Drafters that ask for hidden states (Medusa) get the final-norm output of every tree row."""
    tree = DraftTree.from_paths(3, [[4, 5], [6]])
    with torch.inference_mode():
        cache = new_cache(tiny)
        prefill(tiny, cache, torch.tensor([1, 2]))
        out = forward_tree(tiny, cache, tree, hidden_layers=(-1,))
        assert out.hidden.shape == (len(tree), tiny.config.hidden_size)
        torch.testing.assert_close(tiny.lm_head(out.hidden).float(), out.logits)


def test_hidden_layers_come_back_concatenated_in_the_asked_order(tiny):
    """Several layers (EAGLE-3's fused features): each block equals that layer's rows of one plain forward."""
    prompt, chain = [1, 2, 3], [4, 5, 6]
    layers = (2, 0, 1)  # any order: the blocks follow it
    with torch.inference_mode():
        cache = new_cache(tiny)
        prefill(tiny, cache, torch.tensor(prompt))
        out = forward_tree(tiny, cache, DraftTree.chain(chain[0], chain[1:]), hidden_layers=layers)
        plain = tiny(input_ids=torch.tensor([prompt + chain]), output_hidden_states=True).hidden_states
    hidden = tiny.config.hidden_size
    assert out.hidden.shape == (len(chain), len(layers) * hidden)
    for block, layer in enumerate(layers):
        torch.testing.assert_close(out.hidden[:, block * hidden : (block + 1) * hidden], plain[layer][0, 3:])


def test_sliding_window_caches_are_refused_clearly():
    from transformers import MistralConfig, MistralForCausalLM

    from specbench.errors import ConfigError

    config = MistralConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=8,
    )
    with pytest.raises(ConfigError, match="full-attention"):
        new_cache(MistralForCausalLM(config))


def test_warm_up_runs_every_width_with_the_causal_path_and_the_tree_mask(tiny):
    """warm_up_verify: after a 4-token prefill, a chain (no mask: the causal path) and a star (4-D mask) per width."""
    seen = []

    def spy(module, args, kwargs):
        seen.append((kwargs["input_ids"].shape[1], kwargs.get("attention_mask") is not None))

    hook = tiny.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        with torch.inference_mode():
            warm_up_verify(tiny, (2, 16))
    finally:
        hook.remove()
    verifies = [call for call in seen if call != (4, False)]  # the prefills
    assert verifies == [(2, False), (2, False), (16, False), (16, True)]  # a 1-child star is a chain
