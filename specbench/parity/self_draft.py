"""Self-Draft parity: ZipECHO/Self-Draft's own greedy loop vs specbench's ``SelfDraft`` drafter, step for step.

The official code draws its random branch pads with Python's ``random`` seeded 10 at every
``generate``; specbench draws them from the run's per-sample torch generator. The ``official-rules``
cases therefore start specbench's drafter with the official draws for the same prompt
(``start_like_official``, a diagnostic hook, not a setting) and switch on every option that reproduces
an official rule, so with equal rules each prompt must take the same steps with the same token counts.
The ``default`` cases run specbench's defaults (own pads, seed 0 as the runner) and compare on totals.
"""

from __future__ import annotations

import functools
import random
import sys

from specbench.parity import stepwise
from specbench.parity.common import OfficialSource, SideEnv, timed_generation
from specbench.parity.stepwise import Case, Driver

SOURCE = OfficialSource(
    "self_draft", "https://github.com/ZipECHO/Self-Draft", "38bf7fe6f4bd4bc4889752c4ce177c061d603297"
)
"""The last commit (2024-09-04, "fix: adjust some profile code"), the code the AAAI-25 paper links."""

OFFICIAL_PINS = ("transformers==4.37.2", "loguru")
"""What ``make parity METHOD=self_draft`` installs beside torch: the code replaces
``GenerationMixin.greedy_search`` and uses ``GreedySearchOutput``/``DynamicCache.get_usable_length``
(4.37-4.39; from 4.40 ``generate`` calls ``_greedy_search`` and plain AR runs without a word); loguru
is imported by its modules. Not installed: fastchat, psutil (only the package ``__init__`` needs them)
and ``datasets`` (stubbed)."""

OFFICIAL_SEED = 10
"""``random.seed(10)`` at the start of every official ``generate`` (decoding.py)."""

COUNTING = """\
A step is one target forward after the prefill on both sides. The official prefill runs the prompt and
the branch pads in one forward and emits the first token, as specbench's prompt-only prefill does; the
official `steps` counts the prefill, so its count here is its forwards minus one. Each later forward
commits the target's next token plus the accepted tokens of the best candidate (`hits[:max_hit + 1]`),
as specbench's steps emit.

Budget: the official loop stops once the sequence reaches the budget and may overshoot it in its last
step (then truncates); specbench cuts its last step to the budget. EOS: the official loop checks the
first EOS id only; SmolLM2 has one (2). Both traces are cut by specbench's rule before they are
compared.

Pads: the `official-rules` cases draw specbench's pads as the official code does for each prompt
(`start_like_official`: Python's `random.seed(10)`, then per branch `randint(1, max_pad_len)` tokens
by `random.choice(prompt)`); the `default` cases use the runner's per-sample generator with seed 0.
Each case runs its prompts in order on one drafter (one official model), so the context cache carries
over from prompt to prompt on both sides; cases with the same official knobs run once on the official side.
"""

DIFFERENCES = """\
Each rule of the official code (ZipECHO/Self-Draft@38bf7fe, paths under `self_draft/`) that can change
greedy step counts, and what specbench does about it (`conf/method/self_draft.yaml`,
docs/methods/self_draft.md "Deliberate differences"):

1. **Start-up (branch filling).** Official: `N_b+L-3` padded branches ride in the prefill forward
   (draft_branch.py `DraftBranch.__init__`, the first `L-2` pads cut to one token), then each of `L-3`
   drafting-only forwards drops the first branch and strips the next one's pad (LADE's diagonal fill);
   branch 0's first tokens are predictions after a random pad. specbench: the `N_b` branches start at the
   first decode step, branch 0 from `x`, `L-2` drafting-only steps (one more step per generation). Kept;
   `method.drafter.branch_filling=diagonal` reproduces the official start, the pads running in a forward
   of their own on the prompt's cache (`pad_forwards`) because specbench's prefill is the prompt alone.
2. **Random pads.** Official: Python `random.seed(10)` per `generate`, then per branch `randint(1,
   max_pad_len)` tokens by `random.choice(prompt)`; specbench: the run's torch generator. Kept (runs stay
   reproducible per sample); the `official-rules` cases draw the official pads through a driver hook.
3. **Context-cache update** (cache/context_cache.py `update_cache`). Official: the padded branches'
   n-grams level by level (branches aligned at their ends), then the committed text and branch 0, where the
   n-gram ending at `x` takes its last token from branch 1's pad row instead of the target's next token (an
   indexing slip), then the n-gram keyed at `x` re-inserted and the correct n-gram keyed `G` tokens back
   inserted last. specbench: branch by branch, then the text in order, no slip. Same n-grams otherwise; the
   order is the LRU recency (which tuple a full key evicts). Kept; `official_context_update=true`
   reproduces it.
4. **Tokens per step.** Official: at most `G` (the bonus token is lost on a full match). Kept;
   `official_step_cap=true` (existing) reproduces it.
5. **Flush.** Official: the context cache is reduced after question `q` when `(turns so far + 1) %
   flush_interval == 0` (after questions 1, 3, 5 of single-turn sets, never on 2-turn MT-Bench);
   specbench: when a conversation starts after every `flush_interval` finished ones (2, 4, ...). Kept;
   `official_flush=true` reproduces it.
6. **Corpus lookup** (cache/CorpusCache.py `retrieve_N_gram_with_different_key_length`). Official: per
   key length only the first (limit - found) continuations are tried, so one skipped as a duplicate of a
   context candidate is not refilled from the same key; specbench refills. Kept;
   `official_corpus_lookup=true` reproduces it.
7. **Corpus table.** The official mining (CorpusCache.py: OANC files with newlines deleted, sorted by
   content, slow tokenizer with BOS, the last window of each file skipped, stable top-20, count > k) is not
   run here: its slow tokenizer does not load from the embedded checkpoint (transformers-5 files) and its
   OANC paths are hard-coded. The corpus cases give the official lookup specbench's table (the SOTU corpus,
   `SPECBENCH_CORPUS_DIR`), so they compare the lookup and its use, not the mining.

Not a rule difference: the official code's float16 masks (eager attention, added to float32 scores) and
transformers 4.37 vs 5.x; a near-tie could flip a branch prediction, which the `official-rules` cases
would show as a first differing step. With every option on and the official pads, a prompt that still
differs is a rule not found yet. The weight of each rule (the `official-rules` case with one option
back at its default): docs/methods/self_draft.md, "Parity with the official code".
"""

SIDE = SideEnv(".venv-parity-self_draft", OFFICIAL_PINS, SOURCE)
DRIVER = Driver(
    method="self_draft",
    side=SIDE,
    script="scripts/parity/self_draft_official.py",
    counting=COUNTING,
    differences=DIFFERENCES,
    default_datasets=("humaneval=5", "mt_bench=5"),
)

OFFICIAL_RULES = (
    "method.drafter.branch_filling=diagonal",
    "method.drafter.official_context_update=true",
    "method.drafter.official_step_cap=true",
    "method.drafter.official_flush=true",
    "method.drafter.official_corpus_lookup=true",
)
NO_CORPUS = ("method.drafter.use_corpus_cache=false",)
CASE_OVERRIDES = {
    "official-rules": (*OFFICIAL_RULES, *NO_CORPUS),
    "default": NO_CORPUS,
    "official-rules-corpus": OFFICIAL_RULES,
    "default-corpus": (),
}
CASE_LABELS = tuple(CASE_OVERRIDES)
OFFICIAL_START = frozenset({"official-rules", "official-rules-corpus"})
"""Cases whose drafter draws its pads as the official code does (``start_like_official``)."""

OFFICIAL_KNOBS = ("branch_len", "branch_num", "gram_len", "max_pad_len", "flush_interval", "keep_num")


def official_pads(prompt: list[int], count: int, max_pad_len: int, seed: int = OFFICIAL_SEED) -> list[list[int]]:
    """The official pads: after ``random.seed(seed)``, per branch ``randint(1, max_pad_len)`` prompt tokens
    drawn by ``random.choice`` (``random.Random(seed)`` yields the same stream without touching the global one)."""
    rng = random.Random(seed)
    return [[rng.choice(prompt) for _ in range(rng.randint(1, max_pad_len))] for _ in range(count)]


def start_like_official(drafter) -> None:
    """Diagnostic: the drafter draws its pads as the official code does (its generator unused).

    Everything else is specbench's own code path under the case's settings; with the official branch
    filling (``branch_filling=diagonal``) the branches then start from the official pads.
    """
    if drafter.branch_filling != "diagonal":
        raise SystemExit("error: the official pads need method.drafter.branch_filling=diagonal")
    drafter._draw_pads = lambda count, generator: official_pads(drafter.prompt, count, drafter.max_pad_len)


def compose(overrides: tuple[str, ...], dataset: str = "humaneval", max_new_tokens: int = 128):
    """The composed run config of ``method=self_draft`` under ``overrides`` (greedy)."""
    return stepwise.greedy_config("self_draft", overrides, dataset, max_new_tokens)


def cases(lm) -> list[Case]:
    """Every case, its official knobs read from the drafter config specbench composes for it."""
    out = []
    for label, overrides in CASE_OVERRIDES.items():
        drafter = compose(overrides).method.drafter
        knobs = {key: drafter[key] for key in OFFICIAL_KNOBS}
        out.append(Case(label, overrides, {**knobs, "use_corpus": bool(drafter.use_corpus_cache)}))
    return out


def run_ours(lm, method: str, case: Case, dataset: str, prompts, max_new_tokens: int) -> list[dict]:
    """specbench through the runner's path (composed config, ``build_engine``, per-sample generator, seed 0)."""
    from specbench.core.acceptance import Sampling
    from specbench.core.loop import Decoder
    from specbench.engines import build_engine
    from specbench.runner import sample_generator

    cfg = compose(case.overrides, dataset, max_new_tokens)
    engine = build_engine(cfg.method, lm, Sampling(0.0, 1.0), step_breakdown=False)
    assert isinstance(engine, Decoder)  # Self-Draft runs on the shared loop
    if case.label in OFFICIAL_START:
        start_like_official(engine.drafter)
    return [
        timed_generation(engine, ids, max_new_tokens, sample_generator(0, sid), case.label, case=case.label, id=sid)
        for sid, ids in prompts
    ]


USES_CORPUS = frozenset(label for label, overrides in CASE_OVERRIDES.items() if NO_CORPUS[0] not in overrides)


@functools.cache
def corpus_table(tokenizer) -> list:
    """specbench's corpus table (the drafter's: ``SPECBENCH_CORPUS_DIR`` or the Hub), for the official side."""
    from specbench.corpus import corpus_cache_for

    cache = corpus_cache_for(tokenizer, compose(()).method.drafter.corpus)
    return [[list(key), [[list(cont), count] for cont, count in cache.continuations(key)]] for key in cache]


def main(argv: list[str] | None = None) -> int:
    """``stepwise.run`` with this driver's specbench side (seeded, official pads for the official-rules cases)."""
    corpus = bool(USES_CORPUS & set(stepwise.parse_args(DRIVER, argv, CASE_LABELS).cases))

    def job_extra(lm) -> dict:
        """The corpus table, when a chosen case uses the corpus cache."""
        return {"corpus": corpus_table(lm.tokenizer) if corpus else None}

    original = stepwise.run_ours
    stepwise.run_ours = run_ours
    try:
        return stepwise.run(DRIVER, argv, cases, CASE_LABELS, job_extra)
    finally:
        stepwise.run_ours = original


if __name__ == "__main__":
    sys.exit(main())
