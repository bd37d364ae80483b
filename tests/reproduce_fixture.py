"""A synthetic results folder laid out exactly as the runner writes one, for the reproduce builders' tests.

``write_fixture_results(root)`` writes one run folder per job of every experiment of a scale, AR partners
included (``<experiment>/<model>/<dataset>/T<temperature>-n<max_new_tokens>/<override dirname>`` with
``summary.json`` and ``samples.jsonl``, every experiment one measuring session, as ``reproduce.session`` writes
them; ``sessions=False``: as runs stored before sessions were recorded) and a latency profile CSV per profiled
model. Every number is drawn from an RNG seeded by ``seed`` and the run folder, so the same call writes the same
bytes. AR runs emit one token
per step; the other methods 1.5-3 tokens per step at a per-run step overhead, so speedups vary;
lossless methods reproduce the AR output of the same sample (exact match 1), lossy ones diverge.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from specbench.metrics import run_summary
from specbench.profile import CSV_FIELDS, MASKS, write_csv
from specbench.reproduce.coverage import job_config, run_folder
from specbench.reproduce.plan import experiment_jobs, experiment_names, load_plan, partner_job
from specbench.runner import config_fields
from specbench.schema import SCHEMA_VERSION

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
DEFAULT_SAMPLES = 2  # samples of a run whose limit is null (all) or above MAX_SAMPLES
MAX_SAMPLES = 8
VOCAB_SIZE = 49152
AR_STEP_S = 0.04  # one AR step of the fixture's CPU
PREFILL_S = 0.1
DEVICE_NAME = "cpu: fixture"
ENVIRONMENT = {
    "device": "cpu",
    "device_name": DEVICE_NAME,
    "cpu": "fixture",
    "cpu_count": 2,
    "torch_threads": 2,
    "dtype": "float32",
    "python": "3.11",
    "platform": "fixture",
    "torch": "0.0+fixture",
    "cuda": None,
    "transformers": "0.0+fixture",
    "git_commit": "0" * 40,
    "git_dirty": False,
}
PROFILE_CONTEXTS = (64, 256, 1024)
PROFILE_TOKENS = tuple(2**k for k in range(10))  # 1 .. 512


def rng_for(seed: int, *parts) -> np.random.Generator:
    """A generator seeded by ``seed`` and the text of ``parts`` (stable across processes, unlike hash())."""
    digest = hashlib.sha256("/".join(map(str, [seed, *parts])).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def sample_keys(
    dataset: str, limit: int | None, categories: list[str] | None = None
) -> list[tuple[str, int, str | None]]:
    """(sample_id, n_turns, category) of the samples a run covers (MT-Bench: round robin over its categories, or
    over ``categories`` when the run keeps only those)."""
    count = min(limit, MAX_SAMPLES) if limit else DEFAULT_SAMPLES
    if dataset == "mt_bench":
        kept = list(categories or MT_BENCH_CATEGORIES)
        rounds = [(index // len(kept), MT_BENCH_CATEGORIES.index(kept[index % len(kept)])) for index in range(count)]
        return [(str(81 + 10 * column + row), 2, MT_BENCH_CATEGORIES[column]) for row, column in rounds]
    return [(f"{dataset}/{index}", 1, None) for index in range(count)]


def reference_output(seed: int, cfg: DictConfig, sample_id: str, turn: int) -> list[int]:
    """The AR output of one turn (shared by every lossless run of the same model, data and sampling)."""
    rng = rng_for(seed, cfg.model.name, cfg.dataset.name, cfg.temperature, cfg.top_p, sample_id, turn)
    budget = cfg.max_new_tokens
    length = budget if rng.random() > 0.25 else int(rng.integers(max(budget // 2, 2), budget))
    return rng.integers(VOCAB_SIZE, size=length).tolist()


def accept_lengths(rng: np.random.Generator, tokens: int, tokens_per_step: float) -> list[int]:
    """Tokens emitted per step, summing to ``tokens`` (the prefill emits the first token of a turn)."""
    lengths, left = [], tokens
    while left > 0:
        step = min(left, 1 + int(rng.binomial(4, (tokens_per_step - 1) / 4)))
        lengths.append(step)
        left -= step
    return lengths


def opt_tree_stats(rng: np.random.Generator, accepted: list[int]) -> dict:
    """OPT-Tree's drafter stats: per-step E (near the accepted count) and accepted drafted tokens."""
    expected = [round(max(0.0, a + float(rng.normal(0.3, 0.7))), 3) for a in accepted]
    return {
        "tree_depth_mean": float(np.mean(accepted) + 1) if accepted else 0.0,
        "expected_accept_mean": float(np.mean(expected)) if expected else 0.0,
        "step_expected_accept": expected,
        "step_accepted": accepted,
    }


def turn_record(
    rng: np.random.Generator,
    seed: int,
    cfg: DictConfig,
    run_id: str,
    pace: dict,
    sample: tuple[str, int, str | None],
    turn: int,
    prompt_tokens: int,
    session: str | None,
) -> dict:
    """One samples.jsonl line of one turn at the run's ``pace`` (tokens per step, overhead, drafted nodes)."""
    sample_id, n_turns, category = sample
    output = reference_output(seed, cfg, sample_id, turn)
    if not cfg.method.lossless and len(output) > 4 and rng.random() < 0.5:
        cut = int(rng.integers(1, len(output)))
        output = output[:cut] + rng.integers(VOCAB_SIZE, size=len(output) - cut).tolist()
    lengths = accept_lengths(rng, len(output) - 1, pace["tokens_per_step"])
    drafted = [0 if pace["drafted"] == 0 else max(pace["drafted"], a - 1) for a in lengths]
    step_s = [round(AR_STEP_S * pace["overhead"] * float(rng.uniform(0.95, 1.05)), 6) for _ in lengths]
    verify_s = [round(s * float(rng.uniform(0.85, 0.97)), 6) for s in step_s]
    outside = [step - verify for step, verify in zip(step_s, verify_s)]
    phases = {
        f"{phase}_s": [round(share * o, 6) for o in outside]  # the step breakdown (CPU default)
        for phase, share in (("draft", 0.5), ("accept", 0.3), ("update", 0.2))
    }
    stats = opt_tree_stats(rng, [a - 1 for a in lengths]) if cfg.method.name == "opt_tree" else {}
    return {
        "schema": SCHEMA_VERSION,
        "run_id": run_id,
        "sample_id": sample_id,
        "turn": turn,
        "n_turns": n_turns,
        "category": category,
        "fine_category": None,
        "prompt_tokens": prompt_tokens,
        "prompt_sha": prompt_digest(cfg, sample_id, turn),
        "new_tokens": len(output),
        "output_ids": output,
        "output_text": " ".join(f"t{token}" for token in output),
        "wall_s": PREFILL_S + sum(step_s),
        "batch_size": 1,
        "batch_wall_s": PREFILL_S + sum(step_s),
        "prefill_s": PREFILL_S,
        "target_forwards": len(lengths),
        "accept_lengths": lengths,
        "draft_tokens": drafted,
        "draft_depth": [max(a - 1, min(d, 4)) if d else 0 for a, d in zip(lengths, drafted)],
        "side_branch": [False] * len(lengths),
        "verify_tokens": [1 + d + pace["aux"] for d in drafted],  # root, every drafted node, the drafting rows
        "step_s": step_s,
        "verify_s": verify_s,
        **phases,
        "energy_j": None,
        "stop_reason": "max_new_tokens" if len(output) == cfg.max_new_tokens else "eos",
        "measuring_session": session,
        "drafter_stats": stats,
    }


def prompt_digest(cfg: DictConfig, sample_id: str, turn: int) -> str:
    """The prompt digest of one turn: equal for every run of the same model, dataset and sample (AR pairs with it)."""
    return hashlib.sha256(f"{cfg.model.name}/{cfg.dataset.name}/{sample_id}/{turn}".encode()).hexdigest()[:16]


def aux_rows(cfg: DictConfig) -> int:
    """The verify rows a step spends on drafting beside the root and the drafted tokens: Self-Draft's branches and
    LADE's window (N_b x (L - 1) and W x (N - 1), less the root)."""
    drafter = cfg.method.get("drafter") or {}
    if cfg.method.name == "self_draft":
        return int(drafter.branch_num) * (int(drafter.branch_len) - 1) - 1
    if cfg.method.name.startswith("lade"):
        return int(drafter.window_size) * (int(drafter.ngram_size) - 1) - 1
    return 0


def run_records(seed: int, cfg: DictConfig, folder: Path, run_id: str, session: str | None) -> list[dict]:
    """Every record of one run: each sample's turns, later turns prompted with the earlier answers."""
    rng = rng_for(seed, folder)
    ar = cfg.method.name == "ar"
    pace = {
        "tokens_per_step": 1.0 if ar else float(rng.uniform(1.5, 3.0)),
        "overhead": float(rng.uniform(0.98, 1.02)) if ar else float(rng.uniform(1.05, 1.6)),
        "drafted": 0 if ar else int(rng.integers(3, 64)),
        "aux": aux_rows(cfg),
    }
    records = []
    for sample in sample_keys(cfg.dataset.name, cfg.limit, list(cfg.dataset.get("categories") or [])):
        prompt_tokens = int(rng.integers(40, 800))
        for turn in range(sample[1]):
            records.append(turn_record(rng, seed, cfg, run_id, pace, sample, turn, prompt_tokens, session))
            prompt_tokens += records[-1]["new_tokens"] + int(rng.integers(20, 120))
    return records


def summary(cfg: DictConfig, folder: Path, run_id: str, records: list[dict], seed: int, bench: dict | None) -> dict:
    """The complete run's summary.json, built like the runner's (specbench.metrics.run_summary)."""
    method = OmegaConf.to_container(cfg.method, resolve=True)
    rng = rng_for(seed, folder, "memory")
    stamp = "2026-01-01T00:00:00+00:00"
    return run_summary(
        records,
        **config_fields(cfg),
        run_id=run_id,
        status="complete",
        model_path=cfg.model.get("path"),
        dataset_info={
            "source": "fixture",
            "variant": None,
            "n_total": 80,
            "categories": OmegaConf.to_object(cfg.dataset.categories) if cfg.dataset.get("categories") else None,
            "n_selected": 80,
            "sampler": None,
            "sample_size": None,
            "sample_seed": None,
            "order": cfg.dataset.get("order"),
        },
        prompt_format="chat",
        started_at=stamp,
        updated_at=stamp,
        ended_at=stamp,
        peak_memory={"kind": "process_peak_rss", "bytes": int(2**30 * rng.uniform(1.0, 1.1))},
        environment=ENVIRONMENT,
        config_digest=digest_of(method, cfg),
        device_map=None,
        bench=bench,
        target="",
        artefacts=[],
        budget=None,
        engine={"name": "hf", "batch_size": 1},
        latency_curves=[],
        compile=None,
        memory_traffic=None,
    )


def digest_of(method: dict, cfg: DictConfig) -> str:
    """A config digest that, like the runner's, differs whenever the model, data, sampling or method differ."""
    identity = [method, cfg.model.name, cfg.dataset.name, cfg.temperature, cfg.top_p, cfg.max_new_tokens]
    if cfg.dataset.get("categories"):
        identity.append(list(cfg.dataset.categories))
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def profile_rows(model: str) -> list[dict]:
    """A latency profile with a flat region up to 16 tokens, then linear growth (chain and tree masks)."""
    rows = []
    for context in PROFILE_CONTEXTS:
        for tokens in PROFILE_TOKENS:
            for mask in MASKS:
                median = (20 + context / 64) * (1 + max(0, tokens - 16) / 32) * (1.05 if mask == "tree" else 1.0)
                rows.append(
                    dict(
                        zip(
                            CSV_FIELDS,
                            [
                                model,
                                DEVICE_NAME,
                                "float32",
                                context,
                                tokens,
                                mask,
                                round(median, 3),
                                round(0.95 * median, 3),
                                3,
                            ],
                        )
                    )
                )
    return rows


def write_fixture_results(
    root: Path, scale: str = "smoke", experiments: list[str] | None = None, seed: int = 0, sessions: bool = True
) -> Path:
    """Write one synthetic run per job of the scale's experiments (AR partners included; each experiment one
    measuring session, or none with ``sessions=False``) and the latency profiles under ``root``; return ``root``."""
    root = Path(root)
    for number, name in enumerate(experiments or experiment_names(scale)):
        session = f"20260101T000000Z-f1x7re-{number}" if sessions else None
        for index, job in enumerate(experiment_jobs(scale, name)):
            cfg, ar = job_config(job), partner_job(job)
            folder, partner = Path(run_folder(cfg, job)), run_folder(job_config(ar), ar)
            label = str(folder.relative_to(name))
            bench = {
                "suite": f"reproduce/{scale}",
                "session": name,
                "entry": label,
                "baseline": str(Path(partner).relative_to(name)),
                "index": index,
            }
            run_id = f"{folder.name}@20260101T000000"
            records = run_records(seed, cfg, folder, run_id, session)
            (root / folder).mkdir(parents=True, exist_ok=True)
            (root / folder / "samples.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
            written = summary(cfg, folder, run_id, records, seed, bench if sessions else None)
            (root / folder / "summary.json").write_text(json.dumps(written, indent=2))
    for model in load_plan(scale).profile_models:
        (root / "profile" / model).mkdir(parents=True, exist_ok=True)
        write_csv(profile_rows(model), root / "profile" / model / "latency_cpu_float32.csv")
    return root
