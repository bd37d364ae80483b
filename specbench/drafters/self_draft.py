"""Self-Draft: multi-branch self-drafting (Gao et al., AAAI-25), on the shared loop.

Every step runs ONE target forward over ``[x] + candidates + drafting branches``:

- ``N_b`` *drafting branches* (aux rows, block-diagonal causal masks): branch 0 continues ``x``
  directly, branches ``1..N_b-1`` start with a pad of 1..``max_pad_len`` random prompt tokens. Each
  step appends only the branch's LAST prediction; a branch keeps at most ``pad + L - 2`` tokens
  (so at most ``L``) and drops its oldest token beyond that. Every window of ``G`` branch tokens plus
  the prediction after it is an n-gram for the context cache;
- the *context cache* (``NGramPool``: first token -> at most ``max_val_len`` ``G``-token tuples, LRU)
  also gets the n-grams of the committed text (the whole prompt at a generation's first update) and
  of branch 0 continuing it. It persists across generations within a run: after every
  ``flush_interval`` conversations it keeps only the ``keep_num`` most recent tuples per key;
- the *corpus cache* (static, mined offline; ``specbench.structures.corpus_cache``) adds up to
  ``corpus_max`` continuations of the longest matching context suffix;
- candidates (context first, then corpus) are merged into a trie and verified in the same forward.

Start-up (docs/methods/self_draft.md#start-up): the first ``L-2`` steps only draft (a root-only
tree plus the branch rows).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from specbench.core.drafter import DecodeContext, Drafter, knob_int
from specbench.core.tree import AuxBlock, DraftTree
from specbench.drafters.jacobi import random_prompt_tokens, row_argmax
from specbench.errors import ConfigError
from specbench.structures.pool import NGramPool

if TYPE_CHECKING:
    from specbench.structures.corpus_cache import CorpusCache


@functools.lru_cache(maxsize=256)
def branch_layout(lengths: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Position offsets [m] and block-diagonal causal mask [m, m] of branches with these lengths.

    Branch rows sit at positions ``p+1..p+len`` and see the root plus their own earlier rows only
    (paper Fig 3b). Cached per length tuple; never mutate.
    """
    m = sum(lengths)
    offsets = torch.cat([torch.arange(1, n + 1) for n in lengths]) if m else torch.zeros(0, dtype=torch.long)
    mask = torch.zeros(m, m, dtype=torch.bool)  # [m, m]
    start = 0
    for n in lengths:
        mask[start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool).tril()
        start += n
    return offsets, mask


def windows(tokens: list[int], preds: list[int], gram: int, start: int = 0):
    """(key, value) n-grams: key ``tokens[k]``, value ``tokens[k+1 .. k+gram-1]`` + the prediction after them."""
    for k in range(start, len(tokens) - gram + 1):
        yield tokens[k], (*tokens[k + 1 : k + gram], preds[k + gram - 1])


class SelfDraft(Drafter):
    """Self-Draft drafter: drafting branches (aux rows) + context cache + corpus cache."""

    COUNTERS = (
        "steps",
        "warmup_steps",
        "context_candidates",
        "corpus_candidates",
        "steps_with_candidates",
        "aux_rows",
        "hit_steps",
        "accepted_from_context",
        "accepted_from_corpus",
    )

    def __init__(
        self,
        branch_len: int = 6,
        branch_num: int = 6,
        gram_len: int = 4,
        max_pad_len: int = 2,
        max_val_len: int = 10,
        corpus_max: int = 3,
        flush_interval: int = 2,
        keep_num: int = 2,
        use_context_cache: bool = True,
        use_corpus_cache: bool = True,
        official_step_cap: bool = False,
        corpus=None,
    ):
        super().__init__()
        self.branch_len = knob_int("branch_len", branch_len, 2, "L")
        self.branch_num = knob_int("branch_num", branch_num, 1, "N_b")
        knob_int("gram_len", gram_len, 1, "G")
        self.gram = min(gram_len, self.branch_len - 1)  # official clamp: context_gram_n = min(G, L-1)
        self.max_pad_len = knob_int("max_pad_len", max_pad_len, 1)
        self.max_val_len = knob_int("max_val_len", max_val_len, 1)
        self.corpus_max = knob_int("corpus_max", corpus_max, 0)
        self.flush_interval = knob_int("flush_interval", flush_interval, 0)
        self.keep_num = knob_int("keep_num", keep_num, 0)
        if not (use_context_cache or use_corpus_cache):
            raise ConfigError(
                "method.drafter.use_context_cache and method.drafter.use_corpus_cache are both "
                "false: Self-Draft would verify no candidates (use method=ar for plain decoding)"
            )
        if official_step_cap and self.gram < 2:
            raise ConfigError("method.drafter.official_step_cap needs a gram length min(G, L-1) >= 2")
        self.use_context = bool(use_context_cache)
        self.use_corpus = bool(use_corpus_cache)
        self.official_step_cap = bool(official_step_cap)
        self.corpus_cfg = corpus
        self.corpus_cache: CorpusCache | None = None
        self.pool = NGramPool(self.max_val_len, "max_val_len")  # persists across generations
        self.snapshot = self.pool  # the context cache as the latest new prompt found it
        self.conversations = 0
        self.flushes = 0
        self.last_prompt: list[int] = []
        self.prompt: list[int] = []
        self.branches: list[list[int]] = []  # [] until the first step of a generation starts them
        self.caps: list[int] = []
        self.harvested = 0  # committed tokens already keyed into the context cache this generation
        self._step_candidates: tuple[list, list] = ([], [])

    # -- Drafter interface -------------------------------------------------------------------------

    def setup(self, target, tokenizer) -> None:
        """Load (or build once) the corpus cache for the target's tokenizer."""
        if self.use_corpus and self.corpus_cache is None:
            if self.corpus_cfg is None:
                raise ConfigError(
                    "drafter.corpus (the corpus cache source) is missing; set it or pass drafter.use_corpus_cache=false"
                )
            from specbench.corpus import corpus_cache_for

            self.corpus_cache = corpus_cache_for(tokenizer, self.corpus_cfg)

    def reset(self, prompt_ids: list[int]) -> None:
        """New branches per generation; the context cache persists (flush/keep per conversation).

        A prompt identical to the previous one replays that generation: the context cache goes back
        to its state before it, so untimed warm-up generations leave no trace in the timed ones.
        """
        prompt = list(prompt_ids)
        if prompt == self.last_prompt:
            self.pool = self.snapshot.copy()
        else:
            if not (self.last_prompt and prompt[: len(self.last_prompt)] == self.last_prompt):
                self._start_conversation()
            self.snapshot = self.pool.copy()
        self.last_prompt = prompt
        self.prompt = prompt
        self.branches = []
        self.harvested = 0

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Context + corpus candidates as a trie (none during start-up); the branches as aux rows."""
        if not self.branches:
            self._init_branches(ctx.generator)
        context, corpus = ([], []) if self.starting else self._candidates(ctx.tokens)
        self._step_candidates = (context, corpus)
        paths = context + corpus
        if self.official_step_cap and paths:
            cap = max(len(path) for path in paths) - 1
            paths = [path[:cap] for path in paths]
        tree = DraftTree.from_paths(ctx.root, paths)
        tree.aux = self._branch_block()
        self.books.add(
            steps=1,
            warmup_steps=self.starting,
            context_candidates=len(context),
            corpus_candidates=len(corpus),
            steps_with_candidates=bool(paths),
            aux_rows=len(tree.aux) if tree.aux is not None else 0,
        )
        return tree

    def observe(self, ctx, tree, verified, accepted) -> None:
        """Harvest branch and committed n-grams into the context cache, then extend every branch."""
        self._count_accepted([tree.tokens[i] for i in accepted.path[1:]])
        preds = row_argmax(verified.aux_logits, 0, verified.aux_logits.shape[0]) if tree.aux is not None else []
        root_pred = int(verified.logits[0].argmax())  # branch 0's next token (always greedy, like the code)
        branch_preds = self._split(preds)
        if self.use_context and not self.starting:
            self._update_context_cache(ctx.tokens, accepted.emitted(tree)[0], branch_preds)
        self._extend_branches(branch_preds, root_pred)

    def stats(self) -> dict:
        """Cache sizes, candidates and aux rows per step, hit rate, where accepted tokens came from."""
        books = self.books
        return {
            **books.report(),
            "context_keys": len(self.pool),
            "context_tuples": self.pool.num_tuples,
            "corpus_keys": len(self.corpus_cache) if self.corpus_cache is not None else 0,
            "conversations": self.conversations,
            "flushes": self.flushes,
            "context_candidates_per_step": books.per("context_candidates", "steps"),
            "corpus_candidates_per_step": books.per("corpus_candidates", "steps"),
            "aux_rows_per_step": books.per("aux_rows", "steps"),
            "hit_rate": books.per("hit_steps", "steps_with_candidates"),
        }

    def artefacts(self) -> list[str]:
        """The corpus cache, when one is used."""
        return [self.corpus_cache.part] if self.corpus_cache is not None else []

    # -- internals ---------------------------------------------------------------------------------

    @property
    def starting(self) -> bool:
        """True during start-up: branch 0 (which has no pad) has fewer than ``L-2`` drafted tokens."""
        return len(self.branches[0]) < self.caps[0]

    def _start_conversation(self) -> None:
        """A prompt that does not extend the previous one starts a conversation; flush every few."""
        if self.flush_interval and self.conversations and self.conversations % self.flush_interval == 0:
            self.pool.keep_recent(self.keep_num)
            self.flushes += 1
        self.conversations += 1

    def _init_branches(self, generator: torch.Generator | None) -> None:
        """Branch 0 starts empty (it continues ``x``); the others start with random prompt-token pads."""
        levels = self.branch_len - 2
        pad_lens = [0] + (
            torch.randint(1, self.max_pad_len + 1, (self.branch_num - 1,), generator=generator).tolist()
            if self.branch_num > 1
            else []
        )
        self.branches = [random_prompt_tokens(self.prompt, n, generator) for n in pad_lens]
        self.caps = [n + levels for n in pad_lens]

    def _candidates(self, tokens: list[int]) -> tuple[list[tuple], list[tuple]]:
        """Up to ``max_val_len`` most recent context tuples keyed by ``x``, then corpus continuations."""
        context = self.pool.query(tokens[-1], self.max_val_len) if self.use_context else []
        if not self.use_corpus:
            return context, []
        room = self.max_val_len - len(context)
        limit = min(self.corpus_max, room) if room > 0 else min(self.corpus_max, 2)  # NOTE: official rule
        assert self.corpus_cache is not None  # setup loads it whenever use_corpus is set
        return context, self.corpus_cache.lookup(tokens, limit, exclude=context)

    def _branch_block(self) -> AuxBlock | None:
        """All branches as aux rows (layout cached per tuple of branch lengths); None when all are empty."""
        lengths = tuple(len(branch) for branch in self.branches)
        if not sum(lengths):
            return None
        offsets, mask = branch_layout(lengths)
        tokens = torch.tensor([token for branch in self.branches for token in branch], dtype=torch.long)  # [m]
        return AuxBlock(tokens, offsets, mask)

    def _split(self, preds: list[int]) -> list[list[int]]:
        """Per-branch predictions from the flat aux-row predictions."""
        out, start = [], 0
        for branch in self.branches:
            out.append(preds[start : start + len(branch)])
            start += len(branch)
        return out

    def _update_context_cache(self, tokens: list[int], next_token: int, branch_preds: list[list[int]]) -> None:
        """Insert every G-window of the padded branches, and of committed text continued by branch 0."""
        gram = self.gram
        for branch, preds in zip(self.branches[1:], branch_preds[1:]):
            for key, value in windows(branch, preds, gram):
                self.pool.insert(key, value)
        first = max(0, self.harvested - gram - 1)  # the official code re-keys a few tokens each step
        committed = tokens[first:]
        text = committed + self.branches[0]  # committed tokens (x last), then branch 0 continuing x
        text_preds = committed[1:] + [next_token] + branch_preds[0]
        for key, value in windows(text, text_preds, gram):
            self.pool.insert(key, value)
        self.harvested = len(tokens)

    def _extend_branches(self, branch_preds: list[list[int]], root_pred: int) -> None:
        """Append each branch's last prediction; beyond its cap the oldest token is dropped."""
        for branch, preds, cap in zip(self.branches, branch_preds, self.caps):
            branch.append(preds[-1] if preds else root_pred)
            if len(branch) > cap:
                del branch[0]

    def _count_accepted(self, drafted: list[int]) -> None:
        """Credit accepted drafted tokens to the context cache when one of its candidates holds them."""
        if not drafted:
            return
        context, _ = self._step_candidates
        n = len(drafted)
        from_context = any(list(c[:n]) == drafted for c in context)
        self.books.add(hit_steps=1, **{"accepted_from_context" if from_context else "accepted_from_corpus": n})
