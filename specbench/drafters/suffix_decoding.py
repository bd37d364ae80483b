"""SuffixDecoding (Oliaro et al., 2024; Snowflake ArcticInference, vLLM ``method: suffix``): suffix-tree drafts.

Two suffix trees (``specbench.structures.suffix_tree``) count every string of at most ``d_max`` tokens: a
per-request tree over the prompt and the tokens committed so far, and a global tree over the responses
of earlier requests of the run (the live response included, as the official cache does), bounded to
the ``max_cached_requests`` latest ones (FIFO eviction). Each step the last tokens of the context are
matched in both trees, for every match length ``p``; from each match a speculation tree is grown
greedily by empirical continuation probability (frequency counts), with at most ``MAX_SPEC = alpha * p``
nodes of probability >= ``tau``; the highest-scoring tree (sum of its node probabilities) is verified.
Drafts are deterministic, so the ``match`` rule keeps decoding lossless at every temperature.
"""

from __future__ import annotations

from collections import deque

from specbench.core.drafter import DecodeContext, Drafter, knob_choice, knob_int, knob_number
from specbench.core.tree import DraftTree
from specbench.errors import ConfigError
from specbench.structures.suffix_tree import SELECTION, SPECULATION, SuffixDraft, SuffixTree

REQUEST_SEQ = 0  # the one sequence of a per-request tree


class SuffixDecoding(Drafter):
    """Frequency-scored speculation trees from a per-request and a global suffix tree."""

    COUNTERS = ("steps", "hits", "global_hits", "nodes_proposed", "depth_proposed", "match_length")

    def __init__(
        self,
        max_tree_depth: int = 64,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
        max_spec_tokens: int = 64,
        speculation: str = "tree",
        selection: str = "score",
        max_cached_requests: int | None = 10000,
        per_request_tree: bool = True,
    ):
        super().__init__()
        self.max_tree_depth = knob_int("max_tree_depth", max_tree_depth, 2, "d_max")
        self.max_spec_factor = knob_number("max_spec_factor", max_spec_factor, 0.0, symbol="alpha")
        self.min_token_prob = knob_number("min_token_prob", min_token_prob, 0.0, 1.0, "tau")
        self.max_spec_tokens = knob_int("max_spec_tokens", max_spec_tokens, 0)
        self.tree = knob_choice("speculation", speculation, SPECULATION) == "tree"
        self.selection = knob_choice("selection", selection, SELECTION)
        if max_cached_requests is not None:
            knob_int("max_cached_requests", max_cached_requests, 0)
        self.max_cached_requests = max_cached_requests
        self.per_request_tree = knob_choice("per_request_tree", per_request_tree, (True, False))
        if not self.per_request_tree and max_cached_requests == 0:
            raise ConfigError(
                "method.drafter.per_request_tree=false with max_cached_requests=0 leaves no suffix tree to draft from"
            )
        self._new_run()

    def _new_run(self) -> None:
        """An empty global tree and no request in flight."""
        self.global_tree = SuffixTree(self.max_tree_depth)
        self.cached: deque[int] = deque()  # sequence ids of the global tree's responses, oldest first
        self.next_seq = 0
        self.request_tree = SuffixTree(self.max_tree_depth)
        self._tokens: list[int] | None = None  # the live request's token list (the loop extends it)
        self._synced = 0  # tokens of it already in the trees
        self._prompt_len = 0

    @property
    def uses_global(self) -> bool:
        """Whether earlier responses are cached (max_cached_requests != 0)."""
        return self.max_cached_requests != 0

    def setup(self, target, tokenizer) -> None:
        """Start the run with empty trees (the global tree then learns across the run's requests)."""
        self.forget()

    def forget(self) -> None:
        """Empty trees and no request in flight."""
        self._new_run()

    def reset(self, prompt_ids: list[int]) -> None:
        """Finish the previous response in the global tree, open this one, build the per-request tree."""
        with self.books.timed("insert"):
            if self._tokens is not None:
                self._sync(self._tokens)
            if self.cached:
                self.global_tree.close(self.cached[-1])
            self.request_tree = SuffixTree(self.max_tree_depth)
            if self.per_request_tree:
                self.request_tree.extend(REQUEST_SEQ, prompt_ids)
            if self.uses_global:
                limit = self.max_cached_requests
                while limit is not None and len(self.cached) >= limit:
                    self.global_tree.remove(self.cached.popleft())
                self.cached.append(self.next_seq)
                self.next_seq += 1
        self._tokens = None
        self._synced = self._prompt_len = len(prompt_ids)

    def recall(self, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """Open the generation as ``reset`` does; its output enters the global tree at the next ``reset``, as a live
        response's last tokens do (the trees count token by token, so the result is the same)."""
        self.reset(prompt_ids)
        self._tokens = [*prompt_ids, *output_ids]
        return True

    def _sync(self, tokens: list[int]) -> None:
        """Add the tokens committed since the last step to both trees (the response only to the global one)."""
        new = tokens[self._synced :]
        if new:
            if self.per_request_tree:
                self.request_tree.extend(REQUEST_SEQ, new)
            if self.uses_global:
                self.global_tree.extend(self.cached[-1], new)
        self._synced = len(tokens)

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """The best-scoring speculation over both trees and every match length."""
        with self.books.timed("insert"):
            self._tokens = ctx.tokens
            self._sync(ctx.tokens)
        with self.books.timed("speculate"):
            draft, from_global = self.speculate(ctx.tokens, ctx.remaining - 1)
        tree = DraftTree([ctx.root, *draft.tokens], [-1, *(parent + 1 for parent in draft.parents)])
        self.books.add(
            steps=1,
            hits=bool(draft.tokens),
            global_hits=bool(draft.tokens) and from_global,
            nodes_proposed=len(draft.tokens),
            depth_proposed=max(draft.depths(), default=0),
            match_length=draft.match_len if draft.tokens else 0,
        )
        return tree

    def speculate(self, tokens: list[int], max_draft_depth: int) -> tuple[SuffixDraft, bool]:
        """(draft, whether it came from the global tree); the per-request tree wins ties, as in the official cache."""
        args = (self.max_spec_tokens, self.max_spec_factor, self.min_token_prob, max_draft_depth, self.tree)
        context = tokens[-self.max_tree_depth :]
        best = SuffixDraft()
        if max_draft_depth < 1:
            return best, False
        if self.per_request_tree:
            best = self.request_tree.speculate(context, *args, selection=self.selection)
        if self.uses_global:
            other = self.global_tree.speculate(context, *args, selection=self.selection)
            if not best.at_least(other):
                return other, True
        return best, False

    def stats(self) -> dict:
        """This generation's drafting counters, and the sizes of both trees."""
        books = self.books
        sizes = self.global_tree.sizes()
        return {
            **books.report(),
            "global_nodes": sizes["nodes"],
            "global_tokens": sizes["tokens"],
            "cached_requests": sizes["sequences"],
            "request_tree_nodes": self.request_tree.sizes()["nodes"],
            "hit_rate": books.per("hits", "steps"),
            "global_share": books.per("global_hits", "hits"),
            "nodes_per_step": books.per("nodes_proposed", "steps"),
            "depth_per_step": books.per("depth_proposed", "steps"),
            "match_length_per_hit": books.per("match_length", "hits"),
        }
