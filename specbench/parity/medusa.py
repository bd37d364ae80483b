"""Medusa parity: FasterDecoding/Medusa's own loop vs specbench's ``Medusa`` drafter, step for step.

Both sides use the heads ``python -m specbench.train medusa model=smollm2_135m`` wrote (the official
``medusa_lm_head`` layout) and the same trees: the published ``mc_sim_7b_63`` (the official side reads
its own copy), the sparse tree specbench builds from the heads' calibration table (its default), and
a dense tree (top-4, 3, 2, 1); the last two reach the official code as explicit rank paths.
"""

from __future__ import annotations

from specbench.parity.common import OfficialSource, SideEnv
from specbench.parity.stepwise import Case, Driver, run

SOURCE = OfficialSource(
    "medusa", "https://github.com/FasterDecoding/Medusa", "e2a5d20c048a9b0a4092e6933c34313687422518"
)
"""The last commit (2024-04-18, "Creating medusa2"): sparse trees and the Medusa-2 heads; PyPI's
``medusa-llm`` 0.1 predates both."""

OFFICIAL_PINS = ("transformers==4.36.2", "accelerate", "sentencepiece", "protobuf")
"""What ``make parity METHOD=medusa`` installs beside torch: the commit asks for ``transformers>=4.34``
and its modelling file follows the 4.36 Llama code (``padding_mask`` gone, ``_flash_attn_2_enabled``)."""

COUNTING = """\
A step is one tree verify forward after the prefill on both sides. specbench's prefill emits the first
token and each step emits the accepted drafts plus the target's next token (the bonus). The official
loop runs the heads on the prefill's last hidden state, makes the prefill's token the root of the first
tree, and each step commits the root and the accepted drafts (`accept_length + 1`) while holding the
target's next token as the next root. The same verify forwards therefore give the same per-step counts,
and the official output with its held token equals specbench's output.

Budget: specbench stops once it has emitted `max_new_tokens` tokens (the last step cut to fit). The
official eval script (`llm_judge/gen_model_answer_medusa.py`) stops when its committed count exceeds a
limit; the driver stops it once committed + held >= `max_new_tokens` (that limit at `max_new_tokens - 2`),
the step at which specbench stops. EOS: the official loop stops when its tokenizer's EOS is among the
committed tokens, so a held EOS costs it one more step; specbench stops at an emitted EOS. Both traces are
cut by specbench's rule before they are compared ("official steps (specbench's rule)"); the official
loop's own count is shown beside it.
"""

DIFFERENCES = """\
- **First step (changed in specbench).** specbench used to verify the prefill's token alone first and
  seed the heads with its hidden state (one non-speculative step per generation); the official loop runs
  the heads on the prompt's last hidden state and verifies a full tree at step 1. specbench now does the
  same by default (`method.drafter.first_step=tree`); `first_step=root` keeps the old rule (case
  `sparse-first-root`). The two rules differ only when the first tree accepts a drafted token: on the
  stored prompts it accepted none (the heads, trained on answer positions, miss the first token after
  the chat template), so both took the same steps there; the unit test with oracle heads shows the
  difference (one root-only step more under `root`).
- **Stop rules** (not changed): the official count leaves out the held next root and its EOS check looks
  at committed tokens only; see "How steps are counted and cut".
- **Last step's tree** (not changed): specbench prunes nodes deeper than the remaining budget before the
  last verify; they could never be emitted, so no step count moves.
"""

SIDE = SideEnv(".venv-parity-medusa", OFFICIAL_PINS, SOURCE)
DRIVER = Driver(
    method="medusa",
    side=SIDE,
    script="scripts/parity/medusa_official.py",
    counting=COUNTING,
    differences=DIFFERENCES,
    default_datasets=("mt_bench=5", "humaneval=5"),
)

CASE_LABELS = ("sparse", "mc_sim_7b_63", "dense-4321", "sparse-first-root")
DENSE = ("method.drafter.tree.kind=dense", "method.drafter.tree.sizes=[4,3,2,1]")


def tree_paths(lm, overrides: tuple[str, ...]) -> list[list[int]]:
    """The rank paths of the tree specbench's Medusa lays out under ``overrides`` (sent to the official side)."""
    from specbench.config import compose_config
    from specbench.core.acceptance import Sampling
    from specbench.core.loop import Decoder
    from specbench.drafters.medusa import Medusa
    from specbench.engines import build_engine

    cfg = compose_config("model=smollm2_135m", "method=medusa", *overrides)
    engine = build_engine(cfg.method, lm, Sampling(0.0, 1.0), step_breakdown=False)
    assert isinstance(engine, Decoder) and isinstance(engine.drafter, Medusa)  # Medusa runs on the shared loop
    assert engine.drafter.layout is not None  # laid out by setup
    return [list(path) for path in engine.drafter.layout.paths]


def cases(lm) -> list[Case]:
    """The four compared settings; trees specbench builds go to the official side as rank paths."""
    sparse = tree_paths(lm, ())
    return [
        Case("sparse", (), {"choices": sparse}),
        Case(
            "mc_sim_7b_63",
            ("method.drafter.tree.kind=choices", "method.drafter.tree.choices=mc_sim_7b_63"),
            {"choices": "mc_sim_7b_63"},
        ),
        Case("dense-4321", DENSE, {"choices": tree_paths(lm, DENSE)}),
        Case("sparse-first-root", ("method.drafter.first_step=root",), {"choices": sparse}),
    ]


def heads_dir(lm) -> dict:
    """The trained heads' folder (``specbench.train medusa`` first: a clear error when they are missing)."""
    from specbench.config import compose_config
    from specbench.models.medusa_heads import load_heads

    cfg = compose_config("model=smollm2_135m", "method=medusa")
    loaded = load_heads(cfg.method.drafter.heads, lm.model, cfg.method.drafter.target_name)
    return {"heads_dir": loaded.origin}


def main(argv: list[str] | None = None) -> int:
    return run(DRIVER, argv, cases, CASE_LABELS, heads_dir)
