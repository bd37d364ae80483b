"""The compiled path (specbench.core.compiled): padded layouts, the static cache, exactness, compilations counted.

Graphs are compiled with torch.compile's ``aot_eager`` backend (traced as in runs, no code generation: inductor's
C++ compile costs minutes per bucket on 2 cores), except ``test_inductor_compiled_decoding_equals_eager``, which
runs inductor itself on two small buckets. The conformance suite's ``compiled`` check runs every method.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from specbench import runner as runner_module
from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.core.compiled import CompiledVerifier, compilations
from specbench.core.loop import Decoder
from specbench.core.tree import AuxBlock, DraftTree, flatten
from specbench.core.verify import compact_cache, forward_tree, new_cache, prefill
from specbench.drafters.ar import NoDraft
from specbench.drafters.pld import PromptLookup
from specbench.report.compare import match_ar
from specbench.report.read import load
from specbench.runner import Runner, config_digest
from tests.conftest import tiny_model

CPU = torch.device("cpu")
BUCKETS = (1, 4, 16)


@pytest.fixture(scope="module")
def model():
    """A tiny random Llama of its own (its graphs are this module's), context 2048 for large caches."""
    return tiny_model(max_position_embeddings=2048)


@pytest.fixture(scope="module")
def verifier(model):
    return CompiledVerifier(model, BUCKETS, backend="aot_eager")


def test_a_padded_layout_masks_the_padding():
    """With a shape, the tree's rows see what they see unpadded (and no padding, no stale rows); a padding row sees
    only itself, at the root's position with token 0."""
    tree = DraftTree.from_paths(5, [[6, 7], [8]])
    tree.aux = AuxBlock(torch.tensor([11, 12]), torch.tensor([1, 2]), torch.tril(torch.ones(2, 2, dtype=torch.bool)))
    plain = flatten(tree, 3, torch.float32, CPU)
    padded = flatten(tree, 3, torch.float32, CPU, shape=(8, 16))
    assert padded.attention_mask.shape == (1, 1, 8, 16) and padded.input_ids.shape == (1, 8)
    q = plain.input_ids.shape[1]  # 4 tree rows + 2 aux rows
    torch.testing.assert_close(padded.attention_mask[0, 0, :q, : 3 + q], plain.attention_mask[0, 0])
    blocked = torch.finfo(torch.float32).min
    assert (padded.attention_mask[0, 0, :q, 3 + q :] == blocked).all()
    for row in range(q, 8):
        seen = (padded.attention_mask[0, 0, row] == 0).nonzero().flatten().tolist()
        assert seen == [0, 1, 2, 3 + row]  # the cache and itself
    assert padded.input_ids[0, q:].tolist() == [0, 0] and padded.position_ids[0, q:].tolist() == [3, 3]
    with pytest.raises(ValueError, match="does not fit"):
        flatten(tree, 3, torch.float32, CPU, shape=(4, 16))


def random_tree(rng: random.Random, size: int, vocab: int) -> DraftTree:
    return DraftTree([rng.randrange(vocab) for _ in range(size)], [-1] + [rng.randrange(i) for i in range(1, size)])


@pytest.mark.parametrize("seed", range(3))
def test_compiled_verify_and_compaction_equal_eager(model, verifier, seed):
    """Two steps of random trees: the compiled forward's logits and hidden rows equal the eager ones, and after both
    paths keep the same accepted rows the next step does too (compaction in the static cache equals the eager one)."""
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prompt = torch.tensor([rng.randrange(vocab) for _ in range(rng.randrange(3, 30))])
    with torch.inference_mode():
        static, dynamic = verifier.cache_for(len(prompt) + 40), new_cache(model)
        prefill(model, static, prompt)
        prefill(model, dynamic, prompt)
        past = len(prompt)
        for size in (rng.randrange(1, 17), rng.randrange(1, 17)):
            tree = random_tree(rng, size, vocab)
            out = verifier.verify(static, tree, (-1, 1), verifier.lay_out(tree, past))
            ref = forward_tree(model, dynamic, tree, (-1, 1))
            torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.hidden, ref.hidden, atol=1e-5, rtol=1e-5)
            path = tree.path_to(size - 1)
            compact_cache(static, past, path)
            compact_cache(dynamic, past, path)
            past += len(path)


def test_a_larger_cache_compiles_nothing_again(model, verifier):
    """The cache's rows are a dynamic dimension: decoding on a cache of other rows reuses the bucket's graph."""
    with torch.inference_mode():
        verifier.warm_up(16)
        before, rows = compilations(), verifier.rows
        decoder = Decoder(model, NoDraft(), frozenset(), Sampling(), verifier=verifier)
        decoder.generate([token % model.config.vocab_size for token in range(600)], 8)
    assert verifier.rows > rows and compilations() == before


def test_inductor_compiled_decoding_equals_eager():
    """inductor itself (the backend of runs), on buckets 1 and 16: AR and PLD greedy equal eager AR token for
    token, on a prompt that makes PLD draft."""
    target = tiny_model(seed=3, max_position_embeddings=1024)
    compiled = CompiledVerifier(target, (1, 16))
    prompt = [5, 6, 7, 8, 9] * 4 + [5, 6]
    with torch.inference_mode():
        truth = Decoder(target, NoDraft(), frozenset(), Sampling()).generate(prompt, 24).output_ids
        for drafter in (NoDraft(), PromptLookup()):
            gen = Decoder(target, drafter, frozenset(), Sampling(), verifier=compiled).generate(prompt, 24)
            assert gen.output_ids == truth, type(drafter).__name__
    assert gen.target_forwards < 23  # PLD's drafts were verified (and accepted) on the compiled path


def test_a_drafter_that_needs_the_dynamic_cache_is_refused_by_the_compiled_loop(model, verifier):
    """The loop never hands the static cache to a drafter that runs the target on ctx.cache."""

    class SelfSpeculating(NoDraft):
        needs_dynamic_cache = True

    with pytest.raises(Exception, match="cannot run compiled"):
        Decoder(model, SelfSpeculating(), frozenset(), Sampling(), verifier=verifier)


TINY_RUN = ["model=tiny_llama", "max_new_tokens=10", "progress=false", "data_dir=null"]


def test_compile_decides_the_digest_and_folder_only_when_on():
    """compile=false and auto on CPU keep the digest and folder an eager run had before the setting existed; true
    gives both their own (so the two paths' runs never share a folder)."""
    base = compose_config(*TINY_RUN)
    digests = {
        setting: config_digest(compose_config(*TINY_RUN, f"compile={setting}"), CPU, torch.float32)
        for setting in ("false", "auto", "true")
    }
    stored = OmegaConf.to_container(compose_config(*TINY_RUN), resolve=True)
    del stored["compile"]  # a resolved config from before the setting
    stored = OmegaConf.create(stored)
    assert digests["false"] == digests["auto"] == config_digest(stored, CPU, torch.float32)
    assert digests["true"] != digests["false"]
    assert compose_config(*TINY_RUN, "compile=true").output_dir == base.output_dir + "-compiled"
    assert compose_config(*TINY_RUN, "compile=true", "device=cpu", "compile=auto").output_dir == base.output_dir
    with pytest.raises(Exception, match="compile must be true, false or auto"):
        Runner(compose_config(*TINY_RUN, "compile=sometimes"))


def test_a_compiled_run_compiles_before_timing_and_pairs_with_its_path(tmp_path, monkeypatch):
    """compile=true: every bucket compiled before the first timed sample (none inside one), outputs equal the eager
    run's; the report pairs each run with the AR run of its path, or with eager AR when asked; Draft&Verify runs eager
    and its summary says why."""
    monkeypatch.setattr(
        runner_module, "compiled_verifier", lambda target: CompiledVerifier(target, BUCKETS, "aot_eager")
    )
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hello.\nName a color.\n")
    common = [*TINY_RUN, "dataset=jsonl", f"dataset.path={prompts}", "limit=2"]
    outs = {}
    for method in ("ar", "pld", "draft_verify"):
        for setting in ("false", "true"):
            out = tmp_path / f"{method}-{setting}"
            cfg = compose_config(*common, f"method={method}", f"compile={setting}", f"output_dir={out}")
            outs[method, setting] = str(Runner(cfg).run())
    summaries = {key: json.loads(Path(out, "summary.json").read_text()) for key, out in outs.items()}
    compiled = summaries["pld", "true"]["compile"]
    assert compiled["compiled"] and compiled["buckets"] == list(BUCKETS) and compiled["timed_compilations"] == 0
    assert compiled["compile_s"] > 0
    eager = summaries["draft_verify", "true"]["compile"]
    assert not eager["compiled"] and "needs_dynamic_cache" in eager["eager_because"]
    assert all(summary["metrics"]["bandwidth_share"] > 0 for summary in summaries.values())
    runs, samples = load(list(outs.values()))
    same = match_ar(runs, samples).set_index("run_dir")
    against_eager = match_ar(runs, samples, against="eager").set_index("run_dir")
    assert same.loc[outs["pld", "true"], "ar_run_dir"] == outs["ar", "true"]
    assert same.loc[outs["pld", "false"], "ar_run_dir"] == outs["ar", "false"]
    assert same.loc[outs["draft_verify", "true"], "ar_run_dir"] == outs["ar", "false"]  # it ran eager
    assert (against_eager["ar_run_dir"] == outs["ar", "false"]).all()
    assert (against_eager["exact_match_rate"] == 1.0).all()  # every output, either path, equals eager AR's
