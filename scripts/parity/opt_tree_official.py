"""Run the official OPT-Tree code (Jikai0Wang/OPT-Tree at the pinned commit, ``opt_classic``) on given token prompts.

Runs inside the side env ``.venv-parity-opt_tree`` (transformers 4.41.0, the release's pin), never in
specbench's env. Called by ``python -m specbench.parity opt_tree`` with a job file; prints one JSON
object (the contract of ``specbench.parity.stepwise``):

    job    = {"source", "model_dir", "draft_dir", "max_new_tokens", "eos_ids",
              "cases": [{"label", "nodes", "threshold", "max_depth", "fix_draft_mask"?}], "prompts": [{"id", "ids"}]}
    output = {"versions", "patches", "records": [{"case", "id", "steps", "emitted", "output_ids", "stop"}],
              "ar": {id: output_ids}}

The official ``SPModel.spgenerate`` runs each generation with ``max_new_tokens`` = the job's budget and
stops by its own rule (EOS among the committed tokens, or more than ``max_new_tokens`` committed).
``emitted`` = the official ``accept_length + 1`` of each verify (the root and the accepted drafts it
commits); ``output_ids`` = the committed tokens plus the next root the last verify holds, so
``len(output_ids) == 1 + sum(emitted)``.
"""

from __future__ import annotations

import contextlib
import json
import sys

from official_output import case_record, greedy_references, print_output

PATCHES = [
    "config: transformers 4.41 does not read the `rope_parameters` dict that the checkpoints' config.json "
    "(written by transformers 5) holds, and would fall back to rope_theta=10000; the script sets "
    "config.rope_theta (and rope_scaling=None) from it before each model (target and draft) is built",
    "RoPE base: `opt_classic/modeling_llama_kv.py` builds `LlamaRotaryEmbedding(head_dim, "
    "max_position_embeddings)` without a base, i.e. 10000 for every model; `LlamaAttention._init_rope` is "
    "replaced by one that passes `base=config.rope_theta` (100000 for SmolLM2) when rope_scaling is None",
    "device: the target's tree mask is built with `.cuda()` (modeling_llama_kv.py, `LlamaModel.forward`); "
    "on this CPU-only run `torch.Tensor.cuda` returns the tensor unchanged",
    "tokenizer: the checkpoint's tokenizer files (written by transformers 5) do not load in transformers "
    "4.41 / tokenizers 0.19; `SPModel` uses its tokenizer only for the EOS id its loop checks, so the "
    "official module's AutoTokenizer is pointed at a stand-in with the job's EOS id",
    "loading: both models are built with the official `KVLlamaForCausalLM.from_pretrained` (target: "
    "`model_dir`, draft: `draft_dir`) in float32 on the CPU with the patched config, and `SPModel(target, "
    "model_dir, draft)` is made directly, as `SPModel.from_pretrained` does without the config patch",
    "diagnostic cases only (`fix_draft_mask`): `Tree.add` (opt_classic/tree.py) sets "
    "`kv_cache_mask[rows, parents] = 1` before and again after copying it into the draft's tree mask and "
    "never clears it, so from the third layer on a node also attends to the tree rows its row index's "
    "earlier parents pointed at; the wrapper clears `kv_cache_mask` after each `add`, which gives every "
    "node exactly its ancestors (the paper's tree attention)",
    "counting: `opt_classic.model.verify` is wrapped to record each step's `accept_length` and the next "
    "root it returns as the first token of the next draft; the wrapper returns the official result untouched",
]


class StandInTokenizer:
    """Stands in for ``AutoTokenizer`` in the official module: only the EOS id its loop checks."""

    def __init__(self, eos_id: int):
        self.eos_token_id = eos_id

    def from_pretrained(self, *args, **kwargs) -> StandInTokenizer:
        return self


def patched_config(path: str):
    """The checkpoint's LlamaConfig with ``rope_theta`` taken from the transformers-5 ``rope_parameters``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):
        config.rope_theta = rope["rope_theta"]
        config.rope_scaling = None
    return config


def patch_official(eos_id: int) -> None:
    """The run-time patches: RoPE base from the config, ``.cuda()`` as identity, the tokenizer stand-in."""
    import torch
    from opt_classic import model as official_model
    from opt_classic import modeling_llama_kv as kv

    def init_rope(self) -> None:
        assert self.config.rope_scaling is None  # patch: only the unscaled RoPE, now with the config's base
        self.rotary_emb = kv.LlamaRotaryEmbedding(
            self.head_dim, max_position_embeddings=self.max_position_embeddings, base=self.config.rope_theta
        )

    kv.LlamaAttention._init_rope = init_rope
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]  # patch: CPU only
    official_model.AutoTokenizer = StandInTokenizer(eos_id)


def load_official(job: dict):
    """The official ``SPModel`` over the target and the draft, in float32 on the CPU."""
    import torch
    from opt_classic.model import SPModel
    from opt_classic.modeling_llama_kv import LlamaForCausalLM as KVLlamaForCausalLM

    def load(path: str):
        return KVLlamaForCausalLM.from_pretrained(path, config=patched_config(path), torch_dtype=torch.float32)

    return SPModel(load(job["model_dir"]), job["model_dir"], load(job["draft_dir"])).eval()


def fixed_mask(add):
    """``Tree.add`` followed by clearing the layer-to-layer mask it leaves set (diagnostic cases only)."""

    def add_then_clear(self, logits):
        outputs = add(self, logits)
        self.kv_cache_mask.zero_()
        return outputs

    return add_then_clear


def trace(model, ids: list[int], case: dict, budget: int) -> dict:
    """One official generation, with the per-step record the counting patch collects."""
    import torch
    from opt_classic import model as official_model
    from opt_classic.tree import Tree

    steps: list[dict] = []
    original, add = official_model.verify, Tree.add

    def recorded(*args, **kwargs):
        result = original(*args, **kwargs)
        steps.append({"accepted": int(result[2]), "held": int(result[3][0, 0])})
        return result

    official_model.verify = recorded
    Tree.add = fixed_mask(add) if case.get("fix_draft_mask") else add
    try:
        with contextlib.redirect_stdout(sys.stderr):  # its own prints ("total steps: ...") stay off the JSON
            out = model.spgenerate(
                torch.tensor([ids]),
                temperature=0.0,
                max_new_tokens=budget,
                nodes=case["nodes"],
                threshold=case["threshold"],
                max_depth=case["max_depth"],
            )
    finally:
        official_model.verify, Tree.add = original, add
    committed = out[0, len(ids) :].tolist()
    emitted = [s["accepted"] + 1 for s in steps]
    assert len(committed) == sum(emitted)  # every verify commits its root and accepted drafts
    return {
        "steps": len(steps),
        "emitted": emitted,
        "output_ids": [*committed, steps[-1]["held"]],
        "stop": "eos" if model.tokenizer.eos_token_id in committed else "budget",
    }


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    sys.path.insert(0, job["source"])

    import torch
    from transformers import LlamaForCausalLM

    torch.set_grad_enabled(False)
    patch_official(job["eos_ids"][0])
    model = load_official(job)
    budget = job["max_new_tokens"]
    records = []
    for case in job["cases"]:
        for prompt in job["prompts"]:
            records.append(case_record(case, prompt, trace(model, prompt["ids"], case, budget)))
    del model
    config = patched_config(job["model_dir"])
    plain = LlamaForCausalLM.from_pretrained(job["model_dir"], config=config, torch_dtype=torch.float32).eval()
    print_output(PATCHES, records, greedy_references(plain, job))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
