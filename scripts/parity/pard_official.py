"""Run the official PARD loop (AMD-AGI/PARD at the pinned commit, ``pard/pard_infer.py``) on given token prompts.

Runs inside the side env ``.venv-parity-pard`` (transformers 4.51.3, the commit's pin), never in specbench's env.
Called by ``python -m specbench.parity pard`` with a job file; prints one JSON object (the contract of
``specbench.parity.stepwise``, with the tokens of the official first forward apart):

    job    = {"source", "model_dir", "max_new_tokens", "eos_ids",
              "cases": [{"label", "draft_k", "draft_dir"}], "prompts": [{"id", "ids"}]}
    output = {"versions", "patches",
              "records": [{"case", "id", "steps", "prefill_emitted", "emitted", "output_ids", "stop"}],
              "ar": {id: output_ids}}

The official ``PardInfer.generate`` runs every prompt of a case in one call, in parallel-draft mode (``para``), with
``draft_k`` = the case's K, eager (``nc``). Its first target forward is the prefill and verifies the K tokens the
draft drafted from the prompt; every later forward verifies the last committed token and K drafts. Each forward
commits the accepted drafts and the target's next token, which the loop logs as ``[accept token num]``:
``prefill_emitted`` = the first forward's count, ``emitted`` = the later ones (``steps`` of them), ``output_ids`` = the
committed tokens, so ``len(output_ids) == prefill_emitted + sum(emitted)``.
"""

from __future__ import annotations

import functools
import json
import sys
import types

from medusa_official import StandInTokenizer
from official_output import checkout_module, greedy_references, print_output, rope_from_v5

PATCHES = [
    "device and dtype: `torch.cuda.synchronize` (called by `speed_logger` at every phase) is a no-op on this "
    "CPU-only machine; `PardInfer.model_init` loads both models on CPU (its `device` argument, `cuda` by default) "
    "in float32 (`get_model` is called with float32, not the class's bfloat16); eager (`nc`), no torch.compile",
    "config: transformers 4.51 does not read the `rope_parameters` dict that the embedded checkpoint's and the "
    "draft's config.json (written by transformers 5) hold and would run at rope_theta=10000; the module's "
    "`AutoModelForCausalLM` is given each folder's config with rope_theta (and rope_scaling=None) set from it",
    "prompts: `PardInfer.get_input` (chat template, tokenizer, `.cuda()`) returns the job's token ids instead, so "
    "`generate` runs on specbench's prompts; `get_model`'s `AutoTokenizer` is a stand-in with the job's EOS id "
    "(the loop uses it for `eos_token_id` and for one `decode` per prompt)",
    "settings (no patch): `para` (parallel drafting) on, `draft_k` = the case's K, `tokens` = `max_new_tokens`, `nc` "
    "(no compile); `max_cache_len` (the static caches' length, by default `tokens`; the loop stops 32 tokens short "
    "of it) = the longest prompt + `max_new_tokens` + 64, so only `tokens` stops a generation",
    "counting: a loguru sink collects the loop's own `[accept token num]: n` lines (its stdout sink is removed: "
    "stdout carries the JSON); the stand-in tokenizer's `decode`, called once per prompt on the whole sequence, "
    "records the committed tokens. The AR reference is transformers 4.51's greedy `generate` on the same target",
]


def import_official(source: str) -> types.ModuleType:
    """``pard.pard_infer`` from the checkout, with CUDA synchronisation a no-op and its stdout log sink removed."""
    official = checkout_module(source, "pard.pard_infer")
    official.logger.remove()  # patch: stdout carries the JSON
    return official


def load_config(path: str):
    """A folder's config as transformers 4.51 reads it, with the rope theta of the 5.x file."""
    from transformers import AutoConfig

    return rope_from_v5(AutoConfig.from_pretrained(path))  # patch: rope_theta from the transformers-5 file


class ConfiguredAuto:
    """Stands in for ``AutoModelForCausalLM`` in the official module: the same load, with ``load_config``'s config."""

    @staticmethod
    def from_pretrained(path: str, **kwargs):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, config=load_config(path), **kwargs)


class RecordingTokenizer(StandInTokenizer):
    """The stand-in tokenizer whose ``decode`` (called once per prompt, on prompt + output) records the sequence
    and how many forwards were logged by then."""

    def __init__(self, eos_id: int, counts: list[int]):
        super().__init__(eos_id)
        self.counts = counts
        self.sequences: list[list[int]] = []
        self.ends: list[int] = []

    def decode(self, ids, *args, **kwargs) -> str:
        self.sequences.append(ids.tolist())
        self.ends.append(len(self.counts))
        return ""


def patch(official: types.ModuleType, eos_id: int) -> None:
    """The run-time patches on the official module (see PATCHES)."""
    import torch

    infer = official.PardInfer
    infer.model_init = functools.partialmethod(infer.model_init, device="cpu")
    infer.get_input = lambda self, prompt, tokenizer, prompt_type: ("", torch.tensor([prompt]))
    official.AutoModelForCausalLM = ConfiguredAuto
    official.AutoTokenizer = StandInTokenizer(eos_id)


def run_case(official: types.ModuleType, job: dict, case: dict) -> tuple[list[dict], object]:
    """Every prompt of one case through one official ``generate`` call; the records and the official target."""
    import torch

    prompts = job["prompts"]
    cache_len = max(len(p["ids"]) for p in prompts) + job["max_new_tokens"] + 64
    infer = official.PardInfer(
        draft_k=case["draft_k"],
        tokens=job["max_new_tokens"],
        draft=case["draft_dir"],
        target=job["model_dir"],
        benchmark=None,
        para=True,
        nc=True,
        max_cache_len=cache_len,
        model_serie="-",
    )
    infer.log = False
    infer.get_model(case["draft_dir"], job["model_dir"], "-", torch.float32, cache_len, True, False)
    counts: list[int] = []
    sink = official.logger.add(
        lambda message: counts.append(int(message.split(":")[1])),
        format="{message}",
        filter=lambda entry: entry["message"].startswith("[accept token num]"),
    )
    tokenizer = RecordingTokenizer(job["eos_ids"][0], counts)
    models = (infer.model, infer.model_draft, infer.target_cache, infer.draft_cache)
    infer.generate([p["ids"] for p in prompts], *models, tokenizer=tokenizer)
    official.logger.remove(sink)
    bounds = zip([0, *tokenizer.ends], tokenizer.ends)
    traced = [
        case_trace(case, prompt, sequence, counts[a:b], job["eos_ids"][0])
        for prompt, sequence, (a, b) in zip(prompts, tokenizer.sequences, bounds, strict=True)
    ]
    return traced, infer.model


def case_trace(case: dict, prompt: dict, sequence: list[int], forwards: list[int], eos_id: int) -> dict:
    """One prompt's record from the sequence its ``decode`` received and the counts its forwards logged."""
    output = sequence[len(prompt["ids"]) :]
    assert sum(forwards) == len(output), (forwards, len(output))
    print(f"[official:{case['label']}] {prompt['id']}: {len(forwards)} forwards", file=sys.stderr, flush=True)
    return {
        "case": case["label"],
        "id": prompt["id"],
        "steps": len(forwards) - 1,
        "prefill_emitted": forwards[0],
        "emitted": forwards[1:],
        "output_ids": output,
        "stop": "eos" if eos_id in output else "budget",
    }


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    import torch

    torch.set_grad_enabled(False)
    official = import_official(job["source"])
    patch(official, job["eos_ids"][0])
    records, target = [], None
    for case in job["cases"]:
        traced, target = run_case(official, job, case)
        records += traced
    print_output(PATCHES, records, greedy_references(target, job))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
