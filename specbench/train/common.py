"""Helpers every ``specbench.train`` command shares: config, digests, the target, JSON outputs."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.config import compose_config
from specbench.errors import ConfigError
from specbench.files import write_atomic
from specbench.manifest import digest
from specbench.models.loading import LoadedModel, load_model, resolve_device, resolve_dtype
from specbench.paths import cache_root
from specbench.settings import setting_problems


def compose_train(command: str, overrides: list[str]) -> DictConfig:
    """``conf/train/<command>.yaml`` with Hydra overrides; a bad override is a one-line ConfigError."""
    try:
        return compose_config(*overrides, config_name=f"train/{command}")
    except ConfigError as error:
        raise ConfigError(f"invalid override for `specbench.train {command}`: {error}") from None


@dataclass
class ShareGPTSettings:
    """The types of ``prompts.sharegpt.*``: where the ShareGPT seed prompts come from."""

    hub_id: str
    file: str


@dataclass
class PromptSettings:
    """The types of ``prompts.*`` (conf/train/prompts.yaml): the self-distilled data every trainer uses."""

    sources: list[str]
    per_source_limit: int | None
    max_prompts: int | None
    shuffle_seed: int
    max_prompt_tokens: int
    prompt_format: str
    system_prompt: str | None
    sharegpt: ShareGPTSettings
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    teacher_topk: int
    batch_size: int


@dataclass
class OptimizerSettings:
    """The types of the ``train.*`` keys every trainer shares (the time cap and AdamW with warm-up and clipping);
    each trainer's schema adds its own."""

    max_minutes: float | None
    batch_size: int
    lr: float
    warmup_steps: int
    weight_decay: float
    grad_clip: float


@dataclass
class TrainerSettings:
    """The types of the settings every ``specbench.train`` command shares (conf/train/<command>.yaml); each
    command's schema adds its own nodes."""

    device: str
    dtype: str
    data_dir: str | None
    output_dir: str | None
    force: bool
    progress: bool
    prompts: PromptSettings


def head_training_checks(train) -> list[tuple[bool, str]]:
    """(holds, message) for the ``train.*`` keys the head trainers (Medusa, EAGLE, Hydra) share."""
    return [
        (train.max_steps >= 1, f"train.max_steps must be >= 1 (got {train.max_steps})"),
        (
            train.max_minutes is None or train.max_minutes > 0,
            f"train.max_minutes must be > 0 or null (got {train.max_minutes})",
        ),
        (train.batch_size >= 1, f"train.batch_size must be >= 1 (got {train.batch_size})"),
        (train.lr > 0, f"train.lr must be > 0 (got {train.lr})"),
        (train.eval_sequences >= 1, f"train.eval_sequences must be >= 1 (got {train.eval_sequences})"),
        (train.eval_top_k >= 1, f"train.eval_top_k must be >= 1 (got {train.eval_top_k})"),
        (
            train.amp_dtype in AMP_CHOICES,
            f"train.amp_dtype must be auto, null, bfloat16 or float16 (got {train.amp_dtype})",
        ),
    ]


def data_problems(cfg: DictConfig, soft_labels: bool) -> list[str]:
    """What the trainer's ``train.*`` asks of the self-distilled data that its ``prompts.*`` cannot give, found before
    anything loads: more held-out sequences than the prompts can yield, or (``soft_labels``: the trainer distils
    the target's top-k laws) no top-k records."""
    prompts, held_out = cfg.prompts, cfg.train.eval_sequences
    caps = {
        f"prompts.max_prompts={prompts.max_prompts}": prompts.max_prompts,
        f"prompts.per_source_limit={prompts.per_source_limit} x {len(prompts.sources)} source(s)": (
            None if prompts.per_source_limit is None else prompts.per_source_limit * len(prompts.sources)
        ),
    }
    bounded = {name: cap for name, cap in caps.items() if cap is not None}
    problems = []
    if bounded and held_out >= min(bounded.values()):
        name = min(bounded, key=lambda key: bounded[key])
        problems.append(
            f"train.eval_sequences={held_out} holds out every sequence: {name} gives at most {bounded[name]}; "
            f"lower train.eval_sequences or raise the prompt cap"
        )
    if soft_labels and prompts.teacher_topk < 1:
        problems.append(
            f"this trainer distils the target's top-k next-token laws: prompts.teacher_topk must be >= 1 "
            f"(got {prompts.teacher_topk})"
        )
    return problems


def check_types(cfg: DictConfig, schema: type, what: str) -> None:
    """A ConfigError naming every setting of ``cfg`` that its schema refuses (``what``: e.g. 'draft training')."""
    problems = setting_problems(cfg, schema)
    if problems:
        raise ConfigError(f"invalid {what} settings: " + "; ".join(problems))


def container(node) -> dict:
    """A config node as plain, resolved Python data (for digests and JSON records)."""
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    assert isinstance(data, dict)  # a DictConfig converts to a dict
    return data


def model_identity(lm: LoadedModel) -> dict:
    """What determines a target's outputs: name, weights location, dtype and architecture."""
    config = lm.model.config.to_dict()
    arch = {k: v for k, v in config.items() if not k.startswith("_") and k != "transformers_version"}
    return {"name": lm.name, "path": lm.path, "dtype": str(lm.model.dtype), "config": digest(arch)}


def load_target(cfg: DictConfig) -> LoadedModel:
    """The target named by ``cfg.model`` on ``cfg.device`` in ``cfg.dtype`` (frozen, eval mode)."""
    device = resolve_device(cfg.device)
    lm = load_model(cfg.model, device, resolve_dtype(cfg.dtype, device))
    lm.model.requires_grad_(False)
    return lm


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as indented JSON (the caller makes the enclosing directory atomic)."""
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


class TimeBudget:
    """A training time cap that holds: a step starts only while the slowest step so far still fits in it."""

    def __init__(self, minutes: float | None):
        self.limit = 60 * minutes if minutes else math.inf
        self.start = self.last = time.monotonic()
        self.slowest = 0.0

    def fraction(self) -> float:
        """The share of the budget used so far (0 without a cap)."""
        return (time.monotonic() - self.start) / self.limit

    def allows_step(self) -> bool:
        """Whether one more step (as slow as the slowest yet) ends inside the budget."""
        return time.monotonic() - self.start + self.slowest <= self.limit

    def step_done(self) -> None:
        """Record the step just finished."""
        now = time.monotonic()
        self.slowest = max(self.slowest, now - self.last)
        self.last = now

    def elapsed(self) -> float:
        """Seconds since the budget started."""
        return time.monotonic() - self.start


AMP_CHOICES = (None, "auto", "bfloat16", "float16")


def autocast_dtype(requested: str | None, device: torch.device) -> torch.dtype | None:
    """The mixed-precision dtype to train in: ``auto`` picks bfloat16 only where it is fast (a GPU that
    supports it, or a CPU measured once to multiply faster in bfloat16 than in float32), else float32 (None)."""
    if requested != "auto":
        return getattr(torch, requested) if requested else None
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_bf16_is_faster() else None


def cpu_bf16_is_faster() -> bool:
    """Whether this CPU multiplies faster in bfloat16 than in float32 (measured once, cached per CPU and torch)."""
    from specbench.environment import cpu_name

    path = cache_root() / "hardware.json"
    key = f"{cpu_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads"
    known = json.loads(path.read_text()) if path.is_file() else {}
    if key not in known:
        known[key] = {"bf16_matmul_ms": matmul_ms(torch.bfloat16), "fp32_matmul_ms": matmul_ms(torch.float32)}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(known, indent=2) + "\n")
    return known[key]["bf16_matmul_ms"] < known[key]["fp32_matmul_ms"]


def matmul_ms(dtype: torch.dtype, size: int = 512, repeats: int = 5) -> float:
    """Best-of-``repeats`` milliseconds of a [size, 4 size] x [4 size, size] matmul in ``dtype`` on the CPU."""
    a, b = torch.randn(size, 4 * size).to(dtype), torch.randn(4 * size, size).to(dtype)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return round(1000 * best, 3)
