"""Benchmark suites: several methods in ONE process on the same prompts, ratios measured in that run.

    python -m specbench.bench SUITE [--limit N] [--max-new-tokens N] [--rounds R] [--device D]
                                    [--dtype T] [--out DIR] [OVERRIDE ...]
    python -m specbench.bench --list
    python -m specbench.bench --convert OLD.json [--out DIR]

A suite (``conf/bench/<SUITE>.yaml``) names a model, a dataset and entries: a label plus the Hydra
overrides of one method (``grid`` entries expand into one entry per combination, for sweeps). The
model is loaded once; every prompt runs through every entry, in an order that rotates from prompt
to prompt so drift in machine speed hits all entries alike. Each round builds fresh engines (an untimed warm-up, then
forgotten), so drafters that learn across requests never see a prompt twice.

Nothing is measured here: each entry and round is an ordinary run folder written by the runner
(``<out>/<SUITE>/<session>/<entry>/r<round>/``, the summary naming the suite, session, entry and
baseline), and the printed table is the report's ``steps`` view of the session
(``python -m specbench.report SESSION --merge-repeats --view steps`` prints it again); with compiled entries it is
printed a second time against eager AR (``--ar eager``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specbench.cli import ArgumentParser, adopt_config_dirs, interrupted, user_errors
from specbench.config import add_user_config_dirs, compose_config, find_config, group_options
from specbench.engines import check_method
from specbench.environment import capture, dtype_name
from specbench.errors import ConfigError, StorageError
from specbench.files import file_in_the_way, write_atomic
from specbench.metrics import run_summary
from specbench.models.loading import LoadedModel, TargetFiles, resolve_device, resolve_dtype
from specbench.paths import workspace
from specbench.report.plot import save_acceptance_figure, save_figure
from specbench.report.view import format_table, table
from specbench.runner import Runner, load_target, validate
from specbench.schema import PHASES, SAMPLE_FIELDS, SCHEMA_VERSION, is_integer, validate_record
from specbench.settings import type_problems

RESULTS_DIR = workspace() / "results" / "bench"


@dataclass(frozen=True)
class Entry:
    """One benchmarked configuration: a label, the Hydra overrides that select it, and its grid values (which a
    baseline label with placeholders, ``ar b{batch_size}``, is filled with)."""

    label: str
    overrides: tuple[str, ...]
    values: tuple[tuple[str, str], ...] = ()

    def baseline(self, template: str) -> str:
        """The label of this entry's baseline: ``template`` filled with the entry's grid values."""
        return template.format(**dict(self.values)) if self.values else template


def suite_names() -> list[str]:
    """The suites in conf/bench/ (and the user's config folders' bench/), sorted."""
    return group_options("bench")


def load_suite(name: str) -> DictConfig:
    """conf/bench/<name>.yaml (or a user's ``bench/<name>.yaml``), or a ConfigError listing the suites."""
    path = find_config("bench", name) if name in suite_names() else None
    if path is None:
        raise ConfigError(f"unknown benchmark suite {name!r}; choose one of {suite_names()}")
    suite = OmegaConf.load(path)
    if not isinstance(suite, DictConfig):
        raise ConfigError(f"benchmark suite {path} must be a mapping (suite settings and entries), not a list")
    return suite


ENTRY_KEYS = ("label", "overrides", "grid")
"""The keys of one ``entries`` item of a suite."""


def expand_entries(suite: DictConfig) -> list[Entry]:
    """The suite's entries, each ``grid`` entry expanded into one entry per combination of values."""
    entries = []
    for spec in suite.entries:
        unknown = sorted(str(key) for key in spec if key not in ENTRY_KEYS)
        if unknown:
            raise ConfigError(
                f"benchmark entry {spec.get('label')!r} has unknown keys {unknown} (entries take "
                f"{', '.join(ENTRY_KEYS)}); in a YAML flow mapping a comma inside a label ends it: quote the label"
            )
        base = tuple(spec.get("overrides") or ())
        grid = spec.get("grid") or {}
        keys = list(grid)
        for values in itertools.product(*(list(grid[key]) for key in keys)):
            setting = dict(zip(keys, values))
            short = {key.split(".")[-1]: str(value) for key, value in setting.items()}
            label = spec.label.format(**short)
            entries.append(
                Entry(label, base + tuple(f"{key}={value}" for key, value in setting.items()), tuple(short.items()))
            )
    labels = [entry.label for entry in entries]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ConfigError(
            f"benchmark suite has duplicate entry labels {duplicates}; give grid "
            f"entries a label with {{placeholders}} for the swept keys"
        )
    folders = [entry_folder(label) for label in labels]
    clashes = sorted({label for label, folder in zip(labels, folders) if folders.count(folder) > 1})
    if clashes:
        raise ConfigError(
            f"benchmark entry labels {clashes} map to the same folder name; make them differ in letters or digits"
        )
    return entries


def entry_folder(label: str) -> str:
    """A folder name for an entry label: runs of characters other than letters, digits, ``.=-`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", label).strip("_") or "entry"


def entry_configs(suite: DictConfig, entries: list[Entry], args: argparse.Namespace) -> dict[str, DictConfig]:
    """The composed run config of every entry; all must share the model, device, dtype and dataset."""
    dataset = args.dataset or suite.dataset
    common = [f"model={suite.model}", f"dataset={dataset}", *(suite.get("overrides") or ()), *args.overrides]
    for key in ("max_new_tokens", "device", "dtype"):
        if getattr(args, key) is not None:
            common.append(f"{key}={getattr(args, key)}")
    limit = args.limit if args.limit is not None else suite.get("limit")
    if limit is not None:
        common.append(f"limit={limit}")
    configs = {entry.label: compose_config(*common, *entry.overrides) for entry in entries}
    for cfg in configs.values():  # every entry's run knobs and drafter knobs, before the model loads
        validate(cfg)
        check_method(cfg.method)
    for part in ("model", "dataset"):
        if len({OmegaConf.to_yaml(cfg[part]) for cfg in configs.values()}) > 1:
            raise ConfigError(
                f"benchmark entries must not change the {part} (one {part} per suite: every "
                f"entry runs the same prompts on one loaded model)"
            )
    return configs


def check_out(out: Path) -> None:
    """A StorageError when ``--out`` is (or lies below) a regular file, before anything loads or is written."""
    blocking = file_in_the_way(out)
    if blocking is not None:
        raise StorageError(f"--out {out}: {blocking} is a file, not a folder; choose another --out")


def new_session(out: Path, suite: str, name: str) -> Path:
    """A new session folder ``<out>/<suite>/<name>`` (``-1``, ``-2``... appended rather than reuse one)."""
    for attempt in itertools.count():
        folder = out / suite / (name if attempt == 0 else f"{name}-{attempt}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def round_runners(
    configs: dict[str, DictConfig],
    entries: list[Entry],
    lm: LoadedModel | TargetFiles,
    session: Path,
    suite: str,
    baseline: str,
    round_index: int,
) -> dict[str, Runner]:
    """One runner per entry for this round, writing ``<session>/<entry>/r<round>`` with ``repeat`` = round."""
    runners = {}
    for index, entry in enumerate(entries):
        cfg = configs[entry.label].copy()
        cfg.output_dir = str(session / entry_folder(entry.label) / f"r{round_index}")
        cfg.repeat = round_index
        cfg.progress = False
        bench = {
            "suite": suite,
            "session": session.name,
            "entry": entry.label,
            "baseline": entry.baseline(baseline),
            "index": index,
        }
        runners[entry.label] = Runner(cfg, lm=lm, bench=bench)
    return runners


def load_of(runner: Runner) -> tuple[int, int]:
    """How a runner's requests reach its engine: (concurrency, 0 offline; batch size)."""
    return runner.cfg.concurrency or 0, runner.cfg.batch_size


def batch_phases(runners: dict[str, Runner]) -> list[dict[str, Runner]]:
    """The round's runners by batch size (and concurrency), smallest first: each is a phase of its own (its engines
    started together and closed before the next phase's start), every sample batched alike within it."""
    loads = sorted({load_of(runner) for runner in runners.values()})
    return [{label: r for label, r in runners.items() if load_of(r) == load} for load in loads]


def run_round(runners: dict[str, Runner], bar: tqdm, round_index: int) -> None:
    """Per batch size: warm up and build every entry's engine, then run every batch of samples through every
    entry, order rotating from batch to batch."""
    for phase in batch_phases(runners):
        run_phase(phase, bar, round_index)


def run_phase(runners: dict[str, Runner], bar: tqdm, round_index: int) -> None:
    """Warm up and build the engine of every entry with samples left, then run every batch through those entries,
    order rotating from batch to batch. An entry skips the samples its folder holds (a resumed reproduction
    session); an entry whose folder holds its run complete is not opened (its files stay byte for byte)."""
    active = {label: runner for label, runner in runners.items() if not runner.done()}
    if not active:
        return
    labels = list(active)
    first = next(iter(active.values()))
    samples = first.samples
    status = "failed"
    try:
        for runner in active.values():
            runner.open()
            pending = runner.pending()  # again: the folder is ours now, and reloaded
            runner.start_engine(pending[0] if pending else None)
        for i, batch in enumerate(first.batches(samples)):
            shift = (i + round_index) % len(labels)
            for label in labels[shift:] + labels[:shift]:
                left = [sample for sample in batch if sample.sample_id not in active[label].store.finished_ids]
                if left:
                    active[label].run_batch(left)
            bar.update(len(batch) * len(active))
        status = "complete"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        for runner in active.values():
            runner.finish(status)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options; leftover ``key=value`` words are Hydra overrides for every entry."""
    parser = ArgumentParser(prog="python -m specbench.bench", description=__doc__.splitlines()[0])
    parser.add_argument("suite", nargs="?", help="a suite in conf/bench/ (see --list)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to every entry")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    parser.add_argument(
        "--convert",
        nargs="+",
        type=Path,
        metavar="OLD.json",
        help="turn results files of the earlier single-JSON bench format into run folders",
    )
    parser.add_argument("--limit", type=int, help="prompts (default: the suite's)")
    parser.add_argument("--dataset", help="run the suite on this dataset instead of its own (a conf/dataset name)")
    parser.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    parser.add_argument("--rounds", type=int, help="passes over the prompts (default: the suite's, else 1)")
    parser.add_argument(
        "--entries",
        nargs="+",
        metavar="LABEL",
        help="run only these entries of the suite (its baseline always runs too)",
    )
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help=f"results folder (default {RESULTS_DIR})")
    parser.add_argument(
        "--config-dir",
        "-cd",
        dest="config_dirs",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of your own configs (method/, dataset/, model/, bench/), as for python -m specbench",
    )
    return parser.parse_intermixed_args(argv)


def chosen_entries(entries: list[Entry], labels: list[str] | None, baseline: str, suite: str) -> list[Entry]:
    """The entries ``--entries`` names, and their baselines (all of them without the option)."""
    if not labels:
        return entries
    unknown = sorted(set(labels) - {entry.label for entry in entries})
    if unknown:
        raise ConfigError(
            f"--entries: {unknown} are not entries of suite {suite!r}; its entries: {[e.label for e in entries]}"
        )
    baselines = {entry.baseline(baseline) for entry in entries if entry.label in labels}
    return [entry for entry in entries if entry.label in labels or entry.label in baselines]


def run(args: argparse.Namespace) -> Path:
    """Run one suite end to end into a new session folder; print the report's table; return the folder."""
    suite = load_suite(args.suite)
    entries = expand_entries(suite)
    baseline = suite.get("baseline") or entries[0].label
    entries = chosen_entries(entries, args.entries, baseline, args.suite)
    configs = entry_configs(suite, entries, args)
    first = next(iter(configs.values()))
    device = resolve_device(first.device)
    dtype = resolve_dtype(first.dtype, device)
    missing = sorted({entry.baseline(baseline) for entry in entries} - set(configs))
    if missing:
        raise ConfigError(f"benchmark suite baseline(s) {missing} are not among its entries {list(configs)}")
    rounds = args.rounds if args.rounds is not None else suite.get("rounds", 1)
    if not is_integer(rounds) or rounds < 1:
        raise ConfigError(f"--rounds must be an integer >= 1, got {rounds!r}")
    check_out(args.out)
    # one target for every entry: loaded if one runs on specbench's own engines (vLLM loads its own copy)
    lm = load_target(next((cfg for cfg in configs.values() if cfg.engine.name == "hf"), first), device, dtype)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    session = new_session(args.out, args.suite, f"{lm.name}_{device.type}_{dtype_name(dtype)}_{stamp}")
    bar = None
    for round_index in range(rounds):
        runners = round_runners(configs, entries, lm, session, args.suite, baseline, round_index)
        if bar is None:
            samples = len(next(iter(runners.values())).samples)
            bar = tqdm(total=rounds * samples * len(entries), desc="bench", unit="gen", file=sys.stderr)
        run_round(runners, bar, round_index)
    assert bar is not None  # rounds >= 1: the first round made it
    bar.close()
    environment = capture(device, dtype)
    print(
        f"suite={args.suite} model={lm.name} dataset={first.dataset.name} prompts={samples} "
        f"max_new_tokens={first.max_new_tokens} temperature={first.temperature} rounds={rounds} "
        f"device={environment['device_name']} dtype={dtype_name(dtype)} threads={torch.get_num_threads()}"
    )
    steps = table([session], repeats=True, view="steps")
    print(format_table(steps))
    if steps["compiled"].any():  # compiled entries: their speedups against eager AR too (the table above: same path)
        print("against eager AR:")
        print(format_table(table([session], repeats=True, view="steps", against="eager")))
    cost = table([session], repeats=True, view="cost")
    if cost["ideal_speedup"].notna().any():  # a latency curve is cached for this model and device
        print(format_table(cost))
    batches = table([session], repeats=True, view="batch")
    if batches["batch_size"].nunique() > 1 or batches["concurrency"].nunique() > 1:  # a sweep: its view and figure
        print(format_table(batches))
        save_figure("batch", batches, session / "batch.png", f"{args.suite}: speedup and tokens per step by batch size")
    acceptance = table([session], repeats=True, view="acceptance")
    if not acceptance.empty:
        save_acceptance_figure(acceptance, session / "acceptance.png", f"{args.suite}: acceptance by draft depth")
    print(f"wrote {session}")
    return session


# -- the earlier single-JSON format, read once ------------------------------------------------------


@dataclass
class LegacyRecord:
    """The types of one generation of the earlier single-JSON format."""

    round: int
    sample_id: str
    new_tokens: int
    output_ids: list[int]
    wall_s: float
    prefill_s: float
    target_forwards: int
    draft_tokens: list[int] | None
    drafter_stats: dict


@dataclass
class LegacyMethod:
    """The types of an entry's method node in the earlier format (its other keys are kept as they are)."""

    name: str


@dataclass
class LegacyEntry:
    """The types of one entry of the earlier format."""

    overrides: list[str]
    method: LegacyMethod


@dataclass
class LegacyRow:
    """The types of one row of the earlier format's table (the baseline's speedup is 1.0)."""

    label: str
    speedup: float


@dataclass
class LegacyResults:
    """The types of what the converter reads from a results file of the earlier single-JSON format."""

    suite: str
    model: str
    dataset: str
    prompts: int
    max_new_tokens: int
    temperature: float
    environment: dict
    rows: list[LegacyRow]
    entries: dict[str, LegacyEntry]
    records: dict[str, list[LegacyRecord]]


def legacy_payload(path: Path) -> dict:
    """A results file of the earlier format, read and checked against ``LegacyResults`` (one ConfigError)."""
    try:
        payload = json.loads(path.read_bytes())
    except OSError as error:
        raise ConfigError(f"--convert {path}: cannot read it ({error.strerror})") from None
    except ValueError as error:
        raise ConfigError(f"--convert {path}: not a JSON file ({error})") from None
    problems = type_problems(payload, LegacyResults) if isinstance(payload, dict) else ["it holds no JSON object"]
    if not problems:
        problems = [
            f"entry {label!r} has no records" for label in payload["entries"] if label not in payload["records"]
        ]
    if not problems and not any(row["speedup"] == 1.0 for row in payload["rows"]):
        problems = ["no row has speedup 1.0 (the baseline)"]
    if problems:
        raise ConfigError(f"--convert {path}: not a results file of the earlier bench format: {'; '.join(problems)}")
    return payload


def convert(path: Path, out: Path) -> Path:
    """Write the runs of an earlier bench results file (one JSON) as run folders of a session; return it.

    That format kept per-generation timings, drafts and outputs but not the prompt, the decoded text,
    the per-step accept lengths, the stop reason or the dataset details: those fields are null here,
    and every summary names the file it came from (``converted_from``). The whole file is checked (and its
    records by the samples schema) before anything is written.
    """
    check_out(out)
    payload = legacy_payload(path)
    records = {label: legacy_records(path, label, payload["records"][label]) for label in payload["entries"]}
    sampling = {label: legacy_sampling(path, label, entry, payload) for label, entry in payload["entries"].items()}
    session = new_session(out, entry_folder(payload["suite"]), path.stem)
    baseline = next(row["label"] for row in payload["rows"] if row["speedup"] == 1.0)  # speedups were vs it
    for index, (label, entry) in enumerate(payload["entries"].items()):
        for round_index, converted in records[label].items():
            folder = session / entry_folder(label) / f"r{round_index}"
            folder.mkdir(parents=True)
            bench = {
                "suite": payload["suite"],
                "session": session.name,
                "entry": label,
                "baseline": baseline,
                "index": index,
            }
            summary = legacy_summary(payload, entry, converted, round_index, bench, path.name, sampling[label])
            write_atomic(folder / "samples.jsonl", "".join(json.dumps(r) + "\n" for r in converted))
            write_atomic(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
            write_atomic(
                folder / "config.yaml", OmegaConf.to_yaml({"method": entry["method"], "overrides": entry["overrides"]})
            )
    return session


def legacy_records(path: Path, label: str, records: list[dict]) -> dict[int, list[dict]]:
    """An entry's generations as samples.jsonl records per round, each checked by the samples schema."""
    rounds: dict[int, list[dict]] = {}
    for number, record in enumerate(records, 1):
        converted = legacy_record(record, f"{path.name}#{label}")
        try:
            validate_record(converted)
        except ValueError as error:
            raise ConfigError(f"--convert {path}: entry {label!r}, record {number}: {error}") from None
        rounds.setdefault(record["round"], []).append(converted)
    return dict(sorted(rounds.items()))


def legacy_sampling(path: Path, label: str, entry: dict, payload: dict) -> dict:
    """An entry's sampling settings: its overrides', else the file's (a ConfigError when one is not a number)."""
    overrides = dict(item.split("=", 1) for item in entry["overrides"] if "=" in item)
    try:
        return {
            "temperature": float(overrides.get("temperature", payload["temperature"])),
            "top_p": float(overrides.get("top_p", 1.0)),
            "seed": int(overrides.get("seed", 0)),
        }
    except ValueError as error:
        raise ConfigError(
            f"--convert {path}: entry {label!r} has a sampling override that is not a number ({error})"
        ) from None


def legacy_record(record: dict, run_id: str) -> dict:
    """A samples.jsonl record from one generation of the earlier format (fields it lacked are null)."""
    converted = dict.fromkeys(SAMPLE_FIELDS)
    converted.update(
        schema=SCHEMA_VERSION,
        run_id=run_id,
        sample_id=record["sample_id"],
        turn=0,
        n_turns=1,
        new_tokens=record["new_tokens"],
        output_ids=record["output_ids"],
        wall_s=record["wall_s"],
        prefill_s=record["prefill_s"],
        target_forwards=record["target_forwards"],
        draft_tokens=record["draft_tokens"],
        drafter_stats=record["drafter_stats"],
        **{f"{key}_s": record.get(f"{key}_s") for key in ("step", *PHASES)},
    )
    return converted


def legacy_summary(
    payload: dict, entry: dict, records: list[dict], round_index: int, bench: dict, source: str, sampling: dict
) -> dict:
    """summary.json of one converted entry and round."""
    stamp = re.search(r"\d{8}T\d{6}Z", source)  # the old files were named <model>_<device>_<dtype>_<UTC time>
    when = (
        datetime.strptime(stamp.group(), "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).isoformat(timespec="seconds")
        if stamp
        else None
    )
    method = entry["method"]
    return run_summary(
        records,
        run_id=f"{source}#{bench['entry']}",
        status="complete",
        model=payload["model"],
        model_path=None,
        method=method["name"],
        dataset=payload["dataset"],
        dataset_info=None,
        prompt_format=None,
        lossless=bool(method.get("lossless", True)),
        hyperparameters=method,
        sampling=sampling,
        repeat=round_index,
        experiment=None,
        max_new_tokens=payload["max_new_tokens"],
        limit=payload["prompts"],
        warmup=1,
        started_at=when,
        updated_at=when,
        ended_at=when,
        peak_memory=None,
        device_map=None,
        environment=payload["environment"],
        config_digest=None,
        bench=bench,
        target="",  # the old format recorded no target digest nor parts (the report reads both as unknown)
        artefacts=[],
        budget=None,
        engine={"name": "hf", "batch_size": 1},
        latency_curves=[],
        compile=None,
        memory_traffic=None,
        converted_from=source,
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: ``error: ...`` and exit 2 on a user error."""
    args = parse_args(argv)
    with user_errors(argv):
        add_user_config_dirs(args.config_dirs)
        adopt_config_dirs(args.overrides)
        if args.convert:
            for path in args.convert:
                print(f"{path} -> {convert(path, args.out)}")
        elif args.list or not args.suite:
            for name in suite_names():
                print(f"{name:16s} {load_suite(name).get('description', '')}")
        else:
            try:
                run(args)
            except KeyboardInterrupt as stop:
                interrupted(stop, "the session's finished generations are saved in its run folders")
    return 0


if __name__ == "__main__":
    sys.exit(main())
