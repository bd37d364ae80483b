"""Traversal verification (``specbench.core.traversal``): exact by enumeration over every drafted tree of small shapes
(children drawn without replacement, and deterministic drafts), biased with the with-replacement update (negative
control), block verification itself on chains, never fewer accepted tokens in expectation than multi-candidate
rejection on the trees tested, the greedy walk at T = 0, and the sampled rule through the conformance suite's law
check (with a negative control)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import torch

from specbench import conformance
from specbench.core import traversal
from specbench.core.acceptance import Sampling, accept_match
from specbench.core.block import block_plan
from specbench.core.rules import acceptance_rule
from specbench.core.traversal import accept_traversal, traversal_law
from specbench.core.tree import DraftTree, child_lists
from tests.test_block_verification import VOCAB, Law, random_law

Drafted = tuple[DraftTree, list[tuple[int, ...]], float]  # a tree, each node's path tokens, its chance to be drafted

SHAPES = {  # parent lists: node 0 is the root
    "chain of 3": [-1, 0, 1, 2],
    "2 children": [-1, 0, 0],
    "2 children, the first with a child": [-1, 0, 0, 1],
    "a chain that forks": [-1, 0, 1, 1],
    "2x2": [-1, 0, 0, 1, 1, 2, 2],
}
DECODED = {"2x2": 3}  # tokens of the decode whose law is checked (4 unless named: the 2x2 tree has 216 draws)


def node_paths(parents: list[int], tokens: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The drafted tokens from the root to each node (the root's path is empty)."""
    paths: list[tuple[int, ...]] = [()]
    for node in range(1, len(parents)):
        paths.append(paths[parents[node]] + (tokens[node],))
    return paths


def draw_chance(parents: list[int], tokens: tuple[int, ...], laws: list[torch.Tensor]) -> float:
    """The chance that the children of every node are ``tokens``, each node's drawn in child order WITHOUT replacement
    from its law ``laws[node]`` [VOCAB] (the contract of ``specbench.core.speculative``)."""
    chance = 1.0
    for node, kids in enumerate(child_lists(parents)):
        drawn = [tokens[child] for child in kids]
        if len(set(drawn)) < len(drawn):
            return 0.0
        for i, token in enumerate(drawn):
            chance *= float(laws[node][token]) / (1.0 - sum(float(laws[node][t]) for t in drawn[:i]))
    return chance


def sampled_trees(parents: list[int], draft: Law, prefix: tuple[int, ...]) -> Iterator[Drafted]:
    """Every tree of shape ``parents`` the draft can draw after ``prefix``, with ``draft_probs`` and its chance."""
    for drafted in itertools.product(range(VOCAB), repeat=len(parents) - 1):
        tokens = (0, *drafted)  # the root's token is never read
        paths = node_paths(parents, tokens)
        laws = [draft(prefix + path) for path in paths]
        chance = draw_chance(parents, tokens, laws)
        if chance > 0:
            yield DraftTree(list(tokens), list(parents), torch.stack(laws)), paths, chance


def deterministic_trees(parents: list[int], draft: Law, prefix: tuple[int, ...]) -> Iterator[Drafted]:
    """The one tree a top-k drafter proposes after ``prefix``: the r-th child holds the draft's r-th most likely token
    (ranks wrap around, so a node with more than VOCAB children repeats tokens); no ``draft_probs``."""
    tokens = [0] * len(parents)
    for node, kids in enumerate(child_lists(parents)):
        ranked = draft(prefix + node_paths(parents, tuple(tokens))[node]).argsort(descending=True).tolist()
        for rank, child in enumerate(kids):
            tokens[child] = ranked[rank % VOCAB]
    yield DraftTree(tokens, list(parents)), node_paths(parents, tuple(tokens)), 1.0


Propose = Callable[[tuple[int, ...]], Iterator[Drafted]]


def outcome_laws(target: Law, propose: Propose, prefix: tuple[int, ...]):
    """Per drafted tree after ``prefix``: its chance, its paths and the rule's exact outcome law."""
    for tree, paths, chance in propose(prefix):
        targets = torch.stack([target(prefix + path) for path in paths])  # [num_nodes, VOCAB]
        yield chance, paths, traversal_law(tree, targets)


def step_law(target: Law, propose: Propose, prefix: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    """The exact law of what one step emits after ``prefix`` (accepted drafts + the emitted token)."""
    law: dict[tuple[int, ...], float] = {}
    for chance, paths, outcomes in outcome_laws(target, propose, prefix):
        for node, emitted in outcomes.items():
            for token in range(VOCAB):
                key = paths[node] + (token,)
                law[key] = law.get(key, 0.0) + chance * float(emitted[token])
    return law


def decoded_law(target: Law, propose: Propose, length: int) -> dict[tuple[int, ...], float]:
    """The exact law of the first ``length`` tokens of decoding with traversal verification, step after step."""
    law: dict[tuple[int, ...], float] = {}
    steps: dict[tuple[int, ...], dict[tuple[int, ...], float]] = {}

    def extend(prefix: tuple[int, ...], chance: float) -> None:
        if len(prefix) >= length:
            law[prefix[:length]] = law.get(prefix[:length], 0.0) + chance
            return
        if prefix not in steps:
            steps[prefix] = step_law(target, propose, prefix)
        for emitted, p in steps[prefix].items():
            extend(prefix + emitted, chance * p)

    extend((), 1.0)
    return law


def law_error(target: Law, law: dict[tuple[int, ...], float]) -> float:
    """The largest gap between ``law`` and the target's law of the same sequences (all of them: sums to 1)."""
    assert sum(law.values()) == pytest.approx(1.0)
    return max(abs(chance - math.prod(float(target(s[:i])[x]) for i, x in enumerate(s))) for s, chance in law.items())


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_decoding_with_traversal_verification_has_the_targets_law(shape, seed):
    """Lossless, computed exactly: over every tree the draft can draw (without replacement) and every outcome of the
    rule, the first tokens of the decode follow the target's law."""
    target, draft = random_law(seed), random_law(100 + seed)
    law = decoded_law(target, lambda prefix: sampled_trees(SHAPES[shape], draft, prefix), DECODED.get(shape, 4))
    assert law_error(target, law) < 1e-12


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("parents", [SHAPES["chain of 3"], SHAPES["2x2"], [-1, 0, 0, 0, 0]], ids=str)
def test_deterministic_trees_keep_the_targets_law(parents, seed):
    """One-hot drafts (no ``draft_probs``), repeated tokens under one node included (4 children of 3 tokens)."""
    target, draft = random_law(seed), random_law(100 + seed)
    law = decoded_law(target, lambda prefix: deterministic_trees(parents, draft, prefix), 4)
    assert law_error(target, law) < 1e-12


def test_the_with_replacement_update_on_draws_without_replacement_fails_the_exact_check(monkeypatch):
    """Negative control: keeping ``Q`` after a rejection (the update for independently drawn children) is biased on
    children drawn without replacement, so the exact check can fail."""
    monkeypatch.setattr(traversal, "without_token", lambda draft, token: draft)
    target, draft = random_law(0), random_law(100)
    law = decoded_law(target, lambda prefix: sampled_trees(SHAPES["2 children"], draft, prefix), 3)
    assert law_error(target, law) > 1e-3  # 0.007 here


def block_law(targets: torch.Tensor, drafts: torch.Tensor, tokens: list[int]) -> dict[int, torch.Tensor]:
    """Block verification's outcome law on a chain, in ``traversal_law``'s form: per node, the chance [vocab] of
    stopping there and emitting each token."""
    plan = block_plan(targets, drafts, tokens)
    later = [math.prod(1.0 - h for h in plan.stop[i + 1 :]) for i in range(len(plan.stop))]  # no later stop
    return {node: h * later[node] * plan.emit[node] for node, h in enumerate(plan.stop)}


def expected_accepted(target: Law, trees: Iterator[Drafted], accepted: Callable[[DraftTree, torch.Tensor], dict]):
    """Expected drafted tokens accepted in one step from the empty prefix: ``accepted(tree, targets)`` gives each
    node's chance to end the accepted path (or a [vocab] law whose total is that chance)."""
    total = 0.0
    for tree, paths, chance in trees:
        targets = torch.stack([target(path) for path in paths])
        for node, end in accepted(tree, targets).items():
            total += chance * len(paths[node]) * float(torch.as_tensor(end, dtype=torch.float64).sum())
    return total


def multi_candidate_ends(tree: DraftTree, targets: torch.Tensor) -> dict[int, float]:
    """The exact chance that the ``speculative`` rule (multi-candidate rejection, children drawn without replacement,
    one-hot ``Q`` without ``draft_probs``) ends its accepted path at each node."""
    children, ends = tree.children(), {}

    def visit(node: int, reach: float) -> None:
        residual, stay = targets[node], 1.0
        draft = tree.draft_probs[node].double() if tree.draft_probs is not None else None
        for child in children[node]:
            token = tree.tokens[child]
            q = draft if draft is not None else torch.nn.functional.one_hot(torch.tensor(token), VOCAB).double()
            if not q[token] > 0:
                continue
            accept = min(1.0, float(residual[token] / q[token]))
            visit(child, reach * stay * accept)
            stay *= 1.0 - accept
            rest = (residual - q).clamp(min=0.0)
            residual = rest / rest.sum() if rest.sum() > 0 else residual
            if draft is not None and draft[token] < 1:
                draft = draft.clone()
                draft[token] = 0.0
                draft /= draft.sum()
        ends[node] = reach * stay

    visit(0, 1.0)
    return ends


def token_wise_ends(tree: DraftTree, targets: torch.Tensor) -> dict[int, float]:
    """Token-wise speculative sampling on a chain: node i ends the path after i acceptances and a rejection."""
    drafts, ends, kept = tree.draft_probs, {}, 1.0
    assert drafts is not None
    for node in range(1, len(tree)):
        accept = min(1.0, float(targets[node - 1, tree.tokens[node]] / drafts[node - 1, tree.tokens[node]]))
        ends[node - 1] = kept * (1.0 - accept)
        kept *= accept
    ends[len(tree) - 1] = kept
    return ends


def block_ends(tree: DraftTree, targets: torch.Tensor) -> dict[int, torch.Tensor]:
    """``block_law`` of a drafted chain (its leaf's draft row unused)."""
    assert tree.draft_probs is not None
    return block_law(targets, tree.draft_probs[:-1].double(), tree.tokens[1:])


@pytest.mark.parametrize("seed", range(3))
def test_on_a_chain_traversal_verification_is_block_verification(seed):
    """On every drafted chain the outcome law (stop node and emitted token) is block verification's, so the expected
    accepted count is block's, which is at least token-wise speculative sampling's. Exact expected accepted tokens
    from the empty prefix (chain of 3, seeds 0 / 1 / 2): traversal = block 1.3773 / 1.2429 / 0.4945, token-wise
    1.2715 / 1.0875 / 0.4168: traversal and block are equal, neither is larger."""
    target, draft = random_law(seed), random_law(100 + seed)
    parents = SHAPES["chain of 3"]
    for tree, paths, _ in sampled_trees(parents, draft, ()):
        targets = torch.stack([target(path) for path in paths])
        ours, block = traversal_law(tree, targets), block_ends(tree, targets)
        assert ours.keys() == block.keys()
        assert all(torch.allclose(ours[node], block[node], rtol=0, atol=1e-12) for node in ours)
    traversal_count = expected_accepted(target, sampled_trees(parents, draft, ()), traversal_law)
    assert traversal_count == pytest.approx(expected_accepted(target, sampled_trees(parents, draft, ()), block_ends))
    assert traversal_count > expected_accepted(target, sampled_trees(parents, draft, ()), token_wise_ends)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", ["2 children, the first with a child", "a chain that forks", "2x2"])
def test_on_trees_traversal_accepts_at_least_what_multi_candidate_rejection_accepts(shape, seed):
    """The paper proves optimality on chains only; on trees this holds for every shape and seed tested here. Exact
    expected accepted tokens, traversal vs speculative (seeds 0 / 1 / 2): first child with a child 1.1203 vs 1.1178,
    0.8678 vs 0.8304, 0.4860 vs 0.4829; a chain that forks 1.1522 vs 1.1476, 1.0651 vs 0.9487, 0.6357 vs 0.6218;
    2x2 1.1644 vs 1.1598, 0.8915 vs 0.8824, 0.6479 vs 0.6331."""
    target, draft = random_law(seed), random_law(100 + seed)
    trees = lambda: sampled_trees(SHAPES[shape], draft, ())  # noqa: E731
    assert expected_accepted(target, trees(), traversal_law) > expected_accepted(target, trees(), multi_candidate_ends)


@pytest.mark.parametrize("seed", range(3))
def test_one_level_of_children_is_multi_candidate_rejection(seed):
    """With the children of the root only, p of every child starts from 1: the same acceptances as ``speculative``."""
    target, draft = random_law(seed), random_law(100 + seed)
    for tree, paths, _ in sampled_trees(SHAPES["2 children"], draft, ()):
        targets = torch.stack([target(path) for path in paths])
        ours, theirs = traversal_law(tree, targets), multi_candidate_ends(tree, targets)
        assert {node: float(law.sum()) for node, law in ours.items()} == pytest.approx(theirs, abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("parents", [SHAPES["chain of 3"], SHAPES["2x2"]], ids=str)
def test_deterministic_trees_accept_as_much_as_multi_candidate_rejection_and_no_more(parents, seed):
    """One-hot drafts: the most any exact rule can accept is the target's chance of following each drafted path, and
    both rules reach it (so Medusa's and EAGLE-2's trees gain nothing in expectation from traversal verification)."""
    target, draft = random_law(seed), random_law(100 + seed)
    ((_, paths, _),) = deterministic_trees(parents, draft, ())
    ours = expected_accepted(target, deterministic_trees(parents, draft, ()), traversal_law)
    theirs = expected_accepted(target, deterministic_trees(parents, draft, ()), multi_candidate_ends)
    ceiling = sum(math.prod(float(target(path[:i])[x]) for i, x in enumerate(path)) for path in paths[1:])
    assert ours == pytest.approx(ceiling, abs=1e-12) and theirs == pytest.approx(ceiling, abs=1e-12)


def test_the_sampled_rule_draws_from_its_exact_law():
    """``accept_traversal`` with the run's generator, against ``traversal_law`` on a 2x2 tree (chi-square over the
    (end node, token) outcomes, the conformance suite's statistic)."""
    generator = torch.Generator().manual_seed(8)  # laws whose outcomes spread over 3 end nodes
    targets, drafts = torch.randn(2, 7, VOCAB, generator=generator, dtype=torch.float64).softmax(-1)  # [7, VOCAB] each
    tree = DraftTree([0, 0, 1, 1, 2, 0, 2], SHAPES["2x2"], drafts)
    expected = {(node, x): float(law[x]) for node, law in traversal_law(tree, targets).items() for x in range(VOCAB)}
    counts: Counter = Counter()
    for _ in range(4000):
        accepted = accept_traversal(tree, targets.log(), Sampling(temperature=1.0), generator)  # T = 1: P = targets
        counts[(accepted.path[-1], accepted.next_token)] += 1
    _, dof, p_value = conformance.chi_square(counts, expected)
    assert dof >= 6 and p_value > 1e-3, (counts, expected)


def test_a_child_q_gives_no_mass_is_skipped():
    """A repeated token under one node cannot have been drawn without replacement: it is skipped with its subtree."""
    q = torch.tensor([[0.5, 0.5, 0.0]] * 4, dtype=torch.float64)
    tree = DraftTree([0, 1, 1, 2], [-1, 0, 0, 2], q)  # node 2 repeats node 1's token
    targets = torch.full((4, VOCAB), 1.0 / VOCAB, dtype=torch.float64)
    law = traversal_law(tree, targets)
    assert 2 not in law and 3 not in law and sum(float(x.sum()) for x in law.values()) == pytest.approx(1.0)


def test_an_empty_draft_row_at_a_node_with_children_is_refused():
    tree = DraftTree([0, 1], [-1, 0], torch.zeros(2, VOCAB))
    with pytest.raises(ValueError, match="empty row at a node with children"):
        accept_traversal(tree, torch.zeros(2, VOCAB), Sampling(0.7), torch.Generator())


def test_greedy_is_the_match_walk_and_the_registry_names_the_rule():
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        tree = DraftTree.from_paths(0, [torch.randint(VOCAB, (3,), generator=generator).tolist() for _ in range(3)])
        logits = torch.randn(len(tree), VOCAB, generator=generator)
        assert accept_traversal(tree, logits, Sampling()) == accept_match(tree, logits, Sampling())
    assert acceptance_rule("traversal") is accept_traversal
    root = accept_traversal(DraftTree.root_only(2), torch.zeros(1, VOCAB), Sampling(0.7), generator)
    assert root.path == [0] and 0 <= root.next_token < VOCAB


TRAVERSAL = ("method.acceptance=traversal",)


@pytest.mark.parametrize("method", ["spede", "eagle"])
def test_traversal_verification_in_the_loop_samples_the_targets_law(monkeypatch, method):
    """The rule as the loop runs it, 600 draws, the conformance suite's sampling check: SpeDe's sampled chains and
    EAGLE-1's trees of children drawn without replacement (``draft_probs``) at T = 0.7."""
    monkeypatch.setitem(conformance.STAND_IN_OVERRIDES, method, TRAVERSAL)
    result = conformance.run_check(method, "sampling")
    assert result.passed, result.detail


def test_traversal_verification_that_keeps_rejected_tokens_fails_the_law_check(monkeypatch):
    """Negative control: on Medusa's deterministic trees, a rejected token left in its parent's law (``p`` updated,
    ``P`` not) is emitted too often after rejections, which the drafted-token statistic sees."""

    def keeps_token(target, weight, token):
        chance = target.chance(token)
        return weight * (1.0 - chance) / (1.0 - weight * chance) if chance < 1 else 0.0

    monkeypatch.setattr(traversal, "after_one_hot_rejection", keeps_token)
    monkeypatch.setitem(conformance.STAND_IN_OVERRIDES, "medusa", TRAVERSAL)
    result = conformance.run_check("medusa", "sampling")
    assert result.passed is False and "differs from the target" in result.detail, result.detail
