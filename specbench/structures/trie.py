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
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from itertools import count

from specbench.core.drafter import knob_int, knob_number


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
        self.n_output_node = 0  # nodes with f_out > 0


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
    ):
        knob_int("branch_length", branch_length, 1, "L_b")
        knob_int("max_query_length", max_query_length, 1)
        knob_number("output_weight", output_weight, 0.0, 1.0, "w")
        self.branch_length = branch_length
        self.max_query_length = max_query_length
        self.window = branch_length + max_query_length - 1  # tokens stored after each first token
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

    def _insert(self, first: int, branch: Sequence[int], output: bool) -> None:
        """Add one branch under ``mem[first]``: +1 on the chosen channel of every node on its path."""
        trie = self.mem.get(first)
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
            trie.n_output_node += new_channel
        else:
            trie.n_input_node += new_channel
            self._input_touched.add(first)
        self._touched.add(first)

    def insert_sequence(self, ids: Sequence[int], output: bool) -> None:
        """Insert every window of ``ids`` (a prompt as INPUT, a warm-up answer as OUTPUT) if that channel is on."""
        if not (self.insert_output if output else self.insert_input):
            return
        window = self.window
        for i in range(len(ids) - 1):
            self._insert(ids[i], ids[i + 1 : i + 1 + window], output)

    def stream_output(self, ids: Sequence[int]) -> None:
        """Feed committed output tokens; each token's window goes in as OUTPUT once it is complete."""
        if not self.insert_output:
            return
        stream = self._stream
        stream.extend(ids)
        ready = len(stream) - self.window
        if ready > 0:
            for i in range(ready):
                self._insert(stream[i], stream[i + 1 : i + 1 + self.window], True)
            del stream[:ready]

    def end_request(self) -> None:
        """The request is over: flush its last (shorter) windows, eliminate its prompt, prune."""
        stream = self._stream
        for i in range(len(stream) - 1):
            self._insert(stream[i], stream[i + 1 :], True)
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
        """Halve ``f_out`` of nodes with ``f_out > 1``; delete the others with their subtrees."""
        stack: list[TrieNode] = [trie]
        while stack:
            node = stack.pop()
            for token, child in list(node.children.items()):
                if child.f_out > 1.0:
                    child.f_out *= 0.5
                    stack.append(child)
                else:
                    del node.children[token]
        if not trie.children:
            del self.mem[first]
            return
        self._recount(trie)

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

    def _matches(self, query: Sequence[int]) -> Iterator[tuple[int, TrieNode]]:
        """(query length, matched node) from the longest usable query suffix down to the last token."""
        longest = min(self.max_query_length, len(query))
        for length in range(longest, 0, -1):
            node = self.match(query[len(query) - length :])
            if node is not None and node.children:
                yield length, node

    def retrieve(self, query: Sequence[int], decoding_length: int, max_depth: int) -> Draft:
        """Hierarchical draft: the longest query suffix yielding >= ``max_depth`` nodes, else shorter.

        ``decoding_length`` (L_d) bounds the tokens of the forward, root included; ``max_depth`` is
        the branch length, clipped by the caller to the generation budget.
        """
        return self._retrieve(
            query, max_depth, max_depth, lambda node: self.select(node, query[-1], decoding_length, max_depth)
        )

    def retrieve_branch(self, query: Sequence[int], max_depth: int) -> Draft:
        """LLMA-style single branch: the highest-``fm`` path (fallback when shorter than max_depth // 2)."""
        return self._retrieve(
            query, max(max_depth // 2, 1), max_depth, lambda node: self.best_branch(node, query[-1], max_depth)
        )

    def _retrieve(
        self,
        query: Sequence[int],
        enough: int,
        max_depth: int,
        build: Callable[[TrieNode], tuple[list[int], list[int]]],
    ) -> Draft:
        """Try query suffixes longest first; keep the latest non-empty draft, stop once it has ``enough``."""
        best = Draft([query[-1]], [-1], 0)
        if max_depth < 1:
            return best
        for length, node in self._matches(query):
            tokens, parents = build(node)
            if len(tokens) > 1:
                best = Draft(tokens, parents, length)
                if best.num_drafted >= enough:
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
        """(min f_out, min fm) a node needs to qualify for the draft (the official code's selection).

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

    def select(self, start: TrieNode, root: int, decoding_length: int, max_depth: int) -> tuple[list[int], list[int]]:
        """At most ``decoding_length`` tokens (root included) in DFS order, children by descending fm."""
        out_min, mix_min = self.thresholds(start, decoding_length, max_depth)
        mixed = self.mixed

        def ranked(node: TrieNode, parent: int, depth: int) -> list[tuple[float, int, TrieNode, int, int]]:
            """Qualifying children of ``node``, lowest fm first (so the stack pops the best first)."""
            kids = [
                (fm, token, child, parent, depth)
                for token, child in node.children.items()
                if ((fm := mixed(child)) > 0.0 and fm >= mix_min) or out_min <= child.f_out
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
        """The single highest-fm path below ``start`` (LLMA baseline), at most ``max_depth`` deep."""
        tokens = [root]
        node = start
        while len(tokens) <= max_depth:
            best_fm, best = 0.0, None
            for token, child in node.children.items():
                fm = self.mixed(child)
                if fm > best_fm:
                    best_fm, best = fm, (token, child)
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


def parallel_layout(tokens: list[int], parents: list[int]) -> tuple[list[int], list[int]]:
    """Lookahead's parallel multi-branch draft: each root-to-leaf branch of a trie as its own chain.

    Shared prefixes are copied into every branch, under the trie's own token budget (its node
    count), so later branches are cut or dropped. ``tokens``/``parents`` must be in DFS preorder
    (leaves then come in branch order).
    """
    budget = len(tokens)
    inner = set(parents)
    out_tokens, out_parents = [tokens[0]], [-1]
    for leaf in range(1, len(tokens)):
        if leaf in inner:
            continue
        path = []
        node = leaf
        while node > 0:
            path.append(node)
            node = parents[node]
        previous = 0
        for node in reversed(path[-(budget - len(out_tokens)) :]):
            out_parents.append(previous)
            previous = len(out_tokens)
            out_tokens.append(tokens[node])
        if len(out_tokens) >= budget:
            break
    return out_tokens, out_parents
