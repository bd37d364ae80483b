"""Every benchmark dataset against the shared offline copies: counts, ids, subsamples, prompts, errors."""

from collections import Counter

import pytest

from specbench.data.__main__ import compose_run
from specbench.data.__main__ import main as data_cli
from specbench.data.base import SAMPLERS, build_dataset
from specbench.data.mbpp import MBPP
from specbench.data.mt_bench import MT_BENCH_CATEGORIES, MTBench
from specbench.data.spec_bench import TASK_GROUPS, SpecBench
from specbench.errors import ConfigError, DataUnavailable
from tests.helpers import exit_code

CNN_SHOT = "386b182672cd041d574a3fe0e9ccf2f16b751f2e"
GSM_1 = "A robe takes 2 bolts of blue fiber and half that much white fiber.  How many bolts in total does it take?"
VICUNA = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
    "helpful, detailed, and polite answers to the user's questions."
)
SMOL = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def load(name: str, data_dir, *overrides: str):
    """The dataset ``conf/dataset/NAME.yaml`` builds (as the CLI does), with Hydra overrides."""
    return build_dataset(compose_run(name, *overrides).dataset, str(data_dir) if data_dir else None)


def ids(dataset) -> list[str]:
    """The evaluated sample ids, in order."""
    return [s.sample_id for s in dataset.samples()]


@pytest.mark.parametrize(
    "name,count,first,last",
    [
        ("humaneval", 164, "HumanEval/0", "HumanEval/163"),
        ("mt_bench", 80, "81", "160"),
        ("spec_bench", 480, "81", "560"),
        ("gsm8k", 1319, "gsm8k/0", "gsm8k/1318"),
        ("dolly", 1000, "dolly/0", "dolly/999"),
        ("cnndm", 200, "f001ec5c4704938247d27a44948eebb37ae98d01", None),  # the shot is a train record
        ("xsum", 1000, "38264402", None),
    ],
)
def test_counts_and_id_ranges(shared_data, name, count, first, last):
    got = ids(load(name, shared_data))
    assert len(got) == count == len(set(got)) and got[0] == first
    if last is not None:
        assert got[-1] == last


def test_a_test_records_shot_is_never_evaluated(shared_data):
    cnndm, xsum = (load(name, shared_data, "dataset.shot_split=test") for name in ("cnndm", "xsum"))
    assert CNN_SHOT not in ids(cnndm) and "40741956" not in ids(xsum)
    info = cnndm.describe()
    assert info["sampler"] == "prefix" and info["source"].startswith("local:") and info["n_selected"] == 199


def test_cnndm_default_shot_is_outside_anpd_sample():
    # the shot is row 63 of the 11,490-row Hub test split; ANPD's 1,000 = shuffle(seed=42) prefix
    anpd = SAMPLERS["shuffle"](list(range(11490)), 11490, 1000, 42)
    assert 63 not in anpd and len(anpd) == 1000


def test_shuffle_sampler_equals_datasets_shuffle():
    import datasets

    table = datasets.Dataset.from_dict({"i": list(range(300))})
    expected = table.shuffle(seed=42).select(range(50))["i"]
    assert SAMPLERS["shuffle"](list(range(300)), 300, 50, 42) == expected
    assert SAMPLERS["shuffle"]([i for i in range(300) if i != expected[3]], 300, 50, 42)[:3] == expected[:3]


@pytest.mark.parametrize("name,pool", [("gsm100", range(1319)), ("mbpp100", range(11, 511))])
def test_random_subsamples_are_seeded(shared_data, name, pool):
    first, again = ids(load(name, shared_data)), ids(load(name, shared_data))
    other = ids(load(name, shared_data, "dataset.sample_seed=11"))
    assert first == again and len(first) == 100 == len(set(first)) and set(first) != set(other)
    assert all(int(sample_id.split("/")[1]) in pool for sample_id in first)


def test_gsm100_is_self_drafts_random_sample(shared_data):
    import random

    expected = random.Random(10).sample(range(1319), 100)
    assert ids(load("gsm100", shared_data)) == [f"gsm8k/{i}" for i in expected]
    info = load("gsm100", shared_data).describe()
    settings = (info["sampler"], info["sample_size"], info["sample_seed"], info["n_total"])
    assert settings == ("random.sample", 100, 10, 1319)


def test_hub_shuffle_path_is_seeded(shared_data, monkeypatch):
    data = load("xsum", shared_data, "dataset.sample_size=20")
    monkeypatch.setattr(type(data), "is_local", lambda self: False)
    first = ids(data)
    other = ids(load("xsum", shared_data, "dataset.sample_size=20", "dataset.sample_seed=1"))
    assert first == ids(data) and len(first) == 20 and first != other
    assert data.describe()["sampler"] == "shuffle"


def test_mbpp_variant_and_sanitized_fields(shared_data):
    data = load("mbpp100", shared_data)  # Self-Draft's: the sanitized test split, the statement alone
    first = data.samples()[0]
    assert data.describe()["variant"] == "sanitized" and data.describe()["n_total"] == 257
    assert "Your code should pass" not in first.turns[0] and first.reference["test_list"]
    full = load("mbpp100", shared_data, "dataset.split_variant=full", "dataset.template=task")
    full.samples()
    assert full.describe()["variant"] == "full" and full.describe()["n_total"] == 500
    sanitized = {
        "task_id": 11,
        "prompt": "Write f.",
        "code": "def f(): pass",
        "test_list": ["assert f() is None"],
        "test_imports": [],
    }
    sample = MBPP("m", split_variant="sanitized").to_sample(0, sanitized)
    assert sample.turns == [
        "You are an expert Python programmer, and here is your task: Write f. "
        "Your code should pass these tests:\n\nassert f() is None"
    ]


def test_mbpp_sanitized_without_a_local_copy_needs_the_hub(tmp_path, monkeypatch):
    with pytest.raises(DataUnavailable, match="mbpp_sanitized.jsonl"):
        load("mbpp100", tmp_path, "dataset.split_variant=sanitized").samples()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(DataUnavailable, match="google-research-datasets/mbpp', config 'sanitized'"):
        load("mbpp100", None, "dataset.split_variant=sanitized").samples()


def test_mt_bench_categories_and_hub_records(shared_data):
    samples = load("mt_bench", shared_data).samples()
    assert Counter(s.category for s in samples) == dict.fromkeys(MT_BENCH_CATEGORIES, 10)
    assert all(len(s.turns) == 2 for s in samples)
    hub_row = {"prompt": ["q1", "q2"], "prompt_id": 12345678, "category": "writing", "reference": []}
    sample = MTBench("mt_bench").to_sample(4, hub_row)
    assert (sample.sample_id, sample.turns, sample.reference) == ("85", ["q1", "q2"], None)


def test_categories_select_the_pool_before_sampling_and_order(shared_data):
    """dataset.categories keeps only those categories' samples (Medusa's writing + roleplay questions), in the
    dataset's order, recorded in the run's dataset description; a wrong or empty list names the valid ones."""
    chosen = load("mt_bench", shared_data, "+dataset.categories=[writing,roleplay]")
    everything = load("mt_bench", shared_data).samples()
    assert [s.sample_id for s in chosen.samples()] == [
        s.sample_id for s in everything if s.category in ("writing", "roleplay")
    ]
    assert len(chosen.samples()) == 20
    assert chosen.describe()["categories"] == ["writing", "roleplay"] and chosen.describe()["n_selected"] == 20
    mixed = load("mt_bench", shared_data, "+dataset.categories=[writing,roleplay]", "dataset.order=round_robin")
    assert [s.category for s in mixed.samples(limit=4)] == ["writing", "roleplay", "writing", "roleplay"]
    for wrong, message in (("[writin]", r"\['writin'\] are not categories .* 'writing'"), ("[]", "selects nothing")):
        with pytest.raises(ConfigError, match=message):
            load("mt_bench", shared_data, f"+dataset.categories={wrong}").samples()
    with pytest.raises(ConfigError, match="uncategorized"):
        load("humaneval", shared_data, "+dataset.categories=[code]").samples()


def test_round_robin_order_spans_categories_with_a_small_limit(shared_data):
    canonical = load("mt_bench", shared_data).samples()
    mixed = load("mt_bench", shared_data, "dataset.order=round_robin")
    first = mixed.samples(limit=8)
    assert [s.category for s in first] == list(MT_BENCH_CATEGORIES)
    assert sorted(s.sample_id for s in mixed.samples()) == sorted(s.sample_id for s in canonical)
    assert [s.sample_id for s in load("humaneval", shared_data, "dataset.order=round_robin").samples(limit=3)] == [
        "HumanEval/0",
        "HumanEval/1",
        "HumanEval/2",
    ]  # no categories: the canonical order
    with pytest.raises(ConfigError, match="dataset.order"):
        load("mt_bench", shared_data, "dataset.order=shuffled").samples()


def test_spec_bench_groups(shared_data):
    samples = load("spec_bench", shared_data).samples()
    groups = Counter(s.category for s in samples)
    assert groups == dict.fromkeys(TASK_GROUPS, 80)
    mt = [s for s in samples if s.category == "mt_bench"]
    assert Counter(s.meta["fine_category"] for s in mt)["coding"] == 10 and all(len(s.turns) == 2 for s in mt)
    assert all(len(s.turns) == 1 for s in samples if s.category != "mt_bench")
    assert [s.turns for s in mt] == [s.turns for s in load("mt_bench", shared_data).samples()]


def test_spec_bench_without_local_copy():
    with pytest.raises(DataUnavailable, match="github.com/hemingkx/Spec-Bench.*SPECBENCH_DATA_DIR"):
        SpecBench("spec_bench").samples()


@pytest.mark.parametrize(
    "name,hub_id",
    [
        ("mt_bench", "HuggingFaceH4/mt_bench_prompts"),
        ("gsm100", "openai/gsm8k"),
        ("gsm8k", "openai/gsm8k"),
        ("mbpp100", "google-research-datasets/mbpp"),
        ("cnndm", "abisee/cnn_dailymail"),
        ("xsum", "EdinburghNLP/xsum"),
        ("dolly", "databricks/databricks-dolly-15k"),
    ],
)
def test_offline_without_local_copy_names_hub_id(monkeypatch, name, hub_id):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(DataUnavailable, match=f"'{hub_id}'.*SPECBENCH_DATA_DIR"):
        load(name, None).samples()


def test_dolly_splits(shared_data):
    dev = load("dolly", shared_data, "dataset.split=dev")
    assert ids(dev) == [f"dolly/{i}" for i in range(1000, 1017)]
    assert len(dev.dev_answers()) == 17 and dev.dev_answers()[0] == dev.dev_records()[0]["response"]
    assert load("dolly", shared_data).dev_answers() == dev.dev_answers()
    assert dev.describe()["variant"] == "dev"
    with pytest.raises(ConfigError, match="dataset.split must be"):
        load("dolly", shared_data, "dataset.split=train")


def test_bad_settings_are_config_errors(shared_data):
    with pytest.raises(ConfigError):
        load("mbpp100", shared_data, "dataset.split_variant=tiny")
    with pytest.raises(ConfigError, match="sample_size=2000"):
        load("gsm100", shared_data, "dataset.sample_size=2000").samples()
    with pytest.raises(ConfigError, match="shot_id"):
        data = load(
            "cnndm", shared_data, "dataset.shot_split=test", "dataset.shot_id=nope", "dataset.prompt_format=raw"
        )
        data.completion_prompt(data.samples(1)[0], [])
    with pytest.raises(ConfigError, match="shot_split must be one of"):
        load("cnndm", shared_data, "dataset.shot_split=dev")


# --- prompt rendering snapshots ------------------------------------------------------------------


def test_gsm_prompt_formats(shared_data, embedded):
    tok = embedded.tokenizer
    data = load("gsm8k", shared_data)
    sample = data.samples(2)[1]
    expected = {
        "raw": GSM_1,
        "vicuna": f"{VICUNA} USER: {GSM_1} ASSISTANT:",
        "llama2": f"[INST] {GSM_1} [/INST]",
        "chat": (f"<|im_start|>system\n{SMOL}<|im_end|>\n<|im_start|>user\n{GSM_1}<|im_end|>\n<|im_start|>assistant\n"),
    }
    for fmt, text in expected.items():
        data.prompt_format = fmt
        assert data.prompt(tok, sample, []) == text and data.format_used(tok) == fmt
        assert tok.decode(data.prompt_ids(tok, sample, [])) == text


def test_llama2_system_block(shared_data, embedded):
    data = load("gsm8k", shared_data, "dataset.prompt_format=llama2", "dataset.system_prompt=Be brief.")
    assert data.prompt(embedded.tokenizer, data.samples(2)[1], []) == (
        f"[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n{GSM_1} [/INST]"
    )


@pytest.mark.parametrize(
    "fmt,expected",
    [
        ("vicuna", "{sys} USER: {q1} ASSISTANT: An answer.</s>USER: {q2} ASSISTANT:"),
        ("llama2", "[INST] {q1} [/INST] An answer. </s><s>[INST] {q2} [/INST]"),
        ("raw", "{q1}\n\nAn answer. \n\n{q2}"),
        (
            "chat",
            "<|im_start|>system\n{smol}<|im_end|>\n<|im_start|>user\n{q1}<|im_end|>\n<|im_start|>assistant\n"
            "An answer. <|im_end|>\n<|im_start|>user\n{q2}<|im_end|>\n<|im_start|>assistant\n",
        ),
    ],
)
def test_second_turn_holds_the_first_answer(shared_data, embedded, fmt, expected):
    data = load("mt_bench", shared_data, f"dataset.prompt_format={fmt}")
    sample = data.samples(1)[0]
    q1, q2 = sample.turns
    text = data.prompt(embedded.tokenizer, sample, ["An answer. "])
    assert text == expected.format(sys=VICUNA, q1=q1, q2=q2, smol=SMOL)
    assert data.prompt(embedded.tokenizer, sample, []).count(q2) == 0


def test_cnndm_one_shot_and_instruction(shared_data, embedded):
    data = load("cnndm", shared_data, "dataset.prompt_format=raw", "dataset.shot_split=test")
    sample = data.samples(1)[0]
    text = data.prompt(embedded.tokenizer, sample, [])
    assert text.startswith('Article: (CNN)What do we have for the contestant on "The Price Is Right"?')
    assert (
        '\nSummary: "The Price Is Right" gives away a car ... accidentally . A model makes a big mistake '
        "during a game . Host Drew Carey thought the error was hilarious .\nArticle: (CNN)The Palestinian "
        "Authority officially became"
    ) in text
    assert text.endswith(sample.meta["document"] + "\nSummary:") and text.count("Article: ") == 2
    zero = load("cnndm", shared_data, "dataset.prompt_format=raw", "dataset.shot_split=null")
    assert zero.prompt(embedded.tokenizer, sample, []) == f"Article: {sample.meta['document']}\nSummary:"
    assert sample.turns == [f"Summarize the following articles.\n\n{sample.meta['document']}"]
    assert data.describe()["shot_id"] == CNN_SHOT


def test_the_shot_is_the_shuffled_train_splits_first_record(tmp_path, monkeypatch):
    """Draft&Verify's shot (the default): the train split's first record after ``shuffle(seed=42)``, from the Hub
    (here a stand-in split of 300 records) or a one-record file in data_dir; offline without one, a clear error."""
    import datasets

    train = datasets.Dataset.from_dict(
        {"id": [str(i) for i in range(300)], "document": [f"doc {i}" for i in range(300)], "summary": ["s"] * 300}
    )
    first = train.shuffle(seed=42)[0]["id"]
    monkeypatch.setattr("specbench.data.summarization.hub_reachable", lambda: True)
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, split: train if split == "train" else None)
    data = load("xsum", None, "dataset.prompt_format=raw")
    assert data.shot == f"Article: doc {first}\nSummary: s\n" and data.shot_split == "train"
    (tmp_path / "xsum_train_shot.jsonl").write_text('{"id": "7", "document": "local doc", "summary": "local"}\n')
    assert load("xsum", tmp_path).shot == "Article: local doc\nSummary: local\n"
    monkeypatch.setattr("specbench.data.summarization.hub_reachable", lambda: False)
    with pytest.raises(DataUnavailable, match="xsum_train_shot.jsonl"):
        assert not load("xsum", None).shot  # raises before


def test_xsum_uses_the_document(shared_data, embedded):
    data = load("xsum", shared_data, "dataset.prompt_format=raw", "dataset.shot_split=test")
    sample = data.samples(1)[0]
    text = data.prompt(embedded.tokenizer, sample, [])
    assert text.startswith("Article: Seonaid, 21, won the 50m rifle three positions event")
    assert text.endswith(f"\nArticle: {sample.meta['document']}\nSummary:") and sample.reference


def test_dolly_prompts(shared_data, embedded):
    tok = embedded.tokenizer
    data = load("dolly", shared_data, "dataset.prompt_format=raw")
    with_context, without = data.samples(2)
    assert data.prompt(tok, without, []) == (
        "Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\nWhich is a species of fish? Tope or Rope\n\n### Response:"
    )
    assert data.prompt(tok, with_context, []).startswith(
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n### Instruction:\nWhen did Virgin "
        "Australia start operating?\n\n### Input:\nVirgin Australia, the trading name"
    )
    assert data.prompt(tok, with_context, []).endswith("[4]\n\n### Response:")
    assert with_context.turns[0].startswith("When did Virgin Australia start operating?\n\nVirgin Australia")
    assert without.turns == ["Which is a species of fish? Tope or Rope"]
    assert without.category == "classification"


def test_humaneval_format_tabs_asks_draft_and_verifys_prompt(shared_data):
    """``+dataset.format_tabs=true`` (Draft&Verify's evaluation): every four spaces of the prompt become a tab."""
    plain = load("humaneval", shared_data).samples(1)[0].turns[0]
    tabbed = load("humaneval", shared_data, "+dataset.format_tabs=true").samples(1)[0].turns[0]
    assert "    " in plain and tabbed == plain.replace("    ", "\t") and "    " not in tabbed


def test_humaneval_and_mbpp_raw_prompts(shared_data, embedded):
    data = load("humaneval", shared_data, "dataset.prompt_format=raw")
    sample = data.samples(1)[0]
    assert data.prompt(embedded.tokenizer, sample, []) == sample.turns[0]
    mbpp = load("mbpp100", shared_data, "dataset.prompt_format=llama2")  # Self-Draft's: the statement alone
    sample = mbpp.samples(1)[0]
    assert mbpp.prompt(embedded.tokenizer, sample, []) == (
        "[INST] Write a function to flatten a list and sum all of its elements. [/INST]"
    )
    mbpp = load(
        "mbpp100", shared_data, "dataset.prompt_format=llama2", "dataset.split_variant=full", "dataset.template=task"
    )
    sample = mbpp.samples(1)[0]
    assert mbpp.prompt(embedded.tokenizer, sample, []) == (
        "[INST] You are an expert Python programmer, and here is your task: Write a python function to check "
        "whether the count of inversion of two types are same or not. Your code should pass these tests:\n\n"
        "assert solve([1,0,2],3) == True\nassert solve([1,2,0],3) == False\n"
        "assert solve([1,2,1],3) == True [/INST]"
    )


# --- CLI -------------------------------------------------------------------------------------------


def test_cli_list(shared_data, capsys):
    assert data_cli(["list", "--data-dir", str(shared_data)]) == 0
    out = capsys.readouterr().out
    for name, count in [
        ("mt_bench", 80),
        ("gsm100", 100),
        ("spec_bench", 480),
        ("dolly", 1000),
        ("humaneval", 164),
        ("mbpp100", 100),
        ("cnndm", 200),
        ("xsum", 1000),
        ("gsm8k", 1319),
    ]:
        assert any(line.split()[:2] == [name, str(count)] for line in out.splitlines())
    assert "local:" in out and "random.sample(size=100, seed=10)" in out


def test_cli_show(shared_data, embedded, capsys):
    assert data_cli(["show", "mt_bench", "--limit", "1", "--data-dir", str(shared_data)]) == 0
    out = capsys.readouterr().out
    assert "=== 81  category=writing  turns=2" in out and "<model answer to turn 0>" in out
    assert exit_code(data_cli, ["show", "imaginary"]) == 2
    assert "mt_bench" in capsys.readouterr().err
