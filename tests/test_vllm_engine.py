"""engine=vllm without vLLM: lining vLLM's speculative record up with the steps, the worker's trace as a Generation,
the settings engine=vllm refuses, and what it leaves unchanged for specbench's own engines (tests/test_vllm_smoke.py
runs vLLM itself)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.errors import ConfigError, ModelUnavailable
from specbench.metrics import aggregate, machine_seconds
from specbench.runner import config_digest, validate
from specbench.vllm_engine import (
    differences,
    drafted_per_step,
    engine_args,
    generation_of,
    steps_of_record,
    vllm_methods,
    vllm_python,
)


def test_multi_token_steps_take_the_entries_that_accepted():
    """A step that emitted e > 1 tokens drafted and accepted e - 1: the entries line up with those steps in order."""
    assert drafted_per_step([3, 1, 2], [2, 1], [5, 4]) == [5, 0, 4]


def test_entries_that_accepted_nothing_go_to_one_token_steps_between_the_others():
    """Three one-token steps, one of them drafted (and rejected everything): the (drafted, emitted) pairs are the
    same whichever it was, so the earliest takes it."""
    assert drafted_per_step([2, 1, 1, 1, 3], [1, 0, 2], [3, 5, 2]) == [3, 5, 0, 0, 2]


def test_the_last_step_may_emit_fewer_than_it_accepted():
    """Cut at EOS or the budget: vLLM counts what it accepted past the end."""
    assert drafted_per_step([1, 2], [0, 4], [5, 5]) == [5, 5]
    assert drafted_per_step([1, 1], [3], [5]) == [0, 5]


@pytest.mark.parametrize(
    ("steps", "accepted", "drafted"),
    [
        ([2, 1], [], []),  # a multi-token step without any entry
        ([1, 1], [0, 0, 0], [5, 5, 5]),  # more drafting steps than steps
        ([2, 3], [2, 1], [4, 4]),  # the entries out of order
    ],
)
def test_records_that_cannot_line_up_are_refused(steps, accepted, drafted):
    with pytest.raises(ValueError, match="does not line up"):
        drafted_per_step(steps, accepted, drafted)


def test_a_worker_trace_becomes_the_loops_record():
    """The prefill's token is not a step; each engine step is one target forward; times are since submission."""
    trace = {
        "output_ids": [5, 6, 7, 8, 2],
        "finish_reason": "stop",
        "emitted": [1, 3, 1],
        "times": [0.5, 0.75, 1.0],
        "spec": {"per_step_accepted": [2, 0], "per_step_drafted": [4, 4]},
    }
    gen = generation_of(trace)
    assert (gen.target_forwards, gen.accept_lengths, gen.draft_tokens) == (2, [3, 1], [4, 4])
    assert (gen.verify_tokens, gen.side_branch, gen.step_s) == ([5, 5], [False, False], [0.25, 0.25])
    assert (gen.prefill_s, gen.latency_s, gen.stop_reason) == (0.5, 1.0, "eos")
    without_speculation = generation_of({**trace, "emitted": [1, 1, 1, 1, 1], "times": [0.1] * 5, "spec": None})
    assert without_speculation.draft_tokens == [0, 0, 0, 0]
    assert generation_of({**trace, "finish_reason": "length"}).stop_reason == "max_new_tokens"


def test_a_served_request_gets_its_steps_from_vllms_record():
    """The server's stream may merge steps: the steps that drafted come from vLLM's record (the last cut where the
    output ends), one one-token step per token they leave, and no step times."""
    trace = {
        "output_ids": [5, 6, 7, 8, 9, 10, 2],
        "finish_reason": "stop",
        "times": [0.5, 2.0],
        "spec": {"per_step_accepted": [2, 3], "per_step_drafted": [4, 4]},
    }
    gen = generation_of(trace)  # 6 tokens after the prefill: 3 from the first drafting step, 4 - 1 cut from the last
    assert (gen.accept_lengths, gen.draft_tokens, gen.step_s) == ([3, 3], [4, 4], None)
    assert (gen.prefill_s, gen.latency_s) == (0.5, 2.0)
    plain = generation_of({**trace, "spec": None})
    assert (plain.accept_lengths, plain.draft_tokens) == ([1] * 6, [0] * 6)
    assert steps_of_record(7, [1], [3]) == ([1, 1, 1, 1, 2], [0, 0, 0, 0, 3])
    with pytest.raises(ValueError, match="emits more than"):
        steps_of_record(3, [3, 4], [5, 5])  # the first drafting step alone emits more than the output holds


def test_a_batch_counts_its_wall_time_once():
    """Four requests that took 1 s together: 4 s of latency between them, 1 s of the machine's time."""
    records = [
        {
            "new_tokens": 10,
            "wall_s": 1.0,
            "batch_size": 4,
            "batch_wall_s": 1.0,
            "prefill_s": 0.1,
            "target_forwards": 9,
            "energy_j": None,
        }
        for _ in range(4)
    ]
    assert machine_seconds(records[0]) == 0.25
    assert aggregate(records)["throughput_total"] == pytest.approx(40.0)
    assert aggregate(records)["throughput_mean"] == pytest.approx(10.0)  # what each request saw
    assert machine_seconds({"wall_s": 2.0, "batch_size": None}) == 2.0  # written before batches


def test_the_methods_vllm_runs_map_their_knobs():
    """PLD's n-gram sizes and K become vLLM's ngram settings; a knob vLLM lacks is named, with the value it runs."""
    assert {"ar", "pld", "spede", "suffix_decoding"} <= set(vllm_methods())
    args, parts = engine_args(compose_config("engine=vllm", "method=pld", "method.drafter.num_pred_tokens=7"), 2048)
    assert args["speculative_config"] == {
        "method": "ngram",
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
        "num_speculative_tokens": 7,
    }
    assert (args["dtype"], args["max_model_len"], args["per_request_spec_decode_metrics"]) == (
        "float32",
        2048,
        "detailed",
    )
    assert parts == []
    assert differences(compose_config("engine=vllm", "method=pld").method) == {
        "drafter.occurrence": ("latest", "first"),
        "drafter.continuation": ("repeat", "truncate"),
    }
    same = ("method.drafter.occurrence=first", "method.drafter.continuation=truncate")
    assert differences(compose_config("engine=vllm", "method=pld", *same).method) == {}
    ar, _ = engine_args(compose_config("engine=vllm", "method=ar"), 2048)
    assert "speculative_config" not in ar and "per_request_spec_decode_metrics" not in ar


def test_spede_runs_its_own_draft_in_vllm():
    """The model.draft node becomes the draft's folder (here the target itself), named as the loop names it."""
    args, parts = engine_args(compose_config("engine=vllm", "method=spede", "model.draft.source=target"), 2048)
    assert args["speculative_config"]["model"] == args["model"]
    assert args["speculative_config"]["num_speculative_tokens"] == 5
    assert parts == ["draft:target"]


@pytest.mark.parametrize("method", ["eagle3", "eagle3_1"])
def test_eagle3_heads_go_to_vllms_eagle3_as_a_chain_of_depth_plus_one(method, training_cache):
    """EAGLE-3 and EAGLE-3.1 both run vLLM's eagle3 with their own head (each its model node), depth + 1 drafts;
    the loop's tree is named as the difference until it is a chain (top_k = 1)."""
    overrides = ("engine=vllm", f"method={method}", "method.drafter.depth=3", "model=smollm2_135m")
    with pytest.raises(ModelUnavailable, match=f"python -m specbench.train {method} model=smollm2_135m"):
        engine_args(compose_config(*overrides), 2048)  # the trained head: not in this empty cache
    folder = "some/eagle3-head"
    cfg = compose_config(*overrides, f"model.{method}.source=hub", f"model.{method}.path={folder}")
    args, parts = engine_args(cfg, 2048)
    assert args["speculative_config"] == {"method": "eagle3", "model": folder, "num_speculative_tokens": 4}
    assert parts == [f"{method}:{folder}"]
    assert differences(cfg.method) == {"drafter.top_k": (10, 1)}


def test_eagle_heads_go_to_vllms_eagle_with_fc_bias_moved_written_once(training_cache):
    """EAGLE-2's head runs vLLM's eagle as a chain of depth + 1 drafts, written once in vLLM's layout: no bias on fc
    (moved into the first layer's attention biases, which config.json turns on), and no key vLLM reads as one."""
    overrides = ("engine=vllm", "method=eagle2", "method.drafter.depth=3", "model=smollm2_135m")
    with pytest.raises(ModelUnavailable, match="python -m specbench.train eagle model=smollm2_135m"):
        engine_args(compose_config(*overrides), 2048)  # the trained head: not in this empty cache
    cfg = compose_config(*overrides, "model.eagle.source=random")
    args, parts = engine_args(cfg, 2048)
    folder = Path(args["speculative_config"]["model"])
    assert args["speculative_config"] == {"method": "eagle", "model": str(folder), "num_speculative_tokens": 4}
    assert parts == ["eagle:random(seed=0)"] and differences(cfg.method) == {"drafter.top_k": (10, 1)}
    config = json.loads((folder / "config.json").read_text())
    assert config["attention_bias"] is True and "bias" not in config  # vLLM reads `bias` as attention biases too
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        keys = set(weights.keys())
    assert "fc.bias" not in keys and {f"layers.0.self_attn.{n}_proj.bias" for n in "qkvo"} <= keys
    written = (folder / "model.safetensors").stat().st_mtime_ns
    assert engine_args(cfg, 2048)[0]["speculative_config"]["model"] == str(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == written  # written once


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["batch_size=4"], "specbench's own engines run one request at a time (engine=vllm batches)"),
        (["batch_size=0", "engine=vllm"], "batch_size must be >= 1"),
        (["engine=vllm", "method=hf_generate"], "runs HF generate (method.engine=hf_generate), not a drafter"),
        (["engine=vllm", "method=pld", "budget=auto"], "budget=auto calibrates on the shared loop"),
        (
            ["engine=vllm", "method=lade"],
            "has no vLLM counterpart; engine=vllm runs the methods ['ar', 'dflash', 'eagle2', 'eagle3', 'eagle3_1'",
        ),
        (["engine=vllm", "model=tiny_llama"], "the tiny random model exists only in memory"),
        (["concurrency=4"], "concurrency=4: the number of requests kept in flight against vLLM's server"),
        (["engine=vllm", "concurrency=4", "batch_size=2"], "without batch_size"),
    ],
)
def test_settings_engine_vllm_cannot_run_are_refused_before_anything_loads(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        cfg = compose_config(*overrides)
        validate(cfg)
        engine_args(cfg, 512)


def test_a_kv_cache_that_does_not_fit_says_to_run_fewer_engines(monkeypatch):
    """vLLM's KV-cache shortage (seven CPU engines of a bench session outgrew 24 GB) becomes a setting to change;
    any other failure of vLLM stays as vLLM raised it."""
    from specbench import vllm_engine

    def failing(message):
        def start(*args, **kwargs):
            raise RuntimeError(message)

        return start

    cfg = compose_config("engine=vllm", "method=pld", "model=smollm2_135m")
    shortage = "Available memory on node 0 (0.42/23.54 GiB) on kv cache allocation is less than requested memory for kv"
    monkeypatch.setattr(vllm_engine, "VLLMEngine", failing(f"vLLM failed: Worker failed with error '{shortage}'"))
    with pytest.raises(ConfigError, match=r"engine.kv_cache_gib=1\): .*run fewer vLLM entries at once") as caught:
        vllm_engine.start_vllm(cfg, Sampling(0.0, 1.0), frozenset(), 2048)
    assert shortage in str(caught.value)
    monkeypatch.setattr(vllm_engine, "VLLMEngine", failing("vLLM failed: something else"))
    with pytest.raises(RuntimeError, match="something else"):
        vllm_engine.start_vllm(cfg, Sampling(0.0, 1.0), frozenset(), 2048)


def test_a_missing_vllm_environment_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECBENCH_VLLM_PYTHON", raising=False)
    with pytest.raises(ConfigError, match="make engine-vllm"):
        vllm_python(compose_config("engine=vllm", f"engine.python={tmp_path}/none/bin/python").engine)


def test_engine_settings_leave_the_digests_of_specbench_engines_alone():
    """The engine node, batch_size and the method's vllm node are not settings of an hf run (stored digests keep);
    for a vLLM run the batch size and vLLM's arguments are."""
    device, dtype = torch.device("cpu"), torch.float32

    def digest(*overrides):
        return config_digest(compose_config("method=pld", *overrides), device, dtype)

    assert digest() == digest("method.vllm.speculative_config.num_speculative_tokens=3")
    assert digest("engine=vllm") != digest()
    assert digest("engine=vllm", "batch_size=4") != digest("engine=vllm")
    assert digest("engine=vllm", "engine.engine_args.enforce_eager=false") != digest("engine=vllm")
    assert digest("engine=vllm", "engine.python=/elsewhere/python") == digest("engine=vllm")


def test_a_converted_local_part_follows_its_folder(tmp_path):
    """A published part in a local folder is converted again once its files change (a Hub id or a trained part is
    named by its id or weights digest instead)."""
    import os

    from omegaconf import OmegaConf

    from specbench.models.medusa_heads import local_stamp

    (tmp_path / "model.safetensors").write_bytes(b"1")
    node = OmegaConf.create({"source": "hub", "path": str(tmp_path)})
    before = local_stamp(node, "hub")
    os.utime(tmp_path / "model.safetensors", ns=(before + 10**9, before + 10**9))
    assert local_stamp(node, "hub") == before + 10**9
    assert local_stamp(OmegaConf.create({"source": "hub", "path": "org/some-head"}), "hub") is None


def test_a_model_spread_over_gpus_composes_into_vllms_arguments():
    """Tensor and pipeline parallelism (models larger than one GPU) are vLLM's own arguments: set on the command line,
    they reach vllm.LLM as they are, beside the speculation, and make a run of their own."""
    layout = ("engine.engine_args.tensor_parallel_size=4", "engine.engine_args.pipeline_parallel_size=2")
    cfg = compose_config("engine=vllm", "method=spede", "model.draft.source=target", *layout)
    args, _ = engine_args(cfg, 2048)
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (4, 2)
    assert args["speculative_config"]["method"] == "draft_model"
    one_gpu = compose_config("engine=vllm", "method=spede", "model.draft.source=target")
    assert config_digest(cfg, torch.device("cuda"), torch.float16) != config_digest(
        one_gpu, torch.device("cuda"), torch.float16
    )


def test_vllm_runs_get_their_own_folders():
    assert compose_config("method=pld").output_dir.endswith("/pld-T0.0-n128")
    assert compose_config("method=pld", "engine=vllm", "batch_size=8").output_dir.endswith("/pld-T0.0-n128-vllm-b8")
    assert compose_config("method=pld", "engine=vllm", "concurrency=4").output_dir.endswith("/pld-T0.0-n128-vllm-c4")


def served_copy(name: str, folder, batch_size: int = 1, records=None):
    """A copy of a fixture run as if vLLM had generated it (batch ``batch_size``, the records given or the same)."""
    from tests.test_report import RUNS

    run = folder / f"{name}_vllm_b{batch_size}"
    run.mkdir()
    summary = json.loads((RUNS / name / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "engine": {"name": "vllm", "batch_size": batch_size}}))
    lines = [json.loads(line) for line in (RUNS / name / "samples.jsonl").read_text().splitlines()]
    (run / "samples.jsonl").write_text("".join(json.dumps(record) + "\n" for record in (records or lines)))
    return run, lines


def test_the_crosscheck_sets_each_method_in_both_engines_side_by_side(tmp_path):
    """The fixture's AR and fake method in the loop, and the same in vLLM with one more step on s1: steps equal on
    3 of 4 prompts; outputs equal to both ARs on s0 and s2 (s1 diverges, s3 has no AR)."""
    from specbench.report.compare import cross_check, cross_check_prompts
    from specbench.report.read import load
    from tests.test_report import RUNS

    served_copy("ar_humaneval", tmp_path)
    lines = [json.loads(line) for line in (RUNS / "fake_humaneval" / "samples.jsonl").read_text().splitlines()]
    lines[1] = {**lines[1], "target_forwards": 3, "accept_lengths": [2, 1, 1], "draft_tokens": [3, 3, 0]}
    lines[1]["step_s"], lines[1]["verify_s"] = [0.1, 0.05, 0.05], [0.08, 0.04, 0.04]
    served_copy("fake_humaneval", tmp_path, records=lines)
    runs, samples = load(
        [
            RUNS / "ar_humaneval",
            RUNS / "fake_humaneval",
            tmp_path / "ar_humaneval_vllm_b1",
            tmp_path / "fake_humaneval_vllm_b1",
        ]
    )
    table = cross_check(runs, samples).set_index("method")
    assert table.loc["fake_method", "n_common"] == 4
    assert table.loc["fake_method", "same_steps"] == pytest.approx(0.75)
    assert table.loc["fake_method", "equal_to_ar"] == pytest.approx(0.5)
    assert table.loc["fake_method", "tokens_per_step_hf"] == pytest.approx(14 / 5)
    assert table.loc["fake_method", "tokens_per_step_vllm"] == pytest.approx(14 / 6)
    assert table.loc["ar", "same_steps"] == 1.0 and table.loc["ar", "equal_to_ar"] == 1.0
    prompts = cross_check_prompts(runs, samples)
    assert list(prompts[prompts["method"] == "fake_method"]["steps_equal"]) == [True, False, True, True]


def test_a_vllm_run_pairs_with_vllms_ar_of_the_same_batch_size_over_machine_time(tmp_path):
    """Batch 2: each record counts half its batch's wall time; the loop's AR is never the partner."""
    from specbench.report.compare import match_ar
    from specbench.report.read import load
    from tests.test_report import RUNS

    def batched(name):
        lines = [json.loads(line) for line in (RUNS / name / "samples.jsonl").read_text().splitlines()]
        return [{**r, "batch_size": 2, "batch_wall_s": 2 * r["wall_s"] * 0.5} for r in lines]  # batches half as long

    served_copy("ar_humaneval", tmp_path, 2, batched("ar_humaneval"))
    served_copy("fake_humaneval", tmp_path, 2, batched("fake_humaneval"))
    runs, samples = load([RUNS, tmp_path])
    matched = match_ar(runs, samples).set_index("run_dir")
    served = matched.loc[str(tmp_path / "fake_humaneval_vllm_b2")]
    assert Path(served["ar_run_dir"]).name == "ar_humaneval_vllm_b2"
    loop = matched.loc[str(RUNS / "fake_humaneval")]
    assert served["speedup"] == pytest.approx(loop["speedup"])  # every time halved alike
    assert runs.set_index("run_dir").loc[str(tmp_path / "fake_humaneval_vllm_b2"), "throughput_total"] == pytest.approx(
        2 * runs.set_index("run_dir").loc[str(RUNS / "fake_humaneval"), "throughput_total"]
    )
