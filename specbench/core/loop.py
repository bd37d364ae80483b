"""The one decode loop: prefill -> [propose -> verify -> accept -> compact -> observe] until EOS/budget.

Timing: the device is synchronized at the prefill's ends and at the end of every step (the step's
wall time is a reported metric). The per-phase breakdown (draft, verify forward, acceptance + cache
update, drafter update) adds one synchronization per phase end, so it is switchable: ``auto`` turns it
on where synchronization is free (CPU) and off on CUDA, where extra syncs would stall the queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from specbench.core.acceptance import Acceptance, Sampling, accept_match, draw
from specbench.core.drafter import DecodeContext, Drafter, DrafterError
from specbench.core.tree import DraftTree
from specbench.core.verify import (
    EagerVerifier,
    Verifier,
    cache_length,
    compact_cache,
    prefill,
    prefill_hidden,
    prefill_with_tail,
)
from specbench.errors import ConfigError
from specbench.schema import PHASES, STEP_FIELDS, StepLists

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache

STEP_BREAKDOWN_SETTINGS = (True, False, "auto")
"""The values of the ``step_breakdown`` run knob."""

AcceptFn = Callable[[DraftTree, torch.Tensor, Sampling, "torch.Generator | None"], Acceptance]


@dataclass
class Generation(StepLists):
    """One generated continuation with its per-step traces (``StepLists``: filled by the loop, None for engines
    outside it)."""

    output_ids: list[int]
    prefill_s: float
    target_forwards: int  # verify forwards after the prefill
    stop_reason: str  # "eos" | "max_new_tokens"
    latency_s: float | None = None  # the request's own wall time where the engine measured it (a batch's requests
    # finish at different times); None: the runner's clock around the call is the request's


LOOP_TRACES = tuple(name for name in STEP_FIELDS if name.removesuffix("_s") not in PHASES)
"""The traces the loop fills at every step (the step breakdown's ``<phase>_s`` only when on: ``PhaseClock``)."""


class Engine(Protocol):
    """What the runner times: the shared loop (``Decoder``) or a reference such as HF ``generate``."""

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, generator: torch.Generator | None = None
    ) -> Generation:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``."""
        ...

    def stats(self) -> dict[str, Any]:
        """Method internals after the latest generation (the record's ``drafter_stats``)."""
        ...

    def artefacts(self) -> list[str]:
        """The draft models, heads or caches the engine uses (recorded in the run summary)."""
        ...

    @property
    def compiled(self) -> bool:
        """Whether the target's verify forwards run compiled (``specbench.core.compiled``)."""
        ...

    def forget(self) -> None:
        """Drop what the engine keeps across requests, back to how it was built (after the runner's warm-up)."""
        ...

    def replay(
        self, prompt_ids: list[int], output_ids: list[int], max_new_tokens: int, generator: torch.Generator | None
    ) -> list[int] | None:
        """Bring what the engine keeps across requests to where an earlier generation of the run left it (a resumed run
        replays its finished samples in run order, untimed): from ``output_ids`` (None), or by generating again when
        that memory depends on more than the output (the new output, which should equal ``output_ids``)."""
        ...


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so wall-clock timings are honest (every GPU: a device map spans several)."""
    if device.type == "cuda":
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


def breakdown_enabled(setting: bool | str, device: torch.device) -> bool:
    """Resolve ``step_breakdown`` (true | false | auto): auto is on unless syncs cost (CUDA)."""
    if setting not in STEP_BREAKDOWN_SETTINGS:
        raise ConfigError(f"step_breakdown must be true, false or auto; got {setting!r}")
    if isinstance(setting, str):  # "auto", the one string setting
        return device.type != "cuda"
    return setting


class PhaseClock:
    """Per-step phase timer: at each phase end it syncs and reads the clock, or does nothing when off."""

    def __init__(self, device: torch.device, enabled: bool):
        self.device = device
        self.laps: dict[str, list[float]] | None = {phase: [] for phase in PHASES} if enabled else None
        self.last = 0.0

    def start(self, now: float) -> None:
        """Begin a step at ``now`` (the device is idle: the previous step ended synchronized)."""
        self.last = now

    def lap(self, phase: str) -> None:
        """Close ``phase``: wait for its queued device work, then charge it the time since the last lap."""
        if self.laps is None:
            return
        synchronize(self.device)
        now = time.perf_counter()
        self.laps[phase].append(now - self.last)
        self.last = now

    def record(self, gen: Generation) -> None:
        """Store the laps in ``gen``'s ``<phase>_s`` fields (left None when off)."""
        for phase, laps in (self.laps or {}).items():
            setattr(gen, f"{phase}_s", laps)


@dataclass
class StepOutcome:
    """What one loop step emitted and what it verified (its entries of the ``StepLists`` of the same names)."""

    emitted: list[int]  # tokens committed, before the budget and EOS clip
    draft_tokens: int  # drafted nodes verified (root excluded)
    draft_depth: int  # depth of the verified tree (0: nothing drafted)
    verify_tokens: int  # rows of the verify forward: root, drafted nodes and aux rows
    side_branch: bool  # the accepted path used a child other than its parent's first-listed one

    def entries(self, kept: int, seconds: float) -> dict[str, int | bool | float]:
        """The step's entry of each of ``LOOP_TRACES``: ``kept`` tokens emitted after the clip, what it verified,
        its wall time."""
        verified = {name: value for name, value in vars(self).items() if name != "emitted"}
        return {"accept_lengths": kept, **verified, "step_s": seconds}


def clip_emitted(tokens: list[int], eos_ids: frozenset[int], budget: int) -> tuple[list[int], str | None]:
    """Cut a step's tokens at the first EOS (kept) and at the remaining budget; say why it stopped."""
    for i, token in enumerate(tokens[:budget]):
        if token in eos_ids:
            return tokens[: i + 1], "eos"
    if len(tokens) >= budget:
        return tokens[:budget], "max_new_tokens"
    return tokens, None


class Decoder:
    """Runs the shared loop for one target model and one drafter."""

    def __init__(
        self,
        model: PreTrainedModel,
        drafter: Drafter,
        eos_ids: frozenset[int],
        sampling: Sampling,
        accept_fn: AcceptFn = accept_match,
        step_breakdown: bool | str = "auto",
        verifier: Verifier | None = None,
    ):
        self.model = model
        self.drafter = drafter
        self.eos_ids = eos_ids
        self.sampling = sampling
        self.accept_fn = accept_fn
        self.breakdown = breakdown_enabled(step_breakdown, model.device)
        self.vocab = model.get_input_embeddings().num_embeddings  # the token ids the target reads
        self.verifier = verifier or EagerVerifier(model)  # eager, or compiled on a static cache (core/compiled.py)
        if self.verifier.compiled and drafter.needs_dynamic_cache:
            raise ConfigError(f"{type(drafter).__name__} runs the target on ctx.cache: it cannot run compiled")

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, generator: torch.Generator | None = None
    ) -> Generation:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``."""
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not prompt_ids:
            raise ConfigError("cannot generate from an empty prompt (0 tokens)")
        device = self.model.device
        self.drafter.start(list(prompt_ids))
        cache = self.verifier.cache_for(len(prompt_ids) + max_new_tokens)
        tail = self.drafter.prefill_tail(generator)
        synchronize(device)
        start = time.perf_counter()
        if tail:  # tokens a drafter runs after the prompt in the prefill (LADE's official window start)
            logits, tail_logits = prefill_with_tail(self.model, cache, torch.tensor(prompt_ids), torch.tensor(tail))
            self.drafter.observe_prefill(tail_logits)
        elif self.drafter.hidden_layers:  # hidden states of every prompt row (EAGLE fills its draft cache)
            logits, hidden = prefill_hidden(self.model, cache, torch.tensor(prompt_ids), self.drafter.hidden_layers)
            self.drafter.observe_prompt(hidden)
        else:
            logits = prefill(self.model, cache, torch.tensor(prompt_ids))
        first = draw(logits, self.sampling, generator)
        synchronize(device)
        gen = Generation([first], time.perf_counter() - start, 0, "eos")
        tokens = [*prompt_ids, first]
        _, stop = clip_emitted([first], self.eos_ids, max_new_tokens)
        clock = PhaseClock(device, self.breakdown)
        trace: dict[str, list] = {name: [] for name in LOOP_TRACES}
        while stop is None:
            remaining = max_new_tokens - len(gen.output_ids)
            step_start = time.perf_counter()
            clock.start(step_start)
            shared = None if self.verifier.compiled else cache  # the static cache is the compiled path's own
            ctx = DecodeContext(
                tokens, len(prompt_ids), remaining, gen.target_forwards, generator, shared, self.sampling
            )
            step = self._step(ctx, cache, clock)
            clock.lap("update")  # drafter.observe, and freeing the step's trees and logits on return
            emitted, stop = clip_emitted(step.emitted, self.eos_ids, remaining)
            tokens.extend(emitted)
            gen.output_ids.extend(emitted)
            gen.target_forwards += 1
            synchronize(device)  # the step's timing boundary
            for name, entry in step.entries(len(emitted), time.perf_counter() - step_start).items():
                trace[name].append(entry)
        for name, values in trace.items():
            setattr(gen, name, values)
        clock.record(gen)
        gen.stop_reason = stop
        return gen

    @property
    def compiled(self) -> bool:
        """Whether the verify forwards run compiled on a static cache."""
        return self.verifier.compiled

    def stats(self) -> dict[str, Any]:
        """The drafter's internals after the latest generation."""
        return self.drafter.stats()

    def artefacts(self) -> list[str]:
        """The parts the drafter loaded."""
        return self.drafter.artefacts()

    def replay(
        self, prompt_ids: list[int], output_ids: list[int], max_new_tokens: int, generator: torch.Generator | None
    ) -> list[int] | None:
        """The drafter recalls the generation from its output (``Drafter.recall``), or it runs again on the loop."""
        if self.drafter.recall(list(prompt_ids), list(output_ids)):
            return None
        return self.generate(prompt_ids, max_new_tokens, generator).output_ids

    def forget(self) -> None:
        """The drafter drops its cross-request memory (``Drafter.forget``)."""
        self.drafter.forget()

    def _check_proposal(self, tree: object, ctx: DecodeContext) -> None:
        """Refuse what the drafter handed over before any forward sees it: a tree that is not one (its structure,
        token ids outside the vocabulary, aux shapes), a root other than the last token, or a KV cache left longer
        or shorter than the committed tokens (O(nodes) in Python: far below a forward's time)."""
        name = type(self.drafter).__name__
        if not isinstance(tree, DraftTree):
            raise DrafterError(f"{name}.propose returned a {type(tree).__name__}, not a DraftTree")
        problem = tree.problem(self.vocab)
        if problem is None and tree.tokens[0] != ctx.root:
            problem = f"node 0 is token {tree.tokens[0]}, not the root (the last committed token, {ctx.root})"
        if problem is not None:
            raise DrafterError(f"{name} proposed a tree the target cannot verify at step {ctx.step}: {problem}")
        rows = ctx.position if ctx.cache is None else cache_length(ctx.cache)  # compiled: the drafter sees no cache
        if rows != ctx.position:
            change = f"left {rows - ctx.position} rows of its own in" if rows > ctx.position else "removed rows from"
            raise DrafterError(
                f"{name} {change} the target's KV cache at step {ctx.step} ({rows} rows, the committed tokens hold "
                f"{ctx.position}); a drafter that runs the target on ctx.cache must crop it back to ctx.position rows"
            )

    def _step(self, ctx: DecodeContext, cache: Cache, clock: PhaseClock) -> StepOutcome:
        """One propose -> verify -> accept -> compact -> observe; returns what the step emitted and drafted.

        ``clock`` laps draft, verify and accept; the caller laps update once the step's locals are freed.
        """
        tree = self.drafter.propose(ctx)
        self._check_proposal(tree, ctx)
        tree = tree.pruned(ctx.remaining - 1)  # deeper nodes could never be emitted
        past_len = ctx.position
        flat = self.verifier.lay_out(tree, past_len)
        clock.lap("draft")
        verified = self.verifier.verify(cache, tree, self.drafter.hidden_layers, flat)
        clock.lap("verify")
        accepted = self.accept_fn(tree, verified.logits, self.sampling, ctx.generator)
        compact_cache(cache, past_len, accepted.path)
        clock.lap("accept")
        self.drafter.observe(ctx, tree, verified, accepted)
        return StepOutcome(
            accepted.emitted(tree),
            tree.num_drafted,
            tree.depth,
            flat.input_ids.shape[1],
            tree.leaves_first_branch(accepted.path),
        )
