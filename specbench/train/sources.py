"""Seed prompts for self-distillation, and the guard that keeps evaluation prompts out of training.

Sources (``prompts.sources``), each a list of user turns:

- ``sharegpt``: the first human turn of each ShareGPT conversation, the Medusa paper's seed data
  (3.3.2); Hub dataset ``Aeala/ShareGPT_Vicuna_unfiltered`` (file ``prompts.sharegpt.file``), or that
  file placed in ``data_dir``.
- ``mbpp_train``: the MBPP problems outside the evaluated test split (task_id 511-974 = the train and
  validation splits), worded exactly as ``dataset=mbpp100`` words its test problems; offline from
  ``data_dir/mbpp.jsonl``.
- ``dolly_dev``: Dolly records after the Lookahead test split (``dataset=dolly split=dev``); offline
  the shared copy holds only 17 of them, the Hub has 14,011.

Never train on evaluation prompts: the sources take only non-test splits by construction (asserted),
and ``drop_evaluation_prompts`` removes any prompt whose text equals a turn of any configured
benchmark (every ``conf/dataset``: HumanEval, MBPP test, GSM8K test, MT-Bench, Spec-Bench, Dolly
test, CNN/DM, XSum) that can be read without the Hub (``data_dir`` copies, packaged HumanEval).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

from specbench.config import compose_config, group_options
from specbench.data.base import build_dataset, read_jsonl
from specbench.data.dolly import Dolly
from specbench.data.mbpp import MBPP, TEST_TASK_IDS
from specbench.errors import ConfigError, DataUnavailable
from specbench.hub import hub_reachable

TRAIN_TASK_IDS = range(511, 975)  # MBPP validation (511-600) + train (601-974); test is 11-510
OFFLINE_ADVICE = "offline, use prompts.sources=[mbpp_train,dolly_dev] with data_dir=<folder with mbpp.jsonl>"


def mbpp_train(prompts_cfg, data_dir: str | None) -> list[str]:
    """MBPP problems of the train and validation splits, in the MBPP paper's zero-shot wording."""
    dataset = MBPP("mbpp_train", data_dir=data_dir)
    dataset.hub_split = "train+validation"
    records = dataset.records()
    chosen = [i for i, record in enumerate(records) if record["task_id"] in TRAIN_TASK_IDS]
    assert not any(records[i]["task_id"] in TEST_TASK_IDS for i in chosen), "MBPP test problem in training"
    return [dataset.to_sample(i, records[i]).turns[0] for i in chosen]


def dolly_dev(prompts_cfg, data_dir: str | None) -> list[str]:
    """Dolly instructions after the first 1,000 records (Lookahead's test split)."""
    dataset = Dolly("dolly_dev", split="dev", data_dir=data_dir)
    samples = dataset.samples()
    assert all(int(s.sample_id.split("/")[1]) >= dataset.test_size for s in samples), "Dolly test record"
    return [sample.turns[0] for sample in samples]


def sharegpt(prompts_cfg, data_dir: str | None) -> list[str]:
    """First human turns of ShareGPT conversations (a local copy of the file, else the Hub)."""
    options = prompts_cfg.sharegpt
    local = Path(data_dir).expanduser() / options.file if data_dir else None
    if local is not None and local.is_file():
        records = read_jsonl(local) if local.suffix == ".jsonl" else json.loads(local.read_text("utf-8"))
    else:
        if not hub_reachable():
            raise DataUnavailable(
                f"prompt source 'sharegpt' needs the Hugging Face Hub ({options.hub_id}, file {options.file}) "
                f"or that file in data_dir, and the Hub cannot be reached; {OFFLINE_ADVICE}"
            )
        import datasets

        records = datasets.load_dataset(options.hub_id, data_files=options.file, split="train")
    return [turn for turn in map(first_human_turn, records) if turn]


def first_human_turn(record: dict) -> str | None:
    """The first message from the human in a ShareGPT conversation (None if it has none)."""
    for message in record.get("conversations") or []:
        if message.get("from") == "human":
            return (message.get("value") or "").strip() or None
    return None


SOURCES: dict[str, Callable[[object, str | None], list[str]]] = {
    "mbpp_train": mbpp_train,
    "dolly_dev": dolly_dev,
    "sharegpt": sharegpt,
}


def source_prompts(name: str, prompts_cfg, data_dir: str | None) -> list[str]:
    """The user turns of one named source, at most ``prompts.per_source_limit`` of them."""
    if name not in SOURCES:
        raise ConfigError(f"unknown prompt source {name!r} in prompts.sources; choose from {', '.join(SOURCES)}")
    texts = SOURCES[name](prompts_cfg, data_dir)
    limit = prompts_cfg.per_source_limit
    return texts[:limit] if limit is not None else texts


def normalized(text: str) -> str:
    """Case- and whitespace-insensitive form of a prompt, for matching against evaluation turns."""
    return " ".join(text.split()).lower()


@functools.lru_cache(maxsize=4)
def evaluation_turns(data_dir: str | None) -> tuple[frozenset[str], tuple[str, ...]]:
    """Normalized user turns of every benchmark's evaluated split readable offline, and their names.

    Only local copies (``data_dir``) and packaged data are read: the guard never downloads.
    """
    turns: set[str] = set()
    checked = []
    for name in group_options("dataset"):
        node = compose_config(f"dataset={name}").dataset
        node.source = "local" if data_dir else "package"
        try:
            dataset = build_dataset(node, data_dir)
            records = dataset.records()
            for i in dataset.pool(records):
                turns.update(normalized(t) for t in dataset.to_sample(i, records[i]).turns)
        except (DataUnavailable, ConfigError):
            continue
        checked.append(name)
    return frozenset(turns), tuple(checked)


def drop_evaluation_prompts(tagged: list[tuple[str, str]], data_dir: str | None) -> tuple[list[tuple[str, str]], dict]:
    """Remove (source, text) prompts equal to an evaluation turn; report what was checked and dropped."""
    turns, checked = evaluation_turns(data_dir)
    kept = [(source, text) for source, text in tagged if normalized(text) not in turns]
    return kept, {"checked_against": list(checked), "dropped": len(tagged) - len(kept)}
