"""Bad input is one `error:` line and exit 2, found before any model loads; damaged, locked, unwritable and
concurrent runs lose nothing; trained parts are used only when finished; runs of other prompts never pair."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbench import bench, cli
from specbench.config import compose_config
from specbench.corpus import main as corpus_main
from specbench.data.__main__ import main as data_main
from specbench.data.base import read_jsonl
from specbench.errors import ConfigError, DataError, ModelUnavailable, RunConflict, StorageError
from specbench.files import FolderLock
from specbench.manifest import MANIFEST, finished_manifest, save_trained_heads, write_manifest
from specbench.report import __main__ as report_cli
from specbench.report import compare, read, view
from specbench.reproduce.__main__ import main as reproduce_main
from specbench.runner import Runner
from specbench.store import RunStore
from specbench.train.__main__ import main as train_main
from tests.commands import in_workspace, models_stopped, run_in_process
from tests.conftest import ROOT, SHARED_DATA
from tests.helpers import exit_code

TINY = ["model=tiny_llama", "max_new_tokens=8", "warmup=0", "progress=false", "data_dir=null"]
BAD_KNOBS = {  # the examples: one knob each that a drafter's constructor refuses
    "lade": "method.drafter.window_size=0",
    "opt_tree": "method.drafter.nodes=0",
    "pld": "method.drafter.num_pred_tokens=0",
    "lookahead": "method.drafter.decoding_length=0",
    "spede": "method.drafter.num_assistant_tokens=0",
}


def runner(tmp_path: Path, *overrides: str) -> Runner:
    """A runner of the tiny model into ``tmp_path`` (nothing loaded until it runs)."""
    return Runner(compose_config(*TINY, f"output_dir={tmp_path}", *overrides))


def cli_run(*words: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m specbench WORDS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "specbench", *words], cwd=cwd, capture_output=True, text=True, timeout=300
    )


# -- one error line, exit 2, before anything loads or is written ------------------------------------------


@pytest.mark.parametrize("method", sorted(BAD_KNOBS))
def test_a_bad_method_knob_is_refused_before_the_model_loads(tmp_path, method):
    """The drafter's own check runs when the runner is built, before any model load or write."""
    with pytest.raises(ConfigError, match=BAD_KNOBS[method].split("=")[0]):
        runner(tmp_path / "out", f"method={method}", BAD_KNOBS[method])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (["foo=1"], "unknown setting 'foo'"),
        (["method=nope"], "unknown method 'nope'; choose one of"),
        (["method=ar,nope", "--multirun"], "unknown method 'nope'"),
        (["limit=[1"], "cannot parse the override"),
        (["method.drafter.nope=1"], "unknown setting 'method.drafter.nope'"),
    ],
)
def test_a_bad_command_line_is_one_config_error(words, says):
    """The Hydra apps' command line is composed first: unknown keys, options and syntax in one line."""
    with pytest.raises(ConfigError, match=says):
        cli.check_overrides("config", words)


@pytest.mark.slow
def test_the_cli_prints_one_line_exits_2_and_writes_nothing(tmp_path):
    """Through the real command: an unknown key, and a bad knob (which needs the method composed)."""
    out = tmp_path / "out"
    for words, says in (
        [["foo=1"], "error: unknown setting 'foo'"],
        [["method=lade", "method.drafter.window_size=0"], "error: method.drafter.window_size (W)"],
    ):
        done = cli_run(*TINY, f"output_dir={out}", *words)
        assert done.returncode == 2 and done.stderr.startswith(says), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()
    debug = cli_run(*TINY, f"output_dir={out}", "foo=1", "debug=true")
    assert debug.returncode != 0 and "Traceback" in debug.stderr


@pytest.mark.parametrize(
    ("main", "argv", "says"),
    [
        (bench.main, ["smoke", "foo=1"], "unknown setting 'foo'"),
        (bench.main, ["nope"], "unknown benchmark suite 'nope'"),
        (reproduce_main, ["list", "--scale", "huge"], "unknown scale 'huge'"),
        (train_main, ["draft", "train.steps=0"], "train.steps must be >= 1"),
        (data_main, ["show", "imaginary"], "unknown dataset 'imaginary'"),
        (corpus_main, ["show", "corpus.nope=1"], "unknown setting 'corpus.nope'"),
        (report_cli.main, ["/nonexistent/runs"], "no runs found"),
    ],
)
def test_every_command_line_app_has_the_same_error_path(main, argv, says, capsys):
    """bench, reproduce, train, data, corpus and report: one `error:` line and exit 2."""
    assert exit_code(main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


# -- data files --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"question": "a", "answer": "b"}\n{"question": "c", "answer"\n', "gsm8k_test.jsonl:2: not a JSON record"),
        ('{"question": "a", "answer": "b"}\n\n{"question": "c"}\n', "gsm8k_test.jsonl:3: the record lacks"),
        ("\n\n", "holds no records"),
        ("[1, 2]\n", "must be a JSON object"),
    ],
)
def test_a_damaged_data_file_names_its_file_and_line(tmp_path, content, says):
    """Malformed line, missing field, empty file: a DataError pointing at the place to fix."""
    (tmp_path / "gsm8k_test.jsonl").write_text(content)
    dataset = compose_config("dataset=gsm100", f"data_dir={tmp_path}").dataset
    from specbench.data.base import build_dataset

    with pytest.raises(DataError, match=says):
        build_dataset(dataset, str(tmp_path)).samples()


def test_read_jsonl_checks_alternative_field_names(tmp_path):
    """A required entry lists alternatives (MT-Bench's ``turns`` or ``prompt``)."""
    path = tmp_path / "x.jsonl"
    path.write_text('{"prompt": ["hi"], "category": "c"}\n')
    assert read_jsonl(path, [("turns", "prompt"), ("category",)]) == [{"prompt": ["hi"], "category": "c"}]


# -- one writer per run folder -----------------------------------------------------------------------------


def hold_lock(folder: Path) -> subprocess.Popen:
    """Another process that holds the folder's lock until it is killed."""
    code = (
        "import sys, time; from specbench.files import FolderLock; FolderLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.slow
def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path):
    """While another process writes a folder, a run into it stops with that process's pid; once it is gone
    (killed, its lock stale), the next run takes the folder over and completes."""
    holder = hold_lock(tmp_path)
    try:
        with pytest.raises(RunConflict, match=f"in use by process {holder.pid}"):
            runner(tmp_path, "limit=1").run()
        assert not (tmp_path / "samples.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / ".lock").exists()  # left behind by the killed holder
    runner(tmp_path, "limit=1").run()
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "complete"
    assert not (tmp_path / ".lock").exists()


def test_a_lock_of_a_dead_process_is_taken_over(tmp_path):
    """A lock file naming a process that no longer runs does not block anyone."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    (tmp_path / ".lock").write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    lock = FolderLock(tmp_path).acquire()
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / ".lock").exists()


# -- damage ------------------------------------------------------------------------------------------------


def test_a_torn_summary_is_rebuilt_and_the_run_resumes(tmp_path):
    """summary.json cut mid-write: the digest comes back from config.yaml, finished samples are kept."""
    runner(tmp_path, "limit=1").run()
    first = (tmp_path / "samples.jsonl").read_text()
    summary = tmp_path / "summary.json"
    summary.write_text(summary.read_text()[:40])
    runner(tmp_path, "limit=2").run()
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert (tmp_path / "samples.jsonl").read_text().startswith(first) and len(lines) == 2
    assert json.loads(summary.read_text())["n_samples"] == 2
    with pytest.raises(RunConflict, match="different configuration"):  # the recovered digest still guards it
        runner(tmp_path, "limit=2", "seed=5")


def test_a_full_disk_stops_with_a_clear_error_and_keeps_finished_samples(tmp_path, monkeypatch):
    """The third sample's append fails (ENOSPC): a StorageError naming the file, two samples kept, and the
    rerun (space freed) finishes without duplicates."""
    import specbench.store as store

    real_fsync, calls = os.fsync, []

    def full_disk(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(store.os, "fsync", full_disk)
    with pytest.raises(StorageError, match="No space left on device; samples finished before this are kept"):
        runner(tmp_path, "limit=4").run()
    monkeypatch.setattr(store.os, "fsync", real_fsync)
    kept = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines() if line.endswith("}")]
    assert len({r["sample_id"] for r in kept}) >= 2
    runner(tmp_path, "limit=4").run()
    ids = [json.loads(line)["sample_id"] for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 4


def test_a_full_disk_while_the_summary_is_written_leaves_a_readable_run(tmp_path, monkeypatch):
    """The second summary write fails (ENOSPC): no summary.json.tmp is left, the report reads the kept samples,
    and the rerun completes the run."""
    import specbench.files as files
    from specbench.report.read import load_runs

    real_replace, summaries = os.replace, []

    def full_disk(source, target) -> None:
        if str(target).endswith("summary.json"):
            summaries.append(target)
            if len(summaries) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(source, target)

    monkeypatch.setattr(files.os, "replace", full_disk)
    with pytest.raises(StorageError, match="No space left on device"):
        runner(tmp_path, "limit=3").run()
    monkeypatch.setattr(files.os, "replace", real_replace)
    assert not list(tmp_path.glob("*.tmp"))
    assert load_runs([tmp_path])["n_samples"].tolist() == [2]
    runner(tmp_path, "limit=3").run()
    assert load_runs([tmp_path])["n_samples"].tolist() == [3]


def test_a_read_only_folder_is_a_storage_error(tmp_path, monkeypatch):
    """A folder that cannot be written (EROFS on the first write) is refused with a way out, nothing half-done."""
    import specbench.store as store

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(store, "write_atomic", read_only)
    with pytest.raises(StorageError, match="Read-only file system"):
        runner(tmp_path / "out", "limit=1").run()
    assert not (tmp_path / "out" / ".lock").exists()


# -- trained parts -----------------------------------------------------------------------------------------


def test_a_part_without_a_finished_manifest_is_not_used(tmp_path):
    """No manifest (cut short, partial copy, older trainer) or an unfinished one: ModelUnavailable with the fix."""
    (tmp_path / "weights.bin").write_bytes(b"w")
    with pytest.raises(ModelUnavailable, match="has no manifest.json.*train draft model=x force=true"):
        finished_manifest(tmp_path, "distilled draft", "python -m specbench.train draft model=x")
    manifest = write_manifest(tmp_path, "distilled draft", ["weights.bin"], "s", "d", 10, 10, "steps")
    assert finished_manifest(tmp_path, "distilled draft", "cmd") == manifest
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "finished": False, "steps_done": 3}))
    with pytest.raises(ModelUnavailable, match="unfinished \\(3 of 10 steps"):
        finished_manifest(tmp_path, "distilled draft", "cmd")


def test_a_part_is_identified_by_its_bytes_not_its_manifest(tmp_path):
    """Weights changed under an unchanged manifest, or a manifest edited to another digest: refused, with the fix."""
    (tmp_path / "weights.bin").write_bytes(b"trained")
    manifest = write_manifest(tmp_path, "Medusa heads", ["weights.bin"], "s", "d", 10, 10, "steps")
    assert manifest["weight_files"] == ["weights.bin"]
    (tmp_path / "weights.bin").write_bytes(b"swapped")
    with pytest.raises(ModelUnavailable, match="not what its manifest says: its weights hash to .*force=true"):
        finished_manifest(tmp_path, "Medusa heads", "python -m specbench.train medusa model=x")
    (tmp_path / "weights.bin").write_bytes(b"trained")
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "weights_digest": "0" * 16}))
    with pytest.raises(ModelUnavailable, match="manifest names 0000000000000000"):
        finished_manifest(tmp_path, "Medusa heads", "cmd")
    (tmp_path / "weights.bin").unlink()
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ModelUnavailable, match="lacks a weight file its manifest names"):
        finished_manifest(tmp_path, "Medusa heads", "cmd")


def distilled_stand_in(folder: Path, seed: int) -> None:
    """A finished 'distilled draft' for tiny_llama (a random one, with a manifest), as the trainer leaves it."""
    from specbench.models.loading import build_tiny_llama, load_tokenizer

    tokenizer = load_tokenizer(compose_config("model=tiny_llama").model)
    draft = build_tiny_llama(
        len(tokenizer),
        seed=seed,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
    )
    shutil.rmtree(folder, ignore_errors=True)
    draft.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_manifest(folder, "distilled draft", ["model.safetensors"], f"settings{seed}", "data", 1, 1, "steps")


def test_runs_record_their_parts_and_never_mix_two(tmp_path, monkeypatch):
    """The distilled draft a run used is named by its weights digest in the summary; after the draft is
    retrained (same config, new weights), a run into the same folder is refused instead of mixing them."""
    from specbench.models.parts import part_kind

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    distilled_stand_in(part_kind("draft").folder("tiny_llama"), seed=1)
    out = tmp_path / "run"
    runner(out, "method=spede", "model.draft.source=distilled", "limit=1").run()
    parts = json.loads((out / "summary.json").read_text())["artefacts"]
    assert len(parts) == 1 and parts[0].startswith("draft:") and "/" not in parts[0]
    distilled_stand_in(part_kind("draft").folder("tiny_llama"), seed=2)
    with pytest.raises(RunConflict, match="holds samples made with"):
        runner(out, "method=spede", "model.draft.source=distilled", "limit=2").run()
    assert len((out / "samples.jsonl").read_text().splitlines()) == 1


# -- the report pairs only like with like ------------------------------------------------------------------


@pytest.mark.slow
def test_runs_of_different_prompt_formats_never_pair(tmp_path, shared_data):
    """AR on chat prompts and PLD on raw prompts of the same samples: no speedup, no exact match."""
    common = [
        "model=smollm2_135m",
        "limit=2",
        "max_new_tokens=8",
        "warmup=0",
        "progress=false",
        f"data_dir={shared_data}",
    ]
    Runner(compose_config(*common, "method=ar", f"output_dir={tmp_path / 'ar'}")).run()
    Runner(compose_config(*common, "method=pld", "dataset.prompt_format=raw", f"output_dir={tmp_path / 'pld'}")).run()
    Runner(compose_config(*common, "method=pld", f"output_dir={tmp_path / 'pld_chat'}")).run()
    table = view.table([tmp_path]).set_index("method")
    assert table.loc["ar", "speedup"] == 1.0
    raw = table[table["n_samples"].notna()].loc["pld"]
    rows = compare.match_ar(*read.load([tmp_path])).set_index("run_dir")
    assert pd_isna(rows.loc[str(tmp_path / "pld"), "ar_run_dir"])  # no AR run answered raw prompts
    assert rows.loc[str(tmp_path / "pld_chat"), "ar_run_dir"] == str(tmp_path / "ar")
    assert len(raw) == 2


def pd_isna(value) -> bool:
    """NaN or None."""
    import pandas as pd

    return bool(pd.isna(value))


def test_samples_with_other_prompt_tokens_are_left_out(tmp_path):
    """Per sample: a digest of the prompt tokens must agree with the baseline's, else the pair is dropped."""
    runner(tmp_path / "ar", "limit=2").run()
    shutil.copytree(tmp_path / "ar", tmp_path / "copy")
    summary = json.loads((tmp_path / "copy" / "summary.json").read_text())
    (tmp_path / "copy" / "summary.json").write_text(json.dumps({**summary, "method": "pld"}))
    lines = (tmp_path / "copy" / "samples.jsonl").read_text().splitlines()
    changed = [json.dumps({**json.loads(lines[0]), "prompt_sha": "0" * 16}), *lines[1:]]
    (tmp_path / "copy" / "samples.jsonl").write_text("\n".join(changed) + "\n")
    with pytest.warns(UserWarning, match="1 sample\\(s\\) answered other prompt tokens"):
        rows = compare.match_ar(*read.load([tmp_path])).set_index("method")
    assert rows.loc["pld", "n_common"] == 1


CONTRADICTING_TRAINER_SETTINGS = {
    "medusa, 16 prompts, 32 held out": (
        "medusa",
        ["prompts.max_prompts=16"],
        "train.eval_sequences=32 holds out every sequence: prompts.max_prompts=16 gives at most 16",
    ),
    "hydra, 10 prompts per source": (
        "hydra",
        ["prompts.per_source_limit=10", "train.eval_sequences=20"],
        "prompts.per_source_limit=10 x 2 source(s) gives at most 20",
    ),
    "draft, 32 prompts": ("draft", ["prompts.max_prompts=32"], "train.eval_sequences=32 holds out every sequence"),
    **{
        f"{command} without soft labels": (command, ["prompts.teacher_topk=0"], "prompts.teacher_topk must be >= 1")
        for command in ("draft", "eagle", "eagle3", "hydra")
    },
}


@pytest.mark.parametrize(
    ("command", "words", "says"), CONTRADICTING_TRAINER_SETTINGS.values(), ids=list(CONTRADICTING_TRAINER_SETTINGS)
)
def test_trainer_settings_that_contradict_each_other_are_refused_before_anything_loads(tmp_path, command, words, says):
    """A held-out set the prompt caps cannot leave data beside, or distillation without the target's top-k records:
    one error line before the target loads (found before: after minutes of self-distillation)."""
    with models_stopped(tmp_path, SHARED_DATA), in_workspace():
        outcome = run_in_process(train_main, [command, "model=tiny_llama", *words])
    assert outcome.code == 2 and len(outcome.error_lines()) == 1 and says in outcome.error_lines()[0], outcome


def test_trained_weights_get_the_modes_of_their_siblings(tmp_path):
    """safetensors writes weights private (0600) and mkdtemp makes folders private: a finished part's folder and
    every file in it get the modes an ordinary new folder and file get, as a cache shared by users expects."""
    save_trained_heads(
        tmp_path / "heads",
        "medusa",
        "heads.safetensors",
        {"w": torch.zeros(2)},
        "config.json",
        {},
        {"digest": "d", "result": {"steps": 1, "steps_planned": 1, "stopped_by": "steps"}},
    )
    (tmp_path / "plain").write_text("x")
    (tmp_path / "folder").mkdir()
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "heads").iterdir()}
    assert set(modes) == {"heads.safetensors", "config.json", "training.json", MANIFEST}
    assert set(modes.values()) == {(tmp_path / "plain").stat().st_mode & 0o777}, modes
    assert (tmp_path / "heads").stat().st_mode & 0o777 == (tmp_path / "folder").stat().st_mode & 0o777


def test_training_precision_is_chosen_from_the_hardware():
    """``auto``: bfloat16 only where it is measured (CPU) or known (GPU) to be fast; explicit choices stay."""
    from specbench.train.common import autocast_dtype, cpu_bf16_is_faster

    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu) == (torch.bfloat16 if cpu_bf16_is_faster() else None)
    assert autocast_dtype(None, cpu) is None and autocast_dtype("float16", cpu) == torch.float16


def test_the_time_cap_holds_when_steps_are_slow():
    """A step starts only while the slowest step so far still fits: the cap is never overrun by one."""
    import time

    from specbench.train.common import TimeBudget

    budget = TimeBudget(0.2 / 60)  # 0.2 s
    steps = 0
    while budget.allows_step():
        time.sleep(0.06)
        budget.step_done()
        steps += 1
    assert budget.elapsed() <= 0.2 + 0.02 and steps == 3


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_output_dir_that_is_a_file_is_named_as_such(tmp_path, below):
    """A regular file where the run folder (or one of its parents) should be: one clear error, nothing written."""
    (tmp_path / "taken").write_text("not a folder")
    with pytest.raises(StorageError, match="taken is a file, not a folder; choose another output_dir"):
        RunStore(tmp_path / "taken" / below, "digest")
    assert (tmp_path / "taken").read_text() == "not a folder"
