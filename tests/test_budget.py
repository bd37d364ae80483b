"""budget=N and budget=auto (specbench.budget): the size knob of every method that has one, the digest of
default runs kept, the calibration stored and reused on resume, and outputs unchanged by any budget."""

import json

import pytest
from omegaconf import OmegaConf

from specbench.budget import (
    KNOB_NODE,
    CurveCheck,
    default_value,
    grid,
    held_out,
    knob_key,
    knobbed_methods,
    with_budget,
)
from specbench.config import compose_config
from specbench.costmodel import LatencyCurve
from specbench.data.base import build_dataset
from specbench.engines import check_method
from specbench.errors import ConfigError
from specbench.profile import CURVE_TOKENS, cached_curves, curve_folder, curve_path, stored_curve
from specbench.report.__main__ import main as report_main
from specbench.report.read import load
from specbench.report.view import report_table
from specbench.runner import Runner, config_digest
from tests.test_runner import TINY, records

KNOBBED = knobbed_methods()


def test_the_methods_with_a_size_knob():
    assert {"medusa", "eagle2", "opt_tree", "spede", "pld", "anpd", "lade", "self_draft", "lookahead"} <= set(KNOBBED)
    assert "ar" not in KNOBBED and "hf_generate" not in KNOBBED


@pytest.mark.parametrize("method", KNOBBED)
def test_every_knob_names_an_integer_setting_and_every_grid_value_is_accepted(method):
    cfg = compose_config(f"method={method}", "model=smollm2_135m")
    assert isinstance(default_value(cfg), int)
    assert default_value(cfg) in grid(cfg) and grid(cfg) == sorted(grid(cfg))
    for value in grid(cfg):
        chosen = with_budget(cfg, value)
        assert OmegaConf.select(chosen.method, knob_key(cfg)) == value
        check_method(chosen.method)  # the drafter's constructor accepts it


def test_lade_window_budget_carries_the_guess_set_size():
    cfg = with_budget(compose_config("method=lade"), 4)
    assert cfg.method.drafter.window_size == 4 and cfg.method.drafter.guess_set_size == 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["method=pld", "budget=0"], "integer >= 1"),
        (["method=pld", "budget=many"], "auto or an integer"),
        (["method=pld", "budget=true"], "auto or an integer"),
        (["method=ar", "budget=4"], "method ar has no size knob.*pld"),
        (["method=pld", "budget=auto", "calibration.prompts=0"], "calibration.prompts must be an integer >= 1"),
        (["method=pld", "budget=auto", "calibration.margin=-0.1"], "calibration.margin must be a number >= 0"),
        (["method=pld", "budget=auto", "calibration.max_new_tokens=x"], "max_new_tokens must be an integer or null"),
    ],
)
def test_a_bad_budget_is_one_clear_error_before_anything_loads(tmp_path, overrides, message):
    cfg = compose_config(*TINY, f"output_dir={tmp_path}", *overrides)
    with pytest.raises(ConfigError, match=message):
        Runner(cfg)
    assert not any(tmp_path.iterdir())


def test_the_default_budget_keeps_every_stored_digest(tmp_path):
    """budget: null, the calibration node and the method's budget_knob do not enter the digest."""
    cfg = compose_config("method=opt_tree", f"output_dir={tmp_path}")
    device, dtype = pytest.importorskip("torch").device("cpu"), pytest.importorskip("torch").float32
    bare = OmegaConf.to_container(cfg)
    for key in ("budget", "calibration"):
        bare.pop(key)
    bare["method"].pop(KNOB_NODE)
    assert config_digest(cfg, device, dtype) == config_digest(OmegaConf.create(bare), device, dtype)
    given = compose_config("method=opt_tree", "budget=8", f"output_dir={tmp_path}")
    assert config_digest(given, device, dtype) != config_digest(cfg, device, dtype)
    assert compose_config("method=pld", "budget=3").output_dir.endswith("/pld-b3-T0.0-n128")
    assert compose_config("method=pld").output_dir.endswith("/pld-T0.0-n128")


def test_held_out_prompts_avoid_the_runs_samples():
    """A seeded draw from outside the run: the same seed gives the same prompts, another seed others, and they come
    from the whole dataset rather than its end."""
    dataset = build_dataset(compose_config("dataset=humaneval").dataset, None)
    every = dataset.samples(None)
    run_ids = {s.sample_id for s in every[:5]}
    chosen, overlaps = held_out(dataset, every[:5], 10, seed=0)
    ids = [s.sample_id for s in chosen]
    assert len(set(ids)) == 10 and not run_ids & set(ids) and not overlaps
    assert ids == [s.sample_id for s in held_out(dataset, every[:5], 10, seed=0)[0]]
    assert ids != [s.sample_id for s in held_out(dataset, every[:5], 10, seed=1)[0]]
    positions = [every.index(s) for s in chosen]
    assert min(positions) < len(every) - 10  # not simply the last ten
    chosen, overlaps = held_out(dataset, every, 2, seed=0)
    assert len(chosen) == 2 and overlaps


def test_a_given_budget_sets_the_knob_and_is_recorded(tmp_path):
    out = Runner(compose_config(*TINY, "method=pld", "budget=3", "limit=1", f"output_dir={tmp_path}")).run()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["budget"] == {"mode": "given", "key": "drafter.num_pred_tokens", "value": 3, "default": 10}
    assert summary["hyperparameters"]["drafter"]["num_pred_tokens"] == 3
    assert max(max(r["draft_tokens"]) for r in records(out)) <= 3


@pytest.mark.slow
def test_auto_budget_calibrates_records_its_evidence_and_resumes(tmp_path, training_cache, capsys):
    """One calibration (tiny model, PLD): the curve cached, budget.json and the summary hold the choice and every
    candidate's costs, outputs equal AR's, a resume reuses the stored choice, the report prices the steps."""
    common = [*TINY, "calibration.prompts=2", "calibration.max_new_tokens=8"]
    auto = Runner(compose_config(*common, "method=pld", "budget=auto", "limit=2", f"output_dir={tmp_path}/auto")).run()
    stored = json.loads((auto / "budget.json").read_text())
    assert stored["mode"] == "auto" and stored["key"] == "drafter.num_pred_tokens"
    assert set(map(int, stored["candidates"])) == {1, 2, 3, 4, 6, 8, 10}
    assert stored["value"] in (1, 2, 3, 4, 6, 8, 10) and stored["predicted_speedup"] > 0
    assert stored["calibration"]["sample_ids"] and not stored["calibration"]["overlaps_run"]
    assert stored["curve_check"]["curve_ms"] == pytest.approx(stored["curve"]["chain_ms"][0])
    summary = json.loads((auto / "summary.json").read_text())
    assert summary["budget"] == stored and summary["latency_curves"]
    assert summary["hyperparameters"]["drafter"]["num_pred_tokens"] == stored["value"]
    assert stored["curve_digest"] in {c.digest() for c in cached_curves("tiny_llama", *_cpu())}
    assert "budget=auto: drafter.num_pred_tokens=" in capsys.readouterr().out

    ar = Runner(compose_config(*common, "method=ar", "limit=2", f"output_dir={tmp_path}/ar")).run()
    assert [r["output_ids"] for r in records(auto)] == [r["output_ids"] for r in records(ar)]

    before = (auto / "budget.json").read_bytes()
    Runner(compose_config(*common, "method=pld", "budget=auto", "limit=3", f"output_dir={tmp_path}/auto")).run()
    assert (auto / "budget.json").read_bytes() == before and len(records(auto)) == 3
    assert "reusing the budget" in capsys.readouterr().out

    cost = report_table(*load([tmp_path]), "cost").set_index("method")
    assert cost.loc["ar", "ideal_speedup"] == pytest.approx(1.0)
    assert cost.loc["pld", "budget"] == f"auto:{stored['value']}"
    assert cost.loc["pld", "predicted_speedup"] == pytest.approx(stored["predicted_speedup"])
    runs = load([tmp_path])[0].set_index("method")
    ms_per_token = runs["modelled_ms_per_token"]
    assert cost.loc["pld", "modelled_speedup"] == pytest.approx(ms_per_token["ar"] / ms_per_token["pld"])
    assert cost.loc["ar", "modelled_speedup"] == pytest.approx(1.0)
    assert set(stored["ar"]["forwards"]) == {"1"} and sum(stored["ar"]["forwards"].values()) == stored["ar"]["steps"]

    report_main([str(tmp_path), "--view", "cost", "--reprice", str(auto / "budget.json")])
    repriced = capsys.readouterr().out.split("ideal_choice_there")[1]
    assert "drafter.num_pred_tokens" in repriced and "auto" in repriced


def test_a_stale_cached_curve_is_measured_again(tmp_path, training_cache, capsys):
    """A cached curve ten times slower than this machine's forwards is measured again before pricing (a curve
    measured in the calibration itself is never checked against it)."""
    common = [*TINY, "method=pld", "budget=auto", "calibration.prompts=1", "calibration.max_new_tokens=8", "limit=1"]
    first = json.loads((Runner(compose_config(*common, f"output_dir={tmp_path}/a")).run() / "budget.json").read_text())
    (path,) = curve_folder("tiny_llama", *_cpu()).glob(f"c{first['curve']['context_length']}.json")
    cached = json.loads(path.read_text())
    cached["curve"] |= {key: [10 * ms for ms in cached["curve"][key]] for key in ("chain_ms", "tree_ms")}
    path.write_text(json.dumps(cached))
    second = json.loads((Runner(compose_config(*common, f"output_dir={tmp_path}/b")).run() / "budget.json").read_text())
    assert first["curve_check"]["remeasured"] and second["curve_check"]["remeasured"]
    assert second["curve_check"]["curve_ms"] == pytest.approx(second["curve"]["chain_ms"][0])
    assert second["curve"]["chain_ms"][0] < cached["curve"]["chain_ms"][0] / 2
    assert "measuring the curve again" in capsys.readouterr().out


def test_a_cached_curve_of_another_token_grid_is_not_reused(training_cache):
    """A curve cached at other token counts than CURVE_TOKENS (an older release's grid) reads as absent."""
    from types import SimpleNamespace

    import torch

    lm = SimpleNamespace(name="tiny_llama", model=SimpleNamespace(dtype=torch.float32))
    device = torch.device("cpu")
    path = curve_path(lm, device, 128)
    path.parent.mkdir(parents=True)
    for tokens in ((1, 2, 4), CURVE_TOKENS):
        curve = LatencyCurve(128, tokens, tuple(map(float, tokens)), tuple(map(float, tokens)))
        path.write_text(json.dumps({"curve": curve.to_dict()}))
        assert stored_curve(lm, device, 128) == (curve if tokens == CURVE_TOKENS else None)


def test_a_cached_curve_off_the_measured_forwards_is_stale():
    """Only a cached (not just measured) curve whose T(1) misses AR's measured forwards by over 10 % is stale."""
    assert not CurveCheck(measured_ms=100.0, curve_ms=109.0, remeasured=False).stale
    assert CurveCheck(measured_ms=100.0, curve_ms=125.0, remeasured=False).stale
    assert CurveCheck(measured_ms=100.0, curve_ms=85.0, remeasured=False).stale
    assert not CurveCheck(measured_ms=100.0, curve_ms=125.0, remeasured=True).stale


def _cpu():
    import torch

    return torch.device("cpu"), torch.float32
