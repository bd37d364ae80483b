"""The dataset interface and HumanEval: sources, sample fields, prompt rendering."""

import json

import pytest

from specbench.config import compose_config
from specbench.data.base import Sample, build_dataset
from specbench.data.humaneval import HumanEval
from specbench.data.prompts import VICUNA_SYSTEM, conversation, llama2_text, render, resolve_format, vicuna_text
from specbench.errors import ConfigError, DataError, DataUnavailable


def test_humaneval_from_package():
    data = HumanEval("humaneval")
    samples = data.samples()
    assert len(samples) == 164 and data.resolved_source == "package"
    first = samples[0]
    assert first.sample_id == "HumanEval/0" and first.turns[0].startswith("from typing import List")
    assert first.reference["entry_point"] == "has_close_elements"


def test_humaneval_local_copy_matches_package(shared_data):
    local = HumanEval("humaneval", data_dir=str(shared_data)).samples()
    package = HumanEval("humaneval", source="package").samples()
    assert [s.turns for s in local] == [s.turns for s in package]


def test_limit_takes_prefix():
    assert [s.sample_id for s in HumanEval("humaneval").samples(limit=2)] == ["HumanEval/0", "HumanEval/1"]


def test_offline_hub_source_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(DataUnavailable, match="openai/openai_humaneval.*SPECBENCH_DATA_DIR"):
        HumanEval("humaneval", source="hub").samples()


def test_bad_source_and_format():
    with pytest.raises(ConfigError):
        HumanEval("humaneval", source="ftp").samples()
    with pytest.raises(ConfigError):
        HumanEval("humaneval", prompt_format="markdown")


def test_conversation_is_multi_turn_ready():
    sample = Sample("q1", ["first?", "second?"])
    messages = conversation("be brief", sample.turns, ["answer one"])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[-1]["content"] == "second?"


def test_rendering_chat_and_raw(embedded):
    tok = embedded.tokenizer
    messages = [{"role": "user", "content": "def f():"}]
    chat = tok.decode(render(tok, messages, "chat"))
    assert chat.startswith("<|im_start|>system") and chat.endswith("<|im_start|>assistant\n")
    assert tok.decode(render(tok, messages, "raw")) == "def f():"
    assert resolve_format(tok, "auto") == "chat"


def test_chat_format_without_template_is_a_clear_error():
    class NoTemplate:
        chat_template = None

    with pytest.raises(ConfigError, match="prompt_format=raw"):
        resolve_format(NoTemplate(), "chat")
    assert resolve_format(NoTemplate(), "auto") == "raw"


def test_paper_templates_on_a_two_turn_conversation():
    messages = conversation(None, ["q1", "q2"], [" a1 "])
    assert vicuna_text(messages) == f"{VICUNA_SYSTEM} USER: q1 ASSISTANT: a1</s>USER: q2 ASSISTANT:"
    assert llama2_text(messages) == "[INST] q1 [/INST] a1 </s><s>[INST] q2 [/INST]"
    with_system = conversation("S", ["q1"], [])
    assert vicuna_text(with_system) == "S USER: q1 ASSISTANT:"
    assert llama2_text(with_system) == "[INST] <<SYS>>\nS\n<</SYS>>\n\nq1 [/INST]"


def test_unknown_format_is_a_config_error():
    with pytest.raises(ConfigError, match="vicuna"):
        resolve_format(None, "alpaca")


def test_chat_render_matches_apply_chat_template(embedded):
    tok = embedded.tokenizer
    messages = conversation(None, ["hi", "and then?"], ["hello"])
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert render(tok, messages, "chat") == expected
    llama2 = "[INST] hi [/INST] hello </s><s>[INST] and then? [/INST]"
    assert tok.decode(render(tok, messages, "llama2")) == llama2


@pytest.mark.parametrize("question", [5, None, ["a", "b"]])
def test_a_prompt_that_is_not_text_is_one_data_error_before_any_model(tmp_path, question):
    """A local copy whose question is a number, null or a list: refused when the file is read, naming the line and
    the field (GSM8K declares its fields' types)."""
    (tmp_path / "gsm8k_test.jsonl").write_text(json.dumps({"question": question, "answer": "#### 3"}) + "\n")
    dataset = build_dataset(compose_config("dataset=gsm8k").dataset, str(tmp_path))
    with pytest.raises(DataError, match=r"gsm8k_test.jsonl:1: the record's field question must be a string"):
        dataset.samples()


def test_a_data_file_that_is_not_utf8_names_its_line(tmp_path):
    (tmp_path / "gsm8k_test.jsonl").write_bytes(b'{"question": "q", "answer": "#### 1"}\n{"question": "\xff"}\n')
    dataset = build_dataset(compose_config("dataset=gsm8k").dataset, str(tmp_path))
    with pytest.raises(DataError, match=r"gsm8k_test.jsonl:2: not UTF-8 text \(byte 14\)"):
        dataset.samples()


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("prompts.txt", "Say hello.\nName a color.\n"),
        ("prompts.jsonl", '{"prompt": "Say hello."}\n{"prompt": "Name a color."}\n'),
    ],
    ids=["text", "jsonl"],
)
def test_a_prompt_file_with_a_utf8_byte_order_mark_reads_as_without(tmp_path, name, content):
    """Windows editors write a UTF-8 byte-order mark: a prompt file that starts with one reads as the same file
    without it (not a JSON error on line 1, nor a mark inside the first prompt)."""
    (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + content.encode())
    dataset = build_dataset(compose_config("dataset=jsonl", f"dataset.path={tmp_path / name}").dataset, None)
    assert [sample.turns for sample in dataset.samples()] == [["Say hello."], ["Name a color."]]


def test_a_checkout_reads_the_shared_datasets_beside_it_when_the_variable_is_unset(monkeypatch):
    """python -m specbench without SPECBENCH_DATA_DIR (which only make exports) finds ../shared/datasets beside the
    checkout, as make does: dataset=mbpp100 reads its local copy instead of the unreachable Hub."""
    from tests.conftest import ROOT

    monkeypatch.delenv("SPECBENCH_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    cfg = compose_config("dataset=mbpp100")
    assert cfg.data_dir == str(ROOT.parent / "shared" / "datasets")
    assert len(build_dataset(cfg.dataset, cfg.data_dir).samples(2)) == 2
