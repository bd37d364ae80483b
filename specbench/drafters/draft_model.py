"""Draft-model machinery shared by SpeDe, OPT-Tree and the fixed-tree baselines.

- the draft itself is loaded by ``specbench.models.draft.load_draft`` (the model config's ``draft`` node).
- ``DraftLM``: the draft model with its OWN KV cache. After each step the cache holds a prefix of
  the committed tokens without the new root (the target's correction/bonus token, never drafted).
  ``sync`` catches up lazily from ``ctx.tokens`` (crop to the shared prefix, feed the rest); chains
  grow with ``extend``; trees grow one layer per forward with ``tree_layer`` (each row sees the
  committed prefix and its own ancestors); ``rollback`` / ``keep_tree_rows`` drop what the target
  rejected and keep the accepted rows, so they are not fed again.
- ``DraftModelDrafter``: the Drafter base that loads the draft in ``setup``, times propose/observe
  (``draft_s``) and reports draft forwards, drafted and accepted tokens.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, Drafter
from specbench.core.tree import DraftTree
from specbench.core.verify import compact_cache, new_cache
from specbench.drafters.tree_fill import pick_children
from specbench.errors import ConfigError
from specbench.models.draft import load_draft, vocab_width
from specbench.models.loading import eos_token_ids
from specbench.models.vocab import DraftVocabulary, ReducedHead, draft_vocabulary, size_knob
from specbench.structures.tree_rows import TreeRowMask


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (binary search over C-speed slice compares)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo]; a[:hi + 1] may differ
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class DraftLM:
    """A draft model with its own KV cache, kept equal to a prefix of the committed tokens between steps.

    ``tokens`` are the tokens whose KV rows are cached, in order; a tree step appends tree rows after
    them (``tree_tokens``) until ``keep_tree_rows`` keeps the accepted ones. Logits come back in the
    target's vocabulary width (a smaller draft vocabulary is padded with -inf, a larger one cut).
    """

    def __init__(self, model, target_vocab: int, oov_id: int = 0, vocabulary: DraftVocabulary | None = None):
        self.model = model
        self.draft_vocab = vocab_width(model)
        self.target_vocab = target_vocab
        self.oov_id = oov_id  # fed in place of target ids the draft does not know (CodeLlama's extra ids)
        self.output = self._reduced_output(vocabulary)  # None: the model's own LM head over its whole vocabulary
        self.reset()

    def _reduced_output(self, vocabulary: DraftVocabulary | None) -> ReducedHead | None:
        """The draft's LM head restricted to a reduced draft vocabulary (target ids the draft must know)."""
        if vocabulary is None:
            return None
        if int(vocabulary.tokens.max()) >= self.draft_vocab:
            raise ConfigError(
                f"method.drafter.draft_vocab: the ranking holds target ids beyond the draft's {self.draft_vocab} "
                f"tokens; a reduced draft vocabulary needs a draft with the target's tokenizer"
            )
        return ReducedHead(self.model.get_output_embeddings().weight, vocabulary.tokens)

    def reset(self) -> None:
        """An empty cache for a new generation; counters back to zero."""
        self.cache = new_cache(self.model)
        self.tokens: list[int] = []
        self._drop_tree_state()
        self.forwards = 0  # draft forward passes this generation
        self.fed = 0  # tokens fed through the draft this generation

    @property
    def cache_length(self) -> int:
        """Rows held in the draft cache (committed prefix + any tree rows of the current step)."""
        return self.cache.get_seq_length()

    def sync(self, tokens: list[int]) -> torch.Tensor:
        """Make the cache hold ``tokens`` (crop to the shared prefix, feed the rest); logits [vocab] after the last."""
        return self.sync_with_tail(tokens, [])[-1]

    def sync_with_tail(self, tokens: list[int], tail: list[int]) -> torch.Tensor:
        """``sync`` to ``tokens``, then run ``tail`` (draft ids that stand for positions not known yet: PARD's mask
        tokens) after them in the same causal forward; logits [len(tail) + 1, vocab] (float32) after the last of
        ``tokens`` and after each tail token. The tail's rows leave the cache again."""
        self.keep_tree_rows([])
        keep = min(common_prefix(self.tokens, tokens), len(tokens) - 1)
        self.crop(keep)
        return self._feed(tokens[keep:], tail)

    def extend(self, tokens: list[int]) -> torch.Tensor:
        """Feed ``tokens`` causally after the cached ones; logits [vocab] (float32) after the last of them."""
        return self._feed(tokens, [])[-1]

    def _feed(self, tokens: list[int], tail: list[int]) -> torch.Tensor:
        """One cached forward over ``tokens`` then ``tail``; logits [len(tail) + 1, vocab] after the last token and
        each tail token. The tokens stay in the cache, the tail's rows leave it."""
        ids = torch.tensor([self._draft_ids(tokens) + list(tail)], device=self.model.device)  # [1, k + tail]
        logits = self._forward(len(tail) + 1, input_ids=ids, past_key_values=self.cache)  # [tail + 1, vocab]
        self._count(len(tokens) + len(tail))
        self.tokens.extend(tokens)
        if tail:
            compact_cache(self.cache, len(self.tokens), [])  # the tail's rows go
        return logits

    def tree_layer(self, tokens: list[int], parent_rows: list[int], depth: int) -> torch.Tensor:
        """Feed one layer of a draft tree in one forward; logits [k, vocab] (float32), one row per node.

        Node ``i`` sits at ``depth`` under the tree row ``parent_rows[i]`` (-1 = the root, the last cached
        committed token). Each row sees the committed prefix, its ancestors' tree rows and itself.
        """
        k, past = len(tokens), len(self.tokens)
        mask = self._tree_mask.add(parent_rows, past, self.model.dtype)  # [k, cached + k] additive
        device = self.model.device
        logits = self._forward(
            None,
            input_ids=torch.tensor([self._draft_ids(tokens)], device=device),
            position_ids=torch.full((1, k), past - 1 + depth, dtype=torch.long, device=device),
            attention_mask=mask[None, None].to(device),
            past_key_values=self.cache,
        )
        self._count(k)
        self.tree_tokens.extend(tokens)
        return logits

    def keep_tree_rows(self, rows: list[int]) -> None:
        """End a tree step: keep tree rows ``rows`` (an accepted path, root side first), drop the others."""
        if not self.tree_tokens:
            return
        compact_cache(self.cache, len(self.tokens), rows)
        self.tokens.extend(self.tree_tokens[r] for r in rows)
        self._drop_tree_state()

    def rollback(self, committed: list[int]) -> None:
        """After a chain step: keep the cached rows that lie on ``committed`` minus its last token (the next root)."""
        self.crop(min(common_prefix(self.tokens, committed), len(committed) - 1))

    def crop(self, length: int) -> None:
        """Keep the first ``length`` cached tokens."""
        if length < len(self.tokens):
            compact_cache(self.cache, length, [])
            del self.tokens[length:]

    def teacher_forced(self, tokens: list[int]) -> torch.Tensor:
        """The draft's logits after every prefix of ``tokens`` (target ids), float32 [len(tokens), target vocab], in a
        fresh cache of their own (calibration; the decode cache is untouched)."""
        ids = torch.tensor([self._draft_ids(tokens)], device=self.model.device)  # [1, len]
        return self._forward(None, input_ids=ids)

    def _forward(self, rows: int | None, **inputs) -> torch.Tensor:
        """One cached draft forward over a batch of one; float32 logits in the target's width of its last ``rows``
        rows, [rows, vocab] (None: every row), from the reduced output layer when there is one."""
        if self.output is None:
            kept = {"logits_to_keep": rows} if rows else {}
            return self._target_logits(self.model(**inputs, use_cache=True, **kept).logits[0])
        hidden = self.model.base_model(**inputs, use_cache=True).last_hidden_state[0]  # [k, H]
        return self._target_logits(self.output(hidden[-rows:] if rows else hidden))

    def _drop_tree_state(self) -> None:
        """Forget the current step's tree rows (their KV is gone or kept by the caller)."""
        self.tree_tokens: list[int] = []
        self._tree_mask = TreeRowMask()  # which tree rows each tree row sees

    def _count(self, fed: int) -> None:
        """Book one draft forward over ``fed`` tokens."""
        self.forwards += 1
        self.fed += fed

    def _draft_ids(self, tokens: list[int]) -> list[int]:
        """Target ids as draft input ids (ids beyond the draft's vocabulary become its unknown token)."""
        if self.draft_vocab >= self.target_vocab:
            return tokens
        return [t if t < self.draft_vocab else self.oov_id for t in tokens]

    def _target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., draft_vocab] as float32 [..., target_vocab]."""
        logits = logits.float()
        if self.draft_vocab > self.target_vocab:
            return logits[..., : self.target_vocab]
        if self.draft_vocab < self.target_vocab:
            return torch.nn.functional.pad(logits, (0, self.target_vocab - self.draft_vocab), value=float("-inf"))
        return logits


class DraftModelDrafter(Drafter):
    """Base of the drafters that run a separate draft model: loading and shared stats.

    Subclasses implement ``draft_tree`` (the tree to verify) and ``update`` (draft-cache rollback
    and any schedule). At T > 0 drafts are drawn from the draft's distribution warped like the target's (the run's
    sampling, from the decode context).
    """

    COUNTERS: ClassVar[tuple[str, ...]] = ("steps", "drafted", "accepted_tokens")
    reads_sampling = True
    DRAFT_PART: ClassVar[str] = "draft"
    """The part kind whose model node ``draft`` names (``specbench.models.parts``): the distilled draft's, or PARD's."""

    def __init__(
        self,
        draft=None,
        target_name: str = "target",
        draft_vocab: int | None = None,
    ):
        super().__init__()
        self.draft_cfg = draft
        self.target_name = target_name
        self.draft_vocab = size_knob(draft_vocab)
        self.vocabulary: DraftVocabulary | None = None
        self.lm: DraftLM | None = None
        self.draft_path: str | None = None
        self.draft_part = ""
        self.eos_ids: frozenset[int] = frozenset()

    def setup(self, target, tokenizer) -> None:
        """Load the draft model beside the target (its LM head restricted to the ``draft_vocab`` most frequent
        target tokens when that is set)."""
        loaded = load_draft(self.draft_cfg, self.target_name, target, tokenizer, self.DRAFT_PART)
        oov = getattr(loaded.tokenizer, "unk_token_id", None)
        self.vocabulary = draft_vocabulary(self.draft_vocab, self.target_name, vocab_width(target))
        self.lm = DraftLM(loaded.model, vocab_width(target), oov if oov is not None else 0, self.vocabulary)
        self.draft_path = loaded.path
        self.draft_part = loaded.part
        self.eos_ids = eos_token_ids(target, tokenizer)

    def reset(self, prompt_ids: list[int]) -> None:
        """A fresh draft cache per generation (the prompt is fed at the first sync)."""
        assert self.lm is not None  # loaded by setup
        self.lm.reset()

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Draft this step's tree with the draft model."""
        tree = self.draft_tree(ctx)
        self.books.add(steps=1, drafted=tree.num_drafted)
        return tree

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified, accepted: Acceptance) -> None:
        """Count accepted tokens (on the verified path, before EOS/budget cuts); roll the draft cache back."""
        self.books.add(accepted_tokens=len(accepted.path) - 1)
        self.update(ctx, tree, accepted)

    def draft_tree(self, ctx: DecodeContext) -> DraftTree:
        """The tree to verify this step; node 0 is ``ctx.root``."""
        raise NotImplementedError

    def update(self, ctx: DecodeContext, tree: DraftTree, accepted: Acceptance) -> None:
        """Draft-cache rollback (and schedules) after the target verified ``tree``."""
        raise NotImplementedError

    def pick(self, logits: torch.Tensor, k: int, ctx: DecodeContext) -> tuple[list[int], torch.Tensor | None]:
        """``k`` children from draft logits [vocab] and the q [vocab] they were drawn from (None: top-k, at T = 0)."""
        return pick_children(logits, k, ctx.draft_law(True), ctx.generator)

    def artefacts(self) -> list[str]:
        """The draft model (its weights digest when distilled here) and any reduced draft vocabulary."""
        return [self.draft_part] + ([self.vocabulary.part] if self.vocabulary else [])

    def stats(self) -> dict:
        """Draft model, forwards, drafted/accepted tokens of the latest generation."""
        books = self.books
        return {
            **books.report(),
            "draft_model": self.draft_path,
            "drafted_per_step": books.per("drafted", "steps"),
            "accepted_per_step": books.per("accepted_tokens", "steps"),
            "draft_hit_ratio": books.per("accepted_tokens", "drafted"),
            "draft_forwards": self.lm.forwards if self.lm else 0,
            "draft_tokens_fed": self.lm.fed if self.lm else 0,
        }
