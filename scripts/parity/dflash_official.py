"""Run the official DFlash loop (z-lab/dflash at the pinned commit, ``dflash_generate`` of ``dflash/model.py``) on
given token prompts.

Runs inside the side env ``.venv-parity-dflash`` (transformers 4.57.1, the commit's pin), never in specbench's env.
Called by ``python -m specbench.parity dflash`` with a job file; prints one JSON object (the contract of
``specbench.parity.stepwise``):

    job    = {"source", "model_dir", "max_new_tokens", "eos_ids",
              "cases": [{"label", "block_size", "draft_dir"}], "prompts": [{"id", "ids"}]}
    output = {"versions", "patches",
              "records": [{"case", "id", "steps", "emitted", "output_ids", "stop", "drafts"}],
              "ar": {id: output_ids}}

``emitted`` = the loop's own ``acceptance_lengths`` (per verify forward, the accepted drafts and the target's next
token); ``output_ids`` = the new tokens ``dflash_generate`` returns: the prefill's token, each step's, and the last
step's next token it holds as the next root, cut by its own rule (the budget, then the first stop token), so
``len(output_ids) <= 1 + sum(emitted)``; ``drafts`` = each step's drafted tokens (the block its target verified, root
excluded).
"""

from __future__ import annotations

import json
import sys
import types

from official_output import case_record, checkout_module, greedy_references, print_output, rope_from_v5

PATCHES = [
    "device and dtype: `torch.cuda.synchronize` (called by `_cuda_time` for the timings `return_stats=True` adds) "
    "is a no-op on this CPU-only machine; the target and the drafter are loaded on CPU in float32 (the authors' "
    "benchmark, `dflash/benchmark.py`: bfloat16 on CUDA), sdpa attention",
    "config: transformers 4.57 does not read the `rope_parameters` dict that the embedded checkpoint's config.json "
    "(written by transformers 5) holds and would run at rope_theta=10000; the target is loaded with its config's "
    "rope_theta (and rope_scaling=None) set from it. The drafter's config.json (specbench's `save_draft`, the "
    "authors' layout) holds `rope_theta` itself and loads as it is, every weight matched (no key missing or unused)",
    "settings (no patch): `dflash_generate(drafter, target, ids, max_new_tokens, stop_token_ids=<the job's EOS ids>, "
    "temperature=0.0, block_size=<the case's B>, return_stats=True)`; the mask token is the drafter's "
    "`dflash_config.mask_token_id`",
    "counting: the loop's own `acceptance_lengths` are the per-step counts and the `output_ids` it returns the "
    "tokens; a forward pre-hook on the target (removed after each generation) records the ids each target forward "
    "reads (the prompt, then each step's block: the root and the drafts). The AR reference is transformers 4.57's "
    "greedy `generate` on the same target",
]


def load_target(model_dir: str):
    """The embedded target as transformers 4.57 reads it, with the rope theta of the 5.x file, float32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = rope_from_v5(AutoConfig.from_pretrained(model_dir))  # patch: rope_theta from the transformers-5 file
    return AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()


def load_drafter(official: types.ModuleType, draft_dir: str):
    """The authors' ``DFlashDraftModel`` on the drafter folder, float32; refuses a weight left unmatched."""
    import torch

    drafter, info = official.DFlashDraftModel.from_pretrained(draft_dir, dtype=torch.float32, output_loading_info=True)
    unmatched = {key: value for key, value in info.items() if value}
    if unmatched:
        raise SystemExit(f"error: the official DFlashDraftModel does not match {draft_dir}: {unmatched}")
    return drafter.eval()


def trace(official: types.ModuleType, drafter, target, ids: list[int], case: dict, job: dict) -> dict:
    """One official generation to its own stop rule: its per-step counts and the tokens it returns."""
    import torch

    calls: list[list[int]] = []  # the ids each target forward reads: the prompt, then each step's block
    hook = target.register_forward_pre_hook(lambda module, args: calls.append(args[0][0].tolist()))
    try:
        stats = official.dflash_generate(
            drafter,
            target,
            torch.tensor([ids]),
            max_new_tokens=job["max_new_tokens"],
            stop_token_ids=job["eos_ids"],
            temperature=0.0,
            block_size=case["block_size"],
            return_stats=True,
        )
    finally:
        hook.remove()
    output = stats.output_ids[0, len(ids) :].tolist()
    emitted = [int(n) for n in stats.acceptance_lengths]
    assert len(output) <= 1 + sum(emitted) and len(calls) == 1 + len(emitted), (len(output), emitted, len(calls))
    stop = "eos" if set(output) & set(job["eos_ids"]) else "budget"
    drafts = [block[1:] for block in calls[1:]]
    return {"steps": len(emitted), "emitted": emitted, "output_ids": output, "stop": stop, "drafts": drafts}


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    official = checkout_module(job["source"], "dflash.model")  # patch: CUDA synchronisation a no-op
    target = load_target(job["model_dir"])
    records = []
    for case in job["cases"]:
        drafter = load_drafter(official, case["draft_dir"])
        for prompt in job["prompts"]:
            records.append(case_record(case, prompt, trace(official, drafter, target, prompt["ids"], case, job)))
    print_output(PATCHES, records, greedy_references(target, job))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
