"""Lookahead (Zhao et al., KDD'24; Ant Group's PainlessInferenceAcceleration): trie-based multi-branch drafts.

Each step the last ``max_query_length`` committed tokens query a global frequency trie memory
(``specbench.structures.trie``) filled with the prompt (input branches), the outputs committed so
far in this and earlier requests, and optional warm-up answers from a dataset's dev split (output
branches). Up to ``decoding_length`` tokens of the matched sub-trie are verified in one forward as a
tree (``hierarchical``), as separate root-to-leaf chains (``parallel``) or as one branch (``single``,
the LLMA baseline). Drafts are deterministic, so the ``match`` rule keeps decoding lossless.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from specbench.core.tree import DraftTree
from specbench.drafters.base import DecodeContext, Drafter
from specbench.errors import ConfigError
from specbench.structures.trie import Draft, TrieMemory, parallel_layout

MODES = ("hierarchical", "parallel", "single")
WARMUP_KEYS = ("dataset", "limit", "data_dir")


def warmup_answer_ids(warmup: Mapping | None, tokenizer) -> list[list[int]]:
    """Token ids of the dev-split answers named by ``warmup`` ({dataset, limit, data_dir}), EOS appended.

    The dataset is a ``conf/dataset`` config name whose class offers ``dev_answers()`` (Dolly).
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

    from specbench.config import CONF_DIR, group_options
    from specbench.data.base import build_dataset

    path = CONF_DIR / "dataset" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"method.drafter.warmup.dataset={name!r} is not a dataset config; "
                          f"choose one of {group_options('dataset')}")
    dataset = build_dataset(OmegaConf.load(path), data_dir)
    if not hasattr(dataset, "dev_answers"):
        raise ConfigError(f"method.drafter.warmup.dataset={name!r} has no dev split to warm up from "
                          f"(it needs dev_answers(); dolly has one)")
    return dataset.dev_answers()


class Lookahead(Drafter):
    """Multi-branch drafts retrieved from a frequency trie that learns across requests."""

    def __init__(self, decoding_length: int = 64, branch_length: int = 12, mode: str = "hierarchical",
                 max_query_length: int = 2, output_weight: float = 1e-4, node_capacity_factor: float = 32,
                 output_node_capacity_factor: float = 16, prune_min_trees: int = 1024,
                 warmup: Mapping | None = None):
        problems = []
        if decoding_length < 1:
            problems.append(f"decoding_length (L_d) must be >= 1 (1 = no draft), got {decoding_length}")
        if branch_length < 0:
            problems.append(f"branch_length (L_b) must be >= 0 (0 = no draft), got {branch_length}")
        if mode not in MODES:
            problems.append(f"mode must be one of {MODES}, got {mode!r}")
        if max_query_length < 1:
            problems.append(f"max_query_length must be >= 1, got {max_query_length}")
        if not 0.0 <= output_weight <= 1.0:
            problems.append(f"output_weight (w) must be in [0, 1], got {output_weight}")
        if node_capacity_factor <= 0 or output_node_capacity_factor <= 0:
            problems.append("node_capacity_factor and output_node_capacity_factor must be > 0, got "
                            f"{node_capacity_factor} and {output_node_capacity_factor}")
        if prune_min_trees < 1:
            problems.append(f"prune_min_trees must be >= 1, got {prune_min_trees}")
        if problems:
            raise ConfigError("method.drafter: " + "; ".join(problems))
        self.decoding_length = decoding_length
        self.branch_length = branch_length
        self.mode = mode
        self.max_query_length = max_query_length
        self.output_weight = output_weight
        self.max_node = max(int(node_capacity_factor * decoding_length), 1)
        self.max_output_node = max(int(output_node_capacity_factor * decoding_length), 1)
        self.prune_min_trees = prune_min_trees
        self.warmup = dict(warmup or {})
        self.memory = self._new_memory()
        self.warmup_answers = 0
        self.warmup_s = 0.0
        self._tokens: list[int] | None = None  # the live request's token list (the loop extends it)
        self._synced = 0  # tokens of it already streamed into the memory
        self._reset_counters()

    def _new_memory(self) -> TrieMemory:
        """An empty trie memory with this drafter's branch length, weights and capacities."""
        return TrieMemory(max(self.branch_length, 1), self.max_query_length, self.output_weight,
                          self.max_node, self.max_output_node, self.prune_min_trees)

    def _reset_counters(self) -> None:
        """Per-generation counters (the memory itself persists across requests)."""
        self.steps = self.hits = self.long_hits = 0
        self.nodes_proposed = self.depth_proposed = 0
        self.qts = self.draft_s = self.update_s = 0.0

    def setup(self, target, tokenizer) -> None:
        """Start the run with a fresh memory, warmed up with the dev answers as OUTPUT branches."""
        start = time.perf_counter()
        self.memory = self._new_memory()
        answers = warmup_answer_ids(self.warmup, tokenizer)
        for ids in answers:
            self.memory.insert_sequence(ids, output=True)
        self.memory.end_request()  # prunes when the warm-up touched enough tries
        self.warmup_answers = len(answers)
        self.warmup_s = time.perf_counter() - start
        self._tokens = None

    def reset(self, prompt_ids: list[int]) -> None:
        """End the previous request (last windows, elimination, pruning), then insert this prompt."""
        self._reset_counters()
        start = time.perf_counter()
        if self._tokens is not None:
            self.memory.stream_output(self._tokens[self._synced:])
        self.memory.end_request()
        self.memory.insert_sequence(prompt_ids, output=False)
        self._tokens = None
        self._synced = len(prompt_ids)
        self.update_s += time.perf_counter() - start

    def _sync(self, ctx: DecodeContext) -> None:
        """Stream the tokens committed since the last step (ctx.tokens is the truth after EOS/budget cuts)."""
        self._tokens = ctx.tokens
        self.memory.stream_output(ctx.tokens[self._synced:])
        self._synced = len(ctx.tokens)

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Retrieve a draft for the last committed tokens and lay it out per ``mode``."""
        start = time.perf_counter()
        self._sync(ctx)
        max_depth = min(self.branch_length, self.decoding_length - 1, ctx.remaining - 1)
        query = ctx.tokens[-self.max_query_length:]
        retrieve_start = time.perf_counter()
        draft = self._retrieve(query, max_depth)
        self.qts += time.perf_counter() - retrieve_start
        tokens, parents = draft.tokens, draft.parents
        if self.mode == "parallel":
            tokens, parents = parallel_layout(tokens, parents)
        tree = DraftTree(tokens, parents)
        self._count(draft, tree)
        self.draft_s += time.perf_counter() - start
        return tree

    def _retrieve(self, query: list[int], max_depth: int) -> Draft:
        """The trie draft: one best branch (``single``) or the L_d-node sub-trie (otherwise)."""
        if self.mode == "single":
            return self.memory.retrieve_branch(query, max_depth)
        return self.memory.retrieve(query, self.decoding_length, max_depth)

    def _count(self, draft: Draft, tree: DraftTree) -> None:
        """Per-step statistics: hits, full-query hits, nodes and depth proposed."""
        self.steps += 1
        self.hits += tree.num_drafted > 0
        self.long_hits += draft.query_length == self.max_query_length
        self.nodes_proposed += tree.num_drafted
        self.depth_proposed += max(tree.depths)

    def stats(self) -> dict:
        """Memory sizes (persistent) and this generation's retrieval statistics."""
        steps = max(self.steps, 1)
        return {**self.memory.sizes(), "warmup_answers": self.warmup_answers,
                "warmup_s": self.warmup_s,
                "steps": self.steps, "hit_rate": self.hits / steps,
                "full_query_hit_rate": self.long_hits / steps,
                "nodes_per_step": self.nodes_proposed / steps, "depth_per_step": self.depth_proposed / steps,
                "qts": self.qts, "qts_ms_per_step": 1e3 * self.qts / steps,
                "draft_s": self.draft_s, "update_s": self.update_s}
