"""Reduced draft vocabularies: the ranking, the reduced output layer, drafters that draft only kept tokens and
still equal AR, the clear errors, and ``python -m specbench.train vocab``."""

from __future__ import annotations

import json
import random

import pytest
import torch
from omegaconf import OmegaConf

from specbench.conformance import chi_square
from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.core.rules import acceptance_rule
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.eagle import Eagle, Eagle2, Eagle3, EagleOptTree
from specbench.drafters.medusa import Medusa
from specbench.drafters.opt_tree import OptTree
from specbench.drafters.spede import SpeDe
from specbench.errors import ConfigError, ModelUnavailable
from specbench.models.medusa_heads import MedusaHeads
from specbench.models.parts import part_kind
from specbench.models.vocab import RANKING_FILE, ReducedHead, load_ranking, most_frequent, place_in_vocab
from specbench.train import vocab as train_vocab
from tests.conftest import tiny_model
from tests.helpers import exact_joint, sampled_outputs
from tests.test_eagle import MIN_P, TEMP, TRIALS
from tests.test_loop import ar_greedy

VOCAB = 97  # the tiny model's
KEPT = 24  # draft vocabulary of the drafter tests
HEAD = {"source": "random", "seed": 0}
SELF = {"source": "target"}  # the draft-model methods draft with the target itself
DRAFTERS = {
    "eagle": lambda n: Eagle(head=OmegaConf.create(HEAD), target_name="tiny", draft_vocab=n),
    "eagle2": lambda n: Eagle2(
        head=OmegaConf.create(HEAD), top_k=4, depth=3, total_tokens=12, target_name="tiny", draft_vocab=n
    ),
    "opt_tree_eagle": lambda n: EagleOptTree(
        head=OmegaConf.create(HEAD), nodes=8, threshold=0.0, target_name="tiny", draft_vocab=n
    ),
    "medusa": lambda n: Medusa(
        OmegaConf.create({**HEAD, "num_heads": 3}),
        "tiny",
        OmegaConf.create({"kind": "dense", "sizes": [3, 2, 1]}),
        draft_vocab=n,
    ),
    "spede": lambda n: SpeDe(num_assistant_tokens=4, draft=OmegaConf.create(SELF), target_name="tiny", draft_vocab=n),
    "opt_tree": lambda n: OptTree(
        nodes=10, threshold=0.1, draft=OmegaConf.create(SELF), target_name="tiny", draft_vocab=n
    ),
}


def write_ranking(counts: dict[int, int], name: str = "tiny") -> None:
    """A ranking file as ``python -m specbench.train vocab`` writes it (under the test's SPECBENCH_CACHE)."""
    folder = part_kind("vocab").folder(name)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"digest": "d" * 16, "counts": sorted(counts.items(), key=lambda item: (-item[1], item[0]))}
    (folder / RANKING_FILE).write_text(json.dumps(record))


@pytest.fixture
def ranking(tmp_path, monkeypatch) -> set[int]:
    """A saved ranking for target ``tiny`` whose KEPT most frequent tokens are the odd ids from 1 up."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    write_ranking({token: 1000 - token for token in range(1, VOCAB, 2)})
    return set(range(1, 2 * KEPT, 2))


def test_most_frequent_ranks_by_count_then_id_and_fills_unseen_by_id():
    counts = {5: 3, 2: 3, 9: 1, 40: 7}
    assert most_frequent(counts, 2, 50).tolist() == [2, 40]  # 40 (7), then 2 before 5 (a tie, by id)
    assert most_frequent(counts, 6, 50).tolist() == [0, 1, 2, 5, 9, 40]  # all seen, then the lowest unseen ids
    assert most_frequent(counts, 50, 50) is None and most_frequent(counts, None, 50) is None
    assert most_frequent({99: 5, 3: 1}, 1, 50).tolist() == [3]  # ids beyond the vocabulary are ignored


def test_reduced_head_equals_the_full_layer_on_kept_tokens_and_is_minus_inf_elsewhere():
    torch.manual_seed(0)
    weight, hidden = torch.randn(30, 8), torch.randn(4, 8)  # [vocab, H], [k, H]
    tokens = torch.tensor([1, 4, 7, 29])
    logits = ReducedHead(weight, tokens)(hidden)  # [k, vocab]
    full = hidden @ weight.T
    assert logits.shape == (4, 30) and logits.dtype == torch.float32
    torch.testing.assert_close(logits[:, tokens], full[:, tokens])
    others = torch.ones(30, dtype=torch.bool).index_fill_(0, tokens, False)
    assert torch.isneginf(logits[:, others]).all()
    assert (
        place_in_vocab(torch.zeros(2, 3), torch.tensor([0, 2, 5]), 6).tolist()
        == [[0, -torch.inf, 0, -torch.inf, -torch.inf, 0]] * 2
    )


def test_medusa_heads_with_their_own_output_layers_keep_their_rows():
    torch.manual_seed(0)
    heads = MedusaHeads(16, 40, num_heads=2).eval()
    hidden = torch.randn(16)
    full = heads(hidden)  # [K, vocab]
    tokens = torch.tensor([0, 3, 39])
    heads.restrict_vocabulary(tokens)
    reduced = heads(hidden)
    torch.testing.assert_close(reduced[:, tokens], full[:, tokens])
    assert torch.isneginf(reduced[:, 1]).all()


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_drafts_use_only_kept_tokens_and_greedy_output_equals_ar(tiny, ranking, name, monkeypatch):
    drafter = DRAFTERS[name](KEPT)
    drafter.setup(tiny, None)
    drafted: list[int] = []
    propose = type(drafter).propose

    def spy(self, ctx):
        tree = propose(self, ctx)
        drafted.extend(tree.tokens[1:])
        return tree

    monkeypatch.setattr(type(drafter), "propose", spy)
    rng = random.Random(0)
    for _ in range(2):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(3, 15))]
        with torch.inference_mode():
            out = Decoder(tiny, drafter, frozenset(), Sampling()).generate(prompt, 30)
        assert out.output_ids == ar_greedy(tiny, prompt, 30).output_ids
    assert drafted and set(drafted) <= ranking  # the restriction is real: no drafted token outside the kept set
    assert f"vocab:{'d' * 16}:{KEPT}" in drafter.artefacts()  # a resumed run with another vocabulary is refused


def test_the_full_vocabulary_is_the_default_and_records_nothing(tiny):
    drafter = DRAFTERS["spede"](None)
    drafter.setup(tiny, None)
    assert isinstance(drafter, DraftModelDrafter) and drafter.lm is not None and drafter.lm.output is None
    assert not any(part.startswith("vocab:") for part in drafter.artefacts())


def test_missing_ranking_says_how_to_count_it(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(ModelUnavailable, match=r"python -m specbench.train vocab model=tiny"):
        DRAFTERS["eagle2"](KEPT).setup(tiny, None)
    with pytest.raises(ModelUnavailable, match="draft_vocab"):
        load_ranking("tiny")


def test_bad_sizes_and_eagle3_are_refused(tiny, ranking):
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match=r"method.drafter.draft_vocab \(N\) must be an integer >= 1"):
            DRAFTERS["medusa"](bad)
    with pytest.raises(ConfigError, match="its own draft vocabulary"):
        Eagle3(head=OmegaConf.create(HEAD), target_name="tiny", draft_vocab=KEPT).setup(tiny, None)


def test_train_vocab_counts_the_self_distilled_answers(training_cache, shared_data, capsys):
    path = train_vocab.main(
        [
            "model=tiny_llama",
            "device=cpu",
            "prompts.max_prompts=3",
            "prompts.max_new_tokens=5",
            f"data_dir={shared_data}",
            "progress=false",
        ]  # fmt: skip
    )
    record = json.loads(path.read_text())
    assert path == part_kind("vocab").folder("tiny_llama") / RANKING_FILE
    assert sum(n for _, n in record["counts"]) == record["data_summary"]["answer_tokens"] == 15
    counts = [n for _, n in record["counts"]]
    assert counts == sorted(counts, reverse=True)
    ranking = load_ranking("tiny_llama")
    assert ranking.digest == record["digest"] and sum(ranking.counts.values()) == 15
    assert "distinct tokens in 15 answer tokens" in capsys.readouterr().out


SAMPLED = {  # drafters that draw their drafts from q at T > 0: q is the softmax over the kept tokens
    "eagle": lambda: Eagle(
        head=OmegaConf.create({"source": "random", "seed": 4}),
        shape="paths",
        nodes=None,
        paths=[[0], [0, 0]],
        target_name="tiny",
        draft_vocab=1,
    ),
    "spede": lambda: SpeDe(num_assistant_tokens=3, draft=OmegaConf.create(SELF), target_name="tiny", draft_vocab=1),
}


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_sampled_outputs_follow_the_target_with_one_kept_token(name, tmp_path, monkeypatch):
    """T > 0 (2-token vocabulary, one kept): every draft is token 1, and outputs still follow the target's law."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    write_ranking({1: 5})
    target = tiny_model(vocab_size=2, seed=5, hidden_size=16, num_hidden_layers=1, intermediate_size=32)
    with torch.no_grad():
        target.lm_head.weight.mul_(8)  # peaked, so drafts of token 1 are often accepted and often rejected
    sampling = Sampling(temperature=TEMP)
    prompt = [0, 1, 1]
    drafter = SAMPLED[name]()
    drafter.setup(target, None)
    decoder = Decoder(target, drafter, frozenset(), sampling, acceptance_rule("speculative"))
    counts = sampled_outputs(decoder, prompt, 4, torch.Generator().manual_seed(0), trials=TRIALS)
    assert drafter.stats()["drafted_per_step"] >= 1
    _, _, p_value = chi_square(counts, exact_joint(target, prompt, 4, sampling))
    assert p_value > MIN_P
