"""SAM-Decoding (Hu et al., 2024): drafts copied after the longest suffix match, found by suffix automata.

Each step the drafter knows, in amortised O(1) per committed token (``specbench.structures.suffix_automaton``):

- the *dynamic* match: the longest suffix of the context (prompt + committed output, root included) that
  also ended at an earlier position, read off the dynamic automaton that grows with every committed token;
- optionally the *static* match: the longest suffix of the context that occurs in a text base, from a
  static automaton built once per run over the corpus tokenised with the target's tokenizer.

With match lengths ``l_dyn`` and ``l_static``, the static draft is used when ``l_static - l_bias > l_dyn``
(the corpus must beat the context by ``l_bias`` tokens), and either is used only when the chosen
length ``max(l_dyn, l_static - l_bias)`` reaches ``l_threshold``. The draft is the one chain of the
``n_predicts - 1`` tokens that followed the match's first occurrence. A shorter match goes to the
fallback: ``none`` verifies the root alone (an autoregressive step); ``token_recycling`` expands a static
tree over Token Recycling's successor table (``specbench.structures.successors``: the top-k candidates the
target ranked after each token, refreshed from the logits of every verify pass, SAM steps included). Chains and
recycled trees are deterministic given the history, so the ``match`` rule keeps sampling exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from specbench.core.drafter import DecodeContext, Drafter, knob_choice, knob_int, knob_name
from specbench.core.tree import DraftTree
from specbench.errors import ConfigError
from specbench.structures.suffix_automaton import SuffixAutomaton, SuffixMatcher

if TYPE_CHECKING:
    from specbench.structures.successors import SuccessorTable
    from specbench.structures.tree_shapes import TreeShape

FALLBACKS = ("none", "token_recycling")
RECYCLING_TREES = ("samd", "paper")
CORPUS_KEYS = ("files", "max_tokens")

SAMD_RECYCLING_CHILDREN: tuple[tuple[int, ...], ...] = (
    (7,),
    (6, 5, 3, 2, 2, 1, 1),
    (3, 2, 2, 1, 1, 0, 3, 2, 1, 1, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0),
    (2, 1, 0, 1, 0, 0, 0, 0, 0, 2, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0),
    (2, 0, 1, 0, 1, 0, 0, 0),
)
"""The Token Recycling tree of the official SAM-Decoding code (its ``config/token_recycle.json``, also shipped with
Spec-Bench's SAM-Decoding), as child counts per depth in breadth-first order (children take candidate ranks 0, 1,
...): 60 drafted nodes, 7 / 20 / 21 / 8 / 4 at depths 1 to 5, ranks below 7. Token Recycling's own paper tree
(80 nodes, 6 levels) is ``recycling_tree=paper``."""

_STATIC: dict[tuple, SuffixAutomaton] = {}
"""Static automata built in this process, by (corpus identity, tokenizer identity): a run's warm-up engine and
its measured engine (and the entries of a bench session) build the same one once."""


class SAMDecoding(Drafter):
    """SAM-Decoding's retrieval drafter: a dynamic (and optionally a static) suffix automaton, one chain per step."""

    COUNTERS: ClassVar[tuple[str, ...]] = (
        "steps",
        "dynamic_drafts",
        "static_drafts",
        "fallback_drafts",
        "drafted",
        "accepted_tokens",
        "accepted_dynamic",
        "accepted_static",
        "accepted_fallback",
        "match_length",  # summed over steps: the chosen match length max(l_dyn, l_static - l_bias)
    )

    def __init__(
        self,
        n_predicts: int = 40,
        len_threshold: int = 5,
        len_bias: int = 5,
        fallback: str = "none",
        topk: int = 8,
        recycling_tree: str = "samd",
        static_sam: bool = False,
        corpus: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        self.n_predicts = knob_int("n_predicts", n_predicts, 2, "n")
        self.len_threshold = knob_int("len_threshold", len_threshold, 1, "l_threshold")
        self.len_bias = knob_int("len_bias", len_bias, 0, "l_bias")
        self.fallback = knob_choice("fallback", fallback, FALLBACKS)
        self.topk = knob_int("topk", topk, 1, "k")
        self.recycling_tree = knob_choice("recycling_tree", recycling_tree, RECYCLING_TREES)
        if not isinstance(static_sam, bool):
            raise ConfigError(f"{knob_name('static_sam', None)} must be true or false, got {static_sam!r}")
        self.corpus = self._corpus_spec(corpus) if static_sam else None
        self.shape = self._recycling_shape() if self.fallback == "token_recycling" else None
        self.table: SuccessorTable | None = None  # M, sized to the target in setup (fallback=token_recycling)
        self.static: SuffixAutomaton | None = None
        self.static_part: str | None = None
        self.dynamic = SuffixAutomaton()
        self.matcher: SuffixMatcher | None = None
        self._source = "none"  # where this step's draft came from (for observe)

    # -- Drafter interface -------------------------------------------------------------------------

    def setup(self, target, tokenizer) -> None:
        """Size the successor table to the target (fallback=token_recycling); build (once per process and
        corpus) the static automaton over the corpus, when it is on."""
        if self.shape is not None and self.table is None:
            from specbench.structures.successors import SuccessorTable

            vocab = target.config.vocab_size
            if self.topk > vocab:
                raise ConfigError(f"{knob_name('topk', 'k')} = {self.topk} exceeds the target's vocabulary ({vocab})")
            rows = max(vocab, target.get_input_embeddings().num_embeddings)  # every id the target reads or writes
            self.table = SuccessorTable(rows, self.topk, target.device)
        if self.corpus is None or self.static is not None:
            return
        if tokenizer is None:
            raise ConfigError(
                f"{knob_name('static_sam', None)}=true needs the target's tokenizer to tokenise the corpus; "
                "this model has none"
            )
        self.static, self.static_part = static_automaton(self.corpus, tokenizer)

    def reset(self, prompt_ids: list[int]) -> None:
        """A fresh dynamic automaton over the prompt; the static matcher restarts on the prompt. The successor
        table is kept across requests (the official code never clears it)."""
        with self.books.timed("automaton"):
            self.dynamic = SuffixAutomaton(prompt_ids)
            self.matcher = SuffixMatcher(self.static) if self.static is not None else None
            if self.matcher is not None:
                self.matcher.extend(prompt_ids)

    def forget(self) -> None:
        """The Token Recycling fallback's table back to zeros (the automata are per request)."""
        if self.table is not None:
            self.table.reset()

    def recall(self, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """The automata are per request; the Token Recycling fallback's table, kept across requests, holds the
        target's top-k of every verified row: with it the generation runs again (False)."""
        return self.table is None

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Sync the automata with the committed tokens, then copy after the longer match (or fall back)."""
        with self.books.timed("automaton"):
            self._sync(ctx.tokens)
            state, l_dyn = self.dynamic.repeat()
            l_static = self.matcher.length - self.len_bias if self.matcher is not None else 0
            match = max(l_dyn, l_static)
            k = min(self.n_predicts - 1, ctx.remaining - 1)
            draft: list[int] = []
            source = "none"
            if match >= self.len_threshold and k > 0:
                if l_static > l_dyn:
                    assert self.matcher is not None and self.static is not None
                    draft, source = self.static.continuation(self.matcher.state, k, wrap=False), "static"
                else:
                    draft, source = self.dynamic.continuation(state, k, wrap=True), "dynamic"
        if draft:
            tree = DraftTree.chain(ctx.root, draft)
        elif self.shape is not None and ctx.remaining > 1:  # a short match: Token Recycling's static tree
            source = "fallback"
            tree = self._table().tree(ctx.root, self.shape.pruned(ctx.remaining - 1))
        else:  # no fallback: an autoregressive step
            source = "none"
            tree = DraftTree.root_only(ctx.root)
        self._source = source
        self.books.add(
            steps=1,
            drafted=tree.num_drafted,
            match_length=match,
            dynamic_drafts=source == "dynamic",
            static_drafts=source == "static",
            fallback_drafts=source == "fallback",
        )
        return tree

    def observe(self, ctx, tree, verified, accepted) -> None:
        """Count the drafted tokens the target accepted, by source (the automata learn them at the next propose);
        with the Token Recycling fallback, every verified row's top-k refreshes its token's row of the table."""
        if self.table is not None:
            self.table.update(tree.tokens, verified.logits)
        accepted_tokens = len(accepted.path) - 1  # on the verified path, before EOS/budget cuts
        self.books.add(accepted_tokens=accepted_tokens)
        if self._source != "none":
            self.books.add(**{f"accepted_{self._source}": accepted_tokens})

    def stats(self) -> dict[str, Any]:
        """The books, plus automaton sizes and per-step rates of the latest generation."""
        books = self.books
        drafts = books.counts["dynamic_drafts"] + books.counts["static_drafts"]
        return {
            **books.report(),
            "dynamic_states": self.dynamic.num_states,
            "static_states": self.static.num_states if self.static is not None else 0,
            "matrix_rows_filled": self.table.rows_filled if self.table is not None else 0,
            "retrieval_rate": drafts / books.counts["steps"] if books.counts["steps"] else 0.0,
            "mean_match_length": books.per("match_length", "steps"),
            "drafted_per_step": books.per("drafted", "steps"),
            "accepted_per_step": books.per("accepted_tokens", "steps"),
            "draft_hit_ratio": books.per("accepted_tokens", "drafted"),  # accepted / drafted tokens
        }

    def artefacts(self) -> list[str]:
        """The static corpus (named by its content digest), when one is used."""
        return [self.static_part] if self.static_part is not None else []

    # -- internals ---------------------------------------------------------------------------------

    def _recycling_shape(self) -> TreeShape:
        """The fallback's static tree as a ``TreeShape`` (refused clearly if the successor table is missing)."""
        try:
            from specbench.structures.successors import paths_from_children, recycling_tree
            from specbench.structures.tree_shapes import TreeShape
        except ImportError as error:
            raise ConfigError(
                f"{knob_name('fallback', None)}=token_recycling needs Token Recycling's successor table "
                f"(specbench.structures.successors), which cannot be imported here ({error}); use fallback=none"
            ) from None
        shape = (
            recycling_tree()
            if self.recycling_tree == "paper"
            else TreeShape.from_paths(paths_from_children(SAMD_RECYCLING_CHILDREN))
        )
        if max(shape.ranks) >= self.topk:
            raise ConfigError(
                f"{knob_name('topk', 'k')} = {self.topk} is too small for the {self.recycling_tree} recycling tree, "
                f"whose nodes use candidate rank {max(shape.ranks)} (ranks count from 0)"
            )
        return shape

    def _table(self) -> SuccessorTable:
        if self.table is None:
            raise RuntimeError("SAMDecoding.setup(target, tokenizer) must run before decoding (it sizes the table)")
        return self.table

    def _sync(self, tokens: list[int]) -> None:
        """Feed the automata every committed token not fed yet (``ctx.tokens`` is the only reliable record:
        the loop may cut a step's tokens at EOS or the budget after ``observe``)."""
        fed = len(self.dynamic)
        if fed > len(tokens):
            raise RuntimeError(f"SAMDecoding: the context shrank below the {fed} tokens already fed")
        new = tokens[fed:]
        self.dynamic.extend(new)
        if self.matcher is not None:
            self.matcher.extend(new)

    @staticmethod
    def _corpus_spec(corpus: Mapping[str, Any] | None):
        """The validated ``corpus`` node as a files ``CorpusSpec`` (its files must exist now, before any model)."""
        from specbench.corpus import CorpusSpec

        node = dict(corpus or {})
        unknown = sorted(set(node) - set(CORPUS_KEYS))
        if unknown:
            raise ConfigError(
                f"unknown key(s) {', '.join(f'method.drafter.corpus.{key}' for key in unknown)}; "
                f"valid keys: {', '.join(CORPUS_KEYS)}"
            )
        files, max_tokens = node.get("files"), node.get("max_tokens")
        if not files:
            raise ConfigError(
                f"{knob_name('static_sam', None)}=true needs a text base: set method.drafter.corpus.files=DIR "
                "(a folder of .txt files, one file or a glob) or SPECBENCH_CORPUS_DIR=DIR"
            )
        if max_tokens is not None:
            knob_int("corpus.max_tokens", max_tokens, 1)
        spec = CorpusSpec("files", str(files), {}, max_tokens, {})
        spec.file_paths()  # DataUnavailable now if nothing matches
        return spec


def static_automaton(spec, tokenizer) -> tuple[SuffixAutomaton, str]:
    """The static automaton over ``spec``'s documents tokenised by ``tokenizer`` (no special tokens), one
    ``SEPARATOR`` after each, and its artefact name; built once per process and (corpus, tokenizer)."""
    from specbench.corpus import token_streams, tokenizer_identity

    source, vocabulary = spec.identity(), tokenizer_identity(tokenizer)
    key = (tuple(sorted(source.items())), tuple(sorted(vocabulary.items())))
    part = f"sam-corpus:{spec.label()}-{source['sha256']}-t{source['max_tokens'] or 'all'}-{vocabulary['fingerprint']}"
    automaton = _STATIC.get(key)
    if automaton is None:
        automaton = SuffixAutomaton()
        for document in token_streams(tokenizer, spec.texts(), spec.max_tokens):
            automaton.add_document(document)
        _STATIC.clear()  # keep one: a static automaton takes hundreds of MB for a million tokens
        _STATIC[key] = automaton
    return automaton, part
