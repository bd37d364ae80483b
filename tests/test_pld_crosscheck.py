"""The stored cross-check's PLD step differences between the loop and vLLM come from the copy rule alone."""

from __future__ import annotations

import json

from specbench.config import compose_config
from specbench.data.base import build_dataset
from specbench.models.loading import load_tokenizer
from specbench.runner import prompt_sha
from specbench.structures.ngram import PromptLookupIndex
from tests.conftest import ROOT, SHARED_DATA

SESSION = ROOT / "results" / "bench" / "crosscheck" / "smollm2_135m_cpu_float32_20261128T154623Z"


def records(entry: str) -> dict[str, dict]:
    """The session's records of one entry, by sample."""
    lines = (SESSION / entry / "r0" / "samples.jsonl").read_text().splitlines()
    return {record["sample_id"]: record for record in map(json.loads, lines)}


def replayed_steps(prompt: list[int], output: list[int], continuation: str) -> int:
    """Steps PLD (first occurrence, n-gram 3..1, K 10) takes to emit ``output`` after ``prompt``, each step accepting
    the longest prefix of its draft that the output confirms, plus one token; the prefill emits the first."""
    index = PromptLookupIndex(3, 1, "first", continuation)
    index.extend(prompt + output[:1])
    done, steps = 1, 0
    while done < len(output):
        draft = index.lookup(10)[: len(output) - done - 1]  # the loop prunes nodes past the token budget
        accepted = next((i for i, token in enumerate(draft) if token != output[done + i]), len(draft))
        index.extend(output[done : done + accepted + 1])
        done, steps = done + accepted + 1, steps + 1
    return steps


def test_replaying_the_outputs_gives_each_engines_recorded_steps():
    """Repeating copies give the loop's steps and copies cut at the context's end vLLM's, on every prompt."""
    cfg = compose_config("model=smollm2_135m", "dataset=humaneval", f"data_dir={SHARED_DATA}")
    dataset, tokenizer = build_dataset(cfg.dataset, cfg.data_dir), load_tokenizer(cfg.model)
    loop, vllm = records("pld_hf"), records("pld_vllm")
    differing = 0
    for sample in dataset.samples(len(loop)):
        prompt = dataset.prompt_ids(tokenizer, sample, [])
        ours, theirs = loop[sample.sample_id], vllm[sample.sample_id]
        assert prompt_sha(prompt) == ours["prompt_sha"] and ours["output_ids"] == theirs["output_ids"]
        assert replayed_steps(prompt, ours["output_ids"], "repeat") == len(ours["accept_lengths"])
        assert replayed_steps(prompt, ours["output_ids"], "truncate") == len(theirs["accept_lengths"])
        differing += len(ours["accept_lengths"]) != len(theirs["accept_lengths"])
    assert differing == 2  # HumanEval/1 and /9: the rule is what tells them apart
