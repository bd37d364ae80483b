"""Speculative sampling ("speculative" rule): emitted tokens follow the target's joint law exactly.

Rule-level tests use a fake second-order Markov target and draft (logits of the next token given the
last two tokens, from fixed random tables), so thousands of draws need no model forward; each draw
runs propose -> rule steps until it has emitted 2-3 tokens. One test runs the real Decoder on a tiny
model. Every chi-square test has a negative control: the same test at the same sample size must
reject a rule with one deliberate bug.
"""

from __future__ import annotations

from collections import Counter
from itertools import product

import pytest
import torch

from specbench.conformance import chi_square
from specbench.core import speculative
from specbench.core.acceptance import Acceptance, Sampling, accept_match, target_probs
from specbench.core.drafter import Drafter
from specbench.core.loop import Decoder
from specbench.core.rules import acceptance_rule
from specbench.core.speculative import accept_speculative
from specbench.core.tree import DraftTree
from tests.helpers import draw_without_replacement, exact_joint, sampled_outputs

VOCAB = 5
PROMPT = (0, 1)
MIN_P = 1e-3  # a correct rule must pass at this p-value; a broken one must fail
TRIALS = 6000  # per rule-level chi-square test (each emits 2-3 tokens through 1-3 rule steps)
LOOP_TRIALS = 1000  # Decoder.generate calls (each a prefill and one or two tree verifies)


class Markov2:
    """A fake LM over VOCAB tokens whose next-token logits depend on the last two tokens."""

    def __init__(self, seed: int, scale: float, base: Markov2 | None = None, noise: float = 0.0):
        generator = torch.Generator().manual_seed(seed)
        table = torch.randn(VOCAB, VOCAB, VOCAB, generator=generator) * scale  # [prev2, prev1, vocab]
        self.table = base.table + noise * table if base is not None else table
        self.rows = [list(plane) for plane in self.table]  # rows[prev2][prev1]: [vocab] views

    def logits(self, context: list[int]) -> torch.Tensor:
        """Next-token logits [vocab] after ``context``."""
        return self.rows[context[-2]][context[-1]]

    def warped(self, sampling: Sampling):
        """path -> the warped next-token law [vocab] (computed once for every context)."""
        rows = [list(plane) for plane in target_probs(self.table, sampling)]
        return lambda path: rows[path[-2]][path[-1]]

    def tree_logits(self, context: list[int], tree: DraftTree) -> torch.Tensor:
        """What a verify forward returns: row i = logits after context + the path to node i."""
        paths = node_contexts(context, tree)
        return torch.stack([self.logits(path) for path in paths])  # [num_nodes, vocab]

    def joint(self, length: int, sampling: Sampling) -> dict[tuple, float]:
        """Exact probability of every ``length``-token continuation of PROMPT."""
        joint = {}
        for tokens in product(range(VOCAB), repeat=length):
            context, prob = list(PROMPT), 1.0
            for token in tokens:
                prob *= float(target_probs(self.logits(context), sampling)[token])
                context.append(token)
            joint[tokens] = prob
        return joint


TARGET = Markov2(seed=1, scale=1.5)
DRAFT = Markov2(seed=2, scale=1.0, base=TARGET, noise=1.2)  # correlated with the target, not equal


def node_contexts(context: list[int], tree: DraftTree) -> list[list[int]]:
    """The token context that ends at each node (context already ends with the root's token)."""
    paths = [list(context)]
    for token, parent in zip(tree.tokens[1:], tree.parents[1:]):
        paths.append(paths[parent] + [token])
    return paths


def sampled_tree(context: list[int], branching: list[int], draft_row, generator: torch.Generator) -> DraftTree:
    """Children of each node drawn without replacement from ``draft_row(path)`` [vocab], in draw order.

    ``branching[d]`` children per node at depth d; every node's row goes into draft_probs.
    """
    tokens, parents, paths = [context[-1]], [-1], [list(context)]
    rows = [draft_row(paths[0])]
    level = [0]
    for width in branching:
        next_level = []
        for node in level:
            for token in draw_without_replacement(rows[node], width, generator):
                next_level.append(len(tokens))
                tokens.append(token)
                parents.append(node)
                paths.append(paths[node] + [token])
                rows.append(draft_row(paths[-1]))
        level = next_level
    return DraftTree(tokens, parents, torch.stack(rows))  # draft_probs [num_nodes, vocab]


def top_k_tree(draft: Markov2, context: list[int], branching: list[int]) -> DraftTree:
    """A deterministic tree (OPT-Tree style top-k of the raw draft per node); no draft_probs."""
    paths = [[]]
    for width in branching:
        paths = [
            path + [token]
            for path in paths
            for token in draft.logits(list(context) + path).topk(width).indices.tolist()
        ]
    return DraftTree.from_paths(context[-1], paths)


def emitted_counts(rule, propose, target: Markov2, sampling: Sampling, length: int, trials: int, seed: int) -> Counter:
    """Counts of the first ``length`` tokens emitted by repeated propose -> rule steps from PROMPT."""
    generator = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(trials):
        context = list(PROMPT)
        while len(context) < len(PROMPT) + length:
            tree = propose(context, generator)
            context += rule(tree, target.tree_logits(context, tree), sampling, generator).emitted(tree)
        counts[tuple(context[len(PROMPT) : len(PROMPT) + length])] += 1
    return counts


def resample_from_target(target, draft):
    """BUG (negative control): on reject, sample the target again instead of norm(max(0, p - q))."""
    return target


def keep_token(weights, mass, token):
    """BUG (negative control): never remove a tried token (with-replacement draft / no zeroing)."""
    return mass


def check(counts: Counter, expected: dict, bug: str | None, name: str) -> None:
    """Pass a correct rule at MIN_P; reject the deliberately broken one at the same threshold."""
    stat, dof, p_value = chi_square(counts, expected)
    print(f"{name} bug={bug}: chi2={stat:.1f} dof={dof} p={p_value:.3g} n={sum(counts.values())}")
    if bug is None:
        assert p_value > MIN_P, (stat, dof)
    else:
        assert p_value < MIN_P, (stat, dof)


@pytest.mark.parametrize("bug", [None, "positive_part"])
def test_chain_speculative_sampling_is_exact(monkeypatch, bug):
    """(a) Classic speculative sampling on 3-token chains: 3 emitted tokens follow the target."""
    if bug:
        monkeypatch.setattr(speculative, bug, resample_from_target)
    sampling = Sampling(temperature=1.0)
    draft_row = DRAFT.warped(sampling)

    def propose(context, generator):
        return sampled_tree(context, [1, 1, 1], draft_row, generator)

    counts = emitted_counts(accept_speculative, propose, TARGET, sampling, 3, TRIALS, seed=3)
    check(counts, TARGET.joint(3, sampling), bug, "chain")


@pytest.mark.parametrize("bug", [None, "drop_token"])
def test_tree_speculative_sampling_without_replacement_is_exact(monkeypatch, bug):
    """(b) Children drawn without replacement (3 then 2 per node), top-p warping on both sides."""
    if bug:
        monkeypatch.setattr(speculative, bug, keep_token)  # SpecInfer's with-replacement update
    sampling = Sampling(temperature=1.2, top_p=0.95)
    draft_row = DRAFT.warped(sampling)

    def propose(context, generator):
        return sampled_tree(context, [3, 2], draft_row, generator)

    counts = emitted_counts(accept_speculative, propose, TARGET, sampling, 2, TRIALS, seed=4)
    check(counts, TARGET.joint(2, sampling), bug, "tree")


@pytest.mark.parametrize("bug", [None, "drop_token"])
def test_deterministic_multi_candidate_is_exact(monkeypatch, bug):
    """(c) draft_probs None: one-hot multi-candidate rejection (docs/acceptance.md) over top-k tries."""
    if bug:
        monkeypatch.setattr(speculative, bug, keep_token)  # rejected tokens stay in the residual
    sampling = Sampling(temperature=1.2)

    def propose(context, generator):
        return top_k_tree(DRAFT, context, [3, 2])

    counts = emitted_counts(accept_speculative, propose, TARGET, sampling, 2, TRIALS, seed=5)
    check(counts, TARGET.joint(2, sampling), bug, "one-hot")


def test_repeated_child_tokens_are_skipped():
    """Guard: a child repeating an earlier child's token is never accepted; the first token stays exact."""
    sampling = Sampling(temperature=1.0)
    p = torch.tensor([0.1, 0.5, 0.2, 0.2, 0.0])
    q = torch.tensor([0.0, 0.6, 0.3, 0.1, 0.0])
    logits = torch.log(p).expand(4, VOCAB)  # [num_nodes, vocab]
    expected = {(token,): float(prob) for token, prob in enumerate(p)}
    generator = torch.Generator().manual_seed(0)
    for draft_probs in (None, q.expand(4, VOCAB)):
        counts = Counter()
        for _ in range(4000):
            first, second = (1, 2) if draft_probs is None else draw_without_replacement(q, 2, generator)
            tree = DraftTree([0, first, first, second], [-1, 0, 0, 0], draft_probs)  # node 2 repeats node 1
            result = accept_speculative(tree, logits, sampling, generator)
            assert 2 not in result.path
            counts[(result.emitted(tree)[0],)] += 1
        stat, dof, p_value = chi_square(counts, expected)
        print(f"repeated child draft_probs={draft_probs is not None}: chi2={stat:.1f} dof={dof} p={p_value:.3g}")
        assert p_value > MIN_P, (stat, dof)


def test_greedy_is_match_and_registry_names_rules():
    """T = 0 is the greedy argmax walk of ``match``; the rule is registered as "speculative"."""
    assert acceptance_rule("speculative") is accept_speculative
    generator = torch.Generator().manual_seed(0)
    for seed in range(20):
        context = [seed % VOCAB, (seed * 3) % VOCAB]
        tree = sampled_tree(context, [2, 2], DRAFT.warped(Sampling(temperature=1.0)), generator)
        logits = TARGET.tree_logits(context, tree)
        expected = accept_match(tree, logits, Sampling())
        assert accept_speculative(tree, logits, Sampling(), generator) == expected


class RandomQDrafter(Drafter):
    """Draws a random q per node and its children from q without replacement (the loop's generator)."""

    def __init__(self, vocab: int, branching: list[int]):
        super().__init__()
        self.vocab, self.branching = vocab, branching

    def propose(self, ctx):
        def random_q(path):
            return torch.softmax(2 * torch.randn(self.vocab, generator=ctx.generator), -1)  # [vocab]

        return sampled_tree([ctx.root], self.branching, random_q, ctx.generator)


def accept_q_over_p(tree: DraftTree, logits: torch.Tensor, sampling: Sampling, generator) -> Acceptance:
    """BUG (negative control): p and q swapped (accept with q/p, residual max(0, q - p), bonus from q)."""
    swapped = DraftTree(tree.tokens, tree.parents, target_probs(logits, sampling))
    return accept_speculative(swapped, torch.log(tree.draft_probs), Sampling(temperature=1.0), generator)


@pytest.mark.parametrize("rule", [accept_speculative, accept_q_over_p])
def test_loop_with_sampled_draft_trees_follows_target(rule):
    """(d) The whole Decoder (tree verify, rule, KV compaction) with random-q trees: 3-token joint."""
    from tests.conftest import tiny_model

    model = tiny_model(vocab_size=4, seed=7)
    with torch.no_grad():
        model.lm_head.weight.mul_(6)  # peaked target rows so that a wrong rule shows at this size
    sampling = Sampling(temperature=1.0)
    prompt = [0, 1, 2, 3]
    decoder = Decoder(model, RandomQDrafter(4, [2, 1]), frozenset(), sampling, rule)
    generator = torch.Generator().manual_seed(12)
    counts = sampled_outputs(decoder, prompt, 4, generator, LOOP_TRIALS, keep=3)  # 4 tokens: depth-2 trees
    bug = None if rule is accept_speculative else rule.__name__
    check(counts, exact_joint(model, prompt, 3, sampling), bug, "loop")
