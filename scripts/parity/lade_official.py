"""Run the official LADE package (PyPI ``lade``) on given token prompts; print one JSON object.

Runs inside the side virtual env ``.venv-parity-lade`` (``lade`` + the transformers it was written
for), never in specbench's env. Called by ``python -m specbench.parity lade``, which passes a job
file (JSON) and reads the JSON this script prints on stdout:

    job    = {"model_dir", "window", "ngram", "guess", "max_new_tokens", "seeds": [int],
              "eos_ids": [int], "ar": bool, "prompts": [{"id": str, "ids": [int]}]}
    output = {"versions": {...}, "patches": [str], "records": [{"id", "seed", "steps", "forwards",
              "accept_lengths", "output_ids"} | {"id", "seed": null, "ar_output_ids"}]}

Steps are counted by wrapping the official ``jforward_multilevel`` (one call = one target forward):
``forwards`` counts every call, ``steps`` = forwards - 1 (the first call is the official prefill,
which also emits the first token, as specbench's prefill does). ``accept_lengths`` is the number of
tokens each step appended, read from the attention mask's growth between calls.

Run-time patches (no official code is copied or vendored; each is listed in PATCHES and in the table):
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

PATCHES = [
    "config: transformers 4.34 does not read the `rope_parameters` dict that the embedded checkpoint's "
    "config.json (written by transformers 5) holds, and would fall back to rope_theta=10000; the script "
    "sets config.rope_theta (and rope_scaling=None) from it before the model is built",
    "seed: the official generate calls random.seed(10) on every call; the script wraps random.seed so "
    "that call seeds Python's random with the run's seed instead (seed 10 = the built-in behaviour)",
    "counting: LlamaForCausalLM.jforward_multilevel (installed by lade.augment_all) is wrapped to count "
    "forwards and read each step's emitted tokens from the attention mask's growth; the wrapper "
    "returns the official result untouched",
]


def main(job_path: str) -> int:
    os.environ["USE_LADE"] = "1"  # read by lade's greedy_search_proxy at every generate call
    os.environ.setdefault("CHAT", "0")
    with open(job_path) as f:
        job = json.load(f)

    import lade
    import torch
    import transformers
    from transformers import AutoConfig, LlamaForCausalLM

    torch.set_grad_enabled(False)

    # patch: the seed the official generate uses for its random initial window
    state = {"seed": 10}
    original_seed = random.seed

    def seed_hook(a=None, version=2):
        original_seed(state["seed"] if a == 10 else a, version)

    random.seed = seed_hook

    lade.augment_all()
    lade.config_lade(WINDOW_SIZE=job["window"], LEVEL=job["ngram"], GUESS_SET_SIZE=job["guess"], DEBUG=0)

    # patch: count forwards and per-step emitted tokens around the official multi-level forward
    trace = {"lengths": []}
    official_forward = LlamaForCausalLM.jforward_multilevel

    def counted_forward(self, *args, **kwargs):
        mask = kwargs.get("attention_mask")
        trace["lengths"].append(None if mask is None else int(mask.shape[1]))
        return official_forward(self, *args, **kwargs)

    LlamaForCausalLM.jforward_multilevel = counted_forward

    # patch: the checkpoint's rope settings in the format transformers 4.34 reads
    config = AutoConfig.from_pretrained(job["model_dir"])
    rope = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" in rope:
        config.rope_theta = float(rope["rope_theta"])
        config.rope_scaling = None
    model = LlamaForCausalLM.from_pretrained(job["model_dir"], config=config, torch_dtype=torch.float32)
    model.eval()

    import importlib.metadata as md

    versions = {
        "lade": md.version("lade"),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    save = job.get("save") or {}

    def keep(record: dict) -> None:
        """Append to the results, and save at once where the caller asked (survives an interruption)."""
        records.append(record)
        path = save.get(f"{record['id']}|{record['seed']}")
        if path:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump({**record, "meta": {"versions": versions, "patches": PATCHES}}, f)
            os.replace(path + ".tmp", path)

    eos = list(job["eos_ids"])
    common = dict(
        max_new_tokens=job["max_new_tokens"],
        do_sample=False,
        num_beams=1,
        eos_token_id=eos[0] if len(eos) == 1 else eos,
        pad_token_id=eos[0],
    )
    records = []
    for prompt in job["prompts"]:
        ids = torch.tensor([prompt["ids"]], dtype=torch.long)
        mask = torch.ones_like(ids)
        if job.get("ar"):
            os.environ["USE_LADE"] = "0"
            out = model.generate(ids, attention_mask=mask, **common)
            os.environ["USE_LADE"] = "1"
            keep(
                {
                    "id": prompt["id"],
                    "seed": None,
                    "ar_output_ids": out[0, ids.shape[1] :].tolist()[: job["max_new_tokens"]],
                }
            )
        for seed in job["seeds"]:
            state["seed"] = seed
            trace["lengths"] = []
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, **common)
            wall = time.perf_counter() - start
            lengths = trace["lengths"]
            output = out[0, ids.shape[1] :].tolist()[: job["max_new_tokens"]]
            # the mask grows by the tokens a step appended: call k+1's length - call k's length
            # (the prefill's first token included); the last step appended what the output still lacks
            grown = [b - a for a, b in zip(lengths, lengths[1:])]
            accept = grown[1:] + [len(output) - sum(grown)]
            keep(
                {
                    "id": prompt["id"],
                    "seed": seed,
                    "forwards": len(lengths),
                    "steps": len(lengths) - 1,
                    "accept_lengths": accept,
                    "output_ids": output,
                    "wall_s": round(wall, 3),
                }
            )
            print(
                f"[official] {prompt['id']} seed={seed}: {len(lengths) - 1} steps, {len(output)} tokens, {wall:.1f} s",
                file=sys.stderr,
                flush=True,
            )

    json.dump({"versions": versions, "patches": PATCHES, "records": records}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
