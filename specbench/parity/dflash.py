"""DFlash parity: z-lab/dflash's own loop (``dflash_generate`` of ``dflash/model.py``) vs specbench's ``DFlash``.

Both sides run the DFlash drafter of ``model.dflash`` (``python -m specbench.train dflash model=smollm2_135m`` writes
it in the authors' layout, which their ``DFlashDraftModel.from_pretrained`` loads as it is) with the same block size
B on the embedded target. Both prefills emit one token and hand the drafter the prompt's features; every later step
drafts B - 1 tokens in one drafter forward and verifies them in one target forward, on both sides, so with the same
rules each prompt takes the same steps with the same token counts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from specbench.errors import ModelUnavailable
from specbench.parity import stepwise
from specbench.parity.common import OfficialSource, SideEnv
from specbench.parity.stepwise import Case, Driver, Row

SOURCE = OfficialSource("dflash", "https://github.com/z-lab/dflash", "44947fbf71114e241c96de194f4b382b5dd330d0")
"""The head of main (2026-04-26, "Update sglang dependency to pull request #23000"); ``dflash/model.py`` is its
transformers backend (the sglang, vLLM and MLX backends are not run)."""

OFFICIAL_PINS = ("transformers==4.57.1",)
"""What ``make parity METHOD=dflash`` installs beside torch: the commit's ``transformers`` extra pins transformers
4.57.1 (``dflash/model.py`` imports Qwen3's module internals of that release). Not installed: accelerate and the
benchmark's packages (rich, loguru, datasets, ...): ``dflash/model.py`` imports none of them."""

COUNTING = """\
A step is one target verify forward after the prefill on both sides. Both prefills emit the target's next token
after the prompt and give the drafter the prompt's features (the target layers `dflash_config.target_layer_ids`).
Every later step runs one drafter forward on the block [last committed token, B - 1 mask tokens] over the context
rows it has not cached yet, verifies the block in one target forward, and commits the accepted drafts and the
target's next token: the official loop records `acceptance_length + 1` per step (its `acceptance_lengths`), which
is specbench's emitted count. The official loop keeps the target's next token in `output_ids` as the next block's
root; like specbench, its count belongs to the step that produced it.

Budget: the official loop runs while its committed tokens before the held root are fewer than `max_new_tokens`, so
it may run one step after the budget is reached; it drafts B - 1 tokens to the end and cuts its output to
`max_new_tokens`. specbench drafts at most `remaining - 1` and cuts its last step to the budget. EOS: both stop once
an EOS id is among the committed tokens (the held root included; the official `stop_token_ids` = the job's EOS
ids) and cut the output after the first one. The official trace is cut by specbench's rule (EOS kept, then the
budget) before it is compared.
"""

DIFFERENCES = """\
- **Last step** (not changed): the official loop drafts B - 1 tokens up to the end and may commit past the budget;
  specbench drafts only what the remaining budget can emit. The block attends to itself without a causal mask, so a
  row's draft depends on how many masks follow it; specbench's drafter still runs the full block of B rows and cuts
  the chain after it, so the drafts it verifies are the official ones and the cut counts are the same.
- **Drafter cache**: the official drafter keeps a `DynamicCache` of the context and block keys/values and crops it
  to the committed positions after each draft forward; specbench keeps the context keys/values only. The keys the
  next block attends to are the same.
- **Numerics**: the official models are transformers 4.57's Llama target and the authors' Qwen3-module drafter
  (sdpa attention, float32); specbench's target is transformers 5's Llama and its drafter its own layers (sdpa,
  float32). A near-tie could flip an argmax; it would show as a differing count.
"""

SIDE = SideEnv(".venv-parity-dflash", OFFICIAL_PINS, SOURCE)


def first_draft_difference(official: Sequence[Sequence[int]], ours: Sequence[Sequence[int]]) -> int | None:
    """The first step (1-based) whose specbench drafts are not the start of the official ones (specbench drafts
    fewer at the budget's end); None when every step both sides took agrees."""
    for step, (theirs, mine) in enumerate(zip(official, ours), 1):
        if list(theirs[: len(mine)]) != list(mine):
            return step
    return None


def draft_lines(rows: list[Row]) -> list[str]:
    """The section on the drafted tokens: per prompt, the tokens compared and the first step whose drafts differ."""
    lines = [
        "## Drafted tokens",
        "",
        "Each step's drafted tokens on both sides (official: the block its target verified, root excluded; "
        "specbench: the chain its drafter proposed, which the budget may cut short), over the steps both took.",
        "",
        "| case | dataset | prompt | steps compared | drafted tokens compared | first step whose drafts differ |",
        "|---|---|---|---|---|---|",
    ]
    same = 0
    for row in rows:
        official, ours = row.official_record["drafts"], row.ours_record["drafts"]
        step = first_draft_difference(official, ours)
        same += step is None
        compared = sum(len(mine) for mine in ours[: len(official)])
        lines.append(
            f"| {row.case} | {row.dataset} | {row.prompt} | {min(len(official), len(ours))} | {compared} | "
            f"{'–' if step is None else step} |"
        )
    return [*lines, "", f"The same drafts at every step: {same}/{len(rows)} prompts.", ""]


DRIVER = Driver(
    method="dflash",
    side=SIDE,
    script="scripts/parity/dflash_official.py",
    counting=COUNTING,
    differences=DIFFERENCES,
    default_datasets=("humaneval=2", "mt_bench=2"),
    extra=draft_lines,
)

CASE_OVERRIDES = {"b16": (), "b5": ("method.drafter.block_size=5",)}
"""B = 16 (specbench's default, the block the drafter here was trained with, the authors' Qwen3 drafters') and B = 5."""
CASE_LABELS = tuple(CASE_OVERRIDES)


def drafter_folder(node, target_name: str) -> str:
    """The folder of the drafter a ``model.dflash`` node names (trained here, or a ``hub`` node's local folder): the
    official loop loads it with ``from_pretrained``; a missing trained drafter raises ModelUnavailable."""
    from specbench.models.medusa_heads import head_source
    from specbench.models.parts import part_kind

    source = head_source(node, "dflash", target_name)
    if source == "trained":
        return str(part_kind("dflash").built(target_name)[0])
    folder = Path(os.path.expanduser(str(node["path"]))) if source == "hub" else None
    if folder is None or not (folder / "config.json").is_file():
        raise SystemExit(
            "error: the official loop loads the DFlash drafter from a folder: set model.dflash to the trained "
            "drafter (source: trained) or a folder (source: hub, path: <folder>)"
        )
    return str(folder)


def watch_drafts(engine) -> Callable[[], dict]:
    """Records the tokens specbench's drafter drafts at each step of the next generation (its ``propose``, shadowed
    on the instance); the function returned gives them as the record's ``drafts``."""
    drafter = engine.drafter
    propose = type(drafter).propose
    drafts: list[list[int]] = []

    def recorded(ctx):
        tree = propose(drafter, ctx)
        drafts.append(tree.tokens[1:])
        return tree

    drafter.propose = recorded
    return lambda: {"drafts": drafts}


def cases(lm) -> list[Case]:
    """Every case, with B and the drafter's folder read from the run config specbench composes for it."""
    out = []
    for label, overrides in CASE_OVERRIDES.items():
        drafter = stepwise.greedy_config("dflash", overrides).method.drafter
        folder = drafter_folder(drafter.draft, drafter.target_name)
        out.append(Case(label, overrides, {"block_size": int(drafter.block_size), "draft_dir": folder}, watch_drafts))
    return out


def main(argv: list[str] | None = None) -> int:
    """``stepwise.run`` on the DFlash drafter of ``model.dflash``, once its folder is known."""
    try:
        cases(None)  # resolves the drafter's folder: a missing one is named before any model loads
    except ModelUnavailable as error:
        raise SystemExit(f"error: {error}") from None
    return stepwise.run(DRIVER, argv, cases, CASE_LABELS)


if __name__ == "__main__":
    sys.exit(main())
