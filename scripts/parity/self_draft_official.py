"""Run the official Self-Draft code (ZipECHO/Self-Draft at the pinned commit) on given token prompts; print JSON.

Runs inside the side env ``.venv-parity-self_draft`` (transformers 4.37, the last line whose
``GenerationMixin.greedy_search`` the official code replaces; from 4.40 on ``generate`` calls
``_greedy_search`` and the patch is silently skipped), never in specbench's env. Called by
``python -m specbench.parity self_draft`` with a job file; prints one JSON object (the contract of
``specbench.parity.stepwise``):

    job    = {"source", "model_dir", "max_new_tokens", "eos_ids",
              "cases": [{"label", "branch_len", "branch_num", "gram_len", "max_pad_len", "flush_interval",
                         "keep_num", "use_corpus"}],
              "prompts": [{"id", "ids"}],
              "corpus": [[key, [[continuation, count], ...]], ...] | null}
    output = {"versions", "patches", "records": [{"case", "id", "steps", "emitted", "output_ids", "stop"}],
              "ar": {id: output_ids}}

Each case runs its prompts in order on one model (cases with the same knobs once), as the official
``get_model_answers`` runs single-turn questions: the context cache carries over from prompt to
prompt and is reduced after question ``q`` when ``(q + 1) % flush_interval == 0``. ``steps`` = the
official forwards minus the prefill; ``emitted`` = the tokens each later forward commits
(``hits[:max_hit + 1]``, recorded by a wrapper around the branch update that returns them),
``output_ids`` = the prefill's token and then every committed token, so
``len(output_ids) == 1 + sum(emitted)``.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from argparse import Namespace

from official_output import greedy_generate, greedy_references, print_output

PATCHES = [
    "imports: the package `self_draft/__init__.py` imports `utils.py`, which needs fastchat and psutil; the "
    "script registers an empty `self_draft` package on the checkout's folder and imports `decoding`, "
    "`models.Llama.llama`, `draft_branch` and `cache.CorpusCache` directly, then does what `utils.augment_llama` "
    "and `utils.augment_generate` do (the SD forwards on `LlamaForCausalLM`/`LlamaModel`, `greedy_search` "
    "replaced by the official proxy); `datasets` (imported by CorpusCache.py for loaders it never calls here) "
    "is a stub module",
    "device: `torch.cuda.synchronize()` (called unconditionally in llama.py's forwards) is a no-op on this "
    "CPU-only machine; `generate` is called directly on CPU tensors (the eval loop's `.cuda()` is not run)",
    'attention: the model is loaded with `attn_implementation="eager"`: the official masks are float16 '
    "(asserted in llama.py), which 4.37's SDPA path refuses next to float32 queries; eager adds them to the "
    "float32 scores as the official code intends",
    "config: transformers 4.37 does not read the `rope_parameters` dict that the embedded checkpoint's "
    "config.json (written by transformers 5) holds and would run at rope_theta=10000; the script sets "
    "config.rope_theta (and rope_scaling=None) from it before the model is built",
    "corpus: where a case uses the corpus cache, the official `CorpusCache` is made without its constructor "
    "(which loads a slow tokenizer and mines OANC) and given specbench's corpus table in the official pickle "
    "layout ({key length: {key: {continuation: count}}}, best first), max_key_len 4, search_with_dif_key_len 1",
    "counting: `DraftBranch.update_draft_branches_inter_logits` is wrapped to record the tokens each forward "
    "commits (`hits[:max_hit + 1]`); the wrapper returns the official result untouched. The AR reference is "
    "the same model with `draft_config.self_draft = 0`, i.e. transformers 4.37's own `greedy_search`",
]


def import_official(source: str) -> dict[str, types.ModuleType]:
    """The official modules, imported without the package ``__init__`` (it needs fastchat)."""
    import torch

    torch.cuda.synchronize = lambda *args, **kwargs: None  # patch: no CUDA here
    stub = types.ModuleType("datasets")  # patch: CorpusCache.py imports it for loaders not used here
    stub.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    stub.load_dataset = None
    sys.modules["datasets"] = stub
    package = types.ModuleType("self_draft")  # patch: the package without its __init__
    package.__path__ = [f"{source}/self_draft"]
    sys.modules["self_draft"] = package
    modules = {}
    for name in ("decoding", "models.Llama.llama", "draft_branch", "cache.CorpusCache"):
        __import__(f"self_draft.{name}")
        modules[name] = sys.modules[f"self_draft.{name}"]
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    return modules


def augment(modules: dict[str, types.ModuleType]) -> None:
    """What the official ``augment_llama`` + ``augment_generate`` do; AR keeps transformers' own greedy search."""
    from transformers import GenerationMixin
    from transformers.models.llama import modeling_llama

    llama, decoding = modules["models.Llama.llama"], modules["decoding"]
    modeling_llama.LlamaForCausalLM.SDforward = llama.SDforward
    modeling_llama.LlamaModel.LlamaModelSDforward = llama.LlamaModelSDforward
    modeling_llama.LlamaModel.prepare_SD_decoder_attention_mask = llama.prepare_SD_decoder_attention_mask
    decoding.FUNC_MAP["greedy_search"] = GenerationMixin.greedy_search
    GenerationMixin.greedy_search = decoding.greedy_search_proxy


def load_model(model_dir: str):
    """The embedded checkpoint on CPU in float32, eager attention, with its rope_theta."""
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(model_dir, attn_implementation="eager")  # patch: fp16 masks
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):  # patch: the transformers-5 config keeps rope_theta in this dict
        config.rope_theta = rope["rope_theta"]
        config.rope_scaling = None
    return LlamaForCausalLM.from_pretrained(model_dir, config=config, torch_dtype=torch.float32).eval()


def corpus_cache(module: types.ModuleType, table: list):
    """The official ``CorpusCache`` holding specbench's table (constructor bypassed)."""
    cache = module.CorpusCache.__new__(module.CorpusCache)
    cache.max_key_len, cache.n_gram, cache.search_with_dif_key_len = 4, 4, 1
    cache.n_gram_cache = {length: {} for length in range(1, cache.max_key_len + 1)}
    for key, continuations in table:
        entry = key[0] if len(key) == 1 else tuple(key)
        cache.n_gram_cache[len(key)][entry] = {tuple(cont): count for cont, count in continuations}
    return cache


def draft_config(case: dict) -> Namespace:
    """The official ``draft_config`` for a case (``ini_model_paras`` + main.py defaults)."""
    return Namespace(
        self_draft=1,
        use_corpus=int(case["use_corpus"]),
        use_context=1,
        max_pad_len=case["max_pad_len"],
        branch_num=case["branch_num"],
        branch_len=case["branch_len"],
        init_method="RANDOM_WITH_AUX",
        context_gram_n=min(case["gram_len"], case["branch_len"] - 1),
        flush_interval=case["flush_interval"],
        keep_num=case["keep_num"],
        max_key_len=4,
        search_with_dif_key_len=1,
    )


def run_case(model, modules, case: dict, job: dict, corpus) -> list[dict]:
    """Every prompt of one case in order, flushing as the official question loop does."""
    branch = modules["draft_branch"].DraftBranch
    update = branch.update_draft_branches_inter_logits
    calls: list[list[int]] = []

    def recorded(self, *args, **kwargs):
        result = update(self, *args, **kwargs)
        calls.append(list(result[3][: result[0] + 1]))  # (max_hit, hit_point, pre_len, hits, ...)
        return result

    model.draft_config = draft_config(case)
    model.corpus_cache = corpus if case["use_corpus"] else None
    if hasattr(model, "context_cache"):
        del model.context_cache  # a fresh context cache per case, as per run of main.py
    branch.update_draft_branches_inter_logits = recorded
    records, questions = [], 0
    try:
        for prompt in job["prompts"]:
            calls.clear()
            out, steps, _ = greedy_generate(model, prompt["ids"], job["max_new_tokens"], job["eos_ids"])
            produced = [token for call in calls for token in call]
            returned = out[0, len(prompt["ids"]) :].tolist()
            assert steps == len(calls) and produced[: len(returned)] == returned
            records.append(
                {
                    "case": case["label"],
                    "id": prompt["id"],
                    "steps": steps - 1,
                    "emitted": [len(call) for call in calls[1:]],
                    "output_ids": produced,
                    "stop": "eos" if job["eos_ids"][0] in returned else "budget",
                }
            )
            print(f"[official:{case['label']}] {prompt['id']}: {steps - 1} steps", file=sys.stderr, flush=True)
            questions += 1
            interval = case["flush_interval"]
            if interval and (questions + 1) % interval == 0:  # inference_modes.py, single-turn questions
                model.context_cache.reduce_cache(case["keep_num"])
            model.context_cache.c = 0
    finally:
        branch.update_draft_branches_inter_logits = update
    return records


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    import torch

    torch.set_grad_enabled(False)
    modules = import_official(job["source"])
    augment(modules)
    model = load_model(job["model_dir"])
    corpus = corpus_cache(modules["cache.CorpusCache"], job["corpus"]) if job.get("corpus") else None
    runs: dict[str, list[dict]] = {}  # cases with the same official knobs run once (the code is deterministic)
    records = []
    for case in job["cases"]:
        knobs = json.dumps({key: value for key, value in case.items() if key != "label"}, sort_keys=True)
        if knobs not in runs:
            runs[knobs] = run_case(model, modules, case, job, corpus)
        records += [{**record, "case": case["label"]} for record in runs[knobs]]
    model.draft_config = draft_config({**job["cases"][0], "use_corpus": 0})
    model.draft_config.self_draft = 0  # the official proxy then runs transformers' own greedy search
    print_output(PATCHES, records, greedy_references(model, job))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
