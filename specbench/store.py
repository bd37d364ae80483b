"""A run directory on disk: append-only samples, atomic summary, resume without duplicates or losses.

Reading a folder (``RunStore(...)``) writes nothing. ``begin`` makes this process the folder's only
writer (a lock file; a second process is refused, a dead one's lock taken over) and reloads what is
there; ``close`` releases it. Damage is survivable: a torn last line of ``samples.jsonl`` (and the lines
of a sample not all of whose turns were written) is dropped when the first new sample is appended, and
its sample rerun; a torn ``summary.json`` is rebuilt from the records, its config digest read back from
``config.yaml``. A write that fails (full disk, read-only folder) is a ``StorageError`` that says what
to do; every sample finished before it stays on disk. A writer that stops before its first sample
leaves the folder as it found it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specbench.errors import RunConflict, StorageError
from specbench.files import FolderLock, file_in_the_way, write_atomic

SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.yaml"
DIGEST_LINE = "# config_digest: "
"""First line of config.yaml: the digest again, so a torn summary.json does not lose it."""


@contextmanager
def storage(path: Path, action: str) -> Iterator[None]:
    """Turn an OS error while writing ``path`` into a StorageError naming the cause and the way on."""
    try:
        yield
    except OSError as error:
        raise StorageError(
            f"cannot {action} {path}: {error.strerror or error}; samples finished before this are kept. "
            f"Free space or make the folder writable, then rerun the same command to resume (or choose "
            f"another output_dir=...)"
        ) from error


class RunStore:
    """Owns one run directory: finished samples, appending records, rewriting the summary."""

    def __init__(self, out_dir: Path, config_digest: str, force: bool = False):
        self.dir = Path(out_dir)
        self.digest = config_digest
        self.force = force
        self.lock = FolderLock(self.dir)
        self.records: list[dict] = []
        self.previous_summary: dict | None = None
        self.created: list[Path] = []  # folders ``begin`` made, deepest first (``close`` removes them if left empty)
        self._load()

    def _load(self) -> None:
        """Read what a previous run left, checking it came from the same config (nothing is written)."""
        blocking = file_in_the_way(self.dir)
        if blocking is not None:
            raise StorageError(
                f"output_dir {self.dir}: {blocking} is a file, not a folder; choose another output_dir=... "
                f"(nothing was written)"
            )
        self.previous_summary = self._read_summary()
        old = (self.previous_summary or {}).get("config_digest") or self._stored_digest()
        if old is not None and old != self.digest and not self.force:
            raise RunConflict(
                f"{self.dir} holds results of a different configuration (digest {old} != "
                f"{self.digest}); results are never mixed silently. Choose another output_dir=..., "
                f"or pass force=true to continue into it anyway."
            )
        self.records, self.torn_lines = self._complete_records()

    def _read_summary(self) -> dict | None:
        """summary.json, or None when there is none or it is torn (it is rewritten after the next sample)."""
        path = self.dir / SUMMARY
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            print(f"[specbench] {path} is damaged (not valid JSON); it will be rebuilt from the samples")
            return None

    def _stored_digest(self) -> str | None:
        """The config digest recorded on config.yaml's first line (None without one)."""
        path = self.dir / CONFIG
        first = path.read_text(encoding="utf-8").partition("\n")[0] if path.is_file() else ""
        return first.removeprefix(DIGEST_LINE).strip() if first.startswith(DIGEST_LINE) else None

    def _complete_records(self) -> tuple[list[dict], int]:
        """Records of samples whose every turn was written, and how many lines were not (torn or unfinished)."""
        path = self.dir / SAMPLES
        if not path.is_file():
            return [], 0
        lines = path.read_text(encoding="utf-8").splitlines()
        parsed = []
        for line in lines:
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by an interrupt
        turns = Counter(r["sample_id"] for r in parsed)
        complete = [r for r in parsed if turns[r["sample_id"]] == r["n_turns"]]
        return complete, len(lines) - len(complete)

    def begin(self) -> None:
        """Become the folder's only writer: lock it and reload it. The lines of unfinished samples are dropped from
        the file just before the first new sample is appended (``append``), so a run that stops before it changes
        nothing."""
        self.created = [path for path in (self.dir, *self.dir.parents) if not path.exists()]
        with storage(self.dir, "lock"):
            self.lock.acquire()
        self._load()
        if self.torn_lines:
            print(
                f"[specbench] {self.dir / SAMPLES}: {self.torn_lines} line(s) of unfinished samples will be dropped; "
                f"they will rerun"
            )

    def _drop_torn_lines(self) -> None:
        """Rewrite samples.jsonl with the complete records only (before appending after a torn or unfinished one)."""
        path = self.dir / SAMPLES
        with storage(path, "rewrite"):
            write_atomic(path, "".join(json.dumps(r) + "\n" for r in self.records))
        self.torn_lines = 0

    def close(self) -> None:
        """Stop writing: release the folder's lock, and remove the folders ``begin`` made if nothing was written."""
        self.lock.release()
        for path in self.created:
            if not path.is_dir() or any(path.iterdir()):
                break
            path.rmdir()

    @property
    def finished_ids(self) -> set[str]:
        """Sample ids already complete in this directory."""
        return {r["sample_id"] for r in self.records}

    def append(self, records: list[dict]) -> None:
        """Append all turns of one sample in one write, flushed and fsynced."""
        if self.torn_lines:
            self._drop_torn_lines()
        text = "".join(json.dumps(r) + "\n" for r in records)
        with storage(self.dir / SAMPLES, "append to"), open(self.dir / SAMPLES, "a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        self.records.extend(records)

    def write_summary(self, summary: dict) -> None:
        """Rewrite summary.json atomically."""
        with storage(self.dir / SUMMARY, "write"):
            write_atomic(self.dir / SUMMARY, json.dumps(summary, indent=2) + "\n")

    def read_json(self, name: str) -> dict | None:
        """A JSON file the run keeps beside its records (e.g. ``budget.json``), or None when absent."""
        path = self.dir / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def write_json(self, name: str, data: dict) -> None:
        """Keep ``data`` beside the records as ``name``, atomically."""
        with storage(self.dir / name, "write"):
            write_atomic(self.dir / name, json.dumps(data, indent=2) + "\n")

    def write_config(self, yaml_text: str) -> None:
        """Store the resolved config beside the results, its digest on the first line."""
        with storage(self.dir / CONFIG, "write"):
            write_atomic(self.dir / CONFIG, f"{DIGEST_LINE}{self.digest}\n{yaml_text}")
