"""specbench.train: self-distilled data (cache, resume, evaluation guard), the CLI, draft distillation."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.errors import ConfigError, DataUnavailable
from specbench.models.parts import part_kind
from specbench.paths import cache_root
from specbench.train import __main__ as cli
from specbench.train import selfdistill, sources
from specbench.train.agreement import chain_steps
from specbench.train.common import compose_train, load_target
from specbench.train.draft import layer_plan, settings_digest
from tests.helpers import exit_code

TINY_DATA = [
    "model=tiny_llama",
    "device=cpu",
    "prompts.max_prompts=4",
    "prompts.max_new_tokens=6",
    "prompts.batch_size=3",
    "prompts.teacher_topk=5",
]
TINY_DRAFT = TINY_DATA + [
    "draft.num_layers=1",
    "train.steps=3",
    "train.batch_size=2",
    "train.eval_sequences=1",
    "progress=false",
]


@pytest.fixture
def tiny_setup(training_cache, shared_data):
    """The tiny target and the self-distillation config of the tests."""
    cfg = compose_train("draft", TINY_DATA + [f"data_dir={shared_data}"])
    return load_target(cfg), cfg


def test_self_distilled_greedy_answers_are_cached(tiny_setup, monkeypatch):
    lm, cfg = tiny_setup
    data = selfdistill.self_distilled(lm, cfg.prompts, cfg.data_dir, progress=False)
    assert len(data) == 4
    assert all(len(item.output_ids) == 6 for item in data)  # a random tiny model never says EOS this soon
    assert all(len(item.topk_ids) == 6 and len(item.topk_ids[0]) == 5 for item in data)
    # greedy: every answer token is the top-1 of the distribution recorded while generating it
    assert all(row[0] == token for item in data for row, token in zip(item.topk_ids, item.output_ids))
    assert all(
        item.prompt_ids[:3]
        == lm.tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}], tokenize=True, add_generation_prompt=True
        )["input_ids"][:3]
        for item in data
    )  # rendered with the chat template, like the runner
    files = list((cache_root() / "selfdistill" / "tiny_llama").glob("*.jsonl"))
    assert len(files) == 1 and json.loads(files[0].read_text().splitlines()[0])["header"]["n_prompts"] == 4

    def no_generation(*args, **kwargs):
        raise AssertionError("the cached answers should have been loaded")

    monkeypatch.setattr(selfdistill, "generate_batch", no_generation)
    assert selfdistill.self_distilled(lm, cfg.prompts, cfg.data_dir, progress=False) == data


def test_interrupted_generation_resumes_where_it_stopped(tiny_setup, monkeypatch):
    lm, cfg = tiny_setup
    data = selfdistill.self_distilled(lm, cfg.prompts, cfg.data_dir, progress=False)
    done = next((cache_root() / "selfdistill" / "tiny_llama").glob("*.jsonl"))
    header, *records = done.read_text().splitlines()
    partial = done.with_suffix(".jsonl.partial")
    partial.write_text(header + "\n" + records[0] + "\n" + records[1][:40])  # a torn last line
    done.unlink()
    generated = []
    real = selfdistill.generate_batch

    def counting(lm, prompts, *args):
        generated.extend(prompts)
        return real(lm, prompts, *args)

    monkeypatch.setattr(selfdistill, "generate_batch", counting)
    assert selfdistill.self_distilled(lm, cfg.prompts, cfg.data_dir, progress=False) == data
    assert len(generated) == 3 and not partial.exists() and done.is_file()


def test_other_generation_settings_get_their_own_cache(tiny_setup):
    lm, cfg = tiny_setup
    selfdistill.self_distilled(lm, cfg.prompts, cfg.data_dir, progress=False)
    cfg.prompts.batch_size = 1  # speed only: same data
    selfdistill.self_distilled(lm, cfg.prompts, cfg.data_dir, progress=False)
    cfg.prompts.max_new_tokens = 3
    shorter = selfdistill.self_distilled(lm, cfg.prompts, cfg.data_dir, progress=False)
    assert all(len(item.output_ids) == 3 for item in shorter)
    assert len(list((cache_root() / "selfdistill" / "tiny_llama").glob("*.jsonl"))) == 2


def test_training_prompts_never_include_evaluation_prompts(shared_data):
    cfg = compose_train("draft", ["prompts.max_prompts=null"])
    prompts = selfdistill.training_prompts(cfg.prompts, str(shared_data))
    assert len(prompts) == 464 + 17  # MBPP train + validation, the Dolly records after its test split
    turns, checked = sources.evaluation_turns(str(shared_data))
    assert {"humaneval", "mbpp100", "gsm8k", "mt_bench", "dolly"} <= set(checked)
    assert not {sources.normalized(p) for p in prompts} & turns


def test_the_guard_drops_a_prompt_that_is_an_evaluation_turn(shared_data):
    record = json.loads((shared_data / "mt_bench.jsonl").read_text().splitlines()[0])
    tagged = [("sharegpt", "  " + record["turns"][0].upper()), ("sharegpt", "Write a haiku about tea.")]
    kept, info = sources.drop_evaluation_prompts(tagged, str(shared_data))
    assert kept == tagged[1:] and info["dropped"] == 1


def test_sharegpt_reads_a_local_copy_and_fails_fast_offline(tmp_path, monkeypatch):
    cfg = compose_train("draft", ["prompts.sources=[sharegpt]", "prompts.sharegpt.file=sg.json"])
    conversations = [
        {"conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hi"}]},
        {"conversations": [{"from": "gpt", "value": "no human turn"}]},
    ]
    (tmp_path / "sg.json").write_text(json.dumps(conversations))
    assert sources.source_prompts("sharegpt", cfg.prompts, str(tmp_path)) == ["Hi there"]
    monkeypatch.setattr(sources, "hub_reachable", lambda: False)
    with pytest.raises(DataUnavailable, match="mbpp_train"):
        sources.source_prompts("sharegpt", cfg.prompts, str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="mbpp_train, dolly_dev, sharegpt"):
        sources.source_prompts("alpaca", cfg.prompts, None)


def test_cli_lists_subcommands_and_reports_errors(capsys):
    assert cli.main([]) == 2
    assert "draft" in capsys.readouterr().err
    assert cli.main(["distil"]) == 2
    err = capsys.readouterr().err
    assert "unknown subcommand 'distil'" in err and "medusa" in err
    assert exit_code(cli.main, ["draft", "train.steps=0"]) == 2
    assert capsys.readouterr().err.startswith("error: invalid draft training settings: train.steps must be >= 1")
    assert exit_code(cli.main, ["draft", "train.nonsense"]) == 2
    assert capsys.readouterr().err.startswith("error: invalid override")


def test_chain_steps_follow_greedy_speculative_decoding():
    # token 0 comes from the prefill; each step accepts up to gamma agreeing drafts plus one target token
    assert chain_steps([True] * 9, gamma=4) == 2  # 5 + 3 tokens
    assert chain_steps([True] + [False] * 4, gamma=4) == 4  # AR pace: one token per step
    assert chain_steps([True, True, True, False, True, True, True], gamma=2) == 2  # 3 + 3 tokens
    assert chain_steps([True], gamma=4) == 0


def test_layer_plan():
    assert layer_plan(30, 2, "spread") == [0, 29]
    assert layer_plan(30, 3, "spread") == [0, 14, 29]
    assert layer_plan(30, 2, "first") == [0, 1]
    assert layer_plan(30, 1, "spread") == [0]
    assert layer_plan(30, 2, "random") is None
    with pytest.raises(ConfigError, match="exceeds"):
        layer_plan(2, 3, "first")


def test_a_draft_deeper_than_its_target_is_refused_before_any_answer_is_generated(training_cache, shared_data, capsys):
    """draft.num_layers beyond the target's layers (copied layers) is known once the target loads: one error line
    then, not after the self-distillation."""
    overrides = [*TINY_DRAFT, f"data_dir={shared_data}", "draft.num_layers=3"]
    assert exit_code(cli.main, ["draft", *overrides]) == 2
    assert "draft.num_layers=3 exceeds the target's 2 layers" in capsys.readouterr().err
    assert not (training_cache / "selfdistill").exists()


def test_train_draft_end_to_end_saves_a_loadable_draft_once(training_cache, shared_data, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbench.train import draft as draft_cli

    overrides = TINY_DRAFT + [f"data_dir={shared_data}"]
    assert cli.main(["draft", *overrides]) == 0
    out = part_kind("draft").folder("tiny_llama")
    assert out.parent == training_cache / "drafts" and "agreement" in capsys.readouterr().out
    record = json.loads((out / "training.json").read_text())
    assert record["training"]["steps_done"] == 3 and record["draft"]["copied_target_layers"] == [0]
    after = record["heldout"]["after_training"]
    assert 0 <= after["agreement"] <= 1 and len(after["rank_hits"]) == 8
    assert after["rank_hits"][0] == after["agreement"] and sum(after["rank_hits"]) <= 1 + 1e-3
    assert record["latency"]["draft_step_ms"] > 0 and "tokens_per_step_gamma4" in record["heldout"]["after_training"]
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 1 and model.config.vocab_size == 49152
    assert AutoTokenizer.from_pretrained(out).eos_token_id is not None
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 49152)

    monkeypatch.setattr(draft_cli, "load_target", lambda cfg: pytest.fail("an up-to-date draft was retrained"))
    assert cli.main(["draft", *overrides]) == 0
    assert "up to date" in capsys.readouterr().out


def test_draft_settings_digest_ignores_the_measured_rank_profile():
    """rank_hits is measured on the trained draft (and written into the model config afterwards): changing it
    must not make `make train-draft` retrain a draft whose training settings are unchanged."""
    default = settings_digest(compose_train("draft", ["model=smollm2_135m"]))
    assert settings_digest(compose_train("draft", ["model=smollm2_135m", "model.draft.rank_hits=[0.5]"])) == default
    assert settings_digest(compose_train("draft", ["model=smollm2_135m", "train.steps=7"])) != default


def test_prompts_too_few_for_the_held_out_sequences_are_refused_before_any_answer_is_generated(tiny_setup):
    """Fewer rendered prompts than the trainer holds out (plus one to train on) is one ConfigError before any
    generation: no self-distillation file is started."""
    lm, cfg = tiny_setup
    with pytest.raises(ConfigError, match="4 training prompt\\(s\\) left .* train.eval_sequences=4 holds out"):
        selfdistill.self_distilled(lm, cfg.prompts, cfg.data_dir, progress=False, held_out=4)
    assert not (cache_root() / "selfdistill").exists()
    assert len(selfdistill.self_distilled(lm, cfg.prompts, cfg.data_dir, progress=False, held_out=3)) == 4
