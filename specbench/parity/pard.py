"""PARD parity: AMD-AGI/PARD's own loop (``pard/pard_infer.py``) vs specbench's ``Pard`` drafter, step for step.

Both sides run the PARD draft of ``model.pard`` (``python -m specbench.train pard model=smollm2_135m`` writes it in
the authors' layout: a causal LM folder whose config names its mask token ``pard_token``; ``--draft DIR`` runs
another folder on both sides) with the same K. The official first target forward is the prefill and also verifies
the K tokens the draft drafted from the prompt; specbench's prefill emits one token and its first step drafts from
it. Every later step of both is the same function of the committed tokens (draft the K tokens after them from the
committed tokens and K - 1 masks, verify the last committed token and the K drafts), so the traces take the same
steps from the first committed count both reach; the table's extra section shows where they meet.
"""

from __future__ import annotations

import copy
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

from specbench.errors import ModelUnavailable
from specbench.parity import stepwise
from specbench.parity.common import OfficialSource, SideEnv
from specbench.parity.stepwise import Case, Driver, Row

SOURCE = OfficialSource("pard", "https://github.com/AMD-AGI/PARD", "6f279bf3f1680e0b5d71c562ca5b91bdeef4c038")
"""The head of main (2026-06-10, "Create CONTRIBUTING.md"), with PARD-2; PARD-1's ``pard/pard_infer.py`` runs here."""

OFFICIAL_PINS = ("transformers==4.51.3", "loguru", "click")
"""What ``make parity METHOD=pard`` installs beside torch: the commit's requirement.txt pins transformers 4.51.3
(``StaticCache`` with ``cache_position``), and ``pard_infer.py`` imports loguru and click. Not installed: trl,
deepspeed, wandb, numba (training only)."""

COUNTING = """\
A step is one target forward after the first one on both sides. specbench's first forward (the prefill) emits
one token; the official one (the prefill too) verifies the K tokens the draft drafted from the prompt and
commits the accepted ones and the target's next token ("official prefill tokens" below). Every later forward
verifies the last committed token and K drafts, which the draft drafted in one forward from the committed
tokens it has not read and K - 1 mask tokens (`pard_token`), and commits the accepted drafts and the target's
next token, on both sides. Where the official prefill commits more than one token the per-step lists start
from different committed counts (first differing step 0); a step's count depends only on the committed
tokens, so from the first count both traces reach, they must take the same steps ("Where the traces meet").

Budget: the official loop stops once its generated count reaches `tokens` (= `max_new_tokens`), so its last
step may run past it, and it drafts K tokens to the end; specbench drafts at most `remaining - 1` and cuts its
last step to the budget. EOS: both stop at a committed EOS (the official loop checks its tokenizer's one EOS
id; SmolLM2 has one). The official trace is cut by specbench's rule (EOS kept, then the budget) before it is
compared.
"""

DIFFERENCES = """\
- **First forward** (not changed): the official prefill verifies K drafts drafted from the prompt alone, so it
  can commit up to K + 1 tokens; specbench's prefill is the shared loop's (the prompt, one token) and PARD
  drafts from the second forward on. This moves at most the start of a trace: see "Where the traces meet".
- **Last step** (not changed): the official loop drafts K tokens up to the end and may commit past the budget;
  specbench drafts only what the remaining budget can emit. A drafted token does not depend on how many
  masks follow it (the draft is causal), so the cut counts are the same.
- **Numerics**: the official models are transformers 4.51's Llama (eager attention, a static cache) in float32,
  specbench's transformers 5 (sdpa, a dynamic cache); the draft also reads the committed tokens in other chunks
  before the traces meet. A near-tie could flip an argmax; a differing count after the traces meet shows it.
"""

SIDE = SideEnv(".venv-parity-pard", OFFICIAL_PINS, SOURCE)

CASE_OVERRIDES = {"k8": (), "k4": ("method.drafter.num_draft_tokens=4",)}
"""K = 8 (specbench's default, the authors' training ``para_num``) and K = 4."""
CASE_LABELS = tuple(CASE_OVERRIDES)


def committed_before(first: int, emitted: Sequence[int]) -> list[int]:
    """Tokens committed before each step of a trace whose prefill committed ``first``."""
    return list(itertools.accumulate(emitted[:-1], initial=first)) if emitted else []


def meeting(row: Row) -> tuple[int | None, bool]:
    """The specbench step at which both traces start a step from the same committed count (1-based; None when they
    never do), and whether every step from there on has the same count on both sides."""
    ours = committed_before(1, row.ours)
    official = committed_before(row.official_first, row.official)
    shared = set(ours) & set(official)
    if not shared:
        return None, False
    i, j = ours.index(min(shared)), official.index(min(shared))
    return i + 1, row.ours[i:] == row.official[j:]


def meeting_lines(rows: list[Row]) -> list[str]:
    """The section on where the traces meet: per prompt, the official prefill's tokens and the step they meet at."""
    lines = [
        "## Where the traces meet",
        "",
        "The first specbench step that starts from a committed count the official trace also starts a step from, "
        "and whether all steps from there on emit the same counts on both sides (same rules: yes).",
        "",
        "| case | dataset | prompt | official prefill tokens | meet at specbench step | same steps from there |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        step, same = meeting(row)
        where = "never" if step is None else str(step)
        lines.append(
            f"| {row.case} | {row.dataset} | {row.prompt} | {row.official_first} | {where} | "
            f"{'–' if step is None else stepwise.yes(same)} |"
        )
    met = [meeting(row) for row in rows]
    met_count, same_count = sum(step is not None for step, _ in met), sum(same for _, same in met)
    return [*lines, "", f"Met: {met_count}/{len(rows)}; the same steps from there: {same_count}/{len(rows)}.", ""]


DRIVER = Driver(
    method="pard",
    side=SIDE,
    script="scripts/parity/pard_official.py",
    counting=COUNTING,
    differences=DIFFERENCES,
    default_datasets=("humaneval=2", "mt_bench=2"),
    extra=meeting_lines,
)


def compose(overrides: tuple[str, ...]):
    """The composed run config of ``method=pard`` under ``overrides``."""
    from specbench.config import compose_config

    return compose_config("model=smollm2_135m", "method=pard", "temperature=0", *overrides)


TARGET_STAND_IN = "target"
"""``--draft target``: the target itself with a mask token appended (``target_stand_in``), a diagnostic draft."""


def stand_in_dir() -> Path:
    """Where ``target_stand_in`` writes the target-as-draft folder."""
    from specbench.paths import cache_root

    return cache_root() / "parity" / "pard-target"


def target_stand_in(lm) -> Path:
    """The target with a new mask token appended (``with_mask_token``: its embedding row the mean row) in the
    authors' layout, written once into ``stand_in_dir()``: its first drafted token is the target's own next token,
    so an official prefill commits more than one token whenever the masks guess nothing (a diagnostic draft)."""
    from specbench.files import atomic_dir
    from specbench.models.pard import with_mask_token

    folder = stand_in_dir()
    if not (folder / "config.json").is_file():
        draft = copy.deepcopy(lm.model)
        with_mask_token(draft, None)
        with atomic_dir(folder) as staging:
            draft.save_pretrained(staging)
            lm.tokenizer.save_pretrained(staging)
    return folder


def cases_with(draft: str | None):
    """The cases, each with ``model.pard.path`` = the ``draft`` folder when one is given (``target``: the target
    stand-in, written once the model is loaded); K and the draft's folder read from the composed config."""
    from specbench.models.draft import draft_location

    folder = str(stand_in_dir()) if draft == TARGET_STAND_IN else draft
    extra = (f"model.pard.path={folder}",) if folder else ()

    def cases(lm) -> list[Case]:
        if draft == TARGET_STAND_IN and lm is not None:
            target_stand_in(lm)
        out = []
        for label, overrides in CASE_OVERRIDES.items():
            drafter = compose((*overrides, *extra)).method.drafter
            if drafter.mask_token is not None or drafter.draft_vocab is not None:
                raise SystemExit("error: the official loop reads the mask token from the draft and drafts over all ids")
            folder = draft_location(drafter.draft, drafter.target_name, "", "pard")[0]
            out.append(
                Case(label, (*overrides, *extra), {"draft_k": int(drafter.num_draft_tokens), "draft_dir": folder})
            )
        return out

    return cases


def main(argv: list[str] | None = None) -> int:
    """``stepwise.run`` on the PARD draft of ``model.pard``; ``--draft DIR`` (or ``target``) runs another one."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--draft",
        default=None,
        help="a PARD draft folder (default: the model config's); `target`: "
        "the target with a mask token appended, a diagnostic draft",
    )
    given = sys.argv[2:] if argv is None else argv
    known, rest = parser.parse_known_args(given)
    cases = cases_with(known.draft)
    try:
        cases(None)  # resolves the draft's folder: a missing one is named before any model loads
    except ModelUnavailable as error:
        raise SystemExit(f"error: {error}") from None
    return stepwise.run(DRIVER, rest, cases, CASE_LABELS, shown_argv=given)


if __name__ == "__main__":
    sys.exit(main())
