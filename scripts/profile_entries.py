"""Profile whole generations of a bench suite's entries with torch.profiler (CPU and CUDA kernels).

    python scripts/profile_entries.py OUT SUITE [bench arguments...]
    e.g. PROFILE_ENTRIES="ar pld" python scripts/profile_entries.py /tmp/prof all_methods \\
             model=llama2_7b_random --device cuda --dtype float16 --limit 2 --entries pld

Runs ``python -m specbench.bench`` unchanged, except that every generation of the entries named in
``PROFILE_ENTRIES`` (default "ar pld hf_generate") runs under the profiler; OUT/prof_<entry>_<n>.txt gets the
n-th sample's kernel and operator tables (by self device time, then by self CPU time) headed by the wall time
and the summed device and CPU time, and each sample prints one line with its wall time and the device memory.
Why: on a GPU a batch-1 7B forward is launch-bound, and an entry whose forwards run slower than AR's with
the same kernels shows it as CPU time, not device time. The profiler's own cost inflates the profiled
entries' wall times (~4x on an H200), so compare profiled entries with each other only.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from specbench import runner
from specbench.bench import main


def tables(prof: profile, wall: float) -> str:
    """The profile's operator/kernel tables, headed by the wall time and the summed device and CPU time."""
    events = prof.key_averages()
    device_key = "self_device_time_total"
    device_s = sum(getattr(event, device_key) for event in events if event.device_type.name != "CPU") / 1e6
    cpu_s = sum(event.self_cpu_time_total for event in events) / 1e6
    head = f"wall {wall:.3f} s, kernels {device_s:.3f} s, cpu {cpu_s:.3f} s\n"
    return (
        head
        + events.table(sort_by=device_key, row_limit=18)
        + "\n"
        + events.table(sort_by="self_cpu_time_total", row_limit=18)
    )


def profiling(out: Path, labels: set[str]):
    """A ``Runner.run_sample`` that profiles the samples of ``labels`` and reports every sample's wall time."""
    run_sample = runner.Runner.run_sample
    counts: dict[str, int] = {}

    def run_profiled(self: runner.Runner, sample):
        label = self.bench["entry"] if self.bench else "run"
        index = counts[label] = counts.get(label, -1) + 1
        start = time.perf_counter()
        if label in labels:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            with profile(activities=activities) as prof:
                records = run_sample(self, sample)
            (out / f"prof_{label}_{index}.txt").write_text(tables(prof, time.perf_counter() - start))
        else:
            records = run_sample(self, sample)
        memory = f", device memory {torch.cuda.memory_allocated() / 2**20:.0f} MiB" if torch.cuda.is_available() else ""
        print(
            f"profile_entries: {label} sample {index} ({sample.sample_id}) {time.perf_counter() - start:.2f} s{memory}"
        )
        return records

    return run_profiled


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    labels = set(os.environ.get("PROFILE_ENTRIES", "ar pld hf_generate").split())
    runner.Runner.run_sample = profiling(target, labels)  # type: ignore[method-assign]  # the bench profiles
    sys.exit(main(sys.argv[2:]))
