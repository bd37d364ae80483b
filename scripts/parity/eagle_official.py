"""Run the official EAGLE code (SafeAILab/EAGLE, EAGLE-1 or EAGLE-2 at a pinned commit) on token prompts; print JSON.

Runs inside the side env ``.venv-parity-eagle`` (transformers 4.36.2, both commits' pin), never in specbench's
env. Called by ``python -m specbench.parity eagle`` / ``eagle2`` with a job file; prints one JSON object (the
contract of ``specbench.parity.stepwise``):

    job    = {"source", "generation": "eagle1" | "eagle2", "model_dir", "head_dir", "max_new_tokens", "eos_ids",
              "cases": [{"label", "tree": "mc_sim_7b_63", "paths": [[rank, ...], ...]}            (eagle1)
                        | {"label", "total_token", "depth", "top_k"}],                            (eagle2)
              "prompts": [{"id", "ids"}]}
    output = {"versions", "patches", "records": [{"case", "id", "steps", "emitted", "output_ids", "stop"}],
              "ar": {id: output_ids}}

``head_dir`` holds the head in the official layout (``config.json`` + ``pytorch_model.bin``, exported by the
driver). The official ``EaModel.eagenerate`` runs each generation to its own stop rule (committed tokens >
``max_new_tokens``, or the tokenizer's EOS among them). ``emitted`` = the official ``accept_length + 1`` of each
step (the root and the accepted drafts it commits); ``output_ids`` = the committed tokens plus the held next
root, so ``len(output_ids) == 1 + sum(emitted)``. EAGLE-1's head drafts its own hard-wired ``mc_sim_7b_63``
tree; the script checks that specbench's tree (``paths``) is the same before it runs.
"""

from __future__ import annotations

import json
import sys

from medusa_official import StandInTokenizer  # the same stand-in: the EOS id the loop checks, no text
from official_output import case_record, print_output, rope_from_v5

PATCHES = {
    "config": "config: transformers 4.36 does not read the `rope_parameters` dict that the embedded checkpoint's "
    "config.json (written by transformers 5) holds, and would fall back to rope_theta=10000; the script sets "
    "config.rope_theta (and rope_scaling=None) from it and passes that config to the official "
    "`EaModel.from_pretrained` (which hands it to the base model's `from_pretrained`)",
    "tokenizer": "tokenizer: the embedded checkpoint's tokenizer files (written by transformers 5) do not load in "
    "transformers 4.36 / tokenizers 0.15; `EaModel` uses its tokenizer only for the EOS id its loop checks, so "
    "the official module's AutoTokenizer is pointed at a stand-in with the job's EOS id",
    "rope_base": "EAGLE-1 only, rotary base: the v1 code builds both its target's and its head's "
    "`LlamaRotaryEmbedding` without `base=`, i.e. 10000 whatever the config says; the script sets that "
    "parameter's default in both classes to the config's rope_theta (100000 for SmolLM2) before the model is "
    "built (without it the v1 target's argmax differs from transformers' on about 11 % of prompt positions)",
    "head": "head: specbench's trained head, exported by the driver to the official layout (the same state-dict "
    "names plus `embed_tokens.weight` = the target's input embeddings, which our head shares; config.json with "
    "`bias` and `rope_theta`), loaded strictly by the official `EaModel.from_pretrained`",
    "counting": "counting: `eagle.model.ea_model.update_inference_inputs` is wrapped to record each step's "
    "committed length and the next root it holds; the wrapper returns the official result untouched",
}


def base_config(model_dir: str):
    """The checkpoint's LlamaConfig as transformers 4.36 reads it, with the rope theta of the 5.x file."""
    from transformers import LlamaConfig

    return rope_from_v5(LlamaConfig.from_pretrained(model_dir))  # patch: rope_theta from the transformers-5 file


def set_rope_base(theta: float) -> None:
    """EAGLE-1: make ``base`` default to ``theta`` in the official rotary classes (they are built without it)."""
    from eagle.model import cnets, modeling_llama_kv

    for module in (modeling_llama_kv, cnets):
        init = module.LlamaRotaryEmbedding.__init__
        names = init.__code__.co_varnames[: init.__code__.co_argcount]
        defaults = list(init.__defaults__)
        defaults[names[-len(defaults) :].index("base")] = theta
        init.__defaults__ = tuple(defaults)


def check_tree(case: dict) -> None:
    """EAGLE-1: the official tree (the head's hard-wired ``mc_sim_7b_63``) must be specbench's."""
    from eagle.model import choices

    official = getattr(choices, case["tree"])
    if case["tree"] != "mc_sim_7b_63" or sorted(map(tuple, official)) != sorted(map(tuple, case["paths"])):
        raise SystemExit(f"error: specbench's tree is not the official {case['tree']}: {case['paths']}")


def load_official(job: dict, case: dict, config):
    """The official ``EaModel`` on the embedded checkpoint with the exported head (EAGLE-2: the case's knobs)."""
    import torch
    from eagle.model import ea_model

    ea_model.AutoTokenizer = StandInTokenizer(job["eos_ids"][0])  # patch: the tokenizer
    knobs = {key: case[key] for key in ("total_token", "depth", "top_k")} if job["generation"] == "eagle2" else {}
    return ea_model.EaModel.from_pretrained(
        base_model_path=job["model_dir"],
        ea_model_path=job["head_dir"],
        config=config,
        torch_dtype=torch.float32,
        **knobs,
    ).eval()


def trace(model, ids: list[int], budget: int) -> dict:
    """One official generation to its own stop rule, with the per-step record the counting patch collects."""
    import torch
    from eagle.model import ea_model

    steps: list[tuple[int, int]] = []  # (committed tokens so far, the held next root)
    original = ea_model.update_inference_inputs

    def recorded(*args, **kwargs):
        result = original(*args, **kwargs)  # (input_ids, ..., next root) in both generations
        steps.append((result[0].shape[1] - len(ids), int(result[-1])))
        return result

    ea_model.update_inference_inputs = recorded
    try:
        out = model.eagenerate(torch.tensor([ids]), temperature=0.0, max_new_tokens=budget)
    finally:
        ea_model.update_inference_inputs = original
    committed = out[0, len(ids) :].tolist()
    counts = [n for n, _ in steps]
    eos = model.tokenizer.eos_token_id
    return {
        "steps": len(steps),
        "emitted": [b - a for a, b in zip([0, *counts], counts)],
        "output_ids": [*committed, steps[-1][1]],
        "stop": "eos" if eos in committed else "budget" if len(committed) > budget else "length",
    }


def ar_outputs(job: dict, config) -> dict[str, list[int]]:
    """transformers' own greedy ``generate`` (4.36 Llama) on every prompt: the official side's AR reference."""
    import torch
    from transformers import LlamaForCausalLM

    plain = LlamaForCausalLM.from_pretrained(job["model_dir"], config=config, torch_dtype=torch.float32).eval()
    eos = job["eos_ids"]
    return {
        p["id"]: plain.generate(
            torch.tensor([p["ids"]]),
            max_new_tokens=job["max_new_tokens"],
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )[0, len(p["ids"]) :].tolist()
        for p in job["prompts"]
    }


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    sys.path.insert(0, job["source"])

    import torch

    torch.set_grad_enabled(False)
    config = base_config(job["model_dir"])
    eagle1 = job["generation"] == "eagle1"
    if eagle1:
        set_rope_base(config.rope_theta)
    records = []
    for case in job["cases"]:
        if eagle1:
            check_tree(case)
        model = load_official(job, case, config)
        for prompt in job["prompts"]:
            records.append(case_record(case, prompt, trace(model, prompt["ids"], job["max_new_tokens"])))
        del model
    patches = [text for name, text in PATCHES.items() if eagle1 or name != "rope_base"]
    print_output(patches, records, ar_outputs(job, config))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
