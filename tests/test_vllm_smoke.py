"""engine=vllm with vLLM itself (the environment `make engine-vllm` builds; `make test` builds it first): every
method vLLM runs, on the embedded model in float32, 4 HumanEval prompts x 32 tokens, at batch 1 and 4: outputs equal
to the shared loop's AR token for token, records that add up, and the steps of PLD, Medusa (random heads, written in
vLLM's layout), PARD (the target as its own parallel draft, one of its ids as the mask token), EAGLE-3 (a head
that exits early from the target's layer L - 3) and DFlash (a random drafter, written once for vLLM) equal to the
shared loop's. EAGLE-2's random head (written once, fc's bias moved) checks that vLLM loads it and stays exact; it
accepts almost nothing, so its steps are not compared (tests/test_eagle.py checks the move computes the same head)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.data.base import build_dataset
from specbench.models.eagle3_heads import Eagle3Head, fused_layers, write_head
from specbench.models.eagle_heads import config_for_target
from specbench.models.loading import describe_target, embedded_checkpoint
from specbench.models.pard import MASK_CONFIG_KEY
from specbench.runner import Runner
from specbench.vllm_engine import VLLMEngine, start_vllm, vllm_python
from tests.conftest import ROOT, SHARED_DATA

pytestmark = pytest.mark.slow

PROMPTS = 4
TOKENS = 32
SETTINGS = ("model=smollm2_135m", "dataset=humaneval", f"limit={PROMPTS}", f"max_new_tokens={TOKENS}", "dtype=float32")
SETTINGS = (*SETTINGS, f"data_dir={SHARED_DATA}", "progress=false")
METHODS = {  # each method as vLLM runs it (its `same_when`), so the shared loop's run is the same algorithm
    "ar": (),
    "pld": ("method.drafter.occurrence=first", "method.drafter.continuation=truncate"),
    "suffix_decoding": ("method.drafter.speculation=linear",),
    "spede": ("method.drafter.schedule=constant", "model.draft.source=target"),
    "medusa": ("method.drafter.tree.kind=chain", "model.medusa.source=random", "+model.medusa.num_heads=3"),
    "pard": ("method.drafter.num_draft_tokens=3",),  # and model.pard.path: the folder pard_draft writes
    "eagle2": ("method.drafter.top_k=1", "method.drafter.depth=2", "model.eagle.source=random"),  # fc's bias moved
    "eagle3": ("method.drafter.top_k=1", "method.drafter.depth=2", "model.eagle3.source=hub"),  # + the exit head
    "dflash": ("method.drafter.block_size=4", "model.dflash.source=random"),  # written once for vLLM
}
SAME_STEPS = ("pld", "medusa", "pard", "eagle3", "dflash")
"""The methods whose loop run drafts exactly what vLLM drafts (PLD's cut copies; each Medusa head's top-1 token;
PARD's row argmaxes; the EAGLE-3 head's chain of top-1 tokens; DFlash's block row argmaxes)."""
PARD_MASK = 0
"""The mask token of the stand-in PARD draft (the target itself): an id that its answers do not use."""


@pytest.fixture(scope="module")
def pard_draft(tmp_path_factory) -> Path:
    """The stand-in PARD draft both engines load: the embedded model's files with a mask token in its config."""
    folder = tmp_path_factory.mktemp("pard-draft") / "draft"
    shutil.copytree(embedded_checkpoint(), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, MASK_CONFIG_KEY: PARD_MASK}))
    return folder


@pytest.fixture(scope="module")
def exit_head(tmp_path_factory, embedded) -> Path:
    """The stand-in EAGLE-3 head both engines load: it passes the target's state entering layer L - 3 (the last
    fused layer) through unchanged (attention and MLP outputs zeroed) to the target's own norm and LM head, an
    early exit that predicts the next token often enough for the steps to compare (a random head accepts ~nothing)."""
    target = embedded.model
    torch.manual_seed(0)
    head = Eagle3Head(config_for_target(target), None, target.get_input_embeddings())
    hidden = target.config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()[:, 2 * hidden :] = torch.eye(hidden)  # g_t = the high fused state
        head.midlayer.self_attn.o_proj.weight.zero_()
        head.midlayer.mlp.down_proj.weight.zero_()
        head.norm.weight.copy_(target.model.norm.weight)
        head.lm_head.weight.copy_(target.get_output_embeddings().weight)
    folder = tmp_path_factory.mktemp("eagle3-head")
    write_head(head, folder, str(embedded_checkpoint()), fused_layers(target.config.num_hidden_layers))
    return folder


@pytest.fixture(scope="module")
def part_folders(pard_draft, exit_head) -> dict[str, str]:
    """The folder setting of each method whose stand-in part is written here."""
    return {"pard": f"model.pard.path={pard_draft}", "eagle3": f"model.eagle3.path={exit_head}"}


def method_settings(method: str, part_folders: dict[str, str]) -> tuple[str, ...]:
    """``method`` as vLLM runs it, with its stand-in part's folder."""
    return (*METHODS[method], *((part_folders[method],) if method in part_folders else ()))


@pytest.fixture(scope="module")
def environment():
    """vLLM's environment: `make test` builds it; without it every test here fails, saying how to build it."""
    return vllm_python(compose_config("engine=vllm").engine)


def loop_records(tmp_path_factory, method: str, part_folders: dict[str, str]) -> list[dict]:
    """The shared loop's records of ``method`` (as vLLM runs it) on the smoke prompts."""
    out = tmp_path_factory.mktemp(f"loop-{method}")
    Runner(
        compose_config(*SETTINGS, f"method={method}", *method_settings(method, part_folders), f"output_dir={out}")
    ).run()
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def loop_ar(tmp_path_factory):
    return loop_records(tmp_path_factory, "ar", {})


@pytest.fixture(scope="module")
def prompts():
    """The smoke prompts' token ids, rendered as the runner renders them."""
    cfg = compose_config(*SETTINGS)
    tokenizer = describe_target(cfg.model).tokenizer
    dataset = build_dataset(cfg.dataset, cfg.data_dir)
    return [dataset.prompt_ids(tokenizer, sample, []) for sample in dataset.samples(PROMPTS)]


def served(method: str, part_folders: dict[str, str]) -> VLLMEngine:
    """vLLM started with ``method``'s counterpart."""
    cfg = compose_config(*SETTINGS, "engine=vllm", f"method={method}", *method_settings(method, part_folders))
    target = describe_target(cfg.model)
    return start_vllm(cfg, Sampling(0.0, 1.0), target.eos_ids, target.context_length)


def check_adds_up(gen, method: str) -> None:
    """A generation's per-step record agrees with its output and with what the method can draft."""
    assert len(gen.output_ids) == 1 + sum(gen.accept_lengths) and gen.target_forwards == len(gen.accept_lengths)
    assert all(emitted <= drafted + 1 for emitted, drafted in zip(gen.accept_lengths, gen.draft_tokens, strict=True))
    if method == "ar":
        assert set(gen.accept_lengths) == {1} and set(gen.draft_tokens) == {0}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_vllm_equals_the_shared_loops_ar_at_batch_1_and_4(
    method, environment, loop_ar, prompts, part_folders, tmp_path_factory
):
    """Greedy in float32, every output of every method in vLLM equals the shared loop's AR, alone and batched."""
    engine = served(method, part_folders)
    try:
        generator = torch.Generator()
        batched = engine.generate_batch(prompts, TOKENS, [generator] * len(prompts))
        alone = [engine.generate(prompt, TOKENS, generator) for prompt in prompts]
    finally:
        engine.close()
    for gens in (batched, alone):
        assert [gen.output_ids for gen in gens] == [record["output_ids"] for record in loop_ar]
        for gen in gens:
            check_adds_up(gen, method)
    if method in SAME_STEPS:  # the same algorithm as the loop's: the same steps
        loop = loop_records(tmp_path_factory, method, part_folders)
        assert [gen.accept_lengths for gen in alone] == [record["accept_lengths"] for record in loop]
        assert [gen.accept_lengths for gen in batched] == [record["accept_lengths"] for record in loop]


def test_python_m_specbench_engine_vllm_runs_against_the_server(environment, loop_ar, tmp_path):
    """The README's command, against vLLM's server with 2 requests in flight: the AR's outputs, records that add up
    (the steps from vLLM's per-request record), the load's wall time shared among its 4 requests."""
    out = tmp_path / "pld"
    command = [sys.executable, "-m", "specbench", *SETTINGS, "engine=vllm", "method=pld", "concurrency=2"]
    done = subprocess.run([*command, f"output_dir={out}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [record["output_ids"] for record in records] == [record["output_ids"] for record in loop_ar]
    for record in records:
        assert record["new_tokens"] == 1 + sum(record["accept_lengths"]) and record["step_s"] is None
        assert (record["batch_size"], record["batch_wall_s"]) == (PROMPTS, records[0]["batch_wall_s"])
        assert 0 < record["prefill_s"] < record["wall_s"] <= record["batch_wall_s"]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["engine"]["name"], summary["engine"]["concurrency"]) == ("vllm", 2)
    assert summary["engine"]["engine_args"]["speculative_config"]["method"] == "ngram"
    assert summary["engine"]["vllm"]  # the version vLLM's environment reported
