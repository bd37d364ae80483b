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
tree plus the branch rows). ``branch_filling=diagonal`` starts as the official code does instead:
``N_b+L-3`` padded branches run once after the prompt (the official prefill's branch rows), then each
of ``L-3`` drafting-only steps drops the first branch and the next one loses its pad.

The ``official_*`` switches reproduce rules of the authors' code (ZipECHO/Self-Draft@38bf7fe) that
differ from the paper's description or from ours; ``specbench.parity.self_draft`` compares both step
for step.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from specbench.core.drafter import DecodeContext, Drafter, knob_int
from specbench.core.tree import AuxBlock, DraftTree
from specbench.core.verify import compact_cache
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


BRANCH_FILLINGS = ("direct", "diagonal")


def pad_predictions(model, cache, position: int, pads: list[list[int]]) -> list[int]:
    """Greedy token after each pad, every pad run alone after the ``position`` cached rows (KV dropped again).

    The pads sit at positions ``position ..`` and see the cache plus their own earlier tokens: the official
    prefill's branch rows, run here as one forward of their own on the prompt's cache.
    """
    lengths = tuple(len(pad) for pad in pads)
    offsets, allowed = branch_layout(lengths)  # [m], [m, m]
    m, device = sum(lengths), model.device
    ids = torch.tensor([token for pad in pads for token in pad], device=device)[None]  # [1, m]
    mask = torch.zeros(m, position + m, dtype=model.dtype, device=device)  # [m, past + m]
    mask[:, position:].masked_fill_(~allowed.to(device), torch.finfo(model.dtype).min)
    out = model(
        input_ids=ids,
        position_ids=(position - 1 + offsets).to(device)[None],
        attention_mask=mask[None, None],
        past_key_values=cache,
        use_cache=True,
    )
    compact_cache(cache, position, [])
    last = (torch.tensor(lengths).cumsum(0) - 1).to(device)  # [branches] each pad's last row
    return out.logits[0, last].argmax(dim=-1).tolist()


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
        "pad_forwards",
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
        branch_filling: str = "direct",
        official_context_update: bool = False,
        official_corpus_lookup: bool = False,
        official_flush: bool = False,
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
        if branch_filling not in BRANCH_FILLINGS:
            raise ConfigError(
                f"method.drafter.branch_filling must be one of {', '.join(BRANCH_FILLINGS)}; got {branch_filling!r}"
            )
        if branch_filling == "diagonal" and self.branch_len < 3:
            raise ConfigError("method.drafter.branch_filling=diagonal needs branch_len (L) >= 3")
        if official_context_update and self.branch_num < 2:
            raise ConfigError("method.drafter.official_context_update needs branch_num (N_b) >= 2")
        self.use_context = bool(use_context_cache)
        self.use_corpus = bool(use_corpus_cache)
        self.official_step_cap = bool(official_step_cap)
        self.branch_filling = branch_filling
        self.needs_dynamic_cache = branch_filling == "diagonal"  # its pads run on the target's cache (ctx.cache)
        self.official_context_update = bool(official_context_update)
        self.official_corpus_lookup = bool(official_corpus_lookup)
        self.official_flush = bool(official_flush)
        self.corpus_cfg = corpus
        self.corpus_cache: CorpusCache | None = None
        self.target = None  # the target model (diagonal filling runs the pads on it once per generation)
        self.forget()

    # -- Drafter interface -------------------------------------------------------------------------

    def forget(self) -> None:
        """An empty context cache, no conversation or generation seen (the corpus cache stays: read once per run)."""
        self.pool = NGramPool(self.max_val_len, "max_val_len")  # persists across generations
        self.snapshot = self.pool  # the context cache as the latest new prompt found it
        self.conversations = 0
        self.turns = 0  # generations that were not replays (official_flush counts these)
        self.flushes = 0
        self.last_prompt: list[int] = []
        self.prompt: list[int] = []
        self.branches: list[list[int]] = []  # [] until the first step of a generation starts them
        self.caps: list[int] = []
        self.harvested = 0  # committed tokens already keyed into the context cache this generation
        self._step_candidates: tuple[list, list] = ([], [])

    def setup(self, target, tokenizer) -> None:
        """Keep the target; load (or build once) the corpus cache for its tokenizer."""
        self.target = target
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
            self.turns += 1
            self.snapshot = self.pool.copy()
        self.last_prompt = prompt
        self.prompt = prompt
        self.branches = []
        self.harvested = 0

    def recall(self, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """The context cache holds the drafting branches' n-grams (the target's predictions at the aux rows), which the
        output alone does not tell: the generation runs again (False)."""
        return False

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Context + corpus candidates as a trie (none during start-up); the branches as aux rows."""
        if not self.branches:
            self._init_branches(ctx)
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
        starting = self.starting
        if self.use_context and not starting:
            self._update_context_cache(ctx.tokens, accepted.emitted(tree)[0], branch_preds)
        self._extend_branches(branch_preds, root_pred)
        if starting and self.branch_filling == "diagonal":
            self._drop_first_branch()

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
        if self._flush_due():
            self.pool.keep_recent(self.keep_num)
            self.flushes += 1
        self.conversations += 1

    def _flush_due(self) -> bool:
        """After every ``flush_interval`` conversations; official: when (turns so far + 1) % flush_interval == 0."""
        if not self.flush_interval:
            return False
        if self.official_flush:
            return self.turns > 0 and (self.turns + 1) % self.flush_interval == 0
        return self.conversations > 0 and self.conversations % self.flush_interval == 0

    def _draw_pads(self, count: int, generator: torch.Generator | None) -> list[list[int]]:
        """``count`` pads of 1..``max_pad_len`` random prompt tokens from the run's RNG (lengths, then tokens)."""
        lengths = torch.randint(1, self.max_pad_len + 1, (count,), generator=generator).tolist() if count else []
        return [random_prompt_tokens(self.prompt, n, generator) for n in lengths]

    def _init_branches(self, ctx: DecodeContext) -> None:
        """The branches at a generation's first step (``branch_filling``), each capped at its pad + ``L-2`` tokens.

        direct: branch 0 starts empty (it continues ``x``), the others with their pads. diagonal (official):
        ``N_b+L-3`` pads, the first ``L-2`` cut to one token, each run once after the prompt; branch 0 keeps
        only its pad's prediction, the others their pad and its prediction.
        """
        levels = self.branch_len - 2
        if self.branch_filling == "direct":
            self.branches = [[], *self._draw_pads(self.branch_num - 1, ctx.generator)]
            self.caps = [len(pad) + levels for pad in self.branches]
            return
        if ctx.cache is None:
            raise RuntimeError("branch_filling=diagonal runs the pads on the target's KV cache; the context has none")
        pads = self._draw_pads(self.branch_num + levels - 1, ctx.generator)
        pads = [pad[:1] for pad in pads[:levels]] + pads[levels:]
        preds = pad_predictions(self.target, ctx.cache, ctx.position, pads)
        self.books.add(pad_forwards=1)
        self.branches = [[preds[0]], *([*pad, pred] for pad, pred in zip(pads[1:], preds[1:]))]
        self.caps = [levels, *(len(pad) + levels for pad in pads[1:])]

    def _drop_first_branch(self) -> None:
        """Diagonal filling: branch 0 goes; the next branch loses its pad and continues ``x`` instead."""
        del self.branches[0], self.caps[0]
        pad = self.caps[0] - (self.branch_len - 2)
        del self.branches[0][:pad]
        self.caps[0] -= pad

    def _candidates(self, tokens: list[int]) -> tuple[list[tuple], list[tuple]]:
        """Up to ``max_val_len`` most recent context tuples keyed by ``x``, then corpus continuations."""
        context = self.pool.query(tokens[-1], self.max_val_len) if self.use_context else []
        if not self.use_corpus:
            return context, []
        room = self.max_val_len - len(context)
        limit = min(self.corpus_max, room) if room > 0 else min(self.corpus_max, 2)  # NOTE: official rule
        assert self.corpus_cache is not None  # setup loads it whenever use_corpus is set
        return context, self.corpus_cache.lookup(tokens, limit, exclude=context, refill=not self.official_corpus_lookup)

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
        first = max(0, self.harvested - gram - 1)  # the official code re-keys a few tokens each step
        committed = tokens[first:]
        text = committed + self.branches[0]  # committed tokens (x last), then branch 0 continuing x
        text_preds = committed[1:] + [next_token] + branch_preds[0]
        grams = list(windows(text, text_preds, gram))
        if self.official_context_update and len(committed) >= gram:
            grams = self._official_text_grams(grams, tokens, next_token, len(committed), branch_preds[1])
        for key, value in [*self._padded_grams(branch_preds), *grams]:
            self.pool.insert(key, value)
        self.harvested = len(tokens)

    def _padded_grams(self, branch_preds: list[list[int]]) -> list[tuple[int, tuple[int, ...]]]:
        """The n-grams of branches 1..N_b-1 (pads included), branch by branch; official: level by level.

        The official code aligns the branches at their ends (shorter pads padded in front) and walks the
        rows from the oldest token on, each row across the branches; the order is the LRU recency within a step.
        """
        longest = max((len(branch) for branch in self.branches[1:]), default=0)
        ordered = []
        for b, (branch, preds) in enumerate(zip(self.branches[1:], branch_preds[1:])):
            shift = longest - len(branch)
            for k, gram in enumerate(windows(branch, preds, self.gram)):
                ordered.append(((k + shift, b) if self.official_context_update else (b, k), gram))
        return [gram for _, gram in sorted(ordered, key=lambda item: item[0])]

    def _official_text_grams(
        self, grams: list, tokens: list[int], next_token: int, committed: int, branch1_preds: list[int]
    ) -> list[tuple[int, tuple[int, ...]]]:
        """The official committed-text n-grams: the one ending at ``x`` takes its last token from branch 1's pad
        row (an indexing slip), then the n-gram keyed at ``x`` is inserted again and the correct one keyed
        ``G`` tokens back is inserted last."""
        gram = self.gram
        slip = committed - gram  # index of the n-gram keyed at tokens[-G]: its last token follows x
        key, value = grams[slip]
        pad = self.caps[1] - (self.branch_len - 2)
        grams[slip] = key, (*value[:-1], branch1_preds[pad - 1])
        return [*grams, grams[committed - 1], (tokens[-gram], (*tokens[len(tokens) - gram + 1 :], next_token))]

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
