"""What every official-side parity script ends with: the greedy reference of each prompt and the JSON line the
driver reads. Imported by its siblings (they run as scripts, so this folder is on their path), in their side env."""

from __future__ import annotations

import importlib
import json
import platform
import sys
import types


def checkout_module(source: str, name: str) -> types.ModuleType:
    """The module ``name`` of the official checkout ``source``, with ``torch.cuda.synchronize`` a no-op (the official
    loops of PARD and DFlash time their phases with it; there is no CUDA here)."""
    import torch

    torch.cuda.synchronize = lambda *args, **kwargs: None  # patch: no CUDA here
    sys.path.insert(0, source)
    return importlib.import_module(name)


def rope_from_v5(config):
    """``config`` with ``rope_theta`` taken from the ``rope_parameters`` dict a transformers-5 config.json holds (the
    side envs' older transformers read only ``rope_theta`` and would run at 10000), rope scaling off; a config
    without that dict is returned as it is."""
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):
        config.rope_theta = rope["rope_theta"]
        config.rope_scaling = None
    return config


def greedy_generate(model, ids: list[int], budget: int, eos_ids: list[int]):
    """One greedy ``generate`` call on one unpadded prompt: the sequence it returns (prompt included)."""
    import torch

    inputs = torch.tensor([ids])
    return model.generate(
        inputs,
        attention_mask=torch.ones_like(inputs),
        max_new_tokens=budget,
        do_sample=False,
        eos_token_id=eos_ids,
        pad_token_id=eos_ids[0],
    )


def greedy_references(model, job: dict) -> dict[str, list[int]]:
    """Each prompt's greedy new tokens from ``model`` (the AR reference both sides' outputs are compared with)."""
    return {
        prompt["id"]: greedy_generate(model, prompt["ids"], job["max_new_tokens"], job["eos_ids"])[
            0, len(prompt["ids"]) :
        ].tolist()
        for prompt in job["prompts"]
    }


def case_record(case: dict, prompt: dict, traced: dict) -> dict:
    """One prompt's traced run under one case, labelled for the driver; its step count goes to stderr as progress."""
    record = {"case": case["label"], "id": prompt["id"], **traced}
    print(f"[official:{case['label']}] {prompt['id']}: {record['steps']} steps", file=sys.stderr, flush=True)
    return record


def print_output(patches: list[str], records: list[dict], ar: dict[str, list[int]]) -> None:
    """The one JSON line on stdout: the side env's versions, the run-time patches, the traced steps, the references."""
    import torch
    import transformers

    versions = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    print(json.dumps({"versions": versions, "patches": patches, "records": records, "ar": ar}))
