"""Before a plan runs: which trained parts its pending jobs need (and only those are trained), and how long the
smoke plan takes, estimated from stored runs' wall times."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from specbench.manifest import MANIFEST
from specbench.reproduce import parts as parts_module
from specbench.reproduce import plan as plan_module
from specbench.reproduce.coverage import Job, plan_jobs
from specbench.reproduce.parts import Part, complete_experiments, needed_parts, parts_of, train_needed
from specbench.reproduce.plan import load_plan, run_plan
from specbench.reproduce.walltime import estimate_walltime, stored_timings, walltime_table

EXPERIMENTS = ["r2_table1_code", "r3_node_budget", "r4_tree_sparse"]
"""Model-free (ANPD), a distilled draft (OPT-Tree) and trained Medusa heads, with their AR runs."""


@pytest.fixture(scope="module")
def plan_and_jobs(tmp_path_factory):
    plan = replace(load_plan("smoke"), results_root=tmp_path_factory.mktemp("experiments"))
    return plan, plan_jobs(plan, EXPERIMENTS)


def store(root: Path, job: Job, folder: str | None = None, **changes) -> None:
    """A stored run of ``job`` (in its folder, or ``folder``): a summary as the runner writes it when complete."""
    folder = root / (folder or job.folder)
    folder.mkdir(parents=True, exist_ok=True)
    summary = {
        "status": "complete",
        "config_digest": job.digest,
        "limit": job.limit,
        "method": job.method,
        "dataset": job.dataset,
        "max_new_tokens": job.max_new_tokens,
        **changes,
    }
    (folder / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def finish(part: Part) -> None:
    """Give a part the finished manifest a trainer writes last."""
    part.folder.mkdir(parents=True, exist_ok=True)
    (part.folder / MANIFEST).write_text(json.dumps({"finished": True}))


def test_methods_need_the_parts_their_config_reads(plan_and_jobs):
    _, jobs = plan_and_jobs
    needs = {job.method: {part.node for part in parts_of(job)} for job in jobs}
    assert needs == {"ar": set(), "anpd": set(), "opt_tree": {"draft"}, "medusa": {"medusa"}}


def test_pending_jobs_decide_what_is_trained(plan_and_jobs, cache):
    plan, jobs = plan_and_jobs
    root = plan.results_root
    draft, medusa = Part("draft", "smollm2_135m"), Part("medusa", "smollm2_135m")
    drafted, headed = (sum(job.method == method for job in jobs) for method in ("opt_tree", "medusa"))
    assert drafted and headed
    assert needed_parts(jobs, root) == {draft: drafted, medusa: headed}  # nothing stored: every job is pending
    for job in jobs:
        store(root, job)
    assert needed_parts(jobs, root) == {}  # a fully stored plan trains nothing
    sparse = next(job for job in jobs if job.method == "medusa")
    store(root, sparse, status="interrupted")
    assert needed_parts(jobs, root) == {medusa: 1}
    store(root, sparse, limit=sparse.limit - 1)  # fewer samples than the plan asks for: still pending
    assert needed_parts(jobs, root) == {medusa: 1}
    finish(medusa)
    assert needed_parts(jobs, root) == {}  # trained already (finished manifest): not trained again


def test_train_needed_runs_only_the_needed_trainers(plan_and_jobs, cache, monkeypatch):
    plan, jobs = plan_and_jobs
    for job in jobs:
        store(plan.results_root, job)
    node_budget = next(job for job in jobs if job.method == "opt_tree")
    (plan.results_root / node_budget.folder / "summary.json").unlink()
    commands = []
    monkeypatch.setattr(parts_module, "run_child", lambda command, label: commands.append(command[2:]) or 1.0)
    assert train_needed(jobs, plan.results_root) == {"train draft": 1.0}
    assert commands == [["specbench.train", "draft", "model=smollm2_135m"]]
    store(plan.results_root, node_budget)
    commands.clear()
    assert train_needed(jobs, plan.results_root) == {} and commands == []


def test_a_skipped_set_is_searched_once_per_setting_with_the_jobs_method_overrides(cache, monkeypatch, tmp_path):
    """Draft&Verify on a model config without a skipped set needs the layer_skip part, keyed by its method's
    settings: the trainer gets the job's model, method and placement overrides (not its dataset's), once per setting,
    while a job of it is pending."""
    plan = replace(load_plan("smoke"), results_root=tmp_path / "experiments")
    jobs = plan_jobs(plan, ["r2_table1_draft_verify_code"])
    (search,) = {part for job in jobs for part in parts_of(job)}
    assert search.node == "layer_skip" and search.model == "smollm2_135m"
    assert any(override.startswith("method=") for override in search.overrides)
    assert not any(override.startswith(("dataset", "limit", "model=")) for override in search.overrides)
    commands = []
    monkeypatch.setattr(parts_module, "run_child", lambda command, label: commands.append(command[2:]) or 1.0)
    assert train_needed(jobs, plan.results_root) == {"train layer_skip": 1.0}
    assert commands == [["specbench.train", "layer_skip", "model=smollm2_135m", *search.overrides]]
    for job in jobs:
        store(plan.results_root, job)
    assert needed_parts(jobs, plan.results_root) == {}  # nothing pending: no search, no model loaded


def test_only_experiments_with_a_pending_job_start_a_child(plan_and_jobs, monkeypatch, capsys):
    plan, jobs = plan_and_jobs
    root = plan.results_root / "complete"
    for job in jobs:
        store(root, job)
    sparse = next(job for job in jobs if job.method == "medusa")
    (root / sparse.folder / "summary.json").unlink()
    complete = complete_experiments(jobs, root)
    assert complete == set(EXPERIMENTS) - {"r4_tree_sparse"}
    children = []
    monkeypatch.setattr(plan_module, "run_child", lambda command, label: children.append(label) or 1.0)
    seconds = run_plan(replace(plan, results_root=root), EXPERIMENTS, complete=complete)
    assert children == ["r4_tree_sparse"] and seconds == {"r4_tree_sparse": 1.0}
    assert "r2_table1_code: every run complete" in capsys.readouterr().out


def test_walltime_counts_each_run_folder_once_and_scales_to_the_budget(plan_and_jobs, tmp_path):
    plan, jobs = plan_and_jobs
    stored = tmp_path / "stored"
    for job in jobs:  # measured at twice the plan's budget: 2 s per record of every run, 10 s from start to end
        doubled = job.folder.replace(f"-n{job.max_new_tokens}/", f"-n{2 * job.max_new_tokens}/")
        store(
            stored,
            job,
            doubled,
            max_new_tokens=2 * job.max_new_tokens,
            started_at="2026-01-01T00:00:00+00:00",
            ended_at="2026-01-01T00:00:10+00:00",
            metrics={"n_records": 4, "wall_s": 8.0},
        )
    timings = stored_timings(stored)
    per_job = estimate_walltime(jobs, timings)
    folders = {job.folder for job in jobs}
    assert per_job["new_run"].sum() == len(folders)  # the shared AR run of MT-Bench counts once
    first = per_job.iloc[0]
    records = 8 * (2 if jobs[0].dataset == "mt_bench" else 1)
    assert first["records"] == records and first["seconds"] == pytest.approx((records + 1) * 1.0)  # 1 s at 48 tokens
    table = walltime_table(per_job, EXPERIMENTS)
    assert table.iloc[-1]["experiment"] == "total" and table.iloc[-1]["new_runs"] == len(folders)
