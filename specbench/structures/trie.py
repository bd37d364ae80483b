"""Lookahead's frequency trie memory (Zhao et al., KDD'24; docs/methods/lookahead.md).

A global memory keyed by first token: ``mem[t]`` is a trie of the continuations seen after ``t``
(``window = branch_length + max_query_length - 1`` tokens deep, so a query of ``q`` tokens still
leaves ``branch_length`` levels below its match). Every node keeps two frequency channels that are
never merged: INPUT (the current request's prompt) and OUTPUT (committed outputs and warm-up answers,
global across requests). Ranking uses the mixed frequency ``fm = (1 - w) f_in + w f_out`` (prompt
amplification; ``w = 1e-4``).

Updates: prompts go in as input branches, committed output is streamed in as output branches once a
full window follows a token (shorter windows when the request ends), the request's input frequencies
are zeroed when it ends (branch elimination), and over-capacity tries are pruned (halve ``f_out > 1``,
delete ``f_out <= 1``) once enough tries have been touched.

Invariant used for speed: along any path a child's frequency never exceeds its parent's in either
channel (an insertion increments the whole path; elimination and pruning act on whole subtrees).
So the top-k nodes by ``f_out`` or ``fm`` are found by a best-first walk that touches O(k) nodes
instead of the whole trie, and a node with zero frequency has none below it.

``Rules`` picks, part by part, specbench's rule (the defaults) or the one the official code
(alipay/PainlessInferenceAcceleration, ``lookahead/common/lookahead_cache.py``) runs; the
differences are listed in docs/methods/lookahead.md.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count

from specbench.core.drafter import knob_choice, knob_int, knob_number

SELECTIONS = ("union", "output_threshold")
QUERY_FALLBACKS = ("drafted", "official")
SINGLE_RANKINGS = ("mixed", "output_first")
NODE_PRUNINGS = ("specbench", "official")
BRANCH_WINDOWS = ("query_length", "fixed")


@dataclass(frozen=True)
class Rules:
    """Which rule each part of the memory follows; every default is specbench's, the other value the official code's.

    - ``selection``: ``union`` = a node qualifies in the top ``L_d // 2`` by ``f_out`` or in the top by ``fm``
      until ``L_d`` qualify (positive frequency only, candidates down to the draft depth); ``output_threshold``
      = the code as written: with more than ``L_d`` positive candidates (at any depth) only ``f_out`` >= the
      ``L_d // 2``-th largest ``f_out`` qualifies, otherwise every node does, zero-frequency nodes included.
    - ``query_fallback``: ``drafted`` = stop at the first query suffix whose draft has ``enough`` drafted
      nodes, keep the latest non-empty draft; ``official`` = stop once a draft has ``enough + 1`` tokens root
      included, and every tried suffix's result (a no-draft one too) replaces the previous one.
    - ``single_ranking``: ``mixed`` = the single branch follows the highest ``fm``; ``output_first`` = the
      highest ``10^4 f_out + f_in`` (the code's one-branch helper, whose channel names are swapped).
    - ``node_pruning``: ``specbench`` = output nodes are the nodes with ``f_out > 0``, every update marks
      its trie, emptied tries are dropped; ``official`` = output nodes are the nodes output insertions
      created (all nodes after a squeeze), a whole-sequence insertion marks only tries that existed
      before it, emptied tries stay.
    - ``branch_window``: ``query_length`` = tries store ``L_b + max_query_length - 1`` tokens per branch;
      ``fixed`` = ``L_b + 1`` whatever the query length.
    """

    selection: str = "union"
    query_fallback: str = "drafted"
    single_ranking: str = "mixed"
    node_pruning: str = "specbench"
    branch_window: str = "query_length"

    def __post_init__(self) -> None:
        knob_choice("selection", self.selection, SELECTIONS)
        knob_choice("query_fallback", self.query_fallback, QUERY_FALLBACKS)
        knob_choice("single_ranking", self.single_ranking, SINGLE_RANKINGS)
        knob_choice("node_pruning", self.node_pruning, NODE_PRUNINGS)
        knob_choice("branch_window", self.branch_window, BRANCH_WINDOWS)


class TrieNode:
    """One token of a branch: its children and its input / output frequencies."""

    __slots__ = ("children", "f_in", "f_out")

    def __init__(self) -> None:
        self.children: dict[int, TrieNode] = {}
        self.f_in = 0.0  # the live request's prompt frequency (batch size 1: one input channel)
        self.f_out = 0.0  # global output frequency (committed outputs + warm-up answers)


class Trie(TrieNode):
    """The continuations seen after one first token (the root itself carries no frequency)."""

    __slots__ = ("n_node", "n_input_node", "n_output_node")

    def __init__(self) -> None:
        super().__init__()
        self.n_node = 0  # nodes below the root
        self.n_input_node = 0  # nodes with f_in > 0
        self.n_output_node = 0  # nodes with f_out > 0 (node_pruning=official: the nodes output insertions created)


class Draft:
    """A retrieved draft as parent-index arrays: node 0 is the root token, parents precede children."""

    __slots__ = ("tokens", "parents", "query_length")

    def __init__(self, tokens: list[int], parents: list[int], query_length: int):
        self.tokens = tokens
        self.parents = parents
        self.query_length = query_length  # tokens of the query that matched (0 = no trie found)

    @property
    def num_drafted(self) -> int:
        """Drafted nodes (the root is the committed token)."""
        return len(self.tokens) - 1


class TrieMemory:
    """Lookahead's global trie memory: branch inserting, elimination, pruning and retrieval."""

    def __init__(
        self,
        branch_length: int,
        max_query_length: int = 2,
        output_weight: float = 1e-4,
        max_node: int = 2048,
        max_output_node: int = 1024,
        prune_min_trees: int = 1024,
        insert_input: bool = True,
        insert_output: bool = True,
        eliminate: bool = True,
        rules: Rules | None = None,
    ):
        knob_int("branch_length", branch_length, 1, "L_b")
        knob_int("max_query_length", max_query_length, 1)
        knob_number("output_weight", output_weight, 0.0, 1.0, "w")
        self.rules = rules = rules or Rules()
        self.branch_length = branch_length
        self.max_query_length = max_query_length
        # tokens stored after each first token
        self.window = branch_length + (max_query_length - 1 if rules.branch_window == "query_length" else 1)
        self.official_pruning = rules.node_pruning == "official"
        self.output_weight = output_weight
        self.input_weight = 1.0 - output_weight
        self.max_node = max_node
        self.max_output_node = max_output_node
        self.prune_min_trees = prune_min_trees
        # the paper's Table 5 ablations: False = w/o prompt / w/o output branches, w/o elimination
        self.insert_input, self.insert_output, self.eliminate = insert_input, insert_output, eliminate
        self.mem: dict[int, Trie] = {}
        self._touched: set[int] = set()  # first tokens of tries updated since the last pruning pass
        self._input_touched: set[int] = set()  # first tokens of tries holding the live prompt
        self._stream: list[int] = []  # committed output whose windows are not complete yet
        self.prune_passes = 0

    # --- branch inserting -----------------------------------------------------------------------

    def _insert(self, first: int, branch: Sequence[int], output: bool, streamed: bool) -> None:
        """Add one branch under ``mem[first]``: +1 on the chosen channel of every node on its path.

        ``streamed``: a window of the output stream (official pruning marks a trie that a whole-sequence
        insertion creates only from its next update on).
        """
        trie = self.mem.get(first)
        existed = trie is not None
        if trie is None:
            trie = self.mem[first] = Trie()
        node: TrieNode = trie
        new = new_channel = 0
        for token in branch:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = TrieNode()
                new += 1
            if output:
                new_channel += child.f_out == 0.0
                child.f_out += 1.0
            else:
                new_channel += child.f_in == 0.0
                child.f_in += 1.0
            node = child
        trie.n_node += new
        if output:
            trie.n_output_node += new if self.official_pruning else new_channel
        else:
            trie.n_input_node += new_channel
            self._input_touched.add(first)
        if streamed or existed or not self.official_pruning:
            self._touched.add(first)

    def insert_sequence(self, ids: Sequence[int], output: bool) -> None:
        """Insert every window of ``ids`` (a prompt as INPUT, a warm-up answer as OUTPUT) if that channel is on."""
        if not (self.insert_output if output else self.insert_input):
            return
        window = self.window
        for i in range(len(ids) - 1):
            self._insert(ids[i], ids[i + 1 : i + 1 + window], output, False)

    def stream_output(self, ids: Sequence[int]) -> None:
        """Feed committed output tokens; each token's window goes in as OUTPUT once it is complete."""
        if not self.insert_output:
            return
        stream = self._stream
        stream.extend(ids)
        ready = len(stream) - self.window
        if ready > 0:
            for i in range(ready):
                self._insert(stream[i], stream[i + 1 : i + 1 + self.window], True, True)
            del stream[:ready]

    def end_request(self) -> None:
        """The request is over: flush its last (shorter) windows, eliminate its prompt, prune."""
        stream = self._stream
        for i in range(len(stream) - 1):
            self._insert(stream[i], stream[i + 1 :], True, True)
        stream.clear()
        if self.eliminate:
            self.eliminate_input()
        self.prune()

    # --- branch eliminating and node pruning ----------------------------------------------------

    def eliminate_input(self) -> None:
        """Zero the input frequency in every trie the live prompt touched (outputs stay)."""
        for first in self._input_touched:
            trie = self.mem.get(first)
            if trie is None:
                continue
            stack: list[TrieNode] = [trie]
            while stack:
                for child in stack.pop().children.values():
                    if child.f_in > 0.0:  # below a zero node everything is zero already
                        child.f_in = 0.0
                        stack.append(child)
            trie.n_input_node = 0
        self._input_touched.clear()

    def prune(self) -> None:
        """Once ``prune_min_trees`` tries were touched, shrink the over-capacity ones among them."""
        if len(self._touched) < self.prune_min_trees:
            return
        for first in self._touched:
            trie = self.mem.get(first)
            if trie is not None and (trie.n_node > self.max_node or trie.n_output_node > self.max_output_node):
                self._halve_or_delete(first, trie)
        self._touched.clear()
        self.prune_passes += 1

    def _halve_or_delete(self, first: int, trie: Trie) -> None:
        """Halve ``f_out`` of nodes with ``f_out > 1``; delete the others with their subtrees (and an emptied trie)."""
        stack: list[TrieNode] = [trie]
        while stack:
            node = stack.pop()
            for token, child in list(node.children.items()):
                if child.f_out > 1.0:
                    child.f_out *= 0.5
                    stack.append(child)
                else:
                    del node.children[token]
        if not trie.children and not self.official_pruning:
            del self.mem[first]
            return
        self._recount(trie)
        if self.official_pruning:  # the code sets both counters to the node count after a squeeze
            trie.n_output_node = trie.n_node

    @staticmethod
    def _recount(trie: Trie) -> None:
        """Recompute a trie's node counters after pruning."""
        nodes = inputs = outputs = 0
        stack: list[TrieNode] = [trie]
        while stack:
            for child in stack.pop().children.values():
                nodes += 1
                inputs += child.f_in > 0.0
                outputs += child.f_out > 0.0
                stack.append(child)
        trie.n_node, trie.n_input_node, trie.n_output_node = nodes, inputs, outputs

    # --- retrieval ------------------------------------------------------------------------------

    def mixed(self, node: TrieNode) -> float:
        """Prompt-amplified frequency fm = (1 - w) f_in + w f_out."""
        return self.input_weight * node.f_in + self.output_weight * node.f_out

    def match(self, query: Sequence[int]) -> TrieNode | None:
        """The node reached by ``query[1:]`` inside ``mem[query[0]]`` (every step must have frequency)."""
        node: TrieNode | None = self.mem.get(query[0])
        for token in query[1:]:
            if node is None:
                return None
            node = node.children.get(token)
            if node is not None and node.f_in <= 0.0 and node.f_out <= 0.0:
                node = None
        return node

    def _matches(self, query: Sequence[int]) -> Iterator[tuple[int, TrieNode | None]]:
        """(query length, matched node) from the longest usable query suffix down to the last token.

        ``drafted`` fallback: the suffixes whose match has children; ``official``: every suffix whose first
        token has a trie, its node None when the rest of the suffix does not match.
        """
        official = self.rules.query_fallback == "official"
        longest = min(self.max_query_length, len(query))
        for length in range(longest, 0, -1):
            suffix = query[len(query) - length :]
            node = self.match(suffix)
            if (node is not None and node.children) or (official and suffix[0] in self.mem):
                yield length, node

    def retrieve(self, query: Sequence[int], decoding_length: int, max_depth: int) -> Draft:
        """Hierarchical draft: the longest query suffix yielding >= ``max_depth`` nodes, else shorter.

        ``decoding_length`` (L_d) bounds the tokens of the forward, root included; ``max_depth`` is
        the branch length, clipped by the caller to the generation budget. The ``official`` fallback
        stops at ``max_depth`` tokens, root included.
        """
        official = self.rules.query_fallback == "official"
        return self._retrieve(
            query,
            max_depth - 1 if official else max_depth,
            max_depth,
            lambda node: self.select(node, query[-1], decoding_length, max_depth),
        )

    def retrieve_branch(self, query: Sequence[int], max_depth: int) -> Draft:
        """LLMA-style single branch: the highest-ranked path (fallback when shorter than max_depth // 2).

        The ``official`` fallback stops at ``max_depth // 2`` tokens, root included.
        """
        official = self.rules.query_fallback == "official"
        return self._retrieve(
            query,
            max_depth // 2 - 1 if official else max(max_depth // 2, 1),
            max_depth,
            lambda node: self.best_branch(node, query[-1], max_depth),
        )

    def _retrieve(
        self,
        query: Sequence[int],
        enough: int,
        max_depth: int,
        build: Callable[[TrieNode], tuple[list[int], list[int]]],
    ) -> Draft:
        """Try query suffixes longest first and stop once a draft has ``enough`` drafted nodes.

        ``drafted`` fallback: keep the latest non-empty draft; ``official``: the latest result, empty or not.
        """
        no_draft = Draft([query[-1]], [-1], 0)
        best = no_draft
        if max_depth < 1:
            return best
        official = self.rules.query_fallback == "official"
        for length, node in self._matches(query):
            tokens, parents = build(node) if node is not None and node.children else ([query[-1]], [-1])
            if len(tokens) > 1:
                best = Draft(tokens, parents, length)
            elif official:
                best = no_draft
            if len(tokens) - 1 >= enough:
                break
        return best

    def _best_first(
        self, start: TrieNode, max_depth: int, score: Callable[[TrieNode], float]
    ) -> Iterator[tuple[float, TrieNode]]:
        """Descendants of ``start`` (depth <= max_depth, score > 0) in non-increasing score order.

        NOTE: exact because scores never increase down a path (module docstring), so only popped
        nodes' children need to enter the heap.
        """
        tie = count()
        heap = [(-s, next(tie), child, 1) for child in start.children.values() if (s := score(child)) > 0.0]
        heapq.heapify(heap)
        while heap:
            neg, _, node, depth = heapq.heappop(heap)
            yield -neg, node
            if depth < max_depth:
                for child in node.children.values():
                    s = score(child)
                    if s > 0.0:
                        heapq.heappush(heap, (-s, next(tie), child, depth + 1))

    def thresholds(self, start: TrieNode, decoding_length: int, max_depth: int) -> tuple[float, float]:
        """(min f_out, min fm) a node needs to qualify for the draft (the ``union`` selection).

        A node qualifies when it is in the top ``L_d // 2`` by output frequency, or in the top by
        mixed frequency that brings the qualifying set to ``L_d`` nodes; with fewer than ``L_d``
        candidates every candidate qualifies.
        """
        top_out = max(decoding_length // 2, 1)
        out_min = float("inf")
        by_output: set[int] = set()  # ids of the top nodes by f_out
        for f_out, node in self._best_first(start, max_depth, lambda node: node.f_out):
            out_min = f_out
            by_output.add(id(node))
            if len(by_output) >= top_out:
                break
        qualified = len(by_output)
        for fm, node in self._best_first(start, max_depth, self.mixed):
            if id(node) not in by_output:
                qualified += 1
                if qualified >= decoding_length:
                    return out_min, fm
        return out_min, 0.0

    def output_threshold(self, start: TrieNode, decoding_length: int) -> float:
        """The min ``f_out`` of the ``output_threshold`` selection (0.0: every node, zero-frequency ones too).

        With more than ``L_d`` nodes of positive frequency below ``start`` (at any depth), the
        ``L_d // 2``-th largest ``f_out`` among them; otherwise 0.
        """
        if self._positive_count(start, decoding_length + 1) <= decoding_length:
            return 0.0
        top = max(decoding_length // 2, 1)
        for rank, (f_out, _) in enumerate(self._best_first(start, self.window, lambda node: node.f_out), 1):
            if rank == top:
                return f_out
        return 0.0  # fewer than ``top`` nodes have output frequency: the top-th largest is 0

    @staticmethod
    def _positive_count(start: TrieNode, limit: int) -> int:
        """Nodes with a positive frequency below ``start``, counted up to ``limit``."""
        found = 0
        stack = [start]
        while stack:
            for child in stack.pop().children.values():
                if child.f_in > 0.0 or child.f_out > 0.0:  # below a zero node everything is zero
                    found += 1
                    if found >= limit:
                        return found
                    stack.append(child)
        return found

    def _qualifier(self, start: TrieNode, decoding_length: int, max_depth: int) -> Callable[[TrieNode, float], bool]:
        """The test (node, its fm) a node below ``start`` must pass to enter the draft (``Rules.selection``)."""
        if self.rules.selection == "output_threshold":
            threshold = self.output_threshold(start, decoding_length)
            return lambda node, fm: node.f_out >= threshold
        out_min, mix_min = self.thresholds(start, decoding_length, max_depth)
        return lambda node, fm: (fm > 0.0 and fm >= mix_min) or out_min <= node.f_out

    def select(self, start: TrieNode, root: int, decoding_length: int, max_depth: int) -> tuple[list[int], list[int]]:
        """At most ``decoding_length`` tokens (root included) in DFS order, children by descending fm."""
        qualifies = self._qualifier(start, decoding_length, max_depth)
        mixed = self.mixed

        def ranked(node: TrieNode, parent: int, depth: int) -> list[tuple[float, int, TrieNode, int, int]]:
            """Qualifying children of ``node``, lowest fm first (so the stack pops the best first)."""
            kids = [
                (fm, token, child, parent, depth)
                for token, child in node.children.items()
                if qualifies(child, fm := mixed(child))
            ]
            kids.reverse()  # ties keep insertion order once popped
            kids.sort(key=lambda kid: kid[0])
            return kids

        tokens, parents = [root], [-1]
        stack = ranked(start, 0, 1)
        while stack and len(tokens) < decoding_length:
            _, token, child, parent, depth = stack.pop()
            tokens.append(token)
            parents.append(parent)
            if depth < max_depth:
                stack.extend(ranked(child, len(tokens) - 1, depth + 1))
        return tokens, parents

    def best_branch(self, start: TrieNode, root: int, max_depth: int) -> tuple[list[int], list[int]]:
        """The single highest-ranked path below ``start`` (LLMA baseline), at most ``max_depth`` deep.

        Children rank by ``fm`` (``mixed``) or by ``10^4 f_out + f_in`` (``output_first``); ties keep the first.
        """
        score = self.mixed if self.rules.single_ranking == "mixed" else output_first
        tokens = [root]
        node = start
        while len(tokens) <= max_depth:
            best_score, best = 0.0, None
            for token, child in node.children.items():
                value = score(child)
                if value > best_score:
                    best_score, best = value, (token, child)
            if best is None:
                break
            tokens.append(best[0])
            node = best[1]
        return tokens, list(range(-1, len(tokens) - 1))

    # --- sizes ----------------------------------------------------------------------------------

    def sizes(self) -> dict:
        """Trie count and node counts (all, with input frequency, with output frequency)."""
        tries = self.mem.values()
        return {
            "trie_count": len(self.mem),
            "nodes": sum(t.n_node for t in tries),
            "input_nodes": sum(t.n_input_node for t in tries),
            "output_nodes": sum(t.n_output_node for t in tries),
            "prune_passes": self.prune_passes,
        }


def output_first(node: TrieNode) -> float:
    """The official one-branch rank ``10^4 f_out + f_in`` (its helper's channel names are swapped)."""
    return 1e4 * node.f_out + node.f_in


def parallel_layout(tokens: list[int], parents: list[int], all_branches: bool = False) -> tuple[list[int], list[int]]:
    """Lookahead's parallel multi-branch draft: each root-to-leaf branch of a trie as its own chain.

    Shared prefixes are copied into every branch, under the trie's own token budget (its node
    count), so later branches are cut or dropped. ``tokens``/``parents`` must be in DFS preorder
    (leaves then come in branch order).

    ``all_branches``: the copies stay in the forward, but a branch's first token past the prefix it
    shares with earlier branches hangs under that prefix's first copy, so the greedy walk (first
    matching child) accepts the longest prefix over all branches, as the official verify does (it keeps
    every branch that matched so far); the later copies of a shared prefix are never accepted.
    """
    budget = len(tokens)
    inner = set(parents)
    out_tokens, out_parents = [tokens[0]], [-1]
    first_copy: dict[tuple[int, int], int] = {}  # (first copy of the parent, token) -> its first copy
    for leaf in range(1, len(tokens)):
        if leaf in inner:
            continue
        path = []
        node = leaf
        while node > 0:
            path.append(node)
            node = parents[node]
        previous = shared = 0  # this branch's last copy; the first copy of the prefix it has so far
        for node in reversed(path[-(budget - len(out_tokens)) :]):
            key = (shared, tokens[node])
            out_parents.append(shared if all_branches and key not in first_copy else previous)
            previous = len(out_tokens)
            out_tokens.append(tokens[node])
            shared = first_copy.setdefault(key, previous)
        if len(out_tokens) >= budget:
            break
    return out_tokens, out_parents
