"""vLLM's side of ``engine=vllm``: a worker that runs in vLLM's own environment and serves the runner over a pipe.

``specbench.vllm_engine`` starts it as ``<vLLM's python> vllm_worker.py`` (a file path, not ``-m``: vLLM's
environment need not have specbench installed, and pins another transformers than specbench's). It imports the
standard library and vllm only.

Protocol: one JSON object per line. Requests arrive on stdin; replies leave on the process's original stdout,
which is kept for them alone (everything vLLM and its engine processes print goes to stderr). Requests:

- ``{"op": "start", "engine_args": {...}}``: build ``vllm.LLM(**engine_args)``; reply with versions and the
  load time.
- ``{"op": "generate", "prompts": [[ids]], "max_new_tokens": n, "temperature": t, "top_p": p, "seeds": [s],
  "stop_token_ids": [...]}``: submit every prompt at once, step the engine until all finish; reply with each
  request's output ids, the tokens each engine step added to it (``emitted``, the prefill's first) and when
  (``times``, seconds since submission), and vLLM's per-request speculative-decoding record
  (``spec``: ``per_step_accepted`` / ``per_step_drafted`` over the steps that drafted; null without
  speculation).
- ``{"op": "reset"}``: empty the prefix cache (after a warm-up on a prompt the run answers again).
- ``{"op": "stop"}``: exit.

An error in a request is replied as ``{"error": "...", "traceback": "..."}``; the worker keeps serving.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import traceback
from typing import Any, TextIO

# Run as a file, Python put this folder first on sys.path, where specbench's own modules (profile.py among them)
# would shadow the standard library's for vLLM and its engine processes (which inherit sys.path)
sys.path = [
    entry for entry in sys.path if os.path.realpath(entry or ".") != os.path.dirname(os.path.realpath(__file__))
]


def start(engine_args: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Build the engine; return it and what the run records about it."""
    import torch
    import transformers
    import vllm

    began = time.perf_counter()
    llm = vllm.LLM(**engine_args)
    return llm, {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "arctic_inference": arctic_inference_build(),
        "load_s": round(time.perf_counter() - began, 3),
    }


def arctic_inference_build() -> str | None:
    """Which ArcticInference source the suffix trees were built from (scripts/install_vllm.sh writes it), if any."""
    import importlib.util

    spec = importlib.util.find_spec("arctic_inference")
    if spec is None or not spec.submodule_search_locations:
        return None
    marker = os.path.join(next(iter(spec.submodule_search_locations)), "BUILT_FROM")
    return open(marker).read().strip() if os.path.isfile(marker) else "installed"


REQUEST_IDS = itertools.count()
"""Request ids unique over the worker's life (vLLM refuses a reused id while the first is running)."""


def generate(llm: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Submit every prompt of ``request`` at once and step the engine until all finish (see the module doc)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    greedy = request["temperature"] == 0
    ids = [str(next(REQUEST_IDS)) for _ in request["prompts"]]
    traces: dict[str, dict[str, Any]] = {rid: {"emitted": [], "times": []} for rid in ids}
    submitted = time.perf_counter()
    for rid, prompt, seed in zip(ids, request["prompts"], request["seeds"], strict=True):
        params = SamplingParams(
            max_tokens=request["max_new_tokens"],
            temperature=request["temperature"],
            top_p=1.0 if greedy else request["top_p"],
            seed=None if greedy else seed,
            stop_token_ids=request["stop_token_ids"],
            detokenize=False,
        )
        engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter() - submitted
        for output in outputs:
            record_step(traces[output.request_id], output, now)
    return {"results": [traces[rid] for rid in ids], "wall_s": time.perf_counter() - submitted}


def record_step(trace: dict[str, Any], output: Any, now: float) -> None:
    """Add one engine step's output of a request to its trace (its final ids and spec record once finished)."""
    completion = output.outputs[0]
    grown = len(completion.token_ids) - sum(trace["emitted"])
    if grown:
        trace["emitted"].append(grown)
        trace["times"].append(now)
    if output.finished:
        spec = completion.spec_decode_metrics
        trace.update(
            output_ids=list(completion.token_ids),
            finish_reason=completion.finish_reason,
            spec=None
            if spec is None
            else {"per_step_accepted": list(spec.per_step_accepted), "per_step_drafted": list(spec.per_step_drafted)},
        )


def serve(requests: TextIO, replies: TextIO) -> None:
    """Answer requests until ``stop`` or the end of input."""
    llm: Any = None  # the engine, once started
    for line in requests:
        request = json.loads(line)
        if request["op"] == "stop":
            return
        try:
            if request["op"] == "start":
                llm, reply = start(request["engine_args"])
            elif request["op"] == "reset":
                reply = {"reset": llm.reset_prefix_cache()}
            else:
                reply = generate(llm, request)
        except Exception as error:  # noqa: BLE001 (every failure goes back to the runner, which reports it)
            reply = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> None:
    """Keep the original stdout for replies; send everything else printed to stderr; serve."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, replies)


if __name__ == "__main__":  # vLLM spawns its engine processes: only the worker's own start may serve
    main()
