"""OPT-Tree rows that once had no job: the L-1B rows of Tables 1-3, measured with a labelled ~1B substitute draft
(TinyLlama-1.1B-Chat-v1.0; no LLaMA-2-1B was ever published), and the Fig 8 case study, run on the question the
authors' README shows."""

from __future__ import annotations

import json

import pytest

from specbench.config import compose_config
from specbench.data.prompts import conversation, llama2_text
from specbench.reproduce.coverage import coverage, folder_conflicts, job_config, job_of
from specbench.reproduce.plan import experiment_jobs, load_plan
from specbench.reproduce.tables import model_draft, paper_values
from tests.conftest import ROOT

SUBSTITUTE = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
L1B_MODELS = {"llama2_7b_chat_tinyllama": "llama2_7b_chat", "llama2_13b_chat_tinyllama": "llama2_13b_chat"}
L1B_EXPERIMENTS = ("r3_tables_l1b", "r3_table3_l1b")
CASE_EXPERIMENT = "r3_case_study"
CASE_PROMPT = ROOT / "conf" / "prompts" / "opt_tree_case.jsonl"


@pytest.fixture(scope="module")
def jobs():
    """The jobs of the new experiments, AR partners included (without the plan: they need not be listed yet)."""
    return [
        job_of(name, overrides)
        for name in (*L1B_EXPERIMENTS, CASE_EXPERIMENT)
        for overrides in experiment_jobs("paper", name)
    ]


@pytest.fixture(scope="module")
def opt_tree_rows():
    values = paper_values()
    return values[values["paper"] == "opt_tree"]


@pytest.mark.parametrize("model,target", sorted(L1B_MODELS.items()))
def test_the_substitute_configs_change_only_the_draft(model, target):
    substitute, original = compose_config(f"model={model}").model, compose_config(f"model={target}").model
    assert substitute.name == model and model_draft(model) == "L-1B"
    assert substitute.draft.path == SUBSTITUTE and substitute.draft.source == "hub"
    for key in ("source", "path", "revision", "attn_implementation", "chat_template", "context_length", "device_map"):
        assert substitute[key] == original[key], key


def test_l1b_rows_name_the_substitute(opt_tree_rows):
    rows = opt_tree_rows[opt_tree_rows["draft"] == "L-1B"]
    assert len(rows) == 42
    assert set(rows["model"]) == set(L1B_MODELS)
    assert (rows["unfillable"].str.strip() == "").all()
    assert rows["note"].str.contains("SUBSTITUTE draft, TinyLlama-1.1B-Chat-v1.0", regex=False).all()


@pytest.mark.slow
def test_l1b_rows_are_filled_by_the_substitute_experiments(jobs, opt_tree_rows):
    rows = opt_tree_rows[opt_tree_rows["draft"] == "L-1B"]
    covered = coverage(rows, jobs)
    assert (covered["status"] == "filled").all(), covered.loc[covered["status"] != "filled", ["table", "metric"]]
    by_table = covered.groupby("table")["experiments"].agg(set).to_dict()
    assert by_table == {"Table 1": {"r3_tables_l1b"}, "Table 2": {"r3_tables_l1b"}, "Table 3": {"r3_table3_l1b"}}
    substitute = [job for job in jobs if job.experiment in L1B_EXPERIMENTS]
    assert {job.model for job in substitute} == set(L1B_MODELS)
    assert {job.dataset for job in substitute} == {"mt_bench", "gsm8k"}
    assert all(job.folder.split("/")[2].endswith("@opt_tree_llama2") for job in substitute)  # r3_tables' protocol
    assert {job.temperature for job in substitute if job.experiment == "r3_table3_l1b"} == {1.0}
    assert folder_conflicts(jobs) == {}


@pytest.mark.slow
def test_the_case_study_rows_are_filled_by_the_one_prompt_job(jobs, opt_tree_rows):
    rows = opt_tree_rows[opt_tree_rows["table"] == "Fig 8"]
    covered = coverage(rows, jobs)
    assert len(covered) == 2 and (covered["status"] == "filled").all()
    assert set(covered["experiments"]) == {CASE_EXPERIMENT}
    case = [job for job in jobs if job.experiment == CASE_EXPERIMENT]
    assert sorted(job.method for job in case) == ["ar", "opt_tree"]  # the AR partner of its session
    assert {(job.model, job.dataset, job.temperature, job.max_new_tokens) for job in case} == {
        ("llama2_70b_chat", "opt_tree_case", 0.0, 1024)
    }


def test_the_case_study_asks_the_readme_question_in_the_evaluation_prompt():
    records = [json.loads(line) for line in CASE_PROMPT.read_text().splitlines() if line.strip()]
    assert records == [{"id": "weeknight_dinner", "prompt": "What are some easy recipes for a weeknight dinner?"}]
    cfg = job_config(
        [
            f"+experiment=paper/{CASE_EXPERIMENT}",
            "model=llama2_70b_chat",
            "dataset=jsonl",
            "method=opt_tree",
            "method.drafter.nodes=50",
            "method.drafter.threshold=0.7",
        ]
    )
    assert (cfg.dataset.name, cfg.protocol, cfg.temperature, cfg.max_new_tokens) == (
        "opt_tree_case",
        "opt_tree_case",
        0.0,
        1024,
    )
    assert (cfg.method.drafter.nodes, cfg.method.drafter.threshold, cfg.method.drafter.max_depth) == (50, 0.7, 10)
    assert cfg.model.draft.paper_label == "L-7B"
    text = llama2_text(conversation(cfg.dataset.system_prompt, [records[0]["prompt"]], []))
    assert text.startswith("[INST] <<SYS>>\nYou are a helpful, respectful and honest assistant.")
    assert text.endswith("<</SYS>>\n\nWhat are some easy recipes for a weeknight dinner? [/INST]")


def test_the_paper_plan_runs_the_new_experiments():
    assert {*L1B_EXPERIMENTS, CASE_EXPERIMENT} <= set(load_plan("paper").experiments)
