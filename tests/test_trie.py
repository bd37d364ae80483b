"""Lookahead's frequency trie memory on hand-written token arrays."""

import random

import pytest
import torch

from specbench.core.acceptance import Sampling, accept_match
from specbench.core.tree import DraftTree
from specbench.errors import ConfigError
from specbench.structures.trie import NODE_PRUNINGS, Rules, Trie, TrieMemory, parallel_layout


def node_at(memory: TrieMemory, first: int, path: list[int]):
    """The node reached by ``path`` inside ``mem[first]``."""
    node = memory.mem[first]
    for token in path:
        node = node.children[token]
    return node


def chain(tokens):
    return list(range(-1, len(tokens) - 1))


def test_insert_windows_and_retrieve_with_two_token_query():
    memory = TrieMemory(branch_length=3)  # windows of 3 + 2 - 1 = 4 tokens after each first token
    memory.insert_sequence([1, 2, 3, 4, 5, 6], output=True)
    assert sorted(memory.mem) == [1, 2, 3, 4, 5]
    assert node_at(memory, 1, [2, 3, 4, 5]).children == {}  # window length 4: token 6 is not under 1
    assert node_at(memory, 1, [2]).f_out == 1.0 and node_at(memory, 1, [2]).f_in == 0.0
    draft = memory.retrieve([1, 2], decoding_length=64, max_depth=3)
    assert (draft.tokens, draft.parents, draft.query_length) == ([2, 3, 4, 5], chain([2, 3, 4, 5]), 2)
    assert memory.retrieve([9, 8], decoding_length=64, max_depth=3).tokens == [8]  # nothing known
    assert memory.sizes() == {
        "trie_count": 5,
        "nodes": 4 + 4 + 3 + 2 + 1,
        "input_nodes": 0,
        "output_nodes": 14,
        "prune_passes": 0,
    }


def test_stream_output_waits_for_full_windows_then_flushes_at_request_end():
    memory = TrieMemory(branch_length=2)  # window 3
    memory.stream_output([1, 2, 3])
    assert memory.mem == {}  # no token has 3 followers yet
    memory.stream_output([4, 5])
    assert sorted(memory.mem) == [1, 2]  # 1 -> 2 3 4 and 2 -> 3 4 5
    assert node_at(memory, 2, [3, 4, 5]).f_out == 1.0
    memory.end_request()  # the tail's shorter windows: 3 -> 4 5, 4 -> 5
    assert sorted(memory.mem) == [1, 2, 3, 4]
    assert node_at(memory, 3, [4, 5]).f_out == 1.0 and memory.mem[4].children.keys() == {5}


def test_prompt_amplification_orders_input_branches_first():
    memory = TrieMemory(branch_length=2, max_query_length=1)
    for _ in range(5):
        memory.insert_sequence([7, 1, 2], output=True)  # seen 5 times in outputs
    memory.insert_sequence([7, 3, 4], output=False)  # once in the prompt
    draft = memory.retrieve([7], decoding_length=64, max_depth=2)
    assert draft.tokens == [7, 3, 4, 1, 2] and draft.parents == [-1, 0, 1, 0, 3]
    single = memory.retrieve_branch([7], max_depth=2)
    assert single.tokens == [7, 3, 4]
    plain = TrieMemory(branch_length=2, max_query_length=1, output_weight=1.0)  # no amplification
    for _ in range(5):
        plain.insert_sequence([7, 1, 2], output=True)
    plain.insert_sequence([7, 3, 4], output=False)
    assert plain.retrieve([7], decoding_length=64, max_depth=2).tokens[:3] == [7, 1, 2]


def test_channels_stay_separate_and_elimination_zeroes_only_input():
    memory = TrieMemory(branch_length=2, max_query_length=1)
    memory.insert_sequence([1, 2, 3], output=True)
    memory.insert_sequence([1, 2, 4, 1, 5, 6], output=False)
    two = node_at(memory, 1, [2])
    assert (two.f_in, two.f_out) == (1.0, 1.0)
    assert memory.sizes()["input_nodes"] > 0
    memory.end_request()
    assert (two.f_in, two.f_out) == (0.0, 1.0)
    assert node_at(memory, 1, [2, 4]).f_in == 0.0 and node_at(memory, 1, [5, 6]).f_in == 0.0
    assert memory.sizes()["input_nodes"] == 0
    assert memory.retrieve([1], 64, 2).tokens == [1, 2, 3]  # eliminated prompt branches are not drafted
    assert memory.retrieve([5], 64, 2).tokens == [5]


def test_pruning_halves_frequent_and_deletes_rare_nodes():
    memory = TrieMemory(branch_length=1, max_query_length=1, max_node=2, max_output_node=2, prune_min_trees=1)
    for _ in range(4):
        memory.insert_sequence([1, 2], output=True)
    memory.insert_sequence([1, 3], output=True)
    memory.insert_sequence([1, 4], output=False)
    memory.end_request()  # 3 nodes > max_node = 2: halve f_out > 1, delete f_out <= 1
    assert memory.mem[1].children.keys() == {2}
    assert memory.mem[1].children[2].f_out == 2.0
    assert memory.sizes() == {"trie_count": 1, "nodes": 1, "input_nodes": 0, "output_nodes": 1, "prune_passes": 1}
    memory.end_request()  # nothing touched since the last pass: no pruning
    assert memory.mem[1].children[2].f_out == 2.0 and memory.prune_passes == 1


def test_pruning_waits_for_enough_touched_tries_and_skips_tries_within_capacity():
    memory = TrieMemory(branch_length=1, max_query_length=1, max_node=1, max_output_node=1, prune_min_trees=3)
    memory.insert_sequence([1, 2, 1, 3], output=True)  # tries 1 (-> 2, -> 3) and 2 (-> 1)
    memory.insert_sequence([5, 6], output=True)  # third touched trie
    memory.end_request()
    assert memory.prune_passes == 1
    assert 1 not in memory.mem  # 2 nodes > 1, both f_out = 1: deleted, empty trie dropped
    assert memory.mem[5].children[6].f_out == 1.0  # within capacity: untouched
    small = TrieMemory(branch_length=1, max_query_length=1, max_node=1, max_output_node=1, prune_min_trees=10)
    small.insert_sequence([1, 2, 1, 3], output=True)
    small.end_request()
    assert small.prune_passes == 0 and small.mem[1].children.keys() == {2, 3}


def test_query_falls_back_to_last_token_when_the_longer_match_is_short():
    memory = TrieMemory(branch_length=3)
    memory.insert_sequence([1, 2, 3], output=True)  # 1 -> 2 -> 3: only one node below (1, 2)
    memory.insert_sequence([2, 7, 8, 9], output=True)  # 2 -> 7 8 9
    draft = memory.retrieve([1, 2], decoding_length=64, max_depth=3)
    assert draft.query_length == 1
    assert draft.tokens == [2, 3, 7, 8, 9] and draft.parents == [-1, 0, 0, 2, 3]
    memory.insert_sequence([1, 2, 5, 6, 4], output=True)  # (1, 2) now has 5 -> 6 -> 4 below it
    long = memory.retrieve([1, 2], decoding_length=64, max_depth=3)
    assert long.query_length == 2 and long.tokens == [2, 3, 5, 6, 4]
    assert memory.retrieve([2], decoding_length=64, max_depth=3).query_length == 1  # short context
    assert memory.retrieve([1, 2], decoding_length=64, max_depth=0).tokens == [2]


def random_memory(seed: int) -> TrieMemory:
    rng = random.Random(seed)
    memory = TrieMemory(branch_length=rng.choice([2, 4, 8]), max_query_length=2)
    for _ in range(30):
        ids = [rng.randrange(6) for _ in range(rng.randrange(2, 40))]
        memory.insert_sequence(ids, output=rng.random() < 0.7)
    return memory


def candidates(node, max_depth, depth=1):
    for child in node.children.values():
        if child.f_in > 0 or child.f_out > 0:
            yield child
            if depth < max_depth:
                yield from candidates(child, max_depth, depth + 1)


@pytest.mark.parametrize("seed", range(6))
def test_selection_respects_budget_and_forms_a_valid_tree(seed):
    memory = random_memory(seed)
    rng = random.Random(seed)
    for _ in range(40):
        query = [rng.randrange(6), rng.randrange(6)]
        decoding_length, max_depth = rng.choice([1, 2, 5, 16, 64]), rng.randrange(0, 9)
        draft = memory.retrieve(query, decoding_length, max_depth)
        assert len(draft.tokens) <= max(decoding_length, 1) and draft.tokens[0] == query[-1]
        tree = DraftTree(draft.tokens, draft.parents)  # validates parent order
        assert max(tree.depths) <= max_depth
        start = memory.match(query[-draft.query_length :]) if draft.query_length else None
        if start is None:
            assert draft.num_drafted == 0
            continue
        for leaf in range(1, len(tree)):  # every drafted path exists in the matched trie
            node = start
            for i in tree.path_to(leaf)[1:]:
                node = node.children[tree.tokens[i]]
                assert node.f_in > 0 or node.f_out > 0
        pool = list(candidates(start, max_depth))
        if len(pool) < decoding_length:
            assert draft.num_drafted == len(pool)  # few candidates: every one is drafted


@pytest.mark.parametrize("seed", range(6))
def test_best_first_thresholds_equal_a_full_sort(seed):
    memory = random_memory(seed)
    for trie in memory.mem.values():
        for decoding_length in (4, 16):
            pool = list(candidates(trie, memory.branch_length))
            out_min, mix_min = memory.thresholds(trie, decoding_length, memory.branch_length)
            outputs = sorted((n.f_out for n in pool if n.f_out > 0), reverse=True)
            top = max(decoding_length // 2, 1)
            assert out_min == (outputs[min(top, len(outputs)) - 1] if outputs else float("inf"))
            qualifying = [n for n in pool if n.f_out >= out_min or (memory.mixed(n) > 0 and memory.mixed(n) >= mix_min)]
            assert len(qualifying) >= min(decoding_length, len(pool))


def test_frequencies_never_grow_down_a_path():
    memory = random_memory(0)
    memory.end_request()
    memory.insert_sequence([1, 2, 3, 1, 2, 4], output=False)
    for trie in memory.mem.values():
        stack = [trie]
        while stack:
            node = stack.pop()
            for child in node.children.values():
                if node is not trie:
                    assert child.f_in <= node.f_in and child.f_out <= node.f_out
                stack.append(child)


def test_parallel_layout_copies_shared_prefixes_within_the_budget():
    tokens, parents = [0, 10, 11, 12, 20], [-1, 0, 1, 1, 0]  # 0 -> 10 -> {11, 12}; 0 -> 20
    out_tokens, out_parents = parallel_layout(tokens, parents)
    assert out_tokens == [0, 10, 11, 10, 12] and out_parents == [-1, 0, 1, 0, 3]  # 20 no longer fits
    assert parallel_layout([0, 5, 6], [-1, 0, 1]) == ([0, 5, 6], [-1, 0, 1])
    assert parallel_layout([0], [-1]) == ([0], [-1])
    wide = parallel_layout([0, 1, 2, 3], [-1, 0, 0, 0])
    assert wide == ([0, 1, 2, 3], [-1, 0, 0, 0])
    cut = parallel_layout([0, 1, 2, 3, 4], [-1, 0, 1, 2, 0])  # branches [1,2,3] and [4]
    assert cut == ([0, 1, 2, 3, 4], [-1, 0, 1, 2, 0])


def test_single_branch_follows_the_highest_mixed_frequency():
    memory = TrieMemory(branch_length=4, max_query_length=1)
    memory.insert_sequence([1, 2, 3, 4], output=True)
    memory.insert_sequence([1, 2, 3, 4], output=True)
    memory.insert_sequence([1, 2, 5, 6], output=True)
    memory.insert_sequence([1, 7, 8, 9], output=True)
    draft = memory.retrieve_branch([1], max_depth=4)
    assert draft.tokens == [1, 2, 3, 4] and draft.parents == chain([1, 2, 3, 4])
    assert memory.retrieve_branch([1], max_depth=2).tokens == [1, 2, 3]


def test_bad_parameters_are_config_errors():
    with pytest.raises(ConfigError, match="branch_length"):
        TrieMemory(branch_length=0)
    with pytest.raises(ConfigError, match="output_weight"):
        TrieMemory(branch_length=2, output_weight=2.0)
    with pytest.raises(ConfigError, match="max_query_length"):
        TrieMemory(branch_length=2, max_query_length=0)


# ---------------------------------------------------------------------- the official code's rules (Rules)


def test_output_threshold_selection_is_the_official_rule():
    """Few candidates: every node, eliminated ones too; more than L_d (counted at any depth): f_out >= the
    L_d/2-th largest f_out only, so prompt-only nodes never qualify."""
    drafts = {}
    for selection in ("union", "output_threshold"):
        memory = TrieMemory(branch_length=2, max_query_length=1, rules=Rules(selection=selection))
        memory.insert_sequence([7, 1, 2], output=True)
        memory.insert_sequence([7, 3, 4], output=False)
        memory.end_request()  # 3 and 4 now have zero frequency in both channels
        few = memory.retrieve([7], 64, 2).tokens
        memory.insert_sequence([7, 1, 2], output=True)  # 1 -> 2 seen twice
        memory.insert_sequence([7, 5, 6], output=True)
        memory.insert_sequence([7, 8, 9], output=False)  # the live prompt
        drafts[selection] = few, memory.retrieve([7], 4, 1).tokens, memory.retrieve([7], 4, 2).tokens
    assert drafts["union"] == ([7, 1, 2], [7, 8, 1, 5], [7, 8, 9, 1])
    # depth 1 holds 3 candidates (< L_d = 4), but 6 are positive at any depth: the top-2 f_out (2.0) rule
    assert drafts["output_threshold"] == ([7, 1, 2, 3, 4], [7, 1], [7, 1, 2])


def test_official_fallback_stops_at_branch_length_tokens_root_included():
    drafts = {}
    for fallback in ("drafted", "official"):
        memory = TrieMemory(branch_length=3, rules=Rules(query_fallback=fallback))
        memory.insert_sequence([1, 2, 5, 6], output=True)  # (1, 2) -> 5 -> 6: 2 drafted nodes
        memory.insert_sequence([2, 7, 8, 9], output=True)
        memory.insert_sequence([3, 4], output=True)
        memory.insert_sequence([6, 5], output=True)
        two = memory.retrieve([1, 2], 64, 3)
        # max depth 1: the first trie tried ends the search, even without a draft ((3, 6) does not match)
        depth_one = memory.retrieve([3, 6], 64, 1).tokens
        drafts[fallback] = two.tokens, two.query_length, depth_one
    assert drafts["drafted"] == ([2, 5, 6, 7, 8, 9], 1, [6, 5])
    assert drafts["official"] == ([2, 5, 6], 2, [6])


@pytest.mark.parametrize(
    "pruning,fallback,tokens",
    [("official", "official", [2]), ("official", "drafted", [2, 5]), ("specbench", "official", [2, 5])],
)
def test_official_pruning_keeps_an_emptied_trie_whose_empty_result_replaces_a_draft(pruning, fallback, tokens):
    rules = Rules(query_fallback=fallback, node_pruning=pruning)
    memory = TrieMemory(branch_length=3, max_node=3, prune_min_trees=1, rules=rules)
    memory.insert_sequence([1, 2, 5], output=True)
    memory.insert_sequence([2, 6, 7, 8, 9], output=True)  # mem[2] grows to 5 nodes > 3, each seen once
    memory.end_request()
    assert (2 in memory.mem) == (pruning == "official") and not memory.mem.get(2, Trie()).children
    assert memory.retrieve([1, 2], 64, 3).tokens == tokens


def test_official_pruning_counts_created_output_nodes_and_marks_only_existing_tries():
    counted = {}
    for pruning in NODE_PRUNINGS:
        memory = TrieMemory(branch_length=2, max_query_length=1, prune_min_trees=1, rules=Rules(node_pruning=pruning))
        memory.insert_sequence([1, 2, 3], output=False)
        memory.insert_sequence([1, 2, 3], output=True)  # the nodes exist: output frequency, no new node
        memory.end_request()  # the first insertion created mem[1] and mem[2]; the second one marked them
        memory.insert_sequence([5, 6], output=True)  # creates mem[5]
        memory.end_request()
        counted[pruning] = memory.mem[1].n_output_node, memory.prune_passes
        memory.stream_output([8, 9, 10, 11])  # stream windows always mark their trie
        memory.end_request()
        assert memory.prune_passes == counted[pruning][1] + 1
    assert counted == {"specbench": (2, 2), "official": (0, 1)}


def test_fixed_branch_window_stores_branch_length_plus_one_tokens():
    assert TrieMemory(branch_length=3, max_query_length=3).window == 5
    fixed = TrieMemory(branch_length=3, max_query_length=3, rules=Rules(branch_window="fixed"))
    assert fixed.window == 4
    fixed.insert_sequence([1, 2, 3, 4, 5, 6], output=True)
    assert node_at(fixed, 1, [2, 3, 4, 5]).children == {}


def test_output_first_single_branch_follows_output_frequency():
    memory = TrieMemory(branch_length=2, max_query_length=1, rules=Rules(single_ranking="output_first"))
    for _ in range(5):
        memory.insert_sequence([7, 1, 2], output=True)
    memory.insert_sequence([7, 3, 4], output=False)  # fm ranks this prompt branch first
    assert memory.retrieve_branch([7], max_depth=2).tokens == [7, 1, 2]


def test_official_single_fallback_stops_at_half_the_branch_length_root_included():
    for fallback, tokens in (("drafted", [2, 7, 8, 9]), ("official", [2, 5])):
        memory = TrieMemory(branch_length=4, rules=Rules(query_fallback=fallback))
        memory.insert_sequence([1, 2, 5], output=True)  # (1, 2) -> 5: 1 drafted node, 2 tokens
        for _ in range(2):
            memory.insert_sequence([2, 7, 8, 9], output=True)
        assert memory.retrieve_branch([1, 2], max_depth=4).tokens == tokens


def test_parallel_all_branches_hangs_a_branch_under_the_first_copy_of_its_prefix():
    tokens, parents = [0, 10, 11, 12, 20], [-1, 0, 1, 1, 0]  # 0 -> 10 -> {11, 12}; 0 -> 20
    laid = parallel_layout(tokens, parents, all_branches=True)
    assert laid == ([0, 10, 11, 10, 12], [-1, 0, 1, 0, 1])  # the copy of 10 stays, 12 hangs under the first
    three = parallel_layout([0, 1, 2, 3, 4, 5], [-1, 0, 1, 2, 1, 0], all_branches=True)  # 1 2 3 | 1 4 | 5
    assert three == ([0, 1, 2, 3, 1, 4], [-1, 0, 1, 2, 0, 1])
    greedy = {0: 10, 1: 12, 4: 99}  # the target's argmax at each node: 10, then 12
    for all_branches, path in ((False, [0, 1]), (True, [0, 1, 4])):
        tree = DraftTree(*parallel_layout(tokens, parents, all_branches))
        logits = torch.zeros(len(tree), 100)
        for node, token in greedy.items():
            logits[node, token] = 1.0
        assert accept_match(tree, logits, Sampling()).path == path


def test_bad_rules_are_config_errors():
    for key in ("selection", "query_fallback", "single_ranking", "node_pruning", "branch_window"):
        with pytest.raises(ConfigError, match=key):
            Rules(**{key: "nope"})
