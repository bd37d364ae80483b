"""Medusa typical acceptance ("typical" rule): threshold formula, fast mode, sampled mode, lossiness."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch
from omegaconf import OmegaConf

from specbench.conformance import chi_square
from specbench.core.acceptance import Sampling, accept_match
from specbench.core.rules import acceptance_rule
from specbench.core.tree import DraftTree
from specbench.core.typical import accept_typical, typical_probs, typical_threshold
from specbench.errors import ConfigError
from tests.conftest import ROOT

T1 = Sampling(temperature=1.0)


def medusa_threshold(probs: list[float], epsilon: float = 0.09, delta: float = 0.3) -> float:
    """The paper's min(epsilon, delta * exp(-H)), with Medusa's H = -sum p log(p + 1e-5), in plain Python."""
    entropy = -sum(p * math.log(p + 1e-5) for p in probs)
    return min(epsilon, delta * math.exp(-entropy))


def rows_from_probs(rows: list[list[float]]) -> torch.Tensor:
    """Logits [num_nodes, vocab] whose softmax at T=1 is ``rows``."""
    return torch.log(torch.tensor(rows))


@pytest.mark.parametrize("probs", [[0.25] * 4, [0.97, 0.01, 0.01, 0.01], [0.6, 0.3, 0.06, 0.04]])
def test_threshold_formula(probs):
    got = typical_threshold(torch.tensor(probs), 0.09, 0.3)
    assert float(got) == pytest.approx(medusa_threshold(probs), rel=1e-5)
    assert float(typical_threshold(torch.tensor(probs), 0.5, 1.0)) == pytest.approx(
        medusa_threshold(probs, 0.5, 1.0), rel=1e-5
    )


def test_threshold_uses_entropy_branch_for_flat_rows():
    """Uniform over 4: H ~ log 4, so delta * exp(-H) ~ 0.075 < epsilon = 0.09."""
    assert float(typical_threshold(torch.full((4,), 0.25), 0.09, 0.3)) == pytest.approx(0.3 / 4, rel=1e-3)


def test_fast_mode_picks_deepest_typical_path_then_likelihood():
    # nodes: 0 root, 1 '1', 2 '1 2', 3 '3', 4 '3 4', 5 '3 5'
    tree = DraftTree.from_paths(9, [[1, 2], [3, 4], [3, 5]])
    rows = [
        [0.05, 0.5, 0.05, 0.3, 0.05, 0.05],  # root: tokens 1 (0.5) and 3 (0.3) pass (threshold 0.09)
        [0.9, 0.02, 0.02, 0.02, 0.02, 0.02],  # after '1': token 2 at 0.02 fails
        [1 / 6] * 6,
        [0.05, 0.05, 0.025, 0.025, 0.4, 0.45],  # after '3': tokens 4 (0.4) and 5 (0.45) pass
        [1 / 6] * 6,
        [0.1, 0.1, 0.5, 0.1, 0.1, 0.1],  # after '3 5': argmax 2 is the emitted token
    ]
    result = accept_typical(tree, rows_from_probs(rows), T1)
    assert result.path == [0, 3, 5]  # depth 2 beats the likelier depth-1 '1'; 0.45 beats 0.4
    assert result.next_token == 2


def test_fast_mode_stops_at_root_and_emits_argmax():
    tree = DraftTree.from_paths(9, [[4], [3]])
    rows = [[0.7, 0.2, 0.05, 0.03, 0.02]] * 3  # tokens 3, 4 are below the 0.09 threshold
    result = accept_typical(tree, rows_from_probs(rows), T1)
    assert result.path == [0] and result.next_token == 0


def test_fast_mode_threshold_is_strict():
    """A token exactly at the threshold is rejected (Medusa's ``>``), just above it is accepted."""
    tree = DraftTree.chain(9, [1])
    logits = rows_from_probs([[0.9, 0.1], [0.5, 0.5]])  # low entropy: epsilon binds
    p_child = float(torch.softmax(logits[0], -1)[1])
    assert accept_typical(tree, logits, T1, posterior_threshold=p_child).path == [0]
    assert accept_typical(tree, logits, T1, posterior_threshold=0.999 * p_child).path == [0, 1]


def random_case(rng: random.Random, vocab: int = 8) -> tuple[DraftTree, torch.Tensor]:
    """A random trie that shares a prefix with the greedy path, and its per-node logits [n, vocab].

    Logits are a seeded permutation of 0..vocab-1 per context, so the argmax is unique (gaps >= 1).
    """
    seed = rng.randrange(10**6)

    def logits_after(path: list[int]) -> torch.Tensor:
        generator = torch.Generator().manual_seed(hash((seed, *path)) % 2**31)
        return torch.randperm(vocab, generator=generator).float()  # [vocab]

    greedy = []
    for _ in range(3):
        greedy.append(int(logits_after(greedy).argmax()))
    paths = [
        greedy[: rng.randrange(4)] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 3))]
        for _ in range(rng.randrange(1, 5))
    ]
    tree = DraftTree.from_paths(0, paths)
    node_paths = [[]]
    for token, parent in zip(tree.tokens[1:], tree.parents[1:]):
        node_paths.append(node_paths[parent] + [token])
    return tree, torch.stack([logits_after(path) for path in node_paths])


@pytest.mark.parametrize("mode", ["fast", "sampled"])
def test_reduces_to_greedy_match(mode):
    """T = 0 is ``match``'s greedy walk; T = 1e-3 on the same logits gives the same path and token."""
    rng = random.Random(0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        tree, logits = random_case(rng)
        greedy = accept_match(tree, logits, Sampling())
        assert accept_typical(tree, logits, Sampling(), generator, mode=mode) == greedy
        cold = accept_typical(tree, logits, Sampling(temperature=1e-3), generator, mode=mode)
        assert cold == greedy


def test_sampled_mode_is_exact_for_the_truncated_law_and_lossy_for_the_target():
    """Sampled mode samples P_T restricted to the typical set: tokens below the threshold never appear."""
    probs = [0.6, 0.3, 0.06, 0.04]  # threshold 0.09: tokens 2 and 3 are cut
    tree = DraftTree.from_paths(9, [[1], [2]])  # a typical child and a cut one
    logits = rows_from_probs([probs] * 3)
    truncated = typical_probs(logits[0], T1, 0.09, 0.3).tolist()
    assert truncated == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])
    generator = torch.Generator().manual_seed(0)
    counts = Counter()
    for _ in range(3000):
        result = accept_typical(tree, logits, T1, generator, mode="sampled")
        assert 2 not in result.path
        counts[(result.emitted(tree)[0],)] += 1
    stat, dof, p_value = chi_square(counts, {(t,): p for t, p in enumerate(truncated)})
    print(f"typical sampled vs truncated law: chi2={stat:.2f} dof={dof} p={p_value:.3g}")
    assert p_value > 1e-3
    stat, dof, p_value = chi_square(counts, {(t,): p for t, p in enumerate(probs)})
    print(f"typical sampled vs target law: chi2={stat:.2f} dof={dof} p={p_value:.3g}")
    assert p_value < 1e-3  # lossy: the same counts reject the target's own law


def test_fast_mode_is_deterministic_hence_lossy():
    """No random draw: at T = 1 the emitted token is always the argmax, never a target sample."""
    logits = rows_from_probs([[0.4, 0.35, 0.25]])
    tokens = {
        accept_typical(DraftTree.root_only(0), logits, T1, torch.Generator().manual_seed(s)).next_token
        for s in range(20)
    }
    assert tokens == {0}


def test_configs_using_typical_declare_lossless_false():
    """Every method config whose rule is lossy says so (the report must not call it lossless)."""
    configs = [OmegaConf.load(path) for path in sorted((ROOT / "conf" / "method").glob("*.yaml"))]
    typical = [cfg for cfg in configs if cfg.get("acceptance") == "typical"]
    assert typical, "no method config uses acceptance=typical"
    for cfg in typical:
        assert cfg.lossless is False, cfg.name


def test_kwargs_are_bound_and_checked():
    rule = acceptance_rule("typical", {"posterior_threshold": 0.05, "posterior_alpha": 0.2, "mode": "sampled"})
    tree = DraftTree.chain(0, [1])
    assert rule(tree, rows_from_probs([[0.5, 0.5]] * 2), Sampling(), None).path == [0]
    with pytest.raises(ConfigError, match="not accepted by rule 'typical'"):
        acceptance_rule("typical", {"epsilon": 0.1})
    for bad in ({"posterior_threshold": 1.5}, {"posterior_alpha": -0.1}, {"mode": "slow"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            acceptance_rule("typical", bad)(tree, rows_from_probs([[0.5, 0.5]] * 2), T1, None)
