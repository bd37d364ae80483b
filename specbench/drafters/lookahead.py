"""Lookahead (Zhao et al., KDD'24; Ant Group's PainlessInferenceAcceleration): trie-based multi-branch drafts.

Each step the last ``max_query_length`` committed tokens query a global frequency trie memory
(``specbench.structures.trie``) filled with the prompt (input branches), the outputs committed so
far in this and earlier requests, and optional warm-up answers from a dataset's dev split (output
branches). Up to ``decoding_length`` tokens of the matched sub-trie are verified in one forward as a
tree (``hierarchical``), as separate root-to-leaf chains (``parallel``) or as one branch (``single``,
the LLMA baseline). Drafts are deterministic, so the ``match`` rule keeps decoding lossless.

Every rule in which the official code (alipay/PainlessInferenceAcceleration) differs has a switch
whose non-default value reproduces it (``cut_at_eos``, ``insert_first_prompt_token``, ``selection``,
``query_fallback``, ``single_ranking``, ``parallel_verify``, ``node_pruning``, ``branch_window``;
docs/methods/lookahead.md). They are constructor defaults, left out of conf/method/lookahead.yaml so
runs at the defaults keep their config digest: ``+method.drafter.<key>=<value>`` sets one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specbench.core.drafter import DecodeContext, Drafter, knob_choice, knob_int, knob_number, stopwatch
from specbench.core.tree import DraftTree
from specbench.errors import ConfigError
from specbench.models.loading import eos_token_ids
from specbench.structures.trie import Draft, Rules, TrieMemory, parallel_layout

MODES = ("hierarchical", "parallel", "single")
PARALLEL_VERIFY = ("first_branch", "all_branches")
WARMUP_KEYS = ("dataset", "limit", "data_dir")


def warmup_answer_ids(warmup: Mapping | None, tokenizer) -> list[list[int]]:
    """Token ids of the dev-split answers named by ``warmup`` ({dataset, limit, data_dir}), EOS appended.

    The dataset is a ``conf/dataset`` config name whose class offers ``dev_answers()`` (Dolly: its dev split;
    GSM8K: its train split).
    """
    spec = dict(warmup or {})
    unknown = sorted(set(spec) - set(WARMUP_KEYS))
    if unknown:
        raise ConfigError(f"method.drafter.warmup has unknown keys {unknown}; valid keys: {list(WARMUP_KEYS)}")
    name, limit = spec.get("dataset"), spec.get("limit")
    if not name:
        return []
    if limit is not None and limit < 1:
        raise ConfigError(f"method.drafter.warmup.limit must be >= 1 or null (all answers), got {limit}")
    answers = dev_answers(name, spec.get("data_dir"))
    answers = answers[:limit] if limit is not None else answers
    ids = tokenizer(answers, add_special_tokens=False)["input_ids"] if answers else []
    eos = getattr(tokenizer, "eos_token_id", None)
    return [list(seq) + ([eos] if eos is not None else []) for seq in ids]


def dev_answers(name: str, data_dir: str | None) -> list[str]:
    """The dev-split answers of the ``conf/dataset/<name>.yaml`` dataset."""
    from omegaconf import OmegaConf

    from specbench.config import find_config, group_options
    from specbench.data.base import build_dataset

    path = find_config("dataset", name)
    if path is None:
        raise ConfigError(
            f"method.drafter.warmup.dataset={name!r} is not a dataset config; choose one of {group_options('dataset')}"
        )
    dataset = build_dataset(OmegaConf.load(path), data_dir)
    if not hasattr(dataset, "dev_answers"):
        raise ConfigError(
            f"method.drafter.warmup.dataset={name!r} has no dev split to warm up from "
            f"(it needs dev_answers(); dolly has one)"
        )
    return dataset.dev_answers()


class Lookahead(Drafter):
    """Multi-branch drafts retrieved from a frequency trie that learns across requests."""

    COUNTERS = ("steps", "hits", "full_query_hits", "nodes_proposed", "depth_proposed")

    def __init__(
        self,
        decoding_length: int = 64,
        branch_length: int = 12,
        mode: str = "hierarchical",
        max_query_length: int = 2,
        output_weight: float = 1e-4,
        node_capacity_factor: float = 32,
        output_node_capacity_factor: float = 16,
        prune_min_trees: int = 1024,
        warmup: Mapping | None = None,
        insert_prompt: bool = True,
        insert_output: bool = True,
        eliminate_input: bool = True,
        cut_at_eos: bool = False,
        insert_first_prompt_token: bool = True,
        selection: str = "union",
        query_fallback: str = "drafted",
        single_ranking: str = "mixed",
        parallel_verify: str = "first_branch",
        node_pruning: str = "specbench",
        branch_window: str = "query_length",
    ):
        super().__init__()
        knob_int("decoding_length", decoding_length, 1, "L_d")  # 1 = no draft
        knob_int("branch_length", branch_length, 0, "L_b")  # 0 = no draft
        knob_choice("mode", mode, MODES)
        knob_int("max_query_length", max_query_length, 1)
        knob_number("output_weight", output_weight, 0.0, 1.0, "w")
        knob_number("node_capacity_factor", node_capacity_factor, 1e-9)
        knob_number("output_node_capacity_factor", output_node_capacity_factor, 1e-9)
        knob_int("prune_min_trees", prune_min_trees, 1)
        self.decoding_length = decoding_length
        self.branch_length = branch_length
        self.mode = mode
        self.max_query_length = max_query_length
        self.output_weight = output_weight
        self.max_node = max(int(node_capacity_factor * decoding_length), 1)
        self.max_output_node = max(int(output_node_capacity_factor * decoding_length), 1)
        self.prune_min_trees = prune_min_trees
        self.warmup = dict(warmup or {})
        # Table 5's ablation switches (conf/lookahead_ablation/; not in conf/method/lookahead.yaml, so runs
        # at the defaults keep their config digest): prompt branches, output branches (the warm-up's too),
        # elimination of the finished prompt's branches
        self.insert_prompt, self.insert_output = bool(insert_prompt), bool(insert_output)
        self.eliminate_input = bool(eliminate_input)
        # the official code's rules, each off by default (docs/methods/lookahead.md, "Official rules")
        self.cut_at_eos, self.insert_first_prompt_token = bool(cut_at_eos), bool(insert_first_prompt_token)
        self.rules = Rules(selection, query_fallback, single_ranking, node_pruning, branch_window)
        self.parallel_verify = knob_choice("parallel_verify", parallel_verify, PARALLEL_VERIFY)
        self.eos_ids: frozenset[int] = frozenset()  # set by setup (what cut_at_eos cuts at)
        self.memory = self._new_memory()
        self.warmup_ids: list[list[int]] = []  # the dev answers' token ids, read by setup
        self.warmup_answers = 0
        self.warmup_s = 0.0
        self._tokens: list[int] | None = None  # the live request's token list (the loop extends it)
        self._synced = 0  # tokens of it already streamed into the memory

    def _new_memory(self) -> TrieMemory:
        """An empty trie memory with this drafter's branch length, weights and capacities."""
        return TrieMemory(
            max(self.branch_length, 1),
            self.max_query_length,
            self.output_weight,
            self.max_node,
            self.max_output_node,
            self.prune_min_trees,
            self.insert_prompt,
            self.insert_output,
            self.eliminate_input,
            self.rules,
        )

    def _branch_ids(self, ids: Sequence[int]) -> Sequence[int]:
        """``ids`` up to their first EOS under ``cut_at_eos`` (the official insertions' cut), else all of them."""
        if self.cut_at_eos:
            for i, token in enumerate(ids):
                if token in self.eos_ids:
                    return ids[:i]
        return ids

    def setup(self, target, tokenizer) -> None:
        """Start the run with a fresh memory, warmed up with the dev answers as OUTPUT branches."""
        self.eos_ids = eos_token_ids(target, tokenizer) if target is not None else frozenset()
        self.warmup_ids = warmup_answer_ids(self.warmup, tokenizer)
        self.forget()

    def forget(self) -> None:
        """A fresh memory warmed up with the dev answers (timed: the stats' ``warmup_s``), no request in flight."""
        with stopwatch() as lap:
            self.memory = self._new_memory()
            for ids in self.warmup_ids:
                self.memory.insert_sequence(self._branch_ids(ids), output=True)
            if self.rules.node_pruning == "specbench":  # the official code prunes at the first request's end
                self.memory.end_request()  # prunes when the warm-up touched enough tries
        self.warmup_answers = len(self.warmup_ids)
        self.warmup_s = lap.seconds
        self._tokens = None

    def reset(self, prompt_ids: list[int]) -> None:
        """End the previous request (last windows, elimination, pruning), then insert this prompt."""
        with self.books.timed("end_request"):
            if self._tokens is not None:
                self.memory.stream_output(self._branch_ids(self._tokens[self._synced :]))
            self.memory.end_request()
            prompt = prompt_ids if self.insert_first_prompt_token else prompt_ids[1:]
            self.memory.insert_sequence(self._branch_ids(prompt), output=False)
        self._tokens = None
        self._synced = len(prompt_ids)

    def recall(self, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """Insert the prompt as ``reset`` does; the output streams in at the next ``reset``, as a live response's last
        tokens do (windows enter in token order, so the memory is the same)."""
        self.reset(prompt_ids)
        self._tokens = [*prompt_ids, *output_ids]
        return True

    def _sync(self, ctx: DecodeContext) -> None:
        """Stream the tokens committed since the last step (ctx.tokens is the truth after EOS/budget cuts)."""
        self._tokens = ctx.tokens
        self.memory.stream_output(self._branch_ids(ctx.tokens[self._synced :]))
        self._synced = len(ctx.tokens)

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Retrieve a draft for the last committed tokens and lay it out per ``mode``."""
        self._sync(ctx)
        max_depth = min(self.branch_length, ctx.remaining - 1)
        if self.rules.query_fallback == "drafted" or self.decoding_length == 1:  # official: L_d caps no depth
            max_depth = min(max_depth, self.decoding_length - 1)
        query = ctx.tokens[-self.max_query_length :]
        with self.books.timed("retrieve"):
            draft = self._retrieve(query, max_depth)
        tokens, parents = draft.tokens, draft.parents
        if self.mode == "parallel":
            tokens, parents = parallel_layout(tokens, parents, self.parallel_verify == "all_branches")
        tree = DraftTree(tokens, parents)
        self.books.add(
            steps=1,
            hits=tree.num_drafted > 0,
            full_query_hits=draft.query_length == self.max_query_length,
            nodes_proposed=tree.num_drafted,
            depth_proposed=max(tree.depths),
        )
        return tree

    def _retrieve(self, query: list[int], max_depth: int) -> Draft:
        """The trie draft: one best branch (``single``) or the L_d-node sub-trie (otherwise)."""
        if self.mode == "single":
            return self.memory.retrieve_branch(query, max_depth)
        return self.memory.retrieve(query, self.decoding_length, max_depth)

    def stats(self) -> dict:
        """Memory sizes (persistent), the warm-up, and this generation's retrieval statistics."""
        books = self.books
        return {
            **books.report(),
            **self.memory.sizes(),
            "warmup_answers": self.warmup_answers,
            "warmup_s": round(self.warmup_s, 6),
            "hit_rate": books.per("hits", "steps"),
            "full_query_hit_rate": books.per("full_query_hits", "steps"),
            "nodes_per_step": books.per("nodes_proposed", "steps"),
            "depth_per_step": books.per("depth_proposed", "steps"),
        }
