"""What every parity driver shares: the prompts, the side env's Python, the official checkout, specbench's AR."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / ".parity-src"
"""Official checkouts (git-ignored), one folder per method, at the pinned commit (``make parity-src-<method>``)."""


def render_prompts(datasets: list[tuple[str, int]], tokenizer) -> dict[str, list[tuple[str, list[int]]]]:
    """Token ids of the first ``limit`` samples of each dataset, rendered by specbench's loader."""
    from specbench.config import compose_config
    from specbench.data.base import build_dataset

    prompts = {}
    for name, limit in datasets:
        cfg = compose_config("model=smollm2_135m", f"dataset={name}")
        dataset = build_dataset(cfg.dataset, cfg.data_dir)
        prompts[name] = [(s.sample_id, dataset.prompt_ids(tokenizer, s, [])) for s in dataset.samples(limit)]
    return prompts


def parse_datasets(items: list[str]) -> list[tuple[str, int]]:
    """``name=limit`` items (limit 10 when left out) -> [(name, limit)]."""
    return [(d.partition("=")[0], int(d.partition("=")[2] or 10)) for d in items]


def official_python(venv: str) -> Path:
    """The side env's interpreter; a missing env says which make target builds it."""
    python = REPO / venv / "bin" / "python"
    if not python.is_file():
        method = venv.removeprefix(".venv-parity-")
        raise SystemExit(f"error: {venv} is missing; build it with `make parity METHOD={method}`")
    return python


@dataclass(frozen=True)
class OfficialSource:
    """The authors' repository at a pinned commit, checked out in ``.parity-src/<method>``."""

    method: str
    url: str
    commit: str

    @property
    def folder(self) -> Path:
        return SOURCES / self.method

    def how(self) -> str:
        return f"`make parity METHOD={self.method}` (git clone {self.url}, checkout {self.commit[:12]})"

    def head(self) -> str | None:
        """The checkout's commit, or None when there is no checkout."""
        if not (self.folder / ".git").exists():
            return None
        done = subprocess.run(["git", "-C", str(self.folder), "rev-parse", "HEAD"], capture_output=True, text=True)
        return done.stdout.strip() or None

    def check(self) -> Path:
        """The checkout's folder, once it exists at the pinned commit; else how to make it."""
        head = self.head()
        if head is None:
            raise SystemExit(
                f"error: the official {self.method} code is missing in {self.folder}; get it with {self.how()}"
            )
        if head != self.commit:
            raise SystemExit(
                f"error: {self.folder} is at {head[:12]}, not the pinned {self.commit[:12]}; rerun {self.how()}"
            )
        return self.folder

    def fetch(self) -> None:
        """Clone (``SPECBENCH_PARITY_GIT`` = a local mirror folder or another URL, if set) and check out the commit.

        The clone checks nothing out (``--no-checkout``): the commit may sit on any branch, and a mirror that
        lacks some large blobs (figures) still gives every other file of the commit.
        """
        if self.head() == self.commit:
            return
        url = os.environ.get("SPECBENCH_PARITY_GIT") or self.url
        if self.head() is None:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "clone", "--quiet", "--no-checkout", url, str(self.folder)], check=True)
        subprocess.run(["git", "-C", str(self.folder), "checkout", "--quiet", self.commit], check=True)


@dataclass(frozen=True)
class SideEnv:
    """A method's side virtual env (torch + the official code's pins) and, for GitHub code, its checkout."""

    venv: str
    pins: tuple[str, ...]
    source: OfficialSource | None = None

    def setup(self) -> None:
        """Build the env (torch first, from ``TORCH_SPEC`` as ``make install``), install the pins, fetch the code."""
        root = REPO / self.venv
        marker = root / ".installed"
        wanted = " ".join(self.pins)
        if not (marker.is_file() and marker.read_text() == wanted):
            python = root / "bin" / "python"
            if not python.is_file():
                subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
            pip = [str(python), "-m", "pip", "install", "--quiet"]
            if subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode != 0:
                torch_spec = os.environ.get("TORCH_SPEC", "-r requirements/torch-cpu.txt")
                subprocess.run([*pip, *shlex.split(torch_spec)], check=True, cwd=REPO)
            subprocess.run([*pip, *self.pins], check=True, cwd=REPO)
            marker.write_text(wanted)
        if self.source is not None:
            self.source.fetch()


def run_ar(lm, dataset: str, prompts, max_new_tokens: int) -> dict[str, list[int]]:
    """specbench AR (the loop with no drafter) on each prompt: the reference outputs."""
    from specbench.config import compose_config
    from specbench.core.acceptance import Sampling
    from specbench.engines import build_engine

    cfg = compose_config("model=smollm2_135m", "method=ar", f"dataset={dataset}", "temperature=0")
    engine = build_engine(cfg.method, lm, Sampling(0.0, 1.0), step_breakdown=False)
    outputs = {}
    for sample_id, ids in prompts:
        with torch.inference_mode():
            outputs[sample_id] = engine.generate(ids, max_new_tokens, None).output_ids
        print(f"[specbench:ar] {sample_id}: {len(outputs[sample_id])} tokens", file=sys.stderr, flush=True)
    return outputs


def timed_generation(engine, ids: list[int], max_new_tokens: int, generator, label: str, **keys) -> dict:
    """One specbench generation as a parity record (``keys`` first: case, id, seed), with its log line."""
    start = time.perf_counter()
    with torch.inference_mode():
        gen = engine.generate(ids, max_new_tokens, generator)
    wall = time.perf_counter() - start
    where = " ".join(str(v) for k, v in keys.items() if k != "case")
    print(
        f"[specbench:{label}] {where}: {gen.target_forwards} steps, {len(gen.output_ids)} tokens, {wall:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return {
        **keys,
        "steps": gen.target_forwards,
        "emitted": gen.accept_lengths,
        "output_ids": gen.output_ids,
        "wall_s": round(wall, 3),
    }
