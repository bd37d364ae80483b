"""Acceptance rules: greedy walks, exactness of sample-and-match, the top-p warper."""

import pytest
import torch

from specbench.core.acceptance import Sampling, accept_match, target_probs
from specbench.core.tree import DraftTree


def one_hot_logits(rows: list[int], vocab: int = 8) -> torch.Tensor:
    """Logits whose argmax in row i is rows[i]."""
    logits = torch.zeros(len(rows), vocab)
    logits[torch.arange(len(rows)), torch.tensor(rows)] = 5.0
    return logits  # [num_nodes, vocab]


def test_greedy_takes_deepest_matching_branch():
    tree = DraftTree.from_paths(0, [[1, 2, 3], [1, 4], [5]])  # nodes: 0,1,2,3,4,5
    # argmax per node: root->1, node1->4, node2->(unused), node3->(unused), node4->6, node5->(unused)
    result = accept_match(tree, one_hot_logits([1, 4, 0, 0, 6, 0]), Sampling())
    assert result.path == [0, 1, 4]
    assert result.next_token == 6
    assert result.emitted(tree) == [1, 4, 6]


def test_greedy_rejects_everything_when_root_argmax_unmatched():
    tree = DraftTree.chain(0, [1, 2])
    result = accept_match(tree, one_hot_logits([3, 2, 0]), Sampling())
    assert result.path == [0] and result.next_token == 3


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = target_probs(logits, Sampling(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    probs = target_probs(logits, Sampling(temperature=1.0, top_p=0.81))
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)


def test_sample_and_match_reproduces_target_distribution():
    """Two-token outputs drawn through a tree must follow P(a) * P(b|a) exactly (chi-square style bound)."""
    vocab = 4
    generator = torch.Generator().manual_seed(0)
    root_logits = torch.log(torch.tensor([0.1, 0.4, 0.3, 0.2]))
    child_logits = torch.log(torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]]))
    tree = DraftTree.from_paths(9, [[1], [2]])  # drafts 1 and 2 under the root
    logits = torch.stack([root_logits, child_logits[0], child_logits[1]])
    sampling = Sampling(temperature=1.0)
    counts = torch.zeros(vocab)
    trials = 20000
    for _ in range(trials):
        first = accept_match(tree, logits, sampling, generator).emitted(tree)[0]
        counts[first] += 1
    expected = torch.softmax(root_logits, -1) * trials
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 16.3  # 99.9% quantile of chi-square with 3 degrees of freedom
    accepted_two = accept_match(tree, logits, sampling, torch.Generator().manual_seed(1))
    assert len(accepted_two.emitted(tree)) in (1, 2)


def test_acceptance_rule_binds_kwargs_and_rejects_unknown_ones():
    """method.acceptance / acceptance_kwargs resolve to a callable or a one-line ConfigError."""
    from specbench.core.rules import acceptance_rule
    from specbench.errors import ConfigError

    assert acceptance_rule("match") is accept_match
    with pytest.raises(ConfigError, match="must be one of"):
        acceptance_rule("nope")
    with pytest.raises(ConfigError, match="not accepted by rule 'match'"):
        acceptance_rule("match", {"epsilon": 0.1})
    with pytest.raises(ConfigError, match="posterior_threshold"):
        acceptance_rule("typical", {"posterior_threshold": 2.0})  # caught at startup, not at step 1
