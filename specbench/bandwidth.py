"""Memory traffic of a decoding step and the device's peak memory bandwidth: what a step's bandwidth share is made of.

At batch 1 a target forward reads every weight once, plus the KV rows of its context, so the time a step needs at
the very least is those bytes over the device's peak memory bandwidth (docs/metrics.md#bandwidth-share). This module
says what both are for one run; ``specbench.metrics.traffic_metrics`` turns them and the run's steps into the share.

- ``memory_traffic(model)``: the bytes of weights a forward reads (``weight_bytes``) and the KV bytes per cached
  token it reads (``kv_bytes_per_token``).
- ``peak_bandwidth(device)``: a GPU's from ``GPU_PEAK_BANDWIDTH`` (the vendors' figures), else from NVML (memory clock
  and bus width); a CPU's is measured once (``copy_bandwidth``: a large tensor copy, read + write bytes over its time
  with the process's torch threads) and cached under ``$SPECBENCH_CACHE/bandwidth/``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import torch

from specbench.core.verify import kv_dims
from specbench.energy import nvml_start, pynvml
from specbench.environment import device_name
from specbench.files import write_atomic
from specbench.paths import cache_root

GPU_PEAK_BANDWIDTH: tuple[tuple[str, float], ...] = (
    (r"GH200", 4.0e12),
    (r"H200", 4.8e12),
    (r"H100.*NVL", 3.9e12),
    (r"H100.*PCIe", 2.0e12),
    (r"H100", 3.35e12),  # SXM5, HBM3
    (r"H800", 3.35e12),
    (r"A100.*80GB.*PCIe", 1.935e12),
    (r"A100.*80GB", 2.039e12),  # SXM4
    (r"A100", 1.555e12),  # 40 GB, SXM4 and PCIe
    (r"A800", 2.039e12),
    (r"L40S", 864e9),
    (r"L40\b", 864e9),
    (r"L4\b", 300e9),
    (r"A10G", 600e9),
    (r"A10\b", 600e9),
    (r"RTX 6000 Ada", 960e9),
    (r"A6000", 768e9),
    (r"RTX 4090", 1008e9),
    (r"RTX 3090", 936e9),
    (r"V100", 900e9),
    (r"T4\b", 320e9),
)
"""Peak memory bandwidth (bytes/s) by a pattern of torch's device name, most specific first (vendor data sheets)."""

COPY_BYTES = 256 * 2**20
"""Size of the tensor ``copy_bandwidth`` copies: far beyond any CPU cache, so the copy streams through memory."""
COPY_REPEATS = 20


def memory_traffic(model) -> dict[str, int]:
    """The bytes one batch-1 forward must read: every weight but the input embedding table (only the looked-up rows
    are read, unless the table is also the output layer), and per cached token its keys and values in every layer."""
    weights = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    if output is None or output.weight is not embedding:
        weights -= embedding.numel() * embedding.element_size()
    layers, heads, head_dim = kv_dims(model)
    return {
        "weight_bytes": weights,
        "kv_bytes_per_token": 2 * layers * heads * head_dim * torch.finfo(model.dtype).bits // 8,
    }


def table_bandwidth(name: str) -> float | None:
    """The data-sheet peak of a GPU named ``name`` (None: not in ``GPU_PEAK_BANDWIDTH``)."""
    return next((peak for pattern, peak in GPU_PEAK_BANDWIDTH if re.search(pattern, name)), None)


def nvml_bandwidth(device: torch.device) -> float | None:
    """2 x the maximum memory clock x the bus width (double data rate) from NVML, or None where NVML cannot say."""
    if nvml_start() is not None:
        return None
    try:
        uuid = torch.cuda.get_device_properties(device).uuid
        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        clock_hz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM) * 1e6
        return 2 * clock_hz * pynvml.nvmlDeviceGetMemoryBusWidth(handle) / 8
    except Exception:  # an old driver or pynvml without the call: the bandwidth stays unknown
        return None


def copy_bandwidth(device: torch.device, size: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> float:
    """Bytes/s of the fastest of ``repeats`` copies of a ``size``-byte tensor on ``device`` (read + write bytes)."""
    source = torch.ones(size // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats + 1):  # the first touches the pages
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size / best


def bandwidth_path(device: torch.device) -> Path:
    """Where the measured copy bandwidth of this device and torch thread count is cached."""
    slug = "".join(char if char.isalnum() else "_" for char in device_name(device)).strip("_")
    return cache_root() / "bandwidth" / f"{slug}_t{torch.get_num_threads()}.json"


def measured_bandwidth(device: torch.device) -> dict:
    """This device's copy bandwidth: read from the cache, else measured once and cached with when it was measured."""
    path = bandwidth_path(device)
    if path.is_file():
        return json.loads(path.read_text())
    measured = {
        "bytes_per_s": copy_bandwidth(device),
        "source": f"measured copy of {COPY_BYTES // 2**20} MiB, {torch.get_num_threads()} threads",
        "measured_at": time.time(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(measured, indent=2) + "\n")
    return measured


def peak_bandwidth(device: torch.device) -> dict:
    """``{bytes_per_s, source}``: the device's peak memory bandwidth and where the number comes from (a GPU's data
    sheet or NVML; a CPU's, or an unknown GPU's, measured copy bandwidth)."""
    if device.type == "cuda":
        name = device_name(device)
        peak = table_bandwidth(name)
        if peak is not None:
            return {"bytes_per_s": peak, "source": f"data sheet ({name})"}
        peak = nvml_bandwidth(device)
        if peak is not None:
            return {"bytes_per_s": peak, "source": "NVML: 2 x memory clock x bus width"}
    measured = measured_bandwidth(device)
    return {"bytes_per_s": measured["bytes_per_s"], "source": measured["source"]}
