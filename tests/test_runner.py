"""The runner end to end on a tiny random model: schema, resume, conflicts, interrupts, bad input."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from specbench import conformance
from specbench.config import compose_config as compose_run
from specbench.config import group_options
from specbench.environment import measuring_session
from specbench.errors import ConfigError, DataUnavailable, RunConflict
from specbench.runner import Runner, config_digest
from specbench.schema import SUMMARY_FIELDS, validate_record
from tests.conftest import ROOT

TINY = ["model=tiny_llama", "max_new_tokens=12", "warmup=0", "progress=false"]


def run(tmp_path, *overrides, data_dir=None):
    data = [f"data_dir={data_dir}"] if data_dir else ["data_dir=null"]
    cfg = compose_run(*TINY, f"output_dir={tmp_path}", *data, *overrides)
    return Runner(cfg).run()


def records(out_dir):
    return [json.loads(line) for line in (out_dir / "samples.jsonl").read_text().splitlines()]


def test_run_writes_schema_fields(tmp_path):
    out = run(tmp_path, "limit=3")
    lines = records(out)
    assert [r["sample_id"] for r in lines] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    for record in lines:
        validate_record(record)
        assert record["new_tokens"] == len(record["output_ids"]) == 12
        assert sum(record["accept_lengths"]) == record["new_tokens"] - 1 == record["target_forwards"]
        assert record["measuring_session"] == measuring_session()  # this process: one sitting, one machine
    summary = json.loads((out / "summary.json").read_text())
    assert summary["environment"]["measuring_session"] == measuring_session()
    assert set(SUMMARY_FIELDS) - {"n_records"} <= set(summary)
    assert summary["status"] == "complete" and summary["n_samples"] == 3
    assert summary["repeat"] == 0 and summary["peak_memory"]["bytes"] > 0
    assert summary["metrics"]["tokens_per_step"] == 1.0
    assert summary["environment"]["dtype"] == "float32"
    assert summary["dataset_info"]["source"] == "package" and summary["prompt_format"] == "chat"
    assert (out / "config.yaml").is_file()


def test_resume_extends_without_duplicates(tmp_path):
    run(tmp_path, "limit=2")
    first = records(tmp_path)
    run(tmp_path, "limit=4")
    both = records(tmp_path)
    assert both[:2] == first
    assert [r["sample_id"] for r in both] == [f"HumanEval/{i}" for i in range(4)]
    stored = {name: (tmp_path / name).read_bytes() for name in ("samples.jsonl", "summary.json", "config.yaml")}
    run(tmp_path, "limit=4")  # nothing left to do: the complete run is left untouched
    assert {name: (tmp_path / name).read_bytes() for name in stored} == stored


def test_changed_config_refuses_unless_forced(tmp_path):
    run(tmp_path, "limit=1")
    with pytest.raises(RunConflict, match="force=true"):
        run(tmp_path, "limit=1", "max_new_tokens=8")
    run(tmp_path, "limit=2", "max_new_tokens=8", "force=true")
    assert len(records(tmp_path)) == 2


def test_torn_tail_is_dropped_and_rerun(tmp_path):
    run(tmp_path, "limit=2")
    path = tmp_path / "samples.jsonl"
    good = path.read_text().splitlines()
    path.write_text(good[0] + "\n" + good[1][:40])  # an interrupt cut the second line
    run(tmp_path, "limit=2")
    again = records(tmp_path)
    assert [r["sample_id"] for r in again] == ["HumanEval/0", "HumanEval/1"]
    assert again[1]["output_ids"] == json.loads(good[1])["output_ids"]


def test_local_data_dir_source(tmp_path, shared_data):
    out = run(tmp_path, "limit=1", data_dir=shared_data)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset_info"]["source"] == f"local:{shared_data / 'humaneval.jsonl'}"


def test_bad_settings_are_rejected_before_loading(tmp_path):
    with pytest.raises(ConfigError, match="max_new_tokens must be >= 1"):
        run(tmp_path, "max_new_tokens=0")
    with pytest.raises(ConfigError, match="top_p"):
        run(tmp_path, "top_p=0")


def test_prompt_longer_than_context_is_a_clear_error_and_a_refused_run_writes_nothing(tmp_path):
    """A finished run extended by a command that is refused before its first sample keeps every file byte for byte:
    the summary stays complete with its own run id and limit (config.yaml and the records agree with it)."""
    run(tmp_path, "limit=1", "max_new_tokens=4")
    stored = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    with pytest.raises(ConfigError, match="exceeds the model's context length"):
        run(tmp_path, "limit=2", "max_new_tokens=4", "model.context_length=64", "force=true")
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == stored
    summary = json.loads(stored["summary.json"])
    assert summary["status"] == "complete" and summary["limit"] == 1 and summary["n_samples"] == 1


def test_a_failure_before_the_first_sample_writes_nothing(tmp_path):
    """An error after the model loaded but before any sample finished leaves no folder, config or summary."""
    out = tmp_path / "deep" / "run"
    with pytest.raises(ConfigError, match="exceeds the model's context length"):
        run(out, "limit=1", "max_new_tokens=4", "model.context_length=64")
    assert not any(tmp_path.iterdir())


def test_missing_local_file_names_hub_id_and_setting(tmp_path):
    with pytest.raises(DataUnavailable, match="openai/openai_humaneval.*data_dir"):
        run(tmp_path / "out", "limit=1", "dataset.source=local", data_dir=tmp_path)


def test_hf_generate_engine_matches_ar(tmp_path):
    ar = records(run(tmp_path / "ar", "limit=2"))
    hf = records(run(tmp_path / "hf", "limit=2", "method=hf_generate"))
    assert [r["output_ids"] for r in hf] == [r["output_ids"] for r in ar]
    assert hf[0]["target_forwards"] == 11 and hf[0]["accept_lengths"] is None


def answer_ctrl_c() -> None:
    """In the child before it starts: Ctrl-C's default action, which Python turns into KeyboardInterrupt. A process
    started in the background (nohup ... &, as CI may be) inherits SIGINT ignored, and the child would ignore it too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def killed(cmd: list[str], samples, sig) -> int:
    """Start ``cmd``, send it ``sig`` once ``samples`` holds two lines, and return its exit code."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=answer_ctrl_c
    )
    deadline = time.time() + 120
    while time.time() < deadline and (not samples.exists() or len(samples.read_text().splitlines()) < 2):
        time.sleep(0.05)
    proc.send_signal(sig)
    return proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM], ids=["kill-9", "ctrl-c", "sigterm"])
def test_killed_run_resumes_without_losses_or_duplicates(tmp_path, sig):
    """Kill a CLI run mid-way, rerun the same command: finished samples kept, none duplicated; Ctrl-C and
    SIGTERM leave status "interrupted" (exit 130 / 143), kill -9 a stale lock that the rerun takes over."""
    cmd = [sys.executable, "-m", "specbench", *TINY, "max_new_tokens=48", "limit=8", f"output_dir={tmp_path}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    samples = tmp_path / "samples.jsonl"
    code = killed(cmd, samples, sig)
    summary = json.loads((tmp_path / "summary.json").read_text())  # valid JSON whatever the signal
    if sig != signal.SIGKILL:
        assert code == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig] and summary["status"] == "interrupted"
        assert not (tmp_path / ".lock").exists()
    else:
        assert summary["status"] == "running" and (tmp_path / ".lock").exists()
    before = [json.loads(line) for line in samples.read_text().splitlines() if line.strip().endswith("}")]
    assert 2 <= len(before) < 8
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = records(tmp_path)
    ids = [r["sample_id"] for r in after]
    assert ids == [f"HumanEval/{i}" for i in range(8)]
    assert after[: len(before)] == before
    assert "resuming" in done.stdout
    assert ("taking over the lock" in done.stdout) == (sig == signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_run_of_a_method_that_learns_across_requests_records_the_steps_of_one_that_went_through(tmp_path):
    """SuffixDecoding's global tree holds the responses of the run's earlier requests: killed with -9 mid-way and
    rerun, the run rebuilds it from the finished samples' outputs before the first pending one, so every sample
    records the steps (accepted lengths, drafts, the tree's counters) of a run that was never interrupted."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(conformance.RESUME_PROMPTS * 2)
    settings = [*TINY, "method=suffix_decoding", "dataset=jsonl", f"dataset.path={prompts}", "max_new_tokens=64"]
    cmd = [sys.executable, "-m", "specbench", *settings, f"output_dir={tmp_path / 'killed'}"]
    assert killed(cmd, tmp_path / "killed" / "samples.jsonl", signal.SIGKILL) == -signal.SIGKILL
    before = sum(line.endswith("}") for line in (tmp_path / "killed" / "samples.jsonl").read_text().splitlines())
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=300).returncode == 0
    resumed, straight = records(tmp_path / "killed"), records(run(tmp_path / "straight", *settings[len(TINY) :]))
    assert 2 <= before < len(resumed) == len(straight) == 8
    assert [conformance.steps_of(record) for record in resumed] == [conformance.steps_of(record) for record in straight]


@pytest.mark.slow
def test_cli_prints_table_and_user_errors_have_no_traceback(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "specbench", *TINY, "limit=1", f"output_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    assert "tok/s" in ok.stdout and "tiny_llama" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "specbench", *TINY, "max_new_tokens=0", f"output_dir={tmp_path / 'x'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: invalid run settings") and "Traceback" not in bad.stderr


@pytest.mark.parametrize("dataset", group_options("dataset"))
def test_every_dataset_runs_end_to_end(tmp_path, shared_data, dataset):
    """Each dataset through the runner (tiny model, limit=2): one record per turn, categories carried."""
    own = []
    if dataset == "jsonl":  # the user's own file: one two-turn conversation and one prompt
        prompts = tmp_path / "input" / "mine.jsonl"
        prompts.parent.mkdir()
        prompts.write_text('{"turns": ["Hi.", "And then?"], "category": "a"}\n{"prompt": "Count.", "category": "b"}\n')
        own = [f"dataset.path={prompts}"]
    if dataset == "long_inputs":  # a bucket that leaves the tiny model's 2048-token context room to answer
        own = ["dataset.input_tokens=1024"]
    out = run(tmp_path, f"dataset={dataset}", "limit=2", "max_new_tokens=4", *own, data_dir=shared_data)
    lines = records(out)
    assert len({r["sample_id"] for r in lines}) == 2
    assert len(lines) == sum(r["n_turns"] for r in lines if r["turn"] == 0)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset_info"]["n_selected"] >= 2 and summary["n_samples"] == 2
    if dataset in ("mt_bench", "spec_bench", "jsonl"):
        turns = [0, 1, 0] if dataset == "jsonl" else [0, 1, 0, 1]  # jsonl: a two-turn record, then a one-turn one
        assert [r["turn"] for r in lines] == turns and lines[0]["category"]
        assert lines[1]["prompt_tokens"] > lines[0]["prompt_tokens"] + lines[0]["new_tokens"]


def test_local_weights_through_the_generic_hub_model(tmp_path):
    """model=hub model.path=DIR: a researcher's own checkpoint on disk, no config file needed."""
    from transformers import AutoTokenizer

    from specbench.models.embedded import embedded_checkpoint
    from specbench.models.loading import build_tiny_llama

    weights = tmp_path / "weights"
    build_tiny_llama(
        vocab_size=49152,
        seed=4,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    ).save_pretrained(weights)
    AutoTokenizer.from_pretrained(embedded_checkpoint()).save_pretrained(weights)
    out = run(tmp_path / "out", "model=hub", f"model.path={weights}", "model.name=my_model", "limit=1")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "my_model" and summary["model_path"] == str(weights)
    assert records(out)[0]["new_tokens"] == 12


def test_keys_added_later_keep_stored_digests_at_their_older_value():
    """A drafter key listed in the method's digest_defaults stays out of the digest at that value only."""
    from omegaconf import OmegaConf

    device, dtype = torch.device("cpu"), torch.float32
    cfg = compose_run(*TINY, "method=pld")
    before = config_digest(cfg, device, dtype)
    OmegaConf.set_struct(cfg, False)
    later = OmegaConf.merge(cfg, {"method": {"digest_defaults": {"new_rule": "old"}, "drafter": {"new_rule": "old"}}})
    assert config_digest(later, device, dtype) == before
    assert config_digest(OmegaConf.merge(later, {"method": {"drafter": {"new_rule": "new"}}}), device, dtype) != before


@pytest.mark.parametrize("method", ["spede", "opt_tree", "eagle2", "draft_verify", "pld", "medusa"])
def test_sampling_taken_out_of_the_method_configs_keeps_every_digest(method, monkeypatch):
    """Digest migration: the method configs used to interpolate the run's temperature and top_p into the drafter's
    node (the drafters that draw from them); hashed the old way, that config gives the digest the new one gives, and
    a drafter that never drew from them gets nothing added."""
    from omegaconf import OmegaConf, open_dict

    from specbench import runner
    from specbench.engines import check_method

    device, dtype = torch.device("cpu"), torch.float32
    cfg = compose_run(*TINY, f"method={method}", "temperature=0.7", "top_p=0.9")
    reads = type(check_method(cfg.method)).reads_sampling
    assert reads == (method not in ("pld", "medusa"))
    new = config_digest(cfg, device, dtype)
    older = OmegaConf.create(OmegaConf.to_container(cfg))
    if reads:  # the configs before: drafter.temperature: ${temperature}, drafter.top_p: ${top_p}
        with open_dict(older):
            older.method.drafter.temperature = "${temperature}"
            older.method.drafter.top_p = "${top_p}"
    monkeypatch.setattr(runner, "sampling_where_stored", lambda identity: None)  # the digest before the migration
    assert config_digest(older, device, dtype) == new
    assert (config_digest(cfg, device, dtype) == new) is not reads  # unmigrated, the new config hashes otherwise


def test_digest_defaults_name_keys_of_the_drafter():
    """Every method's digest_defaults names a key its drafter node has, at the default the file gives it."""
    from omegaconf import OmegaConf

    for path in sorted((ROOT / "conf" / "method").glob("*.yaml")):
        node = OmegaConf.load(path)
        for key, older in (node.get("digest_defaults") or {}).items():
            assert key in node.drafter and node.drafter[key] == older, f"{path.name}: digest_defaults.{key}"


def test_digest_ignores_where_local_inputs_live():
    """A clone on another machine (other data_dir / corpus path / GPU layout) resumes the same runs; a knob change
    does not."""

    def digest(*overrides):
        cfg = compose_run(*TINY, "method=self_draft", *overrides)
        return config_digest(cfg, torch.device("cpu"), torch.float32)

    base = digest("data_dir=/a", "method.drafter.corpus.files=/a/corpus")
    assert digest("data_dir=/b", "method.drafter.corpus.files=/b/corpus") == base
    assert (
        digest("data_dir=/a", "method.drafter.corpus.files=/a/corpus", "model.device_map=auto", "step_breakdown=false")
        == base
    )  # layer placement and timing detail, not results
    assert digest("data_dir=/a", "method.drafter.corpus.files=/a/corpus", "method.drafter.branch_len=4") != base


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("temperature=abc", "temperature must be a number (got 'abc')"),
        ("max_new_tokens=many", "max_new_tokens must be an integer"),
        ("limit=2.5", "limit must be an integer or null (got 2.5)"),
        ("top_p=[1]", "top_p must be a number"),
        ("force=maybe", "force must be true or false"),
    ],
)
def test_wrongly_typed_run_settings_are_refused_before_anything_loads(tmp_path, override, message):
    """Types by the RunSettings schema, checked before a model, dataset or run folder is touched."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        Runner(compose_run(*TINY, override, f"output_dir={tmp_path / 'run'}"))
    assert not (tmp_path / "run").exists()
