"""What a step reads (specbench.bandwidth.memory_traffic) and how fast the device can read it (peak_bandwidth)."""

from __future__ import annotations

import pytest
import torch

from specbench import bandwidth
from tests.conftest import tiny_model

CPU = torch.device("cpu")


def test_memory_traffic_counts_every_weight_but_an_untied_input_table():
    """The tiny Llama (untied): every parameter but the input embedding; KV: keys and values of every layer."""
    model = tiny_model()
    every = sum(p.numel() for p in model.parameters()) * 4
    embedding = model.get_input_embeddings().weight.numel() * 4
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    assert bandwidth.memory_traffic(model) == {
        "weight_bytes": every - embedding,
        "kv_bytes_per_token": 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4,
    }
    tied = tiny_model()
    tied.lm_head.weight = tied.get_input_embeddings().weight  # one table, read whole as the output layer, once
    assert bandwidth.memory_traffic(tied)["weight_bytes"] == every - embedding
    half = bandwidth.memory_traffic(tiny_model().half())
    assert half["kv_bytes_per_token"] * 2 == bandwidth.memory_traffic(model)["kv_bytes_per_token"]


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", 4.8e12),
        ("NVIDIA H100 80GB HBM3", 3.35e12),
        ("NVIDIA H100 PCIe", 2.0e12),
        ("NVIDIA A100-SXM4-80GB", 2.039e12),
        ("NVIDIA A100 80GB PCIe", 1.935e12),
        ("NVIDIA A100-SXM4-40GB", 1.555e12),
        ("NVIDIA L4", 300e9),
        ("NVIDIA L40S", 864e9),
        ("Some Future GPU", None),
    ],
)
def test_the_data_sheet_table_names_the_right_gpu(name, peak):
    assert bandwidth.table_bandwidth(name) == peak


def test_a_cpu_bandwidth_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    measured = []
    monkeypatch.setattr(bandwidth, "copy_bandwidth", lambda device: measured.append(device) or 5e9)
    first = bandwidth.peak_bandwidth(CPU)
    assert bandwidth.peak_bandwidth(CPU) == first and first["bytes_per_s"] == 5e9 and len(measured) == 1
    assert "measured copy" in first["source"] and bandwidth.bandwidth_path(CPU).is_file()


def test_a_copy_moves_bytes_at_a_finite_rate():
    assert 0 < bandwidth.copy_bandwidth(CPU, size=4 * 2**20, repeats=2) < float("inf")
