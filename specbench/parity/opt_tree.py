"""OPT-Tree parity: Jikai0Wang/OPT-Tree's own loop (``opt_classic``) vs specbench's ``OptTree`` drafter, step for step.

Both sides run the embedded SmolLM2-135M-Instruct target with the distilled draft specbench trains
(``python -m specbench.train draft model=smollm2_135m``; the official side gets its folder as
``draft_model_path``) and the same node budget n, threshold delta and depth counter: the official
evaluation defaults (n 50, delta 0.5, max_depth 10, specbench's defaults too), the README's
evaluation command's n = 60, and a diagnostic: n 50 with the official draft's tree mask repaired.
"""

from __future__ import annotations

from specbench.parity.common import OfficialSource, SideEnv
from specbench.parity.stepwise import Case, Driver, run

SOURCE = OfficialSource(
    "opt_tree", "https://github.com/Jikai0Wang/OPT-Tree", "4f87f54e8543f9038d10aac32f286d7f14b7407b"
)
"""The last commit (2024-08-11, "fix bug for device error"): ``opt_classic`` (draft models) and ``opt_eagle``."""

OFFICIAL_PINS = ("transformers==4.41.0",)
"""What ``setup opt_tree`` installs beside torch: the release's requirements.txt pins transformers 4.41.0
(and torch 2.0.1, fschat, accelerate, gradio for its demos and eval scripts, which the parity script
does not import); its modelling file (``opt_classic/modeling_llama_kv.py``) follows the 4.31 Llama code."""

COUNTING = """\
A step is one tree verify forward after the prefill on both sides. specbench's prefill emits the first
token and each step emits the accepted drafts plus the target's next token. The official loop
(`SPModel.spgenerate`) makes the prefill's token the root of the first tree; each step commits the root
and the accepted drafts (`accept_length + 1`) and holds the target's next token as the next root, so
the same verify forwards give the same per-step counts, and the official output with its held token
equals specbench's output.

Budget: the official loop runs to its own rule (`new_token > max_new_tokens`, `new_token` = committed
tokens, i.e. it stops once committed + held >= `max_new_tokens` + 2) and never limits the tree's depth
to what the budget leaves, so its last step or two verify deeper trees than specbench's and its output
overshoots the budget. specbench stops at `max_new_tokens` emitted tokens and builds no layer deeper
than `remaining - 1` (`min(max_depth - 1, remaining - 1)`), so at a budget-limited end its last trees
hold more shallow nodes (the same layers, fewer of them, the same top-n rule). Both traces are cut by
specbench's rule (EOS kept, then the budget) before they are compared ("official steps (specbench's
rule)"); the official loop's own count is shown beside it. EOS: the official loop stops when EOS is among
its committed tokens, so a held EOS costs it one more step; specbench stops at an emitted EOS; the cut
removes that step. The official evaluation script prints iterations - 1 as its step count (and
hard-codes its budget at 1024, ignoring `--max-new-token`); the parity script counts verify forwards.
"""

DIFFERENCES = """\
- **The official draft's tree mask keeps stale entries** (official bug; specbench not changed).
  `Tree.add` (opt_classic/tree.py) marks each new node's parent in an n x n block
  (`kv_cache_mask[rows, parents] = 1`), copies the block into the draft's tree mask, then sets the same
  entries to 1 again instead of clearing them. From the third layer on, node i of a layer therefore
  also attends to the rows of the previous layer that the earlier layers' node i had as parents, so
  the draft's distributions at depth >= 4 differ from those of the tree the paper describes (each node
  sees its ancestors), which specbench builds. Most steps are unaffected (the stale entry often is the
  true parent); where they differ, the official E_d and therefore the tree's depth and nodes differ,
  and with them the accepted length. The verify mask is correct on both sides, so outputs equal AR.
  The diagnostic case `n50-mask-fixed` clears the block after each layer (a run-time wrapper): the
  official trace then equals specbench's at every step.
- **Depth capped by the budget** (specbench, not changed): no layer deeper than `remaining - 1` is
  built, since such nodes could never be emitted; the official loop builds its usual tree and
  overshoots. Only the last steps of a budget-limited generation (remaining <= the tree's depth) can
  differ: a capped tree holds the same or more nodes at every depth it keeps, so specbench accepts at
  least as many of the tokens the budget still allows. Prompts that stop at EOS earlier are unaffected.
- **One draft forward less per step** (specbench, not changed): the official loop feeds the newest
  layer, builds the next one, tests `E_d - E_{d-1} > delta` (which needs only layers 1..d) and, when it
  stops, discards the layer it just built; specbench tests first and skips that forward. Same trees.
- **Draft KV of accepted tokens** (not changed): the official draft re-encodes the tokens committed
  since its last call; specbench keeps the rows its tree forward already computed for the accepted path.
  Equal in exact arithmetic; float rounding could flip a near-tie in a top-n (not seen here).
- **Ties in the final top-n** (not changed): the official `torch.topk` over the flattened layers picks
  among equal p̂ in an unspecified order (and can pick a node whose parent it left out when p̂ is 1.0 or
  underflows to 0); specbench prefers the shallower, then the earlier node. Not seen here.
- **Step reporting and budget of the official evaluation** (not changed): it prints iterations - 1 and
  stops at 1024 committed tokens whatever `--max-new-token` says.
"""

SIDE = SideEnv(".venv-parity-opt_tree", OFFICIAL_PINS, SOURCE)
DRIVER = Driver(
    method="opt_tree",
    side=SIDE,
    script="scripts/parity/opt_tree_official.py",
    counting=COUNTING,
    differences=DIFFERENCES,
    default_datasets=("mt_bench=5", "humaneval=5"),
)

CASE_LABELS = ("n50", "n60", "n50-mask-fixed")


def cases(lm) -> list[Case]:
    """The official evaluation defaults (specbench's too), the README's node budget 60, and the mask diagnostic."""
    official = {"nodes": 50, "threshold": 0.5, "max_depth": 10}
    return [
        Case("n50", (), official),
        Case("n60", ("method.drafter.nodes=60",), {**official, "nodes": 60}),
        Case("n50-mask-fixed", (), {**official, "fix_draft_mask": True}),
    ]


def draft_dir(lm) -> dict:
    """The distilled draft's folder (``specbench.train draft`` first: a clear error when it is missing)."""
    from specbench.models.draft import distilled_dir

    return {"draft_dir": str(distilled_dir("smollm2_135m")[0])}


def main(argv: list[str] | None = None) -> int:
    return run(DRIVER, argv, cases, CASE_LABELS, draft_dir)
