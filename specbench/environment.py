"""Environment capture: recorded beside every number so results say where they were measured."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

import torch

from specbench import dependencies

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cpu_name() -> str:
    """CPU model string (from /proc/cpuinfo on Linux)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git_state() -> dict:
    """Commit and dirty flag of the specbench checkout (null outside a git checkout)."""

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if commit is None else bool(status)}


def device_name(device: torch.device) -> str:
    """Human-readable accelerator name, or 'cpu: <model>'."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu: {cpu_name()}"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``float16`` (the spelling config keys use)."""
    return str(dtype).removeprefix("torch.")


CUDNN_ATTENTION_ENV = "SPECBENCH_CUDNN_ATTENTION"
"""Set to 1 to keep PyTorch's cuDNN attention backend for SDPA on CUDA (models.loading switches it off)."""


def cudnn_attention(device: torch.device) -> bool | None:
    """Whether SDPA may pick cuDNN attention on ``device`` in this process (None off CUDA, where it never does)."""
    return os.environ.get(CUDNN_ATTENTION_ENV) == "1" if device.type == "cuda" else None


@cache
def measuring_session() -> str:
    """This process's measuring session, ``<UTC start>-<machine>-<pid>`` (the machine: 6 hex digits of a digest of
    the host name): every record a process times carries it, so a speedup is only ever a ratio of times taken in
    one sitting on one machine (``report.compare``'s same-session pairing)."""
    machine = hashlib.sha256(platform.node().encode()).hexdigest()[:6]
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{machine}-{os.getpid()}"


def capture(device: torch.device, dtype: torch.dtype) -> dict:
    """Everything a reader needs to judge a timing: hardware, threads, library versions (the whole runtime
    dependency set and its match with the lock), code state."""
    import transformers

    return {
        "device": str(device),
        "device_name": device_name(device),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cudnn_attention": cudnn_attention(device),
        "dtype": dtype_name(dtype),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "measuring_session": measuring_session(),
        **git_state(),
        **dependencies.capture(),
    }


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window: CUDA's allocator peak, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
    elif Path("/proc/self/clear_refs").exists():
        Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM (the peak RSS) to the current RSS


def peak_memory(device: torch.device) -> dict | None:
    """Peak memory since ``reset_peak_memory``: {kind, bytes}, or None where it cannot be read.

    On CUDA it is the sum of every visible GPU's allocator peak (a device-mapped model spans several).
    """
    if device.type == "cuda":
        peaks = [torch.cuda.max_memory_allocated(index) for index in range(torch.cuda.device_count())]
        return {"kind": "cuda_max_allocated", "bytes": int(sum(peaks))}
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return {"kind": "process_peak_rss", "bytes": int(line.split()[1]) * 1024}
    return None
