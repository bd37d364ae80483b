"""vLLM's side of ``engine=vllm``: a worker that runs in vLLM's own environment and serves the runner over a pipe.

``specbench.vllm_engine`` starts it as ``<vLLM's python> vllm_worker.py`` (a file path, not ``-m``: vLLM's
environment need not have specbench installed, and pins another transformers than specbench's). It imports the
standard library and vllm only.

Protocol: one JSON object per line. Requests arrive on stdin; replies leave on the process's original stdout,
which is kept for them alone (everything vLLM and its engine processes print goes to stderr). Requests:

- ``{"op": "start", "engine_args": {...}}``: build ``vllm.LLM(**engine_args)``; reply with versions and the
  load time. With ``"server": true`` start vLLM's OpenAI-compatible server on loopback instead (the same arguments
  as its command-line flags), and wait until it answers.
- ``{"op": "generate", "prompts": [[ids]], "max_new_tokens": n, "temperature": t, "top_p": p, "seeds": [s],
  "stop_token_ids": [...]}``: submit every prompt at once, step the engine until all finish; reply with each
  request's output ids, the tokens each engine step added to it (``emitted``, the prefill's first) and when
  (``times``, seconds since submission), and vLLM's per-request speculative-decoding record
  (``spec``: ``per_step_accepted`` / ``per_step_drafted`` over the steps that drafted; null without
  speculation). Against the server, ``"concurrency": n`` keeps n requests in flight (streamed completions of the
  token ids; a request starts as another ends) until all are answered; its trace has the time to the first token and
  the latency (``times``: both, since the request's own start) but not the steps, which a server's stream may merge.
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


def start(engine_args: dict[str, Any], server: bool) -> tuple[Any, dict[str, Any]]:
    """Build the engine (or start the server); return it and what the run records about it."""
    import torch
    import transformers
    import vllm

    began = time.perf_counter()
    llm = Server(engine_args) if server else vllm.LLM(**engine_args)
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


SERVED_NAME = "specbench"
"""The model name the server answers to."""


def flags(engine_args: dict[str, Any]) -> list[str]:
    """vLLM's command-line flags for engine arguments: ``--key-name value``, ``--key`` / ``--no-key`` for booleans,
    JSON for mappings (the speculative config); None is left out (vLLM's default)."""
    out = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return out


class Server:
    """vLLM's OpenAI-compatible server on a free loopback port, for as long as the worker runs."""

    def __init__(self, engine_args: dict[str, Any]):
        import socket
        import subprocess

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        args = {**engine_args}
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.pop("model")]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", SERVED_NAME, *flags(args)]
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # serves /reset_prefix_cache (after the warm-up)
        self.process = subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr, env=env)
        self.wait_until_ready()

    def wait_until_ready(self, timeout_s: float = 900.0) -> None:
        """Poll /health until the server answers (a RuntimeError if it exits or the time runs out)."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM's server exited with code {self.process.returncode} while starting")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(1.0)
        raise RuntimeError(f"vLLM's server did not answer within {timeout_s:.0f} s")

    def reset_prefix_cache(self) -> bool:
        """Empty the server's prefix cache (its development-mode endpoint)."""
        import urllib.request

        with urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{self.port}/reset_prefix_cache", method="POST"), timeout=60
        ) as answer:
            return answer.status == 200

    def close(self) -> None:
        """Stop the server."""
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except Exception:  # noqa: BLE001 (a server that does not stop is killed)
            self.process.kill()


def load(server: Server, request: dict[str, Any]) -> dict[str, Any]:
    """Send every prompt of ``request`` to the server, ``concurrency`` at a time; reply as ``generate`` does."""
    import asyncio

    return asyncio.run(run_load(server, request))


async def run_load(server: Server, request: dict[str, Any]) -> dict[str, Any]:
    """The bounded load: a request starts whenever fewer than ``concurrency`` are in flight, until all are done."""
    import asyncio

    import aiohttp

    gate = asyncio.Semaphore(request["concurrency"])
    timeout = aiohttp.ClientTimeout(total=None)
    began = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        results = await asyncio.gather(
            *(
                one_request(session, gate, server.port, prompt, seed, request)
                for prompt, seed in zip(request["prompts"], request["seeds"], strict=True)
            )
        )
    return {"results": results, "wall_s": time.perf_counter() - began}


async def one_request(session: Any, gate: Any, port: int, prompt: list[int], seed: int | None, request: dict) -> dict:
    """One streamed completion of ``prompt``'s token ids: its output ids, time to first token, latency, spec record."""
    greedy = request["temperature"] == 0
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": request["max_new_tokens"],
        "temperature": request["temperature"],
        "top_p": 1.0 if greedy else request["top_p"],
        "seed": None if greedy else seed,
        "stop_token_ids": request["stop_token_ids"],
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with gate:
        start = time.perf_counter()
        trace: dict[str, Any] = {"output_ids": [], "times": [], "spec": None, "finish_reason": None}
        async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"vLLM's server answered {response.status}: {await response.text()}")
            async for line in response.content:
                read_chunk(trace, line.decode().strip(), time.perf_counter() - start)
    trace["times"] = [trace["times"][0], trace["times"][-1]]  # first token, last token
    return trace


def read_chunk(trace: dict[str, Any], line: str, now: float) -> None:
    """Add one server-sent event of a streamed completion to the request's trace."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    chunk = json.loads(line.removeprefix("data: "))
    for choice in chunk.get("choices") or []:
        if choice.get("token_ids"):
            trace["output_ids"] += choice["token_ids"]
            trace["times"].append(now)
        if choice.get("finish_reason"):
            trace["finish_reason"] = choice["finish_reason"]
    speculative = (chunk.get("metrics") or {}).get("speculative_decoding")
    if speculative:
        trace["spec"] = {key: speculative.get(key) or [] for key in ("per_step_accepted", "per_step_drafted")}


def serve(requests: TextIO, replies: TextIO) -> None:
    """Answer requests until ``stop`` or the end of input."""
    llm: Any = None  # the engine, once started
    for line in requests:
        request = json.loads(line)
        if request["op"] == "stop":
            if isinstance(llm, Server):
                llm.close()
            return
        try:
            if request["op"] == "start":
                llm, reply = start(request["engine_args"], request.get("server", False))
            elif request["op"] == "reset":
                reply = {"reset": llm.reset_prefix_cache()}
            elif isinstance(llm, Server):
                reply = load(llm, request)
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
