"""Reproduction plans and experiment configs: every job composes, plans name real experiments, one
experiment runs end to end as a Hydra multirun, and the paper-vs-measured tables carry both numbers."""

import itertools
import shutil
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from specbench import environment
from specbench.config import compose_config
from specbench.engines import check_method
from specbench.errors import ConfigError
from specbench.reproduce import session
from specbench.reproduce.coverage import job_config
from specbench.reproduce.plan import (
    experiment_jobs,
    experiment_names,
    load_plan,
    partner_job,
    scales,
    select,
    sweep_jobs,
    with_partners,
)
from specbench.reproduce.results import load_results
from specbench.reproduce.session import run_session
from specbench.reproduce.tables import compare, paper_values, parse_setting
from specbench.runner import Runner, validate
from tests.reproduce_fixture import write_fixture_results

EXPERIMENTS = [(scale, name) for scale in scales() for name in experiment_names(scale)]


def covering_jobs(jobs: list[list[str]]) -> list[list[str]]:
    """A few jobs that together use every value of every sweep axis (the full product can be 200 jobs)."""
    values = [sorted({job[i] for job in jobs}) for i in range(len(jobs[0]))]
    width = max(len(axis) for axis in values)
    return [[axis[k % len(axis)] for axis in values] for k in range(width)]


@pytest.mark.parametrize("scale,name", EXPERIMENTS, ids=[f"{s}/{n}" for s, n in EXPERIMENTS])
def test_every_experiment_job_composes(scale, name):
    jobs = sweep_jobs(scale, name)
    assert jobs and all(any(o.startswith("method=") for o in job) for job in jobs)  # run folders name the method
    assert_partnered(jobs)  # the experiment is one session: the AR partners of its jobs are its own
    for job in covering_jobs(jobs):
        cfg = compose_config(*job)
        OmegaConf.to_container(cfg.method, resolve=True)
        OmegaConf.to_container(cfg.dataset, resolve=True)
        assert cfg.experiment == name
        assert str(cfg.results_root).endswith(f"experiments/{scale}")


@pytest.mark.parametrize("name", experiment_names("paper"))
def test_every_paper_job_builds_its_drafter(name):
    """The paper plan's dry run: every job of the experiment's session (the whole sweep, not a cover, and its AR
    partners) passes the run-settings check and constructs its drafter (knobs validated, fixed trees laid out) without
    a model or weights, as the runner does before anything loads; a job that cannot fails with its overrides."""
    for job in experiment_jobs("paper", name):
        cfg = job_config(job)
        cfg.output_dir = "run"  # the scales' output_dir resolves only inside a Hydra run
        try:
            validate(cfg)
            check_method(cfg.method)
        except ConfigError as error:
            pytest.fail(f"{' '.join(job)}: {error}")


def test_plans_hold_every_experiment_of_their_scale():
    for scale in scales():
        plan = load_plan(scale)
        assert sorted(plan.experiments) == experiment_names(scale)
        assert set(plan.sequential) <= set(plan.experiments)


def assert_partnered(jobs: list[list[str]]) -> None:
    """Each job's AR partner (same run settings, method AR) is among the session's jobs (``with_partners``)."""
    keys = {tuple(sorted(job)) for job in with_partners(jobs)}
    for job in jobs:
        partner = partner_job(job)
        assert tuple(sorted(partner)) in keys and "method=ar" in partner
        assert not any(o.startswith(("method.", "+self_draft_cache", "+lookahead_ablation")) for o in partner)


@pytest.fixture(scope="module")
def smoke_configs() -> list[DictConfig]:
    """The composed config of every job of every smoke sweep."""
    return [job_config(job) for name in load_plan("smoke").experiments for job in sweep_jobs("smoke", name)]


def test_smoke_plan_replaces_every_model_by_the_stand_in(smoke_configs):
    assert {cfg.model.name for cfg in smoke_configs} == {load_plan("smoke").stand_in_model}


def test_every_smoke_run_answers_the_same_samples_of_its_dataset(smoke_configs):
    """One sample set per dataset over the whole smoke plan (same limit, budget and order for every job), so a
    sweep's points, its default point and its AR baseline are measured on the same samples (8 MT-Bench questions:
    one per category)."""
    assert {(cfg.limit, cfg.max_new_tokens, cfg.dataset.order) for cfg in smoke_configs} == {(8, 48, "round_robin")}


def test_unknown_scale_and_experiment_are_clear_errors():
    with pytest.raises(ConfigError, match="choose one of"):
        load_plan("huge")
    with pytest.raises(ConfigError, match="not in the smoke plan"):
        select(load_plan("smoke"), ["r9_nothing"])


def test_sweep_jobs_expand_the_cartesian_product():
    jobs = sweep_jobs("smoke", "r1_branch_grid")
    lengths = {job[-2] for job in jobs}
    numbers = {job[-1] for job in jobs}
    assert len(jobs) == len(lengths) * len(numbers) == 9
    assert set(itertools.product(lengths, numbers)) == {(job[-2], job[-1]) for job in jobs}


def test_paper_values_are_complete_rows():
    values = paper_values()
    assert set(values["paper"]) == {"self_draft", "anpd", "opt_tree", "medusa", "lookahead", "lade", "eagle3"}
    assert values["value"].notna().all()
    for setting in values["setting"]:
        assert all(key.startswith(("method.", "category")) for key in parse_setting(setting))


def test_settings_compare_as_values_not_text():
    assert parse_setting("method.drafter.threshold=0.50;method.drafter.nodes=50") == parse_setting(
        "method.drafter.nodes=50;method.drafter.threshold=0.5"
    )
    assert parse_setting("") == {}


@pytest.fixture(scope="module")
def fixture_results(tmp_path_factory):
    root = write_fixture_results(tmp_path_factory.mktemp("experiments") / "smoke")
    return root, load_results(root), load_results(root, by="category")


def test_repeats_give_mean_and_std(fixture_results):
    _, results, by_category = fixture_results
    values = paper_values()
    table4 = values[(values["paper"] == "lookahead") & (values["table"] == "Table 4") & (values["dataset"] == "dolly")]
    compared = compare(table4, results, by_category, "smollm2_135m")
    measured = compared[compared["metric"] == "throughput"]
    assert (measured["repeats"] == 3).all() and measured["measured_std"].notna().all()


def test_rows_with_a_setting_match_only_that_setting(fixture_results):
    _, results, by_category = fixture_results
    values = paper_values()
    row = values[(values["paper"] == "lookahead") & (values["table"] == "Table 6")].iloc[[0]]
    setting = (  # r5_capacity's point at capacity 4, at r5_table4's setting
        "method.drafter.branch_length=8;method.drafter.output_node_capacity_factor=4;method.drafter.warmup.dataset=dolly"
    )
    row = row.assign(dataset="dolly", setting=setting, unfillable="")
    compared = compare(row, results, by_category, "smollm2_135m")
    runs = results.runs
    expected = runs[(runs["method"] == "lookahead") & (runs["setting"] == setting)]
    assert len(expected) == 1
    assert compared["measured"].iloc[0] == pytest.approx(expected["throughput_total"].iloc[0])


@pytest.mark.slow
def test_a_sequential_session_drops_each_jobs_engine_before_the_next(tmp_path, monkeypatch):
    """Peak memory read one job after another starts from the loaded target alone: no earlier job's engine (drafter
    state, caches) is alive when the next job starts."""
    made: dict[str, Runner] = {}
    make, phase = session.session_runners, session.run_phase
    monkeypatch.setattr(session, "session_runners", lambda *args: made.update(make(*args)) or made)
    alive = []
    monkeypatch.setattr(
        session,
        "run_phase",
        lambda runners, bar, index: (
            alive.append(sum(r.engine is not None for r in made.values())) or phase(runners, bar, index)
        ),
    )
    overrides = ["model=tiny_llama", "limit=1", "max_new_tokens=4", "warmup=0", f"results_root={tmp_path}"]
    run_session("smoke", "r3_node_budget", overrides, sequential=True)
    assert alive == [0] * len(made) and len(made) == 4


@pytest.mark.slow
def test_an_experiment_runs_as_one_session_with_its_ar_partner_interleaved(tmp_path, monkeypatch):
    """An experiment is one measuring session: its sweep and the AR partner it lacks, prompts interleaved with the
    order rotating, every record of one session, every speedup paired; a rerun touches nothing; an AR partner
    timed again in a later sitting is refused."""
    order = []
    run_batch = Runner.run_batch
    monkeypatch.setattr(
        Runner, "run_batch", lambda self, batch: order.append(self.bench["entry"]) or run_batch(self, batch)
    )
    overrides = ["model=tiny_llama", "limit=2", "max_new_tokens=4", "warmup=0", f"results_root={tmp_path}"]
    run_session("smoke", "r3_node_budget", overrides)
    results = load_results(tmp_path)
    assert sorted(results.runs["method"]) == ["ar", *["opt_tree"] * 3]  # n = 10, 25, 50 and the AR partner
    assert (results.runs["pairing"] == "").all() and results.runs["speedup"].notna().all()
    assert results.samples["measuring_session"].nunique() == 1 and results.runs["session"].eq("r3_node_budget").all()
    entries = len(results.runs)
    assert order[:entries] != order[entries:] and sorted(order[:entries]) == sorted(order[entries:])  # rotated
    stored = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    run_session("smoke", "r3_node_budget", overrides)  # complete: nothing loads, nothing is written
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == stored
    ar = Path(results.runs.loc[results.runs["method"] == "ar", "run_dir"].iloc[0])
    shutil.rmtree(ar)
    later = f"20990101T000000Z-{environment.measuring_session().split('-')[1]}-1"  # this machine, a later sitting
    monkeypatch.setattr(environment, "measuring_session", lambda: later)
    run_session("smoke", "r3_node_budget", overrides)
    opt_tree = load_results(tmp_path).runs.query("method == 'opt_tree'")
    assert opt_tree["speedup"].isna().all() and opt_tree["pairing"].str.endswith("timed in another session").all()
