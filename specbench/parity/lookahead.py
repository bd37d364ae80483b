"""Lookahead parity: the official PainlessInferenceAcceleration generate vs specbench's ``Lookahead``, step for step.

Three draft modes (the official ``decoding_mode`` hier / par / one = specbench's ``method.drafter.mode``
hierarchical / parallel / single, i.e. ``method=lookahead``, ``lookahead_parallel``, ``lookahead_single``),
each at specbench's defaults and with the ``official-rules`` switches on (``OFFICIAL_RULES``: the drafter's
options that reproduce the official code's rules), at the code's defaults L_d = 64 and L_b = 12.
"""

from __future__ import annotations

from specbench.parity.common import OfficialSource, SideEnv
from specbench.parity.stepwise import Case, Driver, run

SOURCE = OfficialSource(
    "lookahead",
    "https://github.com/alipay/PainlessInferenceAcceleration",
    "78c9b002749f86a2dc601af3d02c5eaf6cc91507",
)
"""The head of main (2026-01-23); its ``lookahead/lookahead`` package is unchanged since bfa2fec (2025-03-14)."""

OFFICIAL_PINS = (
    "transformers==4.36.0",
    "tokenizers==0.15.2",
    "huggingface-hub==0.20.3",
    "safetensors==0.4.5",
    "numpy==1.26.4",
)
"""What ``make parity METHOD=lookahead`` installs beside torch: the commit's ``lookahead/scripts/tests.sh``
runs its Llama example under transformers 4.36.0 (its requirements.txt still names 4.30.2, which lacks
what the Mistral modules import), with the tokenizers / hub / safetensors / numpy of that time."""

OFFICIAL_RULES = (
    "+method.drafter.cut_at_eos=true",
    "+method.drafter.insert_first_prompt_token=false",
    "+method.drafter.selection=output_threshold",
    "+method.drafter.query_fallback=official",
    "+method.drafter.node_pruning=official",
    "+method.drafter.branch_window=fixed",
)
"""The switches every ``*-official-rules`` case sets (docs/methods/lookahead.md, "Official rules")."""

DECODING_LENGTH, BRANCH_LENGTH = 64, 12  # the official and specbench defaults
CAPACITY = {"max_node": 32 * DECODING_LENGTH, "max_output_node": 16 * DECODING_LENGTH}
"""The official side's trie capacities: what ``benchmarks/benchmark.py`` sets (and specbench's default
``node_capacity_factor`` 32 / ``output_node_capacity_factor`` 16), not ``LookaheadCache()``'s 65536 / 512."""

COUNTING = """\
A step is one verify forward after the prefill on both sides. Both prefills emit the first token; each
official step adds `max_match_count + 1` tokens (its `edls`, the prefill's entry dropped), each specbench
step the accepted drafts plus the target's next token. Both sides clip the draft depth to the remaining
budget (the official `update_branch_length = min(branch_length, max_length - len(input_ids) - 1)`), so
neither runs past `max_new_tokens`; the official loop stops when a step's tokens hold EOS, as specbench's.
Both traces are still cut by specbench's rule before they are compared.

Memory: the official trie memory lives on the model (`model.lookahead_cache`) and is never reset by
`generate`. Each (case, dataset) starts both sides from an empty memory, without warm-up (the official
`LookaheadCache(eos_ids, max_node=32·64, max_output_node=16·64)` as `benchmarks/benchmark.py` builds it;
specbench's `build_engine`, `warmup.dataset: null`), then runs the dataset's prompts one at a time in
specbench's order, the memory carried from each prompt to the next on both sides (each request's end:
last output windows, elimination of its prompt's input frequencies, pruning once 1024 tries were updated).
The official side runs the non-batch path (`models/llama/modeling_llama.py` + `common/pretrained_model.py`,
`decoding_kwargs={use_lookahead, decoding_mode, decoding_length: 64, branch_length: 12}`, no stop words).
"""

DIFFERENCES = """\
Every rule in which the official code differs from specbench's drafter, and what was done about it. The
`*-official-rules` cases switch on every option below (`specbench.parity.lookahead.OFFICIAL_RULES`, plus
the mode's own) and match the official code step for step on every prompt, in all three modes. The default
cases show what specbench's defaults change. Switching one option at a time in specbench's hierarchical
case (the same 10 + 10 prompts at 64 tokens, specbench alone; not stored): on HumanEval the default's 261
steps become 398, the official total, with `cut_at_eos=true` alone (the EOS cut is the whole difference
there); on Dolly the default's 149 become 154 with `selection=output_threshold`
alone, 150 with `query_fallback=official`, and stay 149 with each other switch (official: 155). Options
are constructor defaults of `Lookahead`, outside `conf/method/lookahead.yaml` (so stored runs keep their
config digest): set them with `+method.drafter.<key>=<value>`. No default was changed. File references
are to the pinned commit.

- **Prompt cut at the first EOS** (option `cut_at_eos=true`). `LookaheadCache.put` and `stream_put`
  (`common/lookahead_cache.py`) cut every inserted sequence at its first EOS. specbench's chat-template
  prompts hold `<|im_end|>` (EOS) after the system message, so the official code inserts only the system
  text of a HumanEval prompt (18 of its ~150 tokens), none of the user's code. It also never stores EOS
  from outputs or warm-up answers; specbench's default inserts whole prompts and keeps the output's EOS.
  Dolly's `raw` prompts hold no EOS. This is the largest difference of the default cases on HumanEval.
- **First prompt token skipped** (`insert_first_prompt_token=false`). The official generate inserts
  `input_ids[1:]` (`common/pretrained_model.py`), so the window after the prompt's first token is lost.
- **Selection** (`selection=output_threshold`). `Tree.get` means to keep the top `L_d/2` nodes by output
  frequency plus the top by mixed frequency, but its list entries carry no node id (`[None, fi, fo, fm]`),
  so the mixed part never admits a node: with more than `L_d` candidates only `f_out` >= the `L_d/2`-th
  largest `f_out` qualifies (prompt-only nodes never do); with at most `L_d` every node qualifies,
  eliminated zero-frequency nodes included; candidates are counted at any depth, not to the draft depth.
  specbench's default keeps the intended union (and never drafts zero-frequency nodes). The docs claimed
  the two were the same rule; they are corrected.
- **Query fallback** (`query_fallback=official`). `hier_get` stops at the 2-token query when the draft has
  `branch_length` tokens *root included* (`one_get`: `branch_length // 2`), with `branch_length` clipped to
  the budget only; a 1-token query's result replaces the 2-token one even when it is empty or smaller;
  at a clipped `branch_length` of 1 it never falls back. specbench's default stops at
  `min(L_b, L_d - 1, remaining - 1)` drafted nodes and keeps the latest non-empty draft.
- **Pruning** (`node_pruning=official`). The official output-node counter counts the nodes output
  insertions *created* (all nodes after a squeeze); a prompt insertion marks for pruning only tries that
  existed before it; an emptied trie stays in memory; pruning runs only at a request's end (specbench's
  default also prunes right after the warm-up). Squeeze arithmetic and the 1024-trie trigger were the same.
- **Branch window** (`branch_window=fixed`). The official code stores `L_b + 1` tokens per branch whatever
  `max_query_length` is; specbench stores `L_b + max_query_length - 1`: the same at the default 2.
- **Parallel verify** (`parallel_verify=all_branches`, `parallel-official-rules` only). The official verify
  keeps every branch that matched so far and so accepts the longest prefix over all branches; specbench's
  greedy walk follows the first child holding the token, i.e. the first branch, and accepts fewer tokens
  when a later copy of the same prefix goes deeper. With the option, each branch's first token past the
  prefix it shares with earlier branches hangs under that prefix's first copy: the forward keeps the same
  tokens (the copies stay), the walk accepts what the official verify accepts. Without it the
  `parallel-official-rules` case takes 163 / 408 steps on Dolly / HumanEval instead of the official 158 / 401
  (specbench alone, not stored).
- **Single branch** (`single_ranking=output_first`, `single-official-rules` only). `get_one_branch` ranks
  children by `10000 * f_out + f_in` (its variables' names are swapped, so output frequency dominates);
  specbench's default follows the prompt-amplified `fm`. The official single branch is not capped by `L_d`
  (part of `query_fallback=official`).
- **Not reproduced.** (1) `Tree.get` / `get_one_branch` take the root as `match_token_id or self.token_id`,
  so a query ending in token 0 feeds the trie's key token as the root: a bug that would break losslessness
  (token 0, `<|endoftext|>`, does not occur in these prompts or outputs). (2) Warm-up: the official
  benchmark script (not `generate`) inserts the model's own outputs on dev prompts after an end-of-prompt
  token; specbench warms up with the dataset's reference answers (docs); no case here warms up.
  (3) The batch path (`modeling_llama_batch.py`, the README's benchmark) differs again (prompt without its
  last token, `decoding_length // batch` per row, stop words); the pinned comparison is the non-batch path.
"""

SIDE = SideEnv(".venv-parity-lookahead", OFFICIAL_PINS, SOURCE)
DRIVER = Driver(
    method="lookahead",
    side=SIDE,
    script="scripts/parity/lookahead_official.py",
    counting=COUNTING,
    differences=DIFFERENCES,
    default_datasets=("dolly=10", "humaneval=10"),
)

MODES = (
    ("hierarchical", "hier", ()),
    ("parallel", "par", ("+method.drafter.parallel_verify=all_branches",)),
    ("single", "one", ("+method.drafter.single_ranking=output_first",)),
)
"""specbench's ``method.drafter.mode``, the official ``decoding_mode``, and the mode's own official-rules switches."""
CASE_LABELS = tuple(label for mode, _, _ in MODES for label in (mode, f"{mode}-official-rules"))


def cases(lm) -> list[Case]:
    """Each draft mode at specbench's defaults and with the official rules switched on."""
    found = []
    for mode, official_mode, mode_rules in MODES:
        official = {
            "decoding_mode": official_mode,
            "decoding_length": DECODING_LENGTH,
            "branch_length": BRANCH_LENGTH,
            **CAPACITY,
        }
        base = (f"method.drafter.mode={mode}",)
        found.append(Case(mode, base, official))
        found.append(Case(f"{mode}-official-rules", (*base, *OFFICIAL_RULES, *mode_rules), official))
    return found


def main(argv: list[str] | None = None) -> int:
    return run(DRIVER, argv, cases, CASE_LABELS)
