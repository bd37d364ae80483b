"""DraftTree structure and its flattening into one forward (positions, 4-D mask)."""

import random

import pytest
import torch

from specbench.core.tree import AuxBlock, DraftTree, ancestor_mask, flatten


def test_depths_children_and_paths():
    tree = DraftTree([5, 6, 7, 8, 9], [-1, 0, 0, 1, 3])
    assert tree.depths == [0, 1, 1, 2, 3]
    assert tree.children() == [[1, 2], [3], [], [4], []]
    assert tree.path_to(4) == [0, 1, 3, 4]
    assert tree.num_drafted == 4 and not tree.is_chain


def test_from_paths_merges_shared_prefixes():
    tree = DraftTree.from_paths(1, [[2, 3], [2, 4], [5]])
    assert tree.tokens == [1, 2, 3, 4, 5]
    assert tree.parents == [-1, 0, 1, 1, 0]


def test_chain_and_root_only():
    assert DraftTree.chain(3, [4, 5]).is_chain
    assert DraftTree.root_only(3).tokens == [3]


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, 0, 3, 1]])
def test_invalid_parents_rejected(parents):
    with pytest.raises(ValueError):
        DraftTree(list(range(len(parents))), parents)


def test_pruned_keeps_shallow_nodes_and_remaps_parents():
    tree = DraftTree([5, 6, 7, 8, 9], [-1, 0, 1, 0, 3])
    pruned = tree.pruned(1)
    assert pruned.tokens == [5, 6, 8]
    assert pruned.parents == [-1, 0, 0]


def test_ancestor_mask():
    mask = ancestor_mask(torch.tensor([-1, 0, 0, 2]))
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)


def ancestors_by_walking(tree: DraftTree) -> torch.Tensor:
    """The ancestor mask by walking each node's path to the root (the definition, node by node)."""
    mask = torch.zeros(len(tree), len(tree), dtype=torch.bool)
    for node in range(len(tree)):
        mask[node, tree.path_to(node)] = True
    return mask


@pytest.mark.parametrize("seed", range(20))
def test_vectorized_mask_and_positions_match_the_path_definition(seed):
    """Pointer doubling gives every node exactly its root path, and positions = past + depth."""
    rng = random.Random(seed)
    n = rng.randrange(1, 130)
    chain_bias = rng.random()  # from bushy (0) to deep chains (1)
    parents = [-1] + [i - 1 if rng.random() < chain_bias else rng.randrange(i) for i in range(1, n)]
    tree = DraftTree(list(range(n)), parents)
    assert torch.equal(ancestor_mask(torch.tensor(parents)), ancestors_by_walking(tree))
    flat = flatten(tree, past_len=9, dtype=torch.float32, device=torch.device("cpu"))
    assert flat.position_ids[0].tolist() == [9 + depth for depth in tree.depths]
    if flat.attention_mask is not None:
        allowed = flat.attention_mask[0, 0] == 0  # [n, 9 + n]
        assert allowed[:, :9].all() and torch.equal(allowed[:, 9:], ancestors_by_walking(tree))


def test_flatten_chain_uses_causal_fast_path():
    flat = flatten(DraftTree.chain(1, [2, 3]), past_len=10, dtype=torch.float32, device=torch.device("cpu"))
    assert flat.attention_mask is None
    assert flat.position_ids.tolist() == [[10, 11, 12]]


def test_flatten_tree_with_aux_block():
    aux = AuxBlock(torch.tensor([7, 8]), torch.tensor([1, 2]), torch.tensor([[1, 0], [1, 1]], dtype=torch.bool))
    tree = DraftTree([1, 2, 3], [-1, 0, 0], aux=aux)
    flat = flatten(tree, past_len=4, dtype=torch.float32, device=torch.device("cpu"))
    assert flat.input_ids.tolist() == [[1, 2, 3, 7, 8]]
    assert flat.position_ids.tolist() == [[4, 5, 5, 5, 6]]
    allowed = (flat.attention_mask[0, 0] == 0).int()  # [5, 9]
    assert allowed[:, :4].all()  # everyone sees the cache
    assert allowed[:, 4:].tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 0, 0, 1, 0],  # aux rows see the root, their own mask, never tree nodes
        [1, 0, 0, 1, 1],
    ]


def test_depth_and_leaving_the_first_branch():
    tree = DraftTree([9, 1, 2, 3, 4], [-1, 0, 1, 0, 3])  # root's children: 1 (first-listed) and 3
    assert tree.depth == 2 and DraftTree.root_only(9).depth == 0
    assert not tree.leaves_first_branch([0, 1, 2])
    assert tree.leaves_first_branch([0, 3]) and tree.leaves_first_branch([0, 3, 4])
    assert not tree.leaves_first_branch([0])
