"""Energy meters on fake counters: a powercap tree in tmp_path and a stand-in for pynvml."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from specbench import energy

MJ = 1000  # NVML counts millijoules


def zone(root: Path, name: str, label: str, microjoules: int, wrap_uj: int | None = 10_000_000) -> Path:
    """One powercap zone folder: name, energy_uj and (optionally) max_energy_range_uj."""
    folder = root / name
    folder.mkdir()
    (folder / "name").write_text(f"{label}\n")
    (folder / "energy_uj").write_text(f"{microjoules}\n")
    if wrap_uj is not None:
        (folder / "max_energy_range_uj").write_text(f"{wrap_uj}\n")
    return folder


def set_uj(folder: Path, microjoules: int) -> None:
    """Move a fake zone's counter."""
    (folder / "energy_uj").write_text(f"{microjoules}\n")


@pytest.fixture
def powercap(tmp_path):
    """Two packages, plus zones a package sum must leave out: a subzone, the MMIO twin of package 0, psys."""
    root = tmp_path / "powercap"
    root.mkdir()
    zone(root, "intel-rapl:0", "package-0", 1_000_000)
    zone(root, "intel-rapl:1", "package-1", 2_500_000)
    zone(root, "intel-rapl:0:0", "core", 900_000_000)
    zone(root, "intel-rapl-mmio:0", "package-0", 800_000_000)
    zone(root, "intel-rapl:2", "psys", 700_000_000)
    (root / "intel-rapl").mkdir()  # the control type folder sysfs lists beside the zones
    return root


def test_rapl_sums_the_packages_only(powercap):
    meter = energy.open_meter("cpu", powercap_root=powercap)
    assert meter.source == "rapl" and meter.unavailable is None
    assert meter.domains == ["intel-rapl:0 (package-0)", "intel-rapl:1 (package-1)"]
    start = meter.read()
    assert start == pytest.approx(3.5)
    set_uj(powercap / "intel-rapl:0", 1_750_000)
    assert energy.joules_between(start, meter.read(), meter) == pytest.approx(0.75)
    assert meter.describe() == {"source": "rapl", "domains": meter.domains, "unavailable": None}


def test_rapl_wraparound_of_one_package(powercap):
    meter = energy.open_meter("cpu", powercap_root=powercap)
    set_uj(powercap / "intel-rapl:0", 9_500_000)  # 0.5 J before the 10 J wrap
    start = meter.read()
    set_uj(powercap / "intel-rapl:0", 500_000)  # wrapped: +1 J
    set_uj(powercap / "intel-rapl:1", 3_500_000)  # +1 J
    end = meter.read()
    assert end < start
    assert meter.wrap_j == pytest.approx(10.0)
    assert energy.joules_between(start, end, meter) == pytest.approx(2.0)


def test_rapl_wraparound_with_mixed_ranges_is_unknown(tmp_path):
    root = tmp_path / "powercap"
    root.mkdir()
    first = zone(root, "intel-rapl:0", "package-0", 9_000_000, wrap_uj=10_000_000)
    zone(root, "intel-rapl:1", "package-1", 0, wrap_uj=20_000_000)
    meter = energy.open_meter("cpu", powercap_root=root)
    start = meter.read()
    set_uj(first, 1_000_000)
    assert meter.wrap_j is None
    assert energy.joules_between(start, meter.read(), meter) is None


def test_an_unreadable_counter_makes_the_meter_unavailable(powercap, monkeypatch):
    """Since Linux 5.10 energy_uj is root's; the tests run as root, so the refusal is simulated."""
    denied = powercap / "intel-rapl:1" / "energy_uj"
    real = energy.read_int

    def read_int(path: Path) -> int:
        if path == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(energy, "read_int", read_int)
    meter = energy.open_meter("cpu", powercap_root=powercap)
    assert meter.source is None and meter.read() is None
    assert meter.unavailable == f"permission denied on {denied} (root needed since Linux 5.10)"
    assert meter.describe() == {"source": None, "domains": [], "unavailable": meter.unavailable}


def test_a_garbled_counter_makes_the_meter_unavailable(powercap):
    (powercap / "intel-rapl:0" / "energy_uj").write_text("not a number\n")
    meter = energy.open_meter("cpu", powercap_root=powercap)
    assert meter.source is None
    assert meter.unavailable.startswith(f"RAPL counter {powercap / 'intel-rapl:0' / 'energy_uj'} not readable")


def test_absent_tree_and_tree_without_packages(tmp_path):
    absent = energy.open_meter("cpu", powercap_root=tmp_path / "nowhere")
    assert absent.source is None and absent.read() is None
    assert absent.unavailable == f"RAPL counters not readable: {tmp_path / 'nowhere'} absent"
    zone(tmp_path, "intel-rapl:0:0", "core", 1)
    empty = energy.open_meter("cpu", powercap_root=tmp_path)
    assert "no package zone" in empty.unavailable


def test_a_counter_that_breaks_after_opening_nulls_the_reading(powercap):
    meter = energy.open_meter("cpu", powercap_root=powercap)
    assert meter.read() is not None
    (powercap / "intel-rapl:1" / "energy_uj").unlink()
    assert meter.read() is None
    assert meter.unavailable.startswith("reading intel-rapl:1 (package-1) failed")
    assert meter.source == "rapl"  # the counter existed: describe() shows both what it was and why it stopped


def test_joules_between_without_readings():
    meter = energy.EnergyMeter(None, unavailable="none")
    assert energy.joules_between(None, 3.0, meter) is None
    assert energy.joules_between(3.0, None, meter) is None
    assert energy.joules_between(5.0, 3.0, meter) is None  # went back with no wrap range: a counter reset


def test_unmetered_device_types():
    meter = energy.open_meter("mps")
    assert meter.source is None and meter.unavailable == "no energy counter for device type 'mps'"


# --- NVML through a stand-in pynvml ---------------------------------------------------------------------------


class NVMLError(Exception):
    """pynvml's exception base, as the stand-in raises it."""


def fake_pynvml(gpus: list[dict], init_error: Exception | None = None) -> SimpleNamespace:
    """The few pynvml calls the meter makes, over GPUs given as {name, uuid, mj (millijoules, or an error)}."""
    fake: SimpleNamespace

    def init() -> None:
        if init_error is not None:
            raise init_error
        fake.inits += 1

    def total_energy(handle: int) -> int:
        value = fake.gpus[handle]["mj"]
        if isinstance(value, Exception):
            raise value
        return value

    fake = SimpleNamespace(
        gpus=gpus,
        inits=0,
        nvmlInit=init,
        nvmlDeviceGetCount=lambda: len(fake.gpus),
        nvmlDeviceGetHandleByIndex=lambda number: number,
        nvmlDeviceGetUUID=lambda handle: fake.gpus[handle]["uuid"],
        nvmlDeviceGetName=lambda handle: fake.gpus[handle]["name"],
        nvmlDeviceGetTotalEnergyConsumption=total_energy,
    )
    return fake


def two_gpus(second: int | Exception = 50 * MJ, name: str = "NVIDIA H100") -> SimpleNamespace:
    """Two GPUs: NVML number 0 at 10 J and number 1 at ``second``."""
    return fake_pynvml(
        [
            {"name": name, "uuid": "GPU-aaaa1111-0000", "mj": 10 * MJ},
            {"name": "NVIDIA H100", "uuid": "GPU-bbbb2222-0000", "mj": second},
        ]
    )


@pytest.fixture
def nvml(monkeypatch):
    """Installs a stand-in pynvml (the returned setter) with a fresh once-per-process initialisation."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    energy.nvml_start.cache_clear()

    def install(fake: SimpleNamespace | None) -> SimpleNamespace | None:
        monkeypatch.setattr(energy, "pynvml", fake)
        return fake

    yield install
    energy.nvml_start.cache_clear()


def test_nvml_sums_every_visible_gpu_and_initialises_once(nvml):
    fake = nvml(two_gpus())
    meter = energy.open_meter("cuda")
    assert meter.source == "nvml" and meter.unavailable is None
    assert meter.domains == ["NVIDIA H100 (GPU-aaaa1111-0000)", "NVIDIA H100 (GPU-bbbb2222-0000)"]
    start = meter.read()
    assert start == pytest.approx(60.0)
    fake.gpus[1]["mj"] += 2500
    assert energy.joules_between(start, meter.read(), meter) == pytest.approx(2.5)
    energy.open_meter("cuda:1")
    assert fake.inits == 1


def test_cuda_visible_devices_selects_the_gpu(nvml, monkeypatch):
    nvml(two_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    for device in ("cuda", "cuda:0"):
        meter = energy.open_meter(device)
        assert meter.domains == ["NVIDIA H100 (GPU-bbbb2222-0000)"] and meter.read() == pytest.approx(50.0)
    assert "not one of the 1 visible GPUs" in energy.open_meter("cuda:1").unavailable


def test_cuda_visible_devices_by_uuid_prefix_and_order(nvml, monkeypatch):
    nvml(two_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb,GPU-aaaa1111-0000")
    meter = energy.open_meter("cuda:0")
    assert meter.domains == ["NVIDIA H100 (GPU-bbbb2222-0000)"]
    assert energy.open_meter("cuda", gpus=[1]).domains == ["NVIDIA H100 (GPU-aaaa1111-0000)"]


def test_cuda_visible_devices_ends_at_the_first_invalid_entry(nvml, monkeypatch):
    nvml(two_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,0")
    assert len(energy.open_meter("cuda").domains) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert energy.open_meter("cuda").unavailable == "no visible GPU to meter"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1234")
    assert "MIG instance" in energy.open_meter("cuda").unavailable


def test_mixed_gpus_need_a_defined_order(nvml, monkeypatch):
    nvml(two_gpus(name="NVIDIA A100"))
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in energy.open_meter("cuda:0").unavailable
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert energy.open_meter("cuda:0").domains == ["NVIDIA A100 (GPU-aaaa1111-0000)"]


def test_a_gpu_without_the_counter_is_unavailable(nvml, monkeypatch):
    nvml(two_gpus(second=NVMLError("Not Supported")))
    meter = energy.open_meter("cuda")
    assert meter.source is None and meter.read() is None
    assert meter.unavailable == (
        "NVIDIA H100 (GPU-bbbb2222-0000) does not report its total energy (Volta or newer needed): Not Supported"
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert energy.open_meter("cuda").source == "nvml"  # the unsupported GPU is not the process's


def test_nvml_that_cannot_start(nvml):
    nvml(fake_pynvml([], init_error=NVMLError("NVML Shared Library Not Found")))
    meter = energy.open_meter("cuda:0")
    assert meter.source is None
    assert meter.describe()["unavailable"] == "no NVML: pynvml failed to initialise (NVML Shared Library Not Found)"
    nvml(None)
    energy.nvml_start.cache_clear()
    assert energy.open_meter("cuda").unavailable == "no NVML: nvidia-ml-py is not installed"


def test_the_meter_never_raises(nvml, monkeypatch):
    fake = nvml(two_gpus())
    meter = energy.open_meter("cuda")
    fake.gpus[0]["mj"] = RuntimeError("GPU is lost")
    assert meter.read() is None
    assert meter.unavailable == "reading NVIDIA H100 (GPU-aaaa1111-0000) failed: GPU is lost"

    def explode(_):
        raise ZeroDivisionError

    monkeypatch.setattr(fake, "nvmlDeviceGetUUID", explode)
    broken = energy.open_meter("cuda")
    assert broken.source is None and broken.unavailable == "energy meter failed to open: ZeroDivisionError"
    assert energy.open_meter("cuda:x").source is None  # a device string torch would refuse


# --- this machine -------------------------------------------------------------------------------------------


def check_real(meter: energy.EnergyMeter) -> None:
    """A real meter either reads joules or says why it cannot."""
    described = meter.describe()
    if meter.source is None:
        assert meter.read() is None
        assert described["unavailable"] and described["domains"] == []
    else:
        reading = meter.read()
        assert reading is not None and math.isfinite(reading)


def test_this_machines_cpu_meter():
    meter = energy.open_meter("cpu")
    check_real(meter)
    if not energy.POWERCAP_ROOT.exists():
        assert meter.describe()["unavailable"] == "RAPL counters not readable: /sys/class/powercap absent"


def test_this_machines_gpu_meter():
    energy.nvml_start.cache_clear()
    try:
        meter = energy.open_meter("cuda")
        failure = energy.nvml_start()
    finally:
        energy.nvml_start.cache_clear()
    check_real(meter)
    if failure:  # no driver here: the reason is NVML's own
        assert failure.startswith("no NVML: ") and meter.describe()["unavailable"] == failure
