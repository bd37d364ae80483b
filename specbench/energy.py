"""Energy counters, where the hardware exposes them: joules per timed generation and per generated token.

The runner reads an ``EnergyMeter`` (``open_meter``) before and after each timed generation and turns the two
readings into joules with ``joules_between``. Two sources are read, both cumulative hardware counters, so a
reading costs a file read or a driver call and nothing runs beside the generation:

- **nvml** (device type ``cuda``): ``nvmlDeviceGetTotalEnergyConsumption``, the millijoules a GPU has used since
  the driver was loaded (Volta and newer), summed over the GPUs the process uses. ``CUDA_VISIBLE_DEVICES``
  (indices or ``GPU-`` UUIDs, prefixes included) maps torch's device numbers to NVML's. The driver refreshes
  the counter periodically rather than on each call, so one short generation's joules are coarse; a run's
  joules per token, summed over its samples, is the robust figure.
- **rapl** (device type ``cpu``): the powercap sysfs tree (``/sys/class/powercap/intel-rapl:N/energy_uj``,
  also what AMD CPUs expose on recent kernels), summed over the package domains only: the ``intel-rapl:N:M``
  subdomains (cores, uncore, DRAM) lie inside or beside a package and would be counted twice, and a
  ``psys`` domain covers the whole platform. RAPL measures the whole package, every other process on it
  included, so CPU joules mean something only on a quiet machine. Since Linux 5.10 ``energy_uj`` is readable
  by root only.

A meter never raises: a counter that cannot be opened leaves ``source`` None and says why in ``unavailable``,
and a read that fails returns None (that sample's energy is null) and records the reason, so a broken counter
costs a number, never a run.

Why nvidia-ml-py and not zeus: nvidia-ml-py is NVIDIA's own binding of NVML, one pure-Python module
(``pynvml``) with no dependencies, and it exposes the counter read here directly. zeus (0.16) is a measurement
and optimisation framework that reads the same counter through the same binding, and would add numpy,
pandas, scikit-learn, pydantic, rich, tyro, httpx, amdsmi and python-dateutil to the benchmark's
environment for it.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

try:
    pynvml: Any = importlib.import_module("pynvml")
except ImportError:  # a declared dependency; an environment without it only loses GPU energy
    pynvml = None

POWERCAP_ROOT = Path("/sys/class/powercap")
"""Where Linux exposes RAPL counters (a parameter of ``open_meter``, so tests can build a fake tree)."""
PACKAGE_ZONE = re.compile(r"intel-rapl:(\d+)")
"""A top-level RAPL zone (``intel-rapl:N``); subzones (``intel-rapl:N:M``) and ``intel-rapl-mmio:N`` do not match."""
ROOT_NEEDED = "root needed since Linux 5.10"


@dataclass
class Counter:
    """One hardware counter: a label, a reader returning joules, and its wrap range in joules (None: no wrap)."""

    label: str
    read: Callable[[], float]
    wrap_j: float | None = None


@dataclass
class EnergyMeter:
    """The sum of one source's counters: ``read()`` gives cumulative joules since an arbitrary origin, or None.

    ``source`` names the counters ("nvml", "rapl", or None when none can be read), ``unavailable`` the reason
    none can be read (or why the last read failed), ``domains`` the counters summed.
    """

    source: str | None
    counters: list[Counter] = field(default_factory=list)
    unavailable: str | None = None

    @property
    def domains(self) -> list[str]:
        """Labels of the summed counters (RAPL zones, GPUs)."""
        return [counter.label for counter in self.counters]

    @property
    def wrap_j(self) -> float | None:
        """The wrap range shared by every counter (RAPL's max_energy_range_uj), or None if none or not shared."""
        ranges = {counter.wrap_j for counter in self.counters}
        return ranges.pop() if len(ranges) == 1 else None

    def read(self) -> float | None:
        """Cumulative joules summed over the counters, or None (with the reason in ``unavailable``); never raises."""
        if self.source is None:
            return None
        total = 0.0
        for counter in self.counters:
            try:
                total += counter.read()
            except Exception as exc:  # a broken counter nulls one reading, never the run
                self.unavailable = f"reading {counter.label} failed: {describe_error(exc)}"
                return None
        return total

    def describe(self) -> dict:
        """What the run summary records: {source, domains, unavailable}."""
        return {"source": self.source, "domains": self.domains, "unavailable": self.unavailable}


def joules_between(start: float | None, end: float | None, meter: EnergyMeter) -> float | None:
    """Joules used between two readings of ``meter``; None if either is missing or the counter went back unexplained.

    RAPL counters wrap at max_energy_range_uj (often 262 kJ: about 20 minutes of a 200 W package). When all
    packages share that range, the difference modulo it is exact as long as less than one range was used between
    the readings, whichever packages wrapped. NVML's 64-bit millijoule counter never wraps: going back there means
    a driver reload.
    """
    if start is None or end is None:
        return None
    delta = end - start
    if delta >= 0:
        return delta
    wrap = meter.wrap_j
    return None if wrap is None else delta % wrap


def open_meter(
    device: str | torch.device, *, gpus: Sequence[int] | None = None, powercap_root: str | Path = POWERCAP_ROOT
) -> EnergyMeter:
    """The energy meter for ``device``: NVML for ``cuda``, RAPL for ``cpu``; unavailable (with why) otherwise.

    ``cuda:N`` meters GPU N, ``cuda`` every visible GPU (a device-mapped model may use any); ``gpus`` (torch's
    device numbers) overrides both. Never raises.
    """
    try:
        kind, _, index = str(device).partition(":")
        if kind == "cuda":
            return nvml_meter(torch_gpus(index, gpus))
        if kind == "cpu":
            return rapl_meter(Path(powercap_root))
        return EnergyMeter(None, unavailable=f"no energy counter for device type {kind!r}")
    except Exception as exc:  # the meter is optional: nothing in it may fail a run
        return EnergyMeter(None, unavailable=f"energy meter failed to open: {describe_error(exc)}")


def torch_gpus(index: str, gpus: Sequence[int] | None) -> list[int] | None:
    """torch's device numbers to meter: ``gpus``, the device's own index, or None for every visible GPU."""
    if gpus is not None:
        return list(gpus)
    return [int(index)] if index else None


def describe_error(exc: BaseException) -> str:
    """An exception in one line: its message, or its type when it has none."""
    return str(exc) or type(exc).__name__


# --- RAPL (powercap sysfs) ---------------------------------------------------------------------------------


def read_int(path: Path) -> int:
    """The integer a sysfs file holds."""
    return int(path.read_text().strip())


def rapl_meter(root: Path) -> EnergyMeter:
    """RAPL energy summed over the CPU packages under ``root``, or unavailable with why."""
    if not root.is_dir():
        return EnergyMeter(None, unavailable=f"RAPL counters not readable: {root} absent")
    zones = package_zones(root)
    if not zones:
        return EnergyMeter(None, unavailable=f"RAPL counters not readable: no package zone (intel-rapl:N) in {root}")
    counters = []
    for zone in zones:
        counter = rapl_counter(zone)
        if isinstance(counter, str):
            return EnergyMeter(None, unavailable=counter)
        counters.append(counter)
    return EnergyMeter("rapl", counters)


def package_zones(root: Path) -> list[Path]:
    """The package zones under ``root`` (``intel-rapl:N`` named ``package-*``), by package number."""
    found = {}
    for path in root.iterdir():
        match = PACKAGE_ZONE.fullmatch(path.name)
        if match and zone_name(path).startswith("package"):
            found[int(match.group(1))] = path
    return [found[number] for number in sorted(found)]


def zone_name(zone: Path) -> str:
    """A zone's ``name`` (``package-0``, ``psys``); a zone without a readable name is taken for a package."""
    try:
        return (zone / "name").read_text().strip()
    except OSError:
        return "package"


def rapl_counter(zone: Path) -> Counter | str:
    """A counter reading ``zone``'s energy_uj in joules, or the reason it cannot be read."""
    energy = zone / "energy_uj"
    try:
        read_int(energy)
    except PermissionError:
        return f"permission denied on {energy} ({ROOT_NEEDED})"
    except (OSError, ValueError) as exc:
        return f"RAPL counter {energy} not readable: {describe_error(exc)}"
    return Counter(f"{zone.name} ({zone_name(zone)})", functools.partial(microjoules, energy), wrap_range(zone))


def microjoules(path: Path) -> float:
    """A microjoule counter file's value in joules."""
    return read_int(path) / 1e6


def wrap_range(zone: Path) -> float | None:
    """The zone's wrap range in joules (max_energy_range_uj), or None if it cannot be read."""
    try:
        return read_int(zone / "max_energy_range_uj") / 1e6
    except (OSError, ValueError):
        return None


# --- NVML ---------------------------------------------------------------------------------------------------


@functools.cache
def nvml_start() -> str | None:
    """Initialise NVML once per process: None when it is ready, else why it is not."""
    if pynvml is None:
        return "no NVML: nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return f"no NVML: pynvml failed to initialise ({describe_error(exc)})"
    return None


def nvml_meter(torch_indices: list[int] | None) -> EnergyMeter:
    """NVML energy summed over torch's GPUs ``torch_indices`` (None: every visible GPU), or unavailable with why."""
    failure = nvml_start()
    if failure:
        return EnergyMeter(None, unavailable=failure)
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(number) for number in range(count)]
    uuids = [str(pynvml.nvmlDeviceGetUUID(handle)) for handle in handles]
    names = [str(pynvml.nvmlDeviceGetName(handle)) for handle in handles]
    visible = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids)
    if isinstance(visible, str):
        return EnergyMeter(None, unavailable=visible)
    order = order_problem(os.environ, names)
    if order:
        return EnergyMeter(None, unavailable=order)
    wanted = range(len(visible)) if torch_indices is None else torch_indices
    counters = []
    for torch_index in wanted:
        if not 0 <= torch_index < len(visible):
            return EnergyMeter(None, unavailable=f"cuda:{torch_index} is not one of the {len(visible)} visible GPUs")
        number = visible[torch_index]
        counter = nvml_counter(handles[number], f"{names[number]} ({uuids[number]})")
        if isinstance(counter, str):
            return EnergyMeter(None, unavailable=counter)
        counters.append(counter)
    if not counters:
        return EnergyMeter(None, unavailable="no visible GPU to meter")
    return EnergyMeter("nvml", counters)


def nvml_counter(handle: Any, label: str) -> Counter | str:
    """A counter reading one GPU's total energy in joules, or the reason the GPU does not report it."""
    try:
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception as exc:
        return f"{label} does not report its total energy (Volta or newer needed): {describe_error(exc)}"
    return Counter(label, functools.partial(gpu_joules, handle))


def gpu_joules(handle: Any) -> float:
    """One GPU's energy since the driver loaded, in joules (NVML counts millijoules)."""
    return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3


def visible_gpus(setting: str | None, uuids: list[str]) -> list[int] | str:
    """NVML's number for each of CUDA's devices 0, 1, ... under CUDA_VISIBLE_DEVICES, or why it cannot be mapped.

    Like CUDA, the list ends at the first entry that names no further GPU (``-1``, an unknown index or UUID).
    """
    if setting is None:
        return list(range(len(uuids)))
    visible: list[int] = []
    for entry in (part.strip() for part in setting.split(",")):
        if entry.startswith("MIG-"):
            return f"CUDA_VISIBLE_DEVICES names a MIG instance ({entry}): NVML's energy counter covers the whole GPU"
        number = nvml_number(entry, uuids)
        if number is None or number in visible:
            break
        visible.append(number)
    return visible


def nvml_number(entry: str, uuids: list[str]) -> int | None:
    """The NVML number one CUDA_VISIBLE_DEVICES entry names (an index, or a unique GPU-UUID prefix), or None."""
    if entry.isdigit():
        return int(entry) if int(entry) < len(uuids) else None
    if not entry.startswith("GPU-"):
        return None
    matches = [number for number, uuid in enumerate(uuids) if uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None


def order_problem(environ: Mapping[str, str], names: list[str]) -> str | None:
    """Why CUDA's device numbers may not follow NVML's (PCI bus) order, or None when they do.

    CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, which can differ from NVML's order only
    when the GPUs differ; CUDA_VISIBLE_DEVICES given as UUIDs avoids the question.
    """
    setting = environ.get("CUDA_VISIBLE_DEVICES")
    by_uuid = setting is not None and all(part.strip().startswith("GPU-") for part in setting.split(","))
    if by_uuid or len(set(names)) <= 1 or environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
        return None
    return (
        "mixed GPU models: CUDA numbers them fastest first, NVML by PCI bus; set CUDA_DEVICE_ORDER=PCI_BUS_ID "
        "or name the GPUs by UUID in CUDA_VISIBLE_DEVICES"
    )
