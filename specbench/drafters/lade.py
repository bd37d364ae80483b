"""LADE: Lookahead Decoding (Fu et al., ICML 2024), on the shared loop.

Every step runs ONE target forward over ``[x] + verification branch + lookahead window``:

- the *lookahead window* (aux rows) is a 2-D grid of ``W`` columns by ``N-1`` levels; level 0 is a
  causal chain starting at ``x`` (column 0 of level 0 *is* ``x``), level ``l`` column ``j`` sits at
  position ``p+j+l`` and sees level 0 up to column ``j`` plus its own column in levels ``1..l``. Each
  column read top-down is a Jacobi trajectory; the last level's argmax outputs ``new[j]`` extend it;
- the *n-gram pool* stores every column's ``(N-1)``-token trajectory keyed by its level-0 token,
  at most ``G`` tuples per key (LRU);
- the *verification branch* is every pool tuple keyed by ``x`` (up to ``G``), merged into a trie.

Warm-up (docs/methods/lade.md#warm-up): level 0 starts as ``W+N-3`` random prompt tokens that ride
after the prompt in the prefill forward (``prefill_tail``), whose argmax gives level 1, as in the
official code; for ``N-3`` more steps the window grows one level per step (each level drops its first
column as ``x`` advances) and nothing is verified. Then the window shifts by one level per step
(``ALWAYS_FWD_ONE``). ``prefill_window=false`` starts level 0 in the first decode step instead
(``N-2`` warm-up steps, the prefill is the prompt alone).
"""

from __future__ import annotations

import functools

import torch

from specbench.core.drafter import DecodeContext, Drafter, knob_choice, knob_int
from specbench.core.tree import AuxBlock, DraftTree
from specbench.drafters.jacobi import random_prompt_tokens, row_argmax
from specbench.errors import ConfigError
from specbench.models.loading import eos_token_ids
from specbench.structures.pool import NGramPool

WINDOW_EOS = ("replace", "keep")
"""``window_eos``: a Jacobi token equal to EOS is replaced by a random prompt token, or kept."""


@functools.lru_cache(maxsize=64)
def window_layout(columns: int, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position offsets [m] and mask [m, m] of a lookahead window with ``columns`` x ``levels`` cells.

    Row order: level 0 columns ``1..columns-1`` (column 0 is the root ``x``, not an aux row), then
    level ``l`` columns ``0..columns-1`` for ``l = 1..levels-1``. Cached per shape; never mutate.
    """
    cells = [(0, j) for j in range(1, columns)] + [(l, j) for l in range(1, levels) for j in range(columns)]
    row = {cell: i for i, cell in enumerate(cells)}
    offsets = torch.tensor([j + l for l, j in cells], dtype=torch.long)  # [m]
    mask = torch.zeros(len(cells), len(cells), dtype=torch.bool)  # [m, m]
    for i, (level, col) in enumerate(cells):
        for j in range(1, col + 1):
            mask[i, row[(0, j)]] = True  # the level-0 chain up to this column
        for l in range(1, level + 1):
            mask[i, row[(l, col)]] = True  # this column in levels 1..level (itself included)
    return offsets, mask


class Lade(Drafter):
    """LADE drafter: lookahead window (aux rows) + n-gram pool + verification branch."""

    COUNTERS = (
        "steps",
        "warmup_steps",
        "candidates",
        "steps_with_candidates",
        "aux_rows",
        "hit_steps",
        "accepted_draft_tokens",
    )

    def __init__(
        self,
        window_size: int = 15,
        ngram_size: int = 5,
        guess_set_size: int = 15,
        pool_from_prompt: bool = False,
        official_step_cap: bool = True,
        prefill_window: bool = True,
        window_eos: str = "replace",
    ):
        super().__init__()
        self.window = knob_int("window_size", window_size, 1, "W")
        self.ngram = knob_int("ngram_size", ngram_size, 2, "N")
        self.guess = knob_int("guess_set_size", guess_set_size, 1, "G")
        if official_step_cap and ngram_size < 3:
            raise ConfigError(
                "method.drafter.official_step_cap needs ngram_size (N) >= 3: the cap verifies N-2 tokens "
                "(the official loop accepts nothing at N = 2); set official_step_cap=false for N = 2"
            )
        self.pool_from_prompt = bool(pool_from_prompt)
        self.official_step_cap = bool(official_step_cap)
        # the official start (level 0 rides in the prefill, level 1 comes free) needs a level 1 (N >= 3)
        self.prefill_window = bool(prefill_window) and self.ngram >= 3
        self.window_eos = knob_choice("window_eos", window_eos, WINDOW_EOS)
        self.eos_ids: frozenset[int] = frozenset()
        self.pool = NGramPool(self.guess, "guess_set_size")
        self.prompt: list[int] = []
        self.levels: list[list[int]] = []  # levels[0]: columns 1..; levels[l >= 1]: columns 0..; [] = not started
        self.generator: torch.Generator | None = None
        self.harvested = 0  # prompt pool: tokens before this index already keyed n-grams

    # -- Drafter interface -------------------------------------------------------------------------

    def setup(self, target, tokenizer) -> None:
        """Learn the EOS ids (an EOS in the window is replaced by a prompt token, as the official code does)."""
        self.eos_ids = eos_token_ids(target, tokenizer)

    def reset(self, prompt_ids: list[int]) -> None:
        """A fresh pool and window per generation (the official pool lives inside one ``generate`` call)."""
        self.prompt = list(prompt_ids)
        self.pool.clear()
        self.levels = []
        self.harvested = 0
        if self.pool_from_prompt:
            self._harvest(self.prompt)

    def prefill_tail(self, generator: torch.Generator | None) -> list[int]:
        """The official start: level 0's ``W+N-3`` random prompt tokens ride after the prompt in the prefill."""
        if not self.prefill_window:
            return []
        self.generator = generator
        self.levels = [random_prompt_tokens(self.prompt, self.window + self.ngram - 3, generator)]
        return list(self.levels[0])

    def observe_prefill(self, tail_logits: torch.Tensor) -> None:
        """Level 1 = the prefill's argmax at the level-0 tokens; level 0 drops its first (the first output's slot)."""
        self.levels = [self.levels[0][1:], row_argmax(tail_logits, 0, tail_logits.shape[0])]
        self._replace_eos(self.levels[-1])

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Verification branch = pool tuples keyed by ``x``; aux rows = the lookahead window."""
        if not self.levels:
            self.generator = ctx.generator
            self.levels = [random_prompt_tokens(self.prompt, self.window + self.ngram - 3, ctx.generator)]
        candidates = [] if self.warming_up else self.pool.query(ctx.root, self.guess)
        if self.official_step_cap:
            candidates = [c[: self.ngram - 2] for c in candidates]
        tree = DraftTree.from_paths(ctx.root, candidates)
        tree.aux = self._window_block()
        self.books.add(
            steps=1,
            warmup_steps=self.warming_up,
            candidates=len(candidates),
            steps_with_candidates=bool(candidates),
            aux_rows=len(tree.aux),
        )
        return tree

    def observe(self, ctx, tree, verified, accepted) -> None:
        """Read the window's new Jacobi tokens, grow the pool, shift the window."""
        accepted_drafts = len(accepted.path) - 1
        self.books.add(accepted_draft_tokens=accepted_drafts, hit_steps=accepted_drafts > 0)
        new = self._new_tokens(verified)
        if self.warming_up:
            self.levels = [level[1:] for level in self.levels] + [new[1:]]
        else:
            self._update_pool(ctx.root, new)
            shifted = [*self.levels[1:], new]  # every level moves down; level 0 loses the old x column
            self.levels = [shifted[0][1:], *shifted[1:]]
        self._replace_eos(self.levels[-1])
        if self.pool_from_prompt:
            self._harvest(ctx.tokens[self.harvested :] + accepted.emitted(tree))

    def stats(self) -> dict:
        """Pool size, candidates and aux rows per step, hit rate, warm-up steps (counters of the books)."""
        books = self.books
        return {
            **books.report(),
            "pool_keys": len(self.pool),
            "pool_tuples": self.pool.num_tuples,
            "candidates_per_step": books.per("candidates", "steps"),
            "aux_rows_per_step": books.per("aux_rows", "steps"),
            "hit_rate": books.per("hit_steps", "steps_with_candidates"),
        }

    # -- internals ---------------------------------------------------------------------------------

    @property
    def warming_up(self) -> bool:
        """True until all ``N-1`` levels of the window exist (no verification before that)."""
        return len(self.levels) < self.ngram - 1

    def _window_block(self) -> AuxBlock:
        """The current window as aux rows (layout cached per window shape)."""
        offsets, mask = window_layout(len(self.levels[0]) + 1, len(self.levels))
        tokens = torch.tensor([token for level in self.levels for token in level], dtype=torch.long)  # [m]
        return AuxBlock(tokens, offsets, mask)

    def _new_tokens(self, verified) -> list[int]:
        """Argmax at every column of the last level (always greedy, as in the official code)."""
        columns = len(self.levels[0]) + 1
        if len(self.levels) == 1:  # the last level is level 0, whose column 0 is the root row
            root = int(verified.logits[0].argmax())
            return [root, *row_argmax(verified.aux_logits, 0, columns - 1)]
        first = columns - 1 + (len(self.levels) - 2) * columns
        return row_argmax(verified.aux_logits, first, first + columns)

    def _update_pool(self, root: int, new: list[int]) -> None:
        """Insert every column's trajectory, keyed by its level-0 token (``x`` for column 0)."""
        level0 = self.levels[0]
        upper = self.levels[1:]
        for j, token in enumerate(new):
            key = root if j == 0 else level0[j - 1]
            self.pool.insert(key, (*(level[j] for level in upper), token))

    def _replace_eos(self, level: list[int]) -> None:
        """Swap any EOS in a fresh level for a random prompt token (official ``filter_window``; not in
        lade 0.0.2 on PyPI, whose window keeps it: ``window_eos=keep``)."""
        if self.window_eos == "keep":
            return
        for j, token in enumerate(level):
            if token in self.eos_ids:
                level[j] = random_prompt_tokens(self.prompt, 1, self.generator)[0]

    def _harvest(self, tail: list[int]) -> None:
        """Prompt pool: insert the complete n-grams of ``tail`` (the tokens from ``self.harvested`` on)."""
        value_len = self.ngram - 1
        self.pool.insert_sequence(tail, value_len)
        self.harvested += max(len(tail) - value_len, 0)
