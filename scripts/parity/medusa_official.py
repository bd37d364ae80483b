"""Run the official Medusa code (FasterDecoding/Medusa at the pinned commit) on given token prompts; print JSON.

Runs inside the side env ``.venv-parity-medusa`` (transformers 4.36, the line the pinned commit was
written for), never in specbench's env. Called by ``python -m specbench.parity medusa`` with a job
file; prints one JSON object (the contract of ``specbench.parity.stepwise``):

    job    = {"source", "model_dir", "heads_dir", "max_new_tokens", "eos_ids",
              "cases": [{"label", "choices": <a name in medusa/model/medusa_choices.py> | [[rank, ...], ...]}],
              "prompts": [{"id", "ids"}]}
    output = {"versions", "patches", "records": [{"case", "id", "steps", "emitted", "output_ids", "stop"}],
              "ar": {id: output_ids}}

The official ``MedusaModelABC.medusa_generate`` (a generator: one ``yield`` per tree step) runs each
generation; the script stops iterating once the official count of new tokens plus the token it holds
as the next root reaches ``max_new_tokens`` (the eval script's ``new_token > N - 2``), and the official
loop itself stops when its tokenizer's EOS is among the committed tokens. ``emitted`` = the official
``accept_length + 1`` of each step (the root and the accepted drafts it commits); ``output_ids`` = the
committed tokens plus the held next root (argmax of the returned logits), so
``len(output_ids) == 1 + sum(emitted)``.
"""

from __future__ import annotations

import json
import sys

from official_output import case_record, greedy_references, print_output, rope_from_v5

PATCHES = [
    "config: transformers 4.36 does not read the `rope_parameters` dict that the embedded checkpoint's "
    "config.json (written by transformers 5) holds, and would fall back to rope_theta=10000; the script "
    "sets config.rope_theta (and rope_scaling=None) from it before the model is built",
    "tokenizer: the embedded checkpoint's tokenizer files (written by transformers 5: class "
    "`TokenizersBackend`, merges as pairs) do not load in transformers 4.36 / tokenizers 0.15; the official "
    "model uses its tokenizer only for the EOS id its loop checks and to decode the text it yields, so the "
    "official module's AutoTokenizer is pointed at a stand-in with the job's EOS id whose decode returns ''",
    "loading: the model is built with transformers' own `PreTrainedModel.from_pretrained` on the official "
    "`MedusaModelLlama` class with medusa_num_heads/medusa_num_layers from the heads' config.json (the "
    "official `from_pretrained` hard-codes 5 heads and loads the heads non-strictly); the heads' state dict "
    "(the official `medusa_lm_head` layout, written by `specbench.train medusa`) is loaded strictly, each "
    "head's output layer set to the target's LM head where the checkpoint shares it (our heads do; the "
    "official training starts every head's output layer from the LM head)",
    "counting: `medusa.model.medusa_model.update_inference_inputs` is wrapped to record each step's "
    "committed tokens and the next root it leaves in the logits; the wrapper returns the official "
    "result untouched",
]


class StandInTokenizer:
    """Stands in for ``AutoTokenizer`` in the official module: the EOS id its loop checks, no text."""

    def __init__(self, eos_id: int):
        self.eos_token_id = eos_id

    def from_pretrained(self, *args, **kwargs) -> StandInTokenizer:
        return self

    def decode(self, *args, **kwargs) -> str:
        return ""


def load_official(job: dict):
    """The official Medusa model on the embedded checkpoint, with the heads of ``heads_dir``."""
    import torch
    from medusa.model import medusa_model
    from medusa.model.medusa_model import MedusaModelLlama
    from safetensors.torch import load_file
    from transformers import AutoConfig, PreTrainedModel

    medusa_model.AutoTokenizer = StandInTokenizer(job["eos_ids"][0])  # patch: the tokenizer
    config = rope_from_v5(AutoConfig.from_pretrained(job["model_dir"]))  # patch: rope_theta from the 5.x file
    with open(f"{job['heads_dir']}/config.json") as f:
        heads_config = json.load(f)
    config.medusa_num_heads = heads_config["medusa_num_heads"]
    config.medusa_num_layers = heads_config["medusa_num_layers"]
    model = PreTrainedModel.from_pretrained.__func__(  # patch: transformers' loader on the official class
        MedusaModelLlama, job["model_dir"], config=config, torch_dtype=torch.float32
    ).eval()
    state = load_file(f"{job['heads_dir']}/medusa_lm_head.safetensors")
    layers = config.medusa_num_layers
    for k in range(config.medusa_num_heads):
        state.setdefault(f"{k}.{layers}.weight", model.lm_head.weight.detach().clone())  # patch: shared LM head
    model.medusa_head.load_state_dict(state, strict=True)
    return model, config


def official_choices(case: dict):
    """A case's tree: a named official tree, or explicit rank paths."""
    from medusa.model import medusa_choices

    choices = case["choices"]
    return getattr(medusa_choices, choices) if isinstance(choices, str) else [list(p) for p in choices]


def trace(model, ids: list[int], choices, budget: int) -> dict:
    """One official generation, with the per-step record the counting patch collects."""
    import torch
    from medusa.model import medusa_model

    steps: list[dict] = []
    original = medusa_model.update_inference_inputs

    def recorded(*args, **kwargs):
        input_ids, logits, medusa_logits, new_token = original(*args, **kwargs)
        steps.append({"new_token": int(new_token), "held": int(logits[0, -1].argmax()), "ids": input_ids})
        return input_ids, logits, medusa_logits, new_token

    medusa_model.update_inference_inputs = recorded
    try:
        for _ in model.medusa_generate(
            torch.tensor([ids]), temperature=0.0, max_steps=budget + 1, medusa_choices=choices
        ):
            if steps[-1]["new_token"] + 1 >= budget:
                break
    finally:
        medusa_model.update_inference_inputs = original
    committed = steps[-1]["ids"][0, len(ids) :].tolist()
    counts = [s["new_token"] for s in steps]
    eos = model.tokenizer.eos_token_id
    return {
        "steps": len(steps),
        "emitted": [b - a for a, b in zip([0, *counts], counts)],
        "output_ids": [*committed, steps[-1]["held"]],
        "stop": "eos" if eos in committed else "budget",
    }


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    sys.path.insert(0, job["source"])

    import torch
    from transformers import LlamaForCausalLM

    torch.set_grad_enabled(False)
    model, config = load_official(job)
    budget = job["max_new_tokens"]
    records = []
    for case in job["cases"]:
        choices = official_choices(case)
        for prompt in job["prompts"]:
            records.append(case_record(case, prompt, trace(model, prompt["ids"], choices, budget)))
    del model
    plain = LlamaForCausalLM.from_pretrained(job["model_dir"], config=config, torch_dtype=torch.float32).eval()
    print_output(PATCHES, records, greedy_references(plain, job))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
