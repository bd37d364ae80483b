"""A run directory on disk: append-only samples, atomic summary, resume without duplicates or losses."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from specbench.errors import RunConflict
from specbench.files import write_atomic

SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.yaml"


class RunStore:
    """Owns one run directory: finished samples, appending records, rewriting the summary."""

    def __init__(self, out_dir: Path, config_digest: str, force: bool = False):
        self.dir = Path(out_dir)
        self.digest = config_digest
        self.records: list[dict] = []
        self.previous_summary: dict | None = None
        self._open(force)

    def _open(self, force: bool) -> None:
        """Load what a previous run left in the directory, checking it came from the same config."""
        summary_path = self.dir / SUMMARY
        if summary_path.is_file():
            self.previous_summary = json.loads(summary_path.read_text(encoding="utf-8"))
            old = self.previous_summary.get("config_digest")
            if old != self.digest and not force:
                raise RunConflict(
                    f"{self.dir} holds results of a different configuration (digest {old} != "
                    f"{self.digest}); results are never mixed silently. Choose another output_dir=..., "
                    f"or pass force=true to continue into it anyway."
                )
        self.records = self._load_complete_records()

    def _load_complete_records(self) -> list[dict]:
        """Records of samples whose every turn was written; rewrites the file if a tail was torn."""
        path = self.dir / SAMPLES
        if not path.is_file():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        parsed = []
        for line in lines:
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by an interrupt
        turns = Counter(r["sample_id"] for r in parsed)
        complete = [r for r in parsed if turns[r["sample_id"]] == r["n_turns"]]
        if len(complete) != len(lines):
            dropped = len(lines) - len(complete)
            print(f"[specbench] {path}: dropping {dropped} line(s) of unfinished samples; they will rerun")
            write_atomic(path, "".join(json.dumps(r) + "\n" for r in complete))
        return complete

    @property
    def finished_ids(self) -> set[str]:
        """Sample ids already complete in this directory."""
        return {r["sample_id"] for r in self.records}

    def append(self, records: list[dict]) -> None:
        """Append all turns of one sample in one write, flushed and fsynced."""
        text = "".join(json.dumps(r) + "\n" for r in records)
        with open(self.dir / SAMPLES, "a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        self.records.extend(records)

    def write_summary(self, summary: dict) -> None:
        """Rewrite summary.json atomically."""
        write_atomic(self.dir / SUMMARY, json.dumps(summary, indent=2) + "\n")

    def write_config(self, yaml_text: str) -> None:
        """Store the resolved config beside the results (the first write: creates the directory)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / CONFIG, yaml_text)
