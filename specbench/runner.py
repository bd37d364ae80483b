"""The runner: config -> model, engine, samples -> warm-up -> timed generations -> results on disk."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specbench import environment
from specbench.bandwidth import memory_traffic, peak_bandwidth
from specbench.budget import (
    BUDGET_FILE,
    KNOB_NODE,
    budget_problems,
    calibrate,
    default_value,
    given_record,
    knob_key,
    with_budget,
)
from specbench.config import COMPILE_SETTINGS, compile_enabled
from specbench.core.acceptance import Sampling, sampling_problems
from specbench.core.compiled import CompiledVerifier, compilations, compiled_verifier
from specbench.core.loop import STEP_BREAKDOWN_SETTINGS, Engine, Generation, synchronize
from specbench.core.verify import warm_up_verify
from specbench.data.base import Dataset, Sample, build_dataset
from specbench.energy import joules_between, open_meter
from specbench.engines import build_engine, eager_because, prepare_method
from specbench.errors import ConfigError, DataError, RunConflict
from specbench.metrics import machine_seconds, run_summary
from specbench.models.loading import (
    LoadedModel,
    TargetFiles,
    describe_target,
    load_model,
    resolve_device,
    resolve_dtype,
)
from specbench.models.parts import method_input_nodes, part_nodes
from specbench.profile import cached_curves
from specbench.schema import SCHEMA_VERSION, STEP_FIELDS
from specbench.settings import setting_problems
from specbench.store import RunStore
from specbench.vllm_engine import VLLMEngine, counterpart, differences, start_vllm

RUN_ONLY_KEYS = (
    "limit",
    "warmup",
    "output_dir",
    "data_dir",
    "force",
    "progress",
    "repeat",
    "experiment",
    "results_root",
    "step_breakdown",
    "debug",
    "calibration",
    "protocol",
)
"""Top-level keys that do not change what a sample's result is (excluded from the config digest). ``calibration``
only steers ``budget=auto``, whose choice is stored with the run and reused when it resumes; ``protocol`` names the
settings a paper's evaluation sets (which the digest holds), to give its runs their own folders."""


@dataclass
class NamedConfig:
    """The type of a model, method or dataset config's name (what the summary and the report call it)."""

    name: str


@dataclass
class CalibrationSettings:
    """The types of ``calibration.*`` (budget=auto; their ranges are checked with the budget)."""

    prompts: int
    max_new_tokens: int | None
    remeasure: bool


@dataclass
class RunSettings:
    """The types of the run settings of conf/config.yaml (ranges and choices are checked in ``validate``); the
    model, method and dataset are one config each (``model=[]`` would leave none)."""

    model: NamedConfig
    method: NamedConfig
    dataset: NamedConfig
    engine: NamedConfig
    batch_size: int
    concurrency: int | None
    limit: int | None
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    repeat: int
    device: str
    dtype: str
    warmup: int
    calibration: CalibrationSettings
    output_dir: str
    protocol: str | None
    data_dir: str | None
    force: bool
    progress: bool
    debug: bool


def validate(cfg: DictConfig) -> None:
    """Reject impossible run knobs (wrong types first, then ranges) before anything is loaded."""
    problems = setting_problems(cfg, RunSettings)
    if problems:
        raise ConfigError("invalid run settings: " + "; ".join(problems))
    if cfg.max_new_tokens < 1:
        problems.append(f"max_new_tokens must be >= 1 (got {cfg.max_new_tokens})")
    if cfg.limit is not None and cfg.limit < 1:
        problems.append(f"limit must be >= 1 or null for all samples (got {cfg.limit})")
    if cfg.warmup < 0:
        problems.append(f"warmup must be >= 0 (got {cfg.warmup})")
    problems += sampling_problems(cfg.temperature, cfg.top_p)
    if cfg.step_breakdown not in STEP_BREAKDOWN_SETTINGS:
        problems.append(f"step_breakdown must be true, false or auto (got {cfg.step_breakdown!r})")
    if cfg.compile not in COMPILE_SETTINGS:
        problems.append(f"compile must be true, false or auto (got {cfg.compile!r})")
    problems += budget_problems(cfg)
    problems += engine_problems(cfg)
    if problems:
        raise ConfigError("invalid run settings: " + "; ".join(problems))


ENGINE_NAMES = ("hf", "vllm")
"""The ``engine`` options: specbench's own engines on transformers (the shared loop, HF generate), or vLLM."""


def engine_problems(cfg: DictConfig) -> list[str]:
    """What makes a run's engine, batch size and method not go together."""
    if cfg.engine.name not in ENGINE_NAMES:
        return [f"engine must be one of {ENGINE_NAMES} (got {cfg.engine.name!r})"]
    if cfg.batch_size < 1:
        return [f"batch_size must be >= 1 (got {cfg.batch_size})"]
    if cfg.concurrency is not None and (cfg.engine.name != "vllm" or cfg.concurrency < 1 or cfg.batch_size != 1):
        return [
            f"concurrency={cfg.concurrency}: the number of requests kept in flight against vLLM's server, >= 1, with "
            f"engine=vllm and without batch_size (the server batches what is in flight)"
        ]
    if cfg.engine.name == "hf":
        if cfg.batch_size != 1:
            return [
                f"batch_size={cfg.batch_size}: specbench's own engines run one request at a time (engine=vllm batches)"
            ]
        return []
    problems = []
    if cfg.compile is True:
        problems.append(
            "compile=true compiles the shared loop; vLLM's own compiled path: engine.engine_args.enforce_eager=false"
        )
    if cfg.method.engine != "loop":
        problems.append(f"method {cfg.method.name} runs HF generate (method.engine={cfg.method.engine}), not a drafter")
    if cfg.get("budget") == "auto":
        problems.append("budget=auto calibrates on the shared loop; with engine=vllm give budget=N or none")
    if not problems:
        counterpart(cfg.method)  # a ConfigError listing the methods vLLM runs
    return problems


LOCATION_KEYS = ("data_dir", "corpus.files", "model.device_map", "engine.python")
"""Keys (matched on their dotted path's end, at any depth) that say where this machine keeps local inputs
(dataset copies, Self-Draft's corpus text) or places the model's layers, not what a sample's result is;
left out of the digest so a clone elsewhere (or another GPU layout) resumes the same runs."""


def without_locations(node, path: str = ""):
    """A copy of a nested dict without the LOCATION_KEYS entries."""
    if not isinstance(node, dict):
        return node
    return {
        key: without_locations(value, f"{path}{key}.")
        for key, value in node.items()
        if not f"{path}{key}".endswith(LOCATION_KEYS)
    }


METHOD_INPUT_KEYS = method_input_nodes()
"""Nodes of the model config that only a method's drafter reads, through an interpolation in the method node
(``method.drafter.head: ${model.eagle}``): they enter the digest there, resolved, and are left out of the
model node, so adding one to a model config keeps the digests of every other method's stored runs."""


LATER_KEYS_NODE = "digest_defaults"
"""Method node naming drafter keys added after runs were stored, each with the value that keeps the older
behaviour: at that value the key stays out of the digest, so the stored runs (made before the key existed, with
exactly that behaviour) keep their digests; any other value is a new setting and enters the digest."""


def loop_compiles(setting: object, engine: str, device_type: str) -> bool:
    """Whether the shared loop takes the compiled path: ``compile`` resolved on this device type, for specbench's own
    engine only (vLLM compiles by its own engine arguments)."""
    return engine == "hf" and compile_enabled(setting, device_type)


def config_digest(cfg: DictConfig, device: torch.device, dtype: torch.dtype) -> str:
    """sha256 over everything that determines a sample's result (resolved device and dtype included).

    The compiled path emits what the eager one does, but its runs are timed on another path, so ``compile: true``
    enters the digest when it resolves on (its runs never resume into an eager folder) and nothing when it resolves
    off (eager runs keep the digests they had before the compiled path existed).
    """
    identity = without_locations(OmegaConf.to_container(cfg, resolve=True))
    for key in RUN_ONLY_KEYS:
        identity.pop(key, None)
    if loop_compiles(identity.pop("compile", False), identity["engine"]["name"], device.type):
        identity["compile"] = True
    if identity.get("budget") is None:  # the method's default: digests as before budgets existed
        identity.pop("budget", None)
    identity["method"].pop(KNOB_NODE, None)  # which key budget= sets: not a setting of the run
    sampling_where_stored(identity)
    drafter = identity["method"].get("drafter") or {}
    for key, older in (identity["method"].pop(LATER_KEYS_NODE, None) or {}).items():
        if key in drafter and drafter[key] == older:
            drafter.pop(key)
    for key in METHOD_INPUT_KEYS:
        (identity.get("model") or {}).pop(key, None)
    if identity["engine"]["name"] == "hf":  # the engines that existed before engine=: digests as before
        for key in HF_ENGINE_KEYS:
            identity.pop(key, None)
        identity["method"].pop("vllm", None)
    identity.update(device=device.type, dtype=str(dtype))
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def sampling_where_stored(identity: dict) -> None:
    """Put the run's ``temperature`` and ``top_p`` back into the node of a drafter that draws its drafts from them
    (``Drafter.reads_sampling``): runs stored before the decode context carried the sampling had them there (the
    method configs interpolated them), so every stored digest stays valid."""
    drafter = identity["method"].get("drafter")
    if drafter and get_class(drafter["_target_"]).reads_sampling:
        drafter.update(temperature=identity["temperature"], top_p=identity["top_p"])


HF_ENGINE_KEYS = ("engine", "batch_size", "concurrency")
"""Top-level keys left out of the digest of runs on specbench's own engines (one request at a time), with the
method's ``vllm`` node (its counterpart, read by engine=vllm only), so runs stored before engine= keep theirs."""


PART_NODES = part_nodes()
"""Nodes of the model config that name a method's parts (drafts, heads, skipped sets), not the target itself."""


def target_digest(cfg: DictConfig, dtype: torch.dtype) -> str:
    """sha256 over what defines the target's outputs: the model node (weights, revision, chat template...,
    without its drafts/heads and machine locations) and the dtype. Runs pair with AR only when equal."""
    model = without_locations({"model": OmegaConf.to_container(cfg.model, resolve=True)})["model"]
    identity = {key: value for key, value in model.items() if key not in PART_NODES}
    return hashlib.sha256(json.dumps({"model": identity, "dtype": str(dtype)}, sort_keys=True).encode()).hexdigest()[
        :16
    ]


def prompt_sha(prompt_ids: list[int]) -> str:
    """A short digest of a prompt's token ids (the report pairs samples only when their prompts are equal)."""
    return hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:16]


def rounded(seconds: list[float] | None) -> list[float] | None:
    """Per-step times to the microsecond (None stays None: not measured)."""
    return None if seconds is None else [round(s, 6) for s in seconds]


def step_record(gen: Generation) -> dict[str, list | None]:
    """The generation's per-step traces as record fields of the same names (times to the microsecond)."""
    return {name: rounded(getattr(gen, name)) if name.endswith("_s") else getattr(gen, name) for name in STEP_FIELDS}


def sample_generator(seed: int, sample_id: str) -> torch.Generator:
    """A per-sample RNG, independent of run order, so resumed runs draw the same numbers."""
    digest = hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def check_fits(sample: Sample, prompt_ids: list[int], max_new_tokens: int, context_length: int) -> None:
    """Refuse prompts that are empty or leave no room for max_new_tokens in the model's context."""
    if not prompt_ids:
        raise ConfigError(f"sample {sample.sample_id}: the rendered prompt is empty (0 tokens)")
    if len(prompt_ids) + max_new_tokens > context_length:
        raise ConfigError(
            f"sample {sample.sample_id}: prompt ({len(prompt_ids)} tokens) + max_new_tokens "
            f"({max_new_tokens}) exceeds the model's context length ({context_length}); lower "
            f"max_new_tokens or set model.context_length if the model supports more"
        )


def config_fields(cfg: DictConfig) -> dict:
    """The summary fields a run's config alone decides (what ran, with which settings), for ``run_summary``."""
    return {
        "model": cfg.model.name,
        "method": cfg.method.name,
        "dataset": cfg.dataset.name,
        "lossless": bool(cfg.method.lossless),
        "hyperparameters": OmegaConf.to_container(cfg.method, resolve=True),
        "sampling": {"temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed},
        "repeat": cfg.repeat,
        "experiment": cfg.get("experiment"),
        "max_new_tokens": cfg.max_new_tokens,
        "limit": cfg.limit,
        "warmup": cfg.warmup,
    }


class Runner:
    """Runs one configured benchmark into its output directory, resuming where it stopped.

    ``run`` is the whole job (the CLI). A benchmark suite drives several runners in one process on
    one loaded model (``lm``) through the same steps: ``open``, ``start_engine``, ``run_sample`` per
    sample (interleaved across runners), ``finish``; so every number comes from the same records.
    ``bench`` (suite, session, entry, baseline) is recorded in the summary for the report's pairing.
    """

    def __init__(self, cfg: DictConfig, lm: LoadedModel | TargetFiles | None = None, bench: dict | None = None):
        validate(cfg)
        self.budget = given_record(cfg)
        if self.budget is not None:
            cfg = with_budget(cfg, self.budget["value"])
        self.method = prepare_method(cfg.method)  # the drafter's knobs and the acceptance rule, before any model loads
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        self.compile = loop_compiles(cfg.compile, cfg.engine.name, self.device.type)
        self.eager_because = eager_because(cfg.method, self.method.drafter) if self.compile else None
        self.verifier: CompiledVerifier | None = None  # the compiled path's, once the model is loaded
        self.sampling = Sampling(cfg.temperature, cfg.top_p)
        self.store = RunStore(Path(cfg.output_dir), config_digest(cfg, self.device, self.dtype), cfg.force)
        self.run_id = f"{Path(cfg.output_dir).name}@{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
        self.started_at = (self.store.previous_summary or {}).get("started_at") or self._now()
        self.dataset: Dataset = build_dataset(cfg.dataset, cfg.data_dir)
        self.samples = self.dataset.samples(cfg.limit)
        self.dataset_info = self.dataset.describe()
        if not self.samples:
            raise DataError(
                f"dataset {self.dataset.name} has no sample to run: {self.dataset_info['n_selected']} of "
                f"{self.dataset_info['n_total']} records selected from {self.dataset_info['source']}"
            )
        self.energy = open_meter(self.device)
        self.environment = environment.capture(self.device, self.dtype)
        self.bench = bench
        self.lm = lm
        self.traffic: dict | None = None  # memory_traffic, once the model is loaded
        self.engine: Engine | None = None
        self.config_written = False
        self.peak_memory = (self.store.previous_summary or {}).get("peak_memory")
        self.compile_record = self._compile_record()

    @staticmethod
    def _now() -> str:
        return datetime.now(timezone.utc).isoformat(timespec="seconds")

    def run(self) -> Path:
        """Generate every pending sample, writing records and the summary after each one."""
        if self.done():
            print(f"[specbench] {self.store.dir} is complete ({len(self.samples)} sample(s)); nothing to run")
            return self.store.dir  # NOTE: no model load, no lock, and the stored files stay byte for byte
        status = "failed"
        try:
            self.open()
            pending = self.pending()  # again: the folder is ours now, and reloaded
            if len(pending) < len(self.samples):
                print(
                    f"[specbench] resuming {self.store.dir}: {len(self.samples) - len(pending)} "
                    f"sample(s) already done, {len(pending)} to go"
                )
            self.start_engine(pending[0] if pending else None)
            self._run_samples(pending)
            status = "complete"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self.finish(status)
        return self.store.dir

    def pending(self) -> list[Sample]:
        """The samples not yet finished in the output folder."""
        return [s for s in self.samples if s.sample_id not in self.store.finished_ids]

    def done(self) -> bool:
        """Whether the output folder holds this run complete: nothing to load, lock or write."""
        return not self.pending() and (self.store.previous_summary or {}).get("status") == "complete"

    def open(self) -> None:
        """Load the model unless one was given, then become the folder's writer (lock). Nothing is written before
        the first sample is: a model or drafter that fails to load leaves no folder behind (``_write_config``)."""
        if self.lm is None:
            self.lm = load_target(self.cfg, self.device, self.dtype)
        self.traffic = self._traffic()
        self.store.begin()
        if self.cfg.get("budget") == "auto":
            self._choose_budget()

    def _choose_budget(self) -> None:
        """budget=auto: calibrate (or reuse the choice this folder stored), then set the method's size knob."""
        assert isinstance(self.lm, LoadedModel)  # loaded by open(); budget=auto runs on specbench's engines only
        record = self.store.read_json(BUDGET_FILE)
        if record is None:
            calibration = calibrate(self.cfg, self.lm, self.device, self.dataset, self.samples)
            record = calibration.record(knob_key(self.cfg), default_value(self.cfg))
        else:
            print(f"[specbench] reusing the budget this run chose when it started ({self.store.dir / BUDGET_FILE})")
        print(
            f"[specbench] budget=auto: {record['key']}={record['value']} (predicted {record['predicted_speedup']:.2f}x "
            f"AR; the method's default is {record['default']})"
        )
        self.budget = record
        self.cfg = with_budget(self.cfg, record["value"])
        self.method = prepare_method(self.cfg.method)  # the drafter at the chosen size

    def start_engine(self, first: Sample | None) -> None:
        """Build the measured engine once (its drafter the one checked when the run opened), warm it up on ``first``
        (if any), then make it forget what the warm-up taught it (``Engine.forget``) and replay the finished
        samples."""
        if self.cfg.engine.name == "vllm":
            self._start_vllm(first)
            return
        assert isinstance(self.lm, LoadedModel)  # given, or loaded by open() (engine=hf)
        if self.compile and self.eager_because is None:
            self.verifier = compiled_verifier(self.lm.model)
            if first is not None:
                self._compile(first)
        self.engine = build_engine(
            self.cfg.method, self.lm, self.sampling, self.cfg.step_breakdown, self.verifier, self.method
        )
        if first is not None and self.cfg.warmup:
            with torch.inference_mode():
                warm_up_verify(self.lm.model)
            prompt_ids = self._prompt(first, [])
            for _ in range(self.cfg.warmup):
                with torch.inference_mode():
                    self.engine.generate(
                        prompt_ids, self.cfg.max_new_tokens, sample_generator(self.cfg.seed, first.sample_id)
                    )
            self.engine.forget()
        self.compile_record["compiled"] = self.engine.compiled  # what runs, as the engine says
        self._check_parts(self.engine.artefacts())
        if first is not None:
            self._replay_finished()

    def _replay_finished(self) -> None:
        """Resuming: the measured engine goes through the finished samples' generations in run order, untimed, before
        the first pending one (``Engine.replay``), so what a drafter keeps across requests (a global suffix tree, a
        successor matrix, an output trie) is what it would be had the run not stopped, and the resumed samples record
        the steps an uninterrupted run records. The warm-up leaves no trace: the engine forgot it."""
        assert self.engine is not None and self.lm is not None  # built by start_engine, loaded by open()
        turns: dict[str, list[dict]] = {}
        for record in self.store.records:  # in the order they were written
            turns.setdefault(record["sample_id"], []).append(record)
        samples = {sample.sample_id: sample for sample in self.samples}
        regenerated = differ = 0
        for sample_id, records in turns.items():
            sample = samples.get(sample_id) or self._sample(sample_id)
            generator = sample_generator(self.cfg.seed, sample_id)
            for record in sorted(records, key=lambda record: record["turn"]):
                prompt_ids = self._prompt(sample, [r["output_text"] for r in records if r["turn"] < record["turn"]])
                with torch.inference_mode():
                    output = self.engine.replay(prompt_ids, record["output_ids"], self.cfg.max_new_tokens, generator)
                regenerated += output is not None
                differ += output not in (None, record["output_ids"]) or prompt_sha(prompt_ids) != record["prompt_sha"]
        if regenerated:
            print(
                f"[specbench] regenerated the {regenerated} finished generation(s) untimed: {self.cfg.method.name} "
                f"keeps across requests what only the target's verify passes tell"
            )
        if differ:
            print(
                f"[specbench] warning: {differ} finished generation(s) came out differently when replayed (another "
                f"prompt, or nondeterministic kernels); the resumed samples may not record the steps an uninterrupted "
                f"run would"
            )

    def _sample(self, sample_id: str) -> Sample:
        """The dataset's sample of this id, beyond ``limit`` (a folder finished further by an earlier command)."""
        found = next((sample for sample in self.dataset.samples(None) if sample.sample_id == sample_id), None)
        if found is None:
            raise DataError(
                f"{self.store.dir} holds sample {sample_id!r}, which dataset {self.dataset.name} no longer has; "
                f"choose another output_dir=..."
            )
        return found

    def _start_vllm(self, first: Sample | None) -> None:
        """Start vLLM and warm it up on ``first`` (its prefix cache emptied after).

        NOTE: vLLM's warmth lives in its process, so its warm-up runs on the measured engine; a counterpart that
        learns across requests (``vllm.learns_across_requests``: SuffixDecoding's global tree, which vLLM cannot
        empty) gets no warm-up request rather than the first sample's answer in its memory.
        """
        assert self.lm is not None  # given, or loaded by open()
        for key, (value, same) in differences(self.cfg.method).items():
            print(
                f"[specbench] note: method.{key}={value} has no vLLM counterpart; vLLM runs it as {key}={same}",
                file=sys.stderr,
            )
        engine = start_vllm(self.cfg, self.sampling, self.lm.eos_ids, self.lm.context_length)
        self.engine = engine
        if first is not None and not engine.learns_across_requests:
            prompt_ids = self._prompt(first, [])
            for _ in range(self.cfg.warmup):
                engine.generate(prompt_ids, self.cfg.max_new_tokens, sample_generator(self.cfg.seed, first.sample_id))
        self._check_parts(engine.artefacts())
        if first is not None:
            self._replay_finished()
            engine.forget()  # the warm-up's and replayed prompts: no cache hit for a measured prefill

    def _traffic(self) -> dict | None:
        """The summary's ``memory_traffic``: the bytes a batch-1 forward of the loaded target reads and this device's
        peak bandwidth; None for vLLM, whose copy of the model lives in its own process."""
        if not isinstance(self.lm, LoadedModel):
            return None
        peak = peak_bandwidth(self.device)
        return {**memory_traffic(self.lm.model), "peak_bytes_per_s": peak["bytes_per_s"], "peak_source": peak["source"]}

    def _compile_record(self) -> dict:
        """The summary's ``compile`` before this writer compiled anything (its timed compilations carried over)."""
        before = (self.store.previous_summary or {}).get("compile") or {}
        return {
            "setting": self.cfg.compile,
            "compiled": self.compile and self.eager_because is None,
            "eager_because": self.eager_because,
            "buckets": None,
            "compile_s": None,
            "graphs": None,
            "timed_compilations": before.get("timed_compilations", 0),
        }

    def _compile(self, first: Sample) -> None:
        """Compile every bucket of the compiled path on a cache sized for ``first``, before any timed sample; the
        seconds and graphs go to the summary's ``compile``."""
        assert self.verifier is not None and self.lm is not None  # start_engine made both
        rows = len(self._prompt(first, [])) + self.cfg.max_new_tokens
        with torch.inference_mode():
            warm = self.verifier.warm_up(rows)
        print(
            f"[specbench] compile: {len(self.verifier.buckets)} buckets {list(self.verifier.buckets)} in "
            f"{warm.seconds:.1f} s ({warm.graphs} graphs compiled)",
            file=sys.stderr,
        )
        self.compile_record.update(
            buckets=list(self.verifier.buckets), compile_s=round(warm.seconds, 3), graphs=warm.graphs
        )

    def _check_parts(self, parts: list[str]) -> None:
        """Refuse to add samples made with other drafts or heads to a folder's earlier ones (unless forced)."""
        before = (self.store.previous_summary or {}).get("artefacts")
        if self.store.records and before is not None and sorted(before) != sorted(parts) and not self.cfg.force:
            raise RunConflict(
                f"{self.store.dir} holds samples made with {sorted(before)}, but this run loaded {sorted(parts)}; "
                f"results of different drafts or heads are never mixed. Choose another output_dir=..., or pass "
                f"force=true to continue into it anyway"
            )

    def run_sample(self, sample: Sample) -> list[dict]:
        """Time every turn of one sample, append its records and refresh the summary; returns the records."""
        return self.run_batch([sample])

    def run_batch(self, samples: list[Sample]) -> list[dict]:
        """Time every turn of ``samples``, generated together (a batch; one sample on specbench's own engines),
        append their records in one write and refresh the summary; returns the records."""
        environment.reset_peak_memory(self.device)
        records = self._run_batch(samples)
        self._write_config()
        self.store.append(records)
        peak = environment.peak_memory(self.device) if self.cfg.engine.name == "hf" else None  # vLLM's own process
        if peak is not None and (self.peak_memory is None or peak["bytes"] > self.peak_memory["bytes"]):
            self.peak_memory = peak
        self.store.write_summary(self.summary("running"))
        return records

    def batches(self, samples: list[Sample]) -> list[list[Sample]]:
        """``samples`` in the run's batches of ``batch_size`` (in order, so a resumed run batches as the first did:
        a batch's records are written together); with ``concurrency``, one load of them all."""
        size = len(samples) if self.cfg.concurrency is not None else self.cfg.batch_size
        return [samples[start : start + size] for start in range(0, len(samples), size)]

    def _write_config(self) -> None:
        """Before this writer's first record: the resolved config (and a budget=auto choice not yet stored)."""
        if self.config_written:
            return
        self.store.write_config(OmegaConf.to_yaml(self.cfg, resolve=True))
        if self.budget is not None and self.budget["mode"] == "auto" and self.store.read_json(BUDGET_FILE) is None:
            self.store.write_json(BUDGET_FILE, self.budget)
        self.config_written = True

    def finish(self, status: str) -> None:
        """Write the final summary with ``status`` (complete, interrupted or failed) and release the folder. Only a
        writer that added samples writes one: nothing is written before this writer's first sample, so a run refused
        or stopped before it leaves the folder (a finished run's summary included) as it found it."""
        try:
            if self.store.lock.held and self.config_written:
                self.store.write_summary(self.summary(status))
        finally:
            if isinstance(self.engine, VLLMEngine):
                self.engine.close()
            self.store.close()

    def _run_samples(self, pending: list[Sample]) -> None:
        """Run each pending batch of samples; the tqdm bar shows tokens/s so far."""
        bar = tqdm(
            total=len(pending),
            desc=f"{self.cfg.method.name} on {self.dataset.name}",
            unit="sample",
            disable=not self.cfg.progress,
            file=sys.stderr,
        )
        tokens = seconds = 0.0
        for batch in self.batches(pending):
            records = self.run_batch(batch)
            tokens += sum(r["new_tokens"] for r in records)
            seconds += sum(machine_seconds(r) for r in records)
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{tokens / seconds:.1f}" if seconds else "-")
        bar.close()

    def _prompt(self, sample: Sample, answers: list[str]) -> list[int]:
        """Prompt ids for the next turn of ``sample`` given the model's earlier answers."""
        assert self.lm is not None  # given, or loaded by open()
        prompt_ids = self.dataset.prompt_ids(self.lm.tokenizer, sample, answers)
        check_fits(sample, prompt_ids, self.cfg.max_new_tokens, self.lm.context_length)
        return prompt_ids

    def _run_batch(self, samples: list[Sample]) -> list[dict]:
        """All turns of ``samples``, turn by turn (each later turn sees the model's own earlier answers); the
        records of each sample together, in sample order."""
        assert self.lm is not None  # given, or loaded by open()
        generators = {s.sample_id: sample_generator(self.cfg.seed, s.sample_id) for s in samples}
        answers: dict[str, list[str]] = {s.sample_id: [] for s in samples}
        records: dict[str, list[dict]] = {s.sample_id: [] for s in samples}
        for turn in range(max(len(s.turns) for s in samples)):
            active = [s for s in samples if turn < len(s.turns)]
            prompts = [self._prompt(s, answers[s.sample_id]) for s in active]
            gens, wall, energy = self._timed_generate(prompts, [generators[s.sample_id] for s in active])
            for sample, prompt_ids, gen in zip(active, prompts, gens, strict=True):
                text = self.lm.tokenizer.decode(gen.output_ids, skip_special_tokens=True)
                assert isinstance(text, str)  # one sequence of ids decodes to one string
                answers[sample.sample_id].append(text)
                record = self._record(sample, turn, prompt_ids, gen, text, batch=(len(active), wall), energy=energy)
                records[sample.sample_id].append(record)
        return [record for sample in samples for record in records[sample.sample_id]]

    def _timed_generate(
        self, prompts: list[list[int]], generators: list[torch.Generator]
    ) -> tuple[list[Generation], float, float | None]:
        """One call of the engine on ``prompts`` (one, or a batch for vLLM), timed end to end with device
        synchronization on both sides; its generations, wall time and the joules the energy counter read over it
        (None without a counter)."""
        assert self.engine is not None  # built by start_engine
        with torch.inference_mode():
            synchronize(self.device)
            joules_before = self.energy.read()
            graphs = compilations()
            start = time.perf_counter()
            if isinstance(self.engine, VLLMEngine):
                gens = self.engine.generate_batch(
                    prompts, self.cfg.max_new_tokens, list(generators), self.cfg.concurrency
                )
            else:
                (prompt_ids,), (generator,) = prompts, generators
                gens = [self.engine.generate(prompt_ids, self.cfg.max_new_tokens, generator)]
            synchronize(self.device)
            wall = time.perf_counter() - start
            self.compile_record["timed_compilations"] += compilations() - graphs
            joules_after = self.energy.read()
        return gens, wall, joules_between(joules_before, joules_after, self.energy)

    def _record(
        self,
        sample: Sample,
        turn: int,
        prompt_ids: list[int],
        gen: Generation,
        text: str,
        *,
        batch: tuple[int, float],
        energy: float | None,
    ) -> dict:
        """One samples.jsonl line (fields documented in specbench.schema); ``batch`` is the size and wall time of the
        engine call that generated it, ``energy`` that call's joules (shared out evenly among its requests)."""
        assert self.engine is not None  # built by start_engine
        size, wall = batch
        return {
            "schema": SCHEMA_VERSION,
            "run_id": self.run_id,
            "sample_id": sample.sample_id,
            "turn": turn,
            "n_turns": len(sample.turns),
            "category": sample.category,
            "fine_category": sample.meta.get("fine_category"),
            "prompt_tokens": len(prompt_ids),
            "prompt_sha": prompt_sha(prompt_ids),
            "new_tokens": len(gen.output_ids),
            "output_ids": gen.output_ids,
            "output_text": text,
            "wall_s": wall if gen.latency_s is None else gen.latency_s,
            "batch_size": size,
            "batch_wall_s": wall,
            "prefill_s": gen.prefill_s,
            "target_forwards": gen.target_forwards,
            **step_record(gen),
            "energy_j": None if energy is None else energy / size,
            "stop_reason": gen.stop_reason,
            "measuring_session": environment.measuring_session(),
            "drafter_stats": self.engine.stats(),
        }

    def engine_record(self) -> dict:
        """The summary's ``engine``: which engine generated, at which batch size (vLLM adds its versions and the
        arguments it was built with)."""
        described = self.engine.describe() if isinstance(self.engine, VLLMEngine) else {"name": self.cfg.engine.name}
        return {**described, "batch_size": self.cfg.batch_size, "concurrency": self.cfg.concurrency}

    def summary(self, status: str) -> dict:
        """summary.json content for the records on disk now (fields in specbench.schema)."""
        cfg = self.cfg
        return run_summary(
            self.store.records,
            **config_fields(cfg),
            run_id=self.run_id,
            status=status,
            model_path=self.lm.path if self.lm else cfg.model.get("path"),
            dataset_info=self.dataset_info,
            prompt_format=self.dataset.format_used(self.lm.tokenizer) if self.lm else None,
            started_at=self.started_at,
            updated_at=self._now(),
            ended_at=None if status == "running" else self._now(),
            peak_memory=self.peak_memory,
            device_map=self.lm.device_map if self.lm else None,
            environment={**self.environment, "energy": self.energy.describe()},
            config_digest=self.store.digest,
            bench=self.bench,
            target=target_digest(cfg, self.dtype),
            artefacts=sorted(self.engine.artefacts())
            if self.engine
            else (self.store.previous_summary or {}).get("artefacts"),
            budget=self.budget,
            engine=self.engine_record(),
            latency_curves=[curve.to_dict() for curve in cached_curves(cfg.model.name, self.device, self.dtype)],
            compile=self.compile_record,
            memory_traffic=self.traffic or (self.store.previous_summary or {}).get("memory_traffic"),
        )


def load_target(cfg: DictConfig, device: torch.device, dtype: torch.dtype) -> LoadedModel | TargetFiles:
    """The run's target: loaded for specbench's own engines, only its files read for vLLM (which loads it)."""
    return describe_target(cfg.model) if cfg.engine.name == "vllm" else load_model(cfg.model, device, dtype)
