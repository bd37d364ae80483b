"""dataset=long_inputs: prompts of exactly the bucket's tokens from whole, disjoint runs of CNN/DM articles."""

from __future__ import annotations

import json

import pytest

from specbench.bench import expand_entries, load_suite
from specbench.config import compose_config
from specbench.errors import ConfigError
from tests.test_datasets import load


def write_articles(folder, words: list[int]) -> None:
    """A CNN/DM-shaped local copy whose articles have the given word counts (word i of article j: ``aj_i``)."""
    lines = [
        json.dumps({"id": f"id{j}", "article": " ".join(f"a{j}_{i}" for i in range(n)), "highlights": "h"})
        for j, n in enumerate(words)
    ]
    (folder / "cnn_dailymail_test.jsonl").write_text("\n".join(lines) + "\n")


def test_samples_are_disjoint_runs_of_whole_articles_reaching_the_bucket(tmp_path):
    """Bucket 1000 tokens = 750 words: articles of 400 words pair up; the last one alone is left out."""
    write_articles(tmp_path, [400, 400, 300, 500, 800, 100])
    data = load("long_inputs", tmp_path, "dataset.input_tokens=1000")
    samples = data.samples()
    assert data.name == "long_inputs_1000"
    assert [s.sample_id for s in samples] == ["id0+1", "id2+1", "id4+0"]
    assert [s.meta["articles"] for s in samples] == [2, 2, 1]
    assert samples[0].turns[0].startswith("Summarize the news articles below in a few sentences.\n\na0_0 ")
    assert "a1_0" in samples[0].turns[0] and "a2_0" not in samples[0].turns[0]
    assert {s.category for s in samples} == {"1000_tokens"}


def test_every_prompt_is_cut_to_the_buckets_tokens(shared_data, embedded):
    """Each bucket's prompts, rendered with the embedded model's chat template, hold exactly ``input_tokens`` tokens
    (a token cut in the middle of a word may re-encode one shorter: never longer)."""
    for tokens in (1024, 4096):
        data = load("long_inputs", shared_data, f"dataset.input_tokens={tokens}")
        for sample in data.samples(3):
            ids = data.prompt_ids(embedded.tokenizer, sample, [])
            assert tokens - 2 <= len(ids) <= tokens


def test_a_bucket_the_articles_cannot_fill_is_refused(tmp_path):
    write_articles(tmp_path, [100, 100])
    with pytest.raises(ConfigError, match="do not fill one prompt of 4096 tokens"):
        load("long_inputs", tmp_path, "dataset.input_tokens=4096").samples()
    with pytest.raises(ConfigError, match="input_tokens must be an integer >= 64"):
        load("long_inputs", tmp_path, "dataset.input_tokens=8")


def test_the_suite_runs_one_length_per_session_against_its_own_ar():
    """A suite runs one dataset: the bucket comes from the command line, and every entry pairs with that session's
    AR (the dataset's name, long_inputs_<N>, carries the bucket into the report's pairing)."""
    suite = load_suite("long_inputs")
    entries = expand_entries(suite)
    assert (
        len(entries) == 9
        and suite.baseline == "ar"
        and not any("input_tokens" in " ".join(e.overrides) for e in entries)
    )
    assert compose_config("dataset=long_inputs", "dataset.input_tokens=4096").dataset.name == "long_inputs_4096"
