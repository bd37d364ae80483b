"""``python -m specbench.data list|show``: inspect datasets (counts, categories, sources, prompts).

Nothing is generated: ``show`` loads only the model's tokenizer to render the prompts. The dataset
configs are composed from ``conf/`` with the Hydra compose API, so this CLI builds exactly the
datasets that ``python -m specbench dataset=NAME`` runs.

    python -m specbench.data list [--data-dir DIR]
    python -m specbench.data show mt_bench [--limit 2] [--model smollm2_135m] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from omegaconf import DictConfig

from specbench.cli import ArgumentParser, user_errors
from specbench.config import compose_config, group_options
from specbench.data.base import Dataset, Sample, build_dataset
from specbench.errors import ConfigError, UserError
from specbench.models.loading import load_tokenizer


def dataset_names() -> list[str]:
    """Every dataset config in ``conf/dataset``."""
    return group_options("dataset")


def compose_run(dataset: str, *overrides: str) -> DictConfig:
    """The main app's config for ``dataset`` (+ Hydra overrides), composed as ``python -m specbench`` does."""
    if dataset not in dataset_names():
        raise ConfigError(f"unknown dataset {dataset!r}; choose one of {', '.join(dataset_names())}")
    return compose_config(f"dataset={dataset}", *overrides)


def category_counts(samples: list[Sample]) -> str:
    """``category count`` pairs in first-seen order, or ``-`` for an uncategorized dataset."""
    counts = Counter(sample.category for sample in samples)
    if set(counts) == {None}:
        return "-"
    return ", ".join(f"{category} {n}" for category, n in counts.items())


def selection_text(info: dict) -> str:
    """How the samples were chosen, from ``Dataset.describe()``."""
    chosen = f"{info['n_selected']} of {info['n_total']}"
    if info["sampler"] is None:
        return chosen
    return f"{chosen} by {info['sampler']}(size={info['sample_size']}, seed={info['sample_seed']})"


def list_line(name: str, data_dir: str | None) -> str:
    """One dataset's line for ``list``: count, selection, source (+ variant) and categories."""
    try:
        cfg = compose_run(name)
        dataset = build_dataset(cfg.dataset, data_dir or cfg.data_dir)
        samples = dataset.samples()
        info = dataset.describe()
    except UserError as error:
        return f"{name:<11} unavailable: {error}"
    variant = f" [{info['variant']}]" if info["variant"] else ""
    return (
        f"{name:<11} {len(samples):>5}  {info['source']}{variant}\n"
        f"{'':<19}selection: {selection_text(info)}\n"
        f"{'':<19}categories: {category_counts(samples)}"
    )


def list_datasets(data_dir: str | None) -> None:
    """Print every configured dataset with its count, source and categories."""
    print(f"{'dataset':<11} {'count':>5}  source")
    for name in dataset_names():
        print(list_line(name, data_dir))


def show_sample(dataset: Dataset, tokenizer, sample: Sample) -> None:
    """Print a sample's id and category and the rendered prompt of each turn (placeholder answers)."""
    print(f"=== {sample.sample_id}  category={sample.category}  turns={len(sample.turns)}")
    answers: list[str] = []
    for turn in range(len(sample.turns)):
        ids = dataset.prompt_ids(tokenizer, sample, answers)
        print(f"--- turn {turn}: {len(ids)} prompt tokens")
        print(dataset.prompt(tokenizer, sample, answers))
        answers.append(f"<model answer to turn {turn}>")


def show_dataset(name: str, limit: int, model: str, data_dir: str | None) -> None:
    """Print the first ``limit`` samples of a dataset with prompts rendered for ``model``."""
    cfg = compose_run(name, f"model={model}")
    dataset = build_dataset(cfg.dataset, data_dir or cfg.data_dir)
    samples = dataset.samples(limit)
    tokenizer = load_tokenizer(cfg.model)
    print(f"{name}: {dataset.describe()}")
    print(f"prompt format: {dataset.format_used(tokenizer)} (model {cfg.model.name})")
    for sample in samples:
        show_sample(dataset, tokenizer, sample)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The ``list`` / ``show`` command line."""
    parser = ArgumentParser(prog="python -m specbench.data", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    list_cmd = commands.add_parser("list", help="every dataset with its count, categories and source")
    list_cmd.add_argument("--data-dir", help="folder of local JSONL copies (default: SPECBENCH_DATA_DIR)")
    show = commands.add_parser("show", help="sample ids, categories and rendered prompts of one dataset")
    show.add_argument("dataset", help="a conf/dataset name, e.g. mt_bench")
    show.add_argument("--limit", type=int, default=3, help="samples to show (default 3)")
    show.add_argument("--model", default="smollm2_135m", help="conf/model name whose tokenizer renders")
    show.add_argument("--data-dir", help="folder of local JSONL copies (default: SPECBENCH_DATA_DIR)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one command; user errors are printed in one line (exit status 2)."""
    args = parse_args(argv)
    with user_errors(argv):
        if args.command == "list":
            list_datasets(args.data_dir)
        else:
            show_dataset(args.dataset, args.limit, args.model, args.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
