"""Run the official Lookahead code (alipay/PainlessInferenceAcceleration, pinned commit) on token prompts; print JSON.

Runs inside the side env ``.venv-parity-lookahead`` (transformers 4.36, the version the commit's own test
script runs its Llama example under), never in specbench's env. Called by ``python -m specbench.parity
lookahead`` with a job file; prints one JSON object (the contract of ``specbench.parity.stepwise``):

    job    = {"source", "model_dir", "max_new_tokens", "eos_ids",
              "cases": [{"label", "decoding_mode", "decoding_length", "branch_length", "max_node",
                         "max_output_node"}],
              "prompts": [{"id", "ids"}]}
    output = {"versions", "patches", "records": [{"case", "id", "steps", "emitted", "output_ids", "stop"}],
              "ar": {id: output_ids}}

The official non-batch path runs: ``lookahead/lookahead/models/llama/modeling_llama.py``'s
``LlamaForCausalLM.generate`` with ``decoding_kwargs``. Each case starts from a fresh ``LookaheadCache``
(the capacities ``benchmarks/benchmark.py`` sets: ``max_node`` and ``max_output_node`` from the job) that
the model keeps across the case's prompts, run in the job's order, as specbench's drafter keeps its
memory across the requests of a run. ``emitted`` = the official ``edls`` after the prefill's (tokens each
verify forward added), ``output_ids`` = every token after the prompt, so ``len(output_ids) == 1 + sum(emitted)``.
"""

from __future__ import annotations

import json
import sys

from official_output import case_record, greedy_references, print_output

PATCHES = [
    "grouped-query attention: the official `LlamaAttention` sizes k_proj / v_proj with `num_attention_heads` "
    "and has no `repeat_kv`; SmolLM2 has 9 query and 3 key/value heads. After the official `__init__`, k_proj "
    "and v_proj are replaced by a projection with the checkpoint's [3 x 64, 576] weight whose output is "
    "repeated to the 9 heads in transformers' `repeat_kv` order (head h reads key/value head h // 3): the "
    "same values, the cache just stores the repeated heads",
    "config: transformers 4.36 does not read the `rope_parameters` dict of the embedded checkpoint's "
    "config.json (written by transformers 5) and would fall back to rope_theta=10000; the script sets "
    "config.rope_theta from it before the model is built (the plain HF model of the AR reference too)",
    "parallel mode: `LookaheadCache.par_get` builds its mask with `np.ones` (float64), which the verify code "
    "then cannot use to index (`decoding_mode='par'` raises a TypeError unpatched); the script casts the "
    "returned mask to int64 (the same 0/1 values)",
    "tokenizer: none is loaded (the checkpoint's transformers-5 tokenizer files do not load in 4.36); the "
    "official generate takes the token ids specbench rendered and uses a tokenizer only for debug printing",
]


def patch_official() -> None:
    """Apply the grouped-query attention and parallel-mask patches to the imported official modules."""
    import numpy as np
    import torch
    from lookahead.common.lookahead_cache import LookaheadCache
    from lookahead.models.llama import modeling_llama

    class RepeatedKV(torch.nn.Linear):
        """A key / value projection with the checkpoint's heads, its output repeated to every query head."""

        def __init__(self, hidden: int, kv_heads: int, head_dim: int, repeats: int):
            super().__init__(hidden, kv_heads * head_dim, bias=False)
            self.shape = (kv_heads, 1, head_dim)
            self.repeats = repeats

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = super().forward(x)
            heads = out.unflatten(-1, self.shape)  # [b, q, kv, 1, d]
            return heads.expand(*heads.shape[:-2], self.repeats, heads.shape[-1]).flatten(-3)

    official_init = modeling_llama.LlamaAttention.__init__

    def init_with_kv_heads(self, config):
        official_init(self, config)
        kv_heads = config.num_key_value_heads
        if kv_heads != self.num_heads:
            repeats = self.num_heads // kv_heads
            self.k_proj = RepeatedKV(self.hidden_size, kv_heads, self.head_dim, repeats)
            self.v_proj = RepeatedKV(self.hidden_size, kv_heads, self.head_dim, repeats)

    modeling_llama.LlamaAttention.__init__ = init_with_kv_heads
    official_par_get = LookaheadCache.par_get

    def par_get_int_mask(self, *args, **kwargs):
        ids, mask, sizes = official_par_get(self, *args, **kwargs)
        return ids, np.asarray(mask, dtype=np.int64), sizes

    LookaheadCache.par_get = par_get_int_mask


def load_config(model_dir: str):
    """The checkpoint's LlamaConfig with rope_theta read from the transformers-5 ``rope_parameters``."""
    from transformers import LlamaConfig

    config = LlamaConfig.from_pretrained(model_dir)
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise SystemExit(f"error: rope_type {rope['rope_type']!r} is not what the official Llama code computes")
    if "rope_theta" in rope:
        config.rope_theta = float(rope["rope_theta"])
    return config


def trace(model, ids: list[int], case: dict, budget: int, eos_ids: list[int]) -> dict:
    """One official lookahead generation: per-step token counts and the tokens after the prompt."""
    import torch

    prompt = torch.tensor([ids])
    decoding_kwargs = {  # a fresh dict per call: generate writes its drafts into it
        "use_lookahead": True,
        "decoding_mode": case["decoding_mode"],
        "decoding_length": case["decoding_length"],
        "branch_length": case["branch_length"],
    }
    out = model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=budget,
        do_sample=False,
        eos_token_id=eos_ids,
        pad_token_id=eos_ids[0],
        use_cache=True,
        return_dict_in_generate=True,
        decoding_kwargs=decoding_kwargs,
    )
    output_ids = out.sequences[0, len(ids) :].tolist()
    emitted = out.kwargs["edls"][1:]
    return {
        "steps": len(emitted),
        "emitted": emitted,
        "output_ids": output_ids,
        "stop": "eos" if any(t in eos_ids for t in output_ids) else "budget",
    }


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    sys.path.insert(0, f"{job['source']}/lookahead")

    import torch
    from lookahead.common.lookahead_cache import LookaheadCache
    from lookahead.models.llama.modeling_llama import LlamaForCausalLM as OfficialLlama
    from transformers import LlamaForCausalLM

    torch.set_grad_enabled(False)
    patch_official()
    config = load_config(job["model_dir"])
    model = OfficialLlama.from_pretrained(job["model_dir"], config=config, torch_dtype=torch.float32).eval()
    budget, eos_ids = job["max_new_tokens"], job["eos_ids"]
    records = []
    for case in job["cases"]:
        model.lookahead_cache = LookaheadCache(
            eos_ids=eos_ids, max_node=case["max_node"], max_output_node=case["max_output_node"]
        )
        for prompt in job["prompts"]:
            records.append(case_record(case, prompt, trace(model, prompt["ids"], case, budget, eos_ids)))
    del model
    plain = LlamaForCausalLM.from_pretrained(job["model_dir"], config=config, torch_dtype=torch.float32).eval()
    print_output(PATCHES, records, greedy_references(plain, job))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
