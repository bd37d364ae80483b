"""The compiled path: verify forwards through ``torch.compile`` on a static KV cache, at a few bucketed widths.

Eager PyTorch pays a host-side launch for every kernel of every layer; at batch 1 on a GPU that, not the
weights' memory traffic, sets a step's time. Compiling the target's forward (with CUDA graphs on a GPU,
``mode="reduce-overhead"``) removes most of it, but a compiled graph has fixed shapes. So:

- the KV cache is a ``static_cache`` (``specbench.core.verify``) of a fixed number of rows, allocated once and
  reused by every generation of the process while it is large enough (``CompiledVerifier.cache_for``; its rows
  are a multiple of ``ROW_QUANTUM`` and marked dynamic, so a larger one compiles nothing again);
- a verify forward runs at the smallest of ``BUCKETS`` widths that holds its tree and aux rows: the pass is
  padded to that width and to the cache's rows (``flatten``'s ``shape``), the padding masked out, so each
  width is one graph, compiled once (during the warm-up: ``CompiledVerifier.warm_up``);
- acceptance keeps the accepted path's rows as on the eager path (``compact_cache``: rows gathered into place,
  then the valid length set), so rollback moves no rows and never syncs with the host.

The prefill stays eager (its length varies; it runs once per generation). Every drafter runs on this path
unless it declares ``needs_dynamic_cache`` (it runs the target on ``ctx.cache`` itself, e.g. Draft&Verify's
skipped-layer draft): then its engine stays eager and the run's summary says why (``specbench.engines``).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from specbench.core.tree import DraftTree, FlatPass, flatten
from specbench.core.verify import VerifyOutput, compact_cache, static_cache, verify_output
from specbench.errors import ConfigError

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
"""Verify widths (rows) the compiled path compiles: a tree (with its aux rows) runs at the smallest that holds it."""

ROW_QUANTUM = 256
"""The static cache's rows are a multiple of this (prompt + budget + the largest bucket, rounded up)."""

RECOMPILE_LIMIT = 64
"""torch._dynamo's limit of graphs per compiled function, raised to it: one graph per bucket, per model shape and
backend (torch's default, 8, is exactly the buckets of one model)."""


def compilations() -> int:
    """Graphs torch.compile has compiled in this process so far (every backend, every function)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def rows_forward(model, input_ids, position_ids, attention_mask, cache: Cache):
    """One target forward of fixed-shape inputs ([1, bucket] ids and positions, [1, 1, bucket, rows] mask) on the
    static cache: the logits [1, bucket, vocab] and every hidden state [1, bucket, hidden] (the drafters' choice
    of layers is made after, so every drafter shares one graph per bucket)."""
    out = model(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=True,
    )
    return out.logits, out.hidden_states


@dataclass
class WarmUp:
    """What compiling every bucket cost: wall seconds and graphs compiled (0 once compiled in this process)."""

    seconds: float
    graphs: int


class CompiledVerifier:
    """Verify forwards of one target through torch.compile at bucketed widths on a reused static cache.

    One per model and backend (``compiled_verifier``), shared by every engine on that model, so a benchmark
    session compiles each bucket once and every generation reuses one cache.
    """

    compiled = True

    def __init__(self, model, buckets: tuple[int, ...] = BUCKETS, backend: str = "inductor") -> None:
        if getattr(model, "hf_device_map", None) and len(set(model.hf_device_map.values())) > 1:
            raise ConfigError("compile=true needs the target on one device (model.device_map spreads it)")
        self.model = model
        self.buckets = tuple(sorted(set(buckets)))
        self.backend = backend
        self.cudagraphs = model.device.type == "cuda" and backend == "inductor"
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self.forward = torch.compile(
            rows_forward,
            backend=backend,
            mode="reduce-overhead" if self.cudagraphs else None,
            dynamic=False,
            fullgraph=True,
        )
        self.cache: Cache | None = None
        self.rows = 0  # rows of self.cache
        self.warm: set[int] = set()  # buckets compiled (and, with CUDA graphs, recorded) on self.cache
        with torch.inference_mode():  # transformers installs its hidden-state hooks at the first such eager forward
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=model.device), output_hidden_states=True)

    def cache_for(self, context: int) -> Cache:
        """The static cache, emptied, with room for ``context`` positions and a pass of the largest bucket (a larger
        one, kept for later generations, when the current one is too small)."""
        needed = context + self.buckets[-1]
        if self.cache is None or self.rows < needed:
            self.rows = -(-needed // ROW_QUANTUM) * ROW_QUANTUM
            self.cache = static_cache(self.model, self.rows)
            self.warm = set()  # CUDA graphs are recorded again for a new cache
            for layer in self.cache.layers:  # one graph per bucket whatever the cache's rows
                torch._dynamo.mark_dynamic(layer.keys, 2)
                torch._dynamo.mark_dynamic(layer.values, 2)
        compact_cache(self.cache, 0, [])
        return self.cache

    def bucket(self, width: int) -> int:
        """The smallest bucket of at least ``width`` rows."""
        for bucket in self.buckets:
            if bucket >= width:
                return bucket
        raise ValueError(
            f"a verify forward of {width} rows is wider than the compiled path's largest bucket ({self.buckets[-1]})"
        )

    def lay_out(self, tree: DraftTree, past_len: int) -> FlatPass:
        """``tree`` padded to its bucket and to the cache's rows, the padding masked out."""
        width = len(tree) + (len(tree.aux) if tree.aux is not None else 0)
        flat = flatten(tree, past_len, self.model.dtype, self.model.device, (self.bucket(width), self.rows))
        assert flat.attention_mask is not None  # flatten always masks a pass of a given shape
        torch._dynamo.mark_dynamic(flat.attention_mask, 3)  # the cache's rows
        return flat

    def verify(self, cache: Cache, tree: DraftTree, hidden_layers: tuple[int, ...], flat: FlatPass) -> VerifyOutput:
        """The compiled forward of the padded pass; copies of the rows the tree and its aux rows own."""
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are no longer read
        logits, hidden_states = self.forward(self.model, flat.input_ids, flat.position_ids, flat.attention_mask, cache)
        return verify_output(tree, logits, hidden_states, hidden_layers, copy=True)

    def warm_up(self, context: int) -> WarmUp:
        """Compile every bucket not yet warm on the cache for ``context`` positions (one forward each; three with CUDA
        graphs, which are recorded at the second or third), so that no timed step compiles."""
        before, start = compilations(), time.perf_counter()
        cache = self.cache_for(context)
        for bucket in sorted(set(self.buckets) - self.warm):
            tree = DraftTree.chain(0, [0] * (bucket - 1))
            for _ in range(3 if self.cudagraphs else 1):
                self.verify(cache, tree, (), self.lay_out(tree, 0))
                compact_cache(cache, 0, [])
            self.warm.add(bucket)
        return WarmUp(time.perf_counter() - start, compilations() - before)


_VERIFIERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {backend: CompiledVerifier}


def compiled_verifier(model, backend: str = "inductor") -> CompiledVerifier:
    """The one ``CompiledVerifier`` of ``model`` and ``backend`` in this process."""
    verifiers = _VERIFIERS.setdefault(model, {})
    if backend not in verifiers:
        verifiers[backend] = CompiledVerifier(model, backend=backend)
    return verifiers[backend]
