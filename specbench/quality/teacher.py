"""Teacher-forced exactness of a greedy run: is every emitted token the target's argmax, up to a near tie?

    python -m specbench.quality.teacher RUN_DIR [--tolerance X] [--limit N]

A lossless method at temperature 0 must emit the target's greedy tokens. In float16 or bfloat16 a verify
pass over a tree and AR's one-token pass round differently, so two nearly tied logits can swap and a
correct method can drift from AR. This check needs no float64 rerun and no AR partner: it reruns the
target once over prompt + output (teacher forcing, one forward, in the run's device and dtype) and judges
every generated position by its gap, the position's max logit minus the emitted token's logit:

- gap == 0: the emitted token is an argmax (ties included);
- 0 < gap <= tolerance x max(1, |max logit|): a **near tie**, a swap that rounding alone can explain;
- anything larger (or NaN): a **violation**, which rounding cannot explain.

The tolerance is relative to the max logit's magnitude because a logit's rounding step is: by default
``DEFAULT_ULPS`` machine epsilons of the run's dtype (``default_tolerance``). The command prints the
records with a near tie or a violation and the run's teacher-forced exact rate; it exits 1 when a record
has a violation, 2 with one ``error:`` line on bad input (a sampled run, a rebuilt prompt that differs).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from specbench.cli import ArgumentParser, user_errors
from specbench.data.base import Dataset, Sample
from specbench.errors import ConfigError, DataError
from specbench.models.loading import LoadedModel, load_model, resolve_device, resolve_dtype
from specbench.quality.scores import run_dataset
from specbench.runner import prompt_sha
from specbench.store import CONFIG, SAMPLES, SUMMARY, RunStore

DEFAULT_ULPS = 4
"""Default tolerance in machine epsilons of the run's dtype: the logits' own rounding (half a step each)
plus the few steps by which a tree pass, a one-token pass and this full-sequence pass drift apart."""


def default_tolerance(dtype: torch.dtype) -> float:
    """The relative logit-gap tolerance for ``dtype``: ``DEFAULT_ULPS`` machine epsilons."""
    return DEFAULT_ULPS * torch.finfo(dtype).eps


# --- the check itself: pure, no model -----------------------------------------------------------------


@dataclass(frozen=True)
class TokenCheck:
    """How the emitted tokens of one output compare with the target's argmax at each position."""

    positions: int  # generated positions checked (the output's length)
    violations: int  # positions whose gap exceeds the tolerance
    near_ties: int  # positions whose token is not an argmax but within the tolerance
    first_violation: int  # index in the output of the first violation; -1 when none
    max_gap: float  # the largest gap over the positions, in logits (0.0 when every token is an argmax)


def logit_gaps(logits: torch.Tensor, emitted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position, the max logit minus the emitted token's logit, and the max logit itself."""
    rows = logits if logits.dtype == torch.float64 else logits.float()  # [n, vocab]; exact for half types
    top = rows.max(dim=-1).values  # [n]
    chosen = rows.gather(-1, emitted.to(rows.device)[:, None])[:, 0]  # [n]
    return top - chosen, top


def check_tokens(logits: torch.Tensor, emitted: Sequence[int] | torch.Tensor, tolerance: float) -> TokenCheck:
    """Judge ``emitted`` ([n] token ids) against ``logits`` ([n, vocab], row i predicts token i)."""
    emitted = torch.as_tensor(emitted, dtype=torch.long)  # [n]
    if logits.dim() != 2 or logits.shape[0] != emitted.shape[0]:
        raise ValueError(f"logits {tuple(logits.shape)} do not give one row per emitted token ({len(emitted)})")
    if tolerance < 0:
        raise ValueError(f"the tolerance must be >= 0 (got {tolerance})")
    if len(emitted) and not 0 <= int(emitted.min()) <= int(emitted.max()) < logits.shape[1]:
        raise ValueError(f"an emitted token id lies outside the target's {logits.shape[1]} logits")
    gap, top = logit_gaps(logits, emitted)  # [n], [n]
    allowed = tolerance * top.abs().clamp(min=1.0)  # [n]
    violation = ~(gap <= allowed)  # [n]; a NaN gap is a violation
    near = (gap > 0) & ~violation  # [n]
    return TokenCheck(
        positions=len(emitted),
        violations=int(violation.sum()),
        near_ties=int(near.sum()),
        first_violation=int(violation.nonzero()[0, 0]) if violation.any() else -1,
        max_gap=float(gap.max()) if len(emitted) else 0.0,
    )


# --- a run folder: its target, prompts and records ----------------------------------------------------

RECORD_FIELDS = ("sample_id", "turn", "output_ids", "output_text")
"""The record fields the check reads (``prompt_sha`` too, when the record's schema has it)."""


@dataclass
class StoredRun:
    """What the check reads from a run folder before loading anything."""

    dir: Path
    cfg: DictConfig
    summary: dict
    records: list[dict]


def read_run(run_dir: Path) -> StoredRun:
    """The config, summary and complete samples' records of a run folder (nothing is written)."""
    if not (run_dir / CONFIG).is_file():
        raise DataError(f"{run_dir}: no {CONFIG}; give a run folder written by python -m specbench")
    store = RunStore(run_dir, "", force=True)  # force: only reading, whichever config wrote the folder
    if store.previous_summary is None:
        raise DataError(f"{run_dir}: no readable {SUMMARY}; rerun the run's command to rebuild it")
    missing = sorted({field for r in store.records for field in RECORD_FIELDS if field not in r})
    if missing:
        raise DataError(f"{run_dir / SAMPLES}: records lack the field(s) {missing} the check needs")
    cfg = OmegaConf.load(run_dir / CONFIG)
    assert isinstance(cfg, DictConfig)  # a run's config.yaml is a mapping
    return StoredRun(run_dir, cfg, store.previous_summary, store.records)


def check_greedy(run: StoredRun) -> None:
    """Refuse a sampled run: only greedy (temperature 0) outputs must be the target's argmax."""
    temperature = run.cfg.get("temperature")
    if temperature != 0:
        raise ConfigError(
            f"{run.dir} was sampled at temperature {temperature}; the teacher-forced check applies only to "
            f"greedy runs (temperature=0), whose every token must be the target's argmax"
        )


def run_device(run: StoredRun) -> tuple[torch.device, torch.dtype]:
    """The device and dtype the run generated on (resolved when it ran, so ``auto`` means what it meant then)."""
    environment = run.summary.get("environment") or {}
    device_name, dtype_name = environment.get("device", run.cfg.device), environment.get("dtype", run.cfg.dtype)
    device_type = str(device_name).split(":")[0]
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{run.dir} ran on {device_name}, which this machine lacks; check it where it ran")
    device = resolve_device(str(device_name))
    return device, resolve_dtype(str(dtype_name), device)


def selected(records: list[dict], limit: int | None) -> list[dict]:
    """The records of the first ``limit`` samples (all their turns), in file order; all when None."""
    if limit is None:
        return records
    keep = set(list(dict.fromkeys(r["sample_id"] for r in records))[:limit])
    return [r for r in records if r["sample_id"] in keep]


class Prompts:
    """Rebuilds each record's prompt ids as the runner rendered them, checked against its ``prompt_sha``."""

    def __init__(self, run: StoredRun, tokenizer):
        self.dataset: Dataset = run_dataset(run.dir)
        self.tokenizer = tokenizer
        self.samples: dict[str, Sample] = {s.sample_id: s for s in self.dataset.samples(None)}
        self.texts = {(r["sample_id"], r["turn"]): r["output_text"] for r in run.records}
        self.unverified = 0  # records without a stored prompt digest (written before schema 3)

    def __call__(self, record: dict) -> list[int]:
        """Prompt ids of ``record``'s turn; a later turn sees the run's own earlier answers."""
        sample_id, turn = record["sample_id"], record["turn"]
        sample = self.samples.get(sample_id)
        if sample is None:
            raise DataError(f"sample {sample_id} is not in dataset {self.dataset.name} as configured for this run")
        try:
            answers = [self.texts[sample_id, earlier] for earlier in range(turn)]
        except KeyError:
            raise DataError(f"sample {sample_id} turn {turn}: the run holds no record of an earlier turn") from None
        ids = self.dataset.prompt_ids(self.tokenizer, sample, answers)
        self.verify(record, ids)
        return ids

    def verify(self, record: dict, ids: list[int]) -> None:
        """Refuse a rebuilt prompt whose digest differs from the one the run stored."""
        stored = record.get("prompt_sha")
        if stored is None:
            self.unverified += 1
        elif prompt_sha(ids) != stored:
            raise DataError(
                f"sample {record['sample_id']} turn {record['turn']}: the rebuilt prompt (digest "
                f"{prompt_sha(ids)}) differs from the run's ({stored}); the dataset copy, tokenizer or chat "
                f"template is not the one the run used"
            )


def teacher_logits(model, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """The target's logits at each generated position: one forward over prompt + output[:-1]."""
    if not output_ids:
        return torch.empty(0, model.config.vocab_size)  # [0, vocab]
    ids = torch.tensor([prompt_ids + output_ids[:-1]], device=model.device)  # [1, P + n - 1]
    with torch.inference_mode():
        out = model(input_ids=ids, logits_to_keep=len(output_ids), use_cache=False)
    return out.logits[0]  # [n, vocab]; row i predicts output_ids[i]


# --- a whole run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordCheck:
    """One record's identity and its ``TokenCheck``."""

    sample_id: str
    turn: int
    check: TokenCheck

    def row(self) -> dict:
        """A flat table row."""
        return {"sample_id": self.sample_id, "turn": self.turn, **asdict(self.check)}


@dataclass(frozen=True)
class RunCheck:
    """The teacher-forced check of a run: its setting, the tolerance used and every checked record."""

    run_dir: str
    method: str
    lossless: bool
    device: str
    dtype: str
    tolerance: float
    records: list[RecordCheck]
    unverified_prompts: int = 0

    @property
    def exact_rate(self) -> float | None:
        """Teacher-forced exact rate: the share of checked records without a violation (None without records)."""
        if not self.records:
            return None
        return sum(r.check.violations == 0 for r in self.records) / len(self.records)

    def table(self) -> pd.DataFrame:
        """One row per checked record."""
        columns = ["sample_id", "turn", *TokenCheck.__dataclass_fields__]
        return pd.DataFrame([r.row() for r in self.records], columns=columns)

    def totals(self) -> dict:
        """The run-level numbers: records, positions, violations, near ties, the exact rate."""
        table = self.table()
        return {
            "records": len(table),
            "positions": int(table["positions"].sum()),
            "violations": int(table["violations"].sum()),
            "near_ties": int(table["near_ties"].sum()),
            "records_with_near_ties": int((table["near_ties"] > 0).sum()),
            "teacher_forced_exact": self.exact_rate,
            "max_gap": float(table["max_gap"].max()) if len(table) else 0.0,
        }


def check_records(lm: LoadedModel, prompts: Prompts, records: list[dict], tolerance: float) -> list[RecordCheck]:
    """Rerun the target on each record's prompt + output and judge its tokens."""
    checks = []
    for record in records:
        logits = teacher_logits(lm.model, prompts(record), record["output_ids"])  # [n, vocab]
        try:
            check = check_tokens(logits, record["output_ids"], tolerance)
        except ValueError as error:
            raise DataError(f"sample {record['sample_id']} turn {record['turn']}: {error}") from None
        checks.append(RecordCheck(record["sample_id"], record["turn"], check))
    return checks


def check_run(run_dir: Path | str, tolerance: float | None = None, limit: int | None = None) -> RunCheck:
    """Teacher-forced check of a greedy run folder's records (the first ``limit`` samples when given)."""
    if tolerance is not None and tolerance < 0:
        raise ConfigError(f"--tolerance must be >= 0 (got {tolerance})")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1 (got {limit})")
    run = read_run(Path(run_dir))
    check_greedy(run)
    device, dtype = run_device(run)
    tolerance = default_tolerance(dtype) if tolerance is None else tolerance
    records = selected(run.records, limit)
    if not records:
        raise DataError(f"{run.dir} holds no finished sample to check")
    lm = load_model(run.cfg.model, device, dtype)
    prompts = Prompts(run, lm.tokenizer)
    checks = check_records(lm, prompts, records, tolerance)
    return RunCheck(
        run_dir=str(run.dir),
        method=str(run.cfg.method.name),
        lossless=bool(run.cfg.method.get("lossless", True)),
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        tolerance=tolerance,
        records=checks,
        unverified_prompts=prompts.unverified,
    )


# --- command line ---------------------------------------------------------------------------------------


def report_text(result: RunCheck) -> str:
    """The printed report: the setting, the records with a near tie or violation, the run's totals."""
    totals = result.totals()
    lines = [
        f"{result.run_dir}: {result.method} on {result.device} in {result.dtype}, "
        f"tolerance {result.tolerance:.3g} x max(1, |max logit|)"
    ]
    if not result.lossless:
        lines.append("note: this method is lossy (lossless: false); violations are expected")
    if result.unverified_prompts:
        lines.append(f"note: {result.unverified_prompts} record(s) carry no prompt digest; their prompts are unchecked")
    table = result.table()
    flagged = table[(table["violations"] > 0) | (table["near_ties"] > 0)]
    lines.append(
        flagged.to_string(index=False, float_format="{:.3g}".format)
        if len(flagged)
        else "every emitted token is an argmax of the teacher-forced logits"
    )
    rate = totals["teacher_forced_exact"]
    lines.append(
        f"records {totals['records']}, positions {totals['positions']}, violations {totals['violations']}, "
        f"near ties {totals['near_ties']} (in {totals['records_with_near_ties']} record(s)), max gap "
        f"{totals['max_gap']:.3g}, teacher-forced exact {'-' if rate is None else f'{rate:.3f}'}"
    )
    return "\n".join(lines)


def _parser() -> ArgumentParser:
    """The command line of ``python -m specbench.quality.teacher``."""
    parser = ArgumentParser(prog="python -m specbench.quality.teacher", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="a greedy run folder")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help=f"relative logit-gap tolerance (default {DEFAULT_ULPS} machine epsilons of the run's dtype)",
    )
    parser.add_argument("--limit", type=int, default=None, help="check only the first N samples")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Print the check of one run; 0 without violations, 1 with some, 2 (one error line) on bad input."""
    args = _parser().parse_args(argv)
    with user_errors(argv):
        result = check_run(args.run_dir, args.tolerance, args.limit)
    print(report_text(result))
    return int(result.totals()["violations"] > 0)


if __name__ == "__main__":
    sys.exit(main())
