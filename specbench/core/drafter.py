"""The Drafter interface (the only place where methods differ), its decode context, books and knob checks.

Every method is a ``Drafter`` run by the one loop (``specbench.core.loop``). What a drafter counts
lives in its ``books`` (``DrafterBooks``: per-generation counters and named timers, zeroed by the
loop at the start of every generation), and every drafter validates its config values with the
``knob_*`` functions below, so statistics and error messages read the same for every method. The
per-step phase timing (draft / verify / accept / update) is the loop's; a drafter times only the
parts of its own work that the phases cannot tell apart (e.g. Lookahead's trie retrieval).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from specbench.core.acceptance import Acceptance, Sampling
from specbench.core.tree import DraftTree
from specbench.core.verify import VerifyOutput
from specbench.errors import ConfigError

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase


class DrafterError(RuntimeError):
    """A drafter handed the loop something it cannot verify (a malformed tree, ids outside the vocabulary, rows left
    in the target's KV cache): a bug in that drafter, named in the message, caught before any forward."""


@dataclass
class DecodeContext:
    """What a drafter may read about the decode in progress."""

    tokens: list[int]  # prompt + committed output; tokens[-1] is the root x (KV not cached)
    prompt_len: int
    remaining: int  # tokens still allowed by max_new_tokens (the root's successor included)
    step: int  # verify steps done so far in this generation
    generator: torch.Generator | None  # the run's seeded RNG (random pads, sampled drafts)
    cache: DynamicCache | None = None  # the target's KV cache of tokens[:-1]: a drafter may run the target on it
    # (self-speculation) and append rows, but must crop it back to ``position`` rows before proposing; None on the
    # compiled path, whose static cache is its own (such a drafter declares ``needs_dynamic_cache``)
    sampling: Sampling = field(default_factory=Sampling)  # the run's sampling: the one route by which it reaches
    # a drafter (the loop's, which the acceptance rule uses too)

    def draft_law(self, sampled: bool) -> Sampling | None:
        """The law a drafter draws this step's drafts from: the run's when it samples (T > 0) and the drafter's
        ``sampled`` knob says so; None = the draft's top-k (deterministic drafts)."""
        return self.sampling if sampled and not self.sampling.greedy else None

    @property
    def root(self) -> int:
        """The last committed token x: node 0 of every proposed tree."""
        return self.tokens[-1]

    @property
    def position(self) -> int:
        """Position p of the root token."""
        return len(self.tokens) - 1


class Lap:
    """The wall time of one measured block (filled when the block ends)."""

    seconds: float = 0.0


@contextmanager
def stopwatch() -> Iterator[Lap]:
    """Measure the wall time of a block: ``with stopwatch() as lap: ...``, then read ``lap.seconds``."""
    lap = Lap()
    start = time.perf_counter()
    try:
        yield lap
    finally:
        lap.seconds = time.perf_counter() - start


class DrafterBooks:
    """A drafter's per-generation counters and named timers, reported in its ``drafter_stats``.

    The counters are declared once (the drafter's ``COUNTERS``), so every record carries all of them,
    zeros included, and a misspelt name fails at once instead of starting a new counter.
    """

    def __init__(self, counters: Sequence[str] = ()) -> None:
        self.names = tuple(counters)
        self.counts: Counter[str] = Counter(dict.fromkeys(self.names, 0))  # name -> total this generation
        self.seconds: dict[str, float] = {}

    def clear(self) -> None:
        """Zero everything (the loop calls this before each generation)."""
        self.counts = Counter(dict.fromkeys(self.names, 0))
        self.seconds.clear()

    def add(self, **increments: float) -> None:
        """Add to declared counters (booleans count as 0 / 1)."""
        unknown = sorted(set(increments) - set(self.names))
        if unknown:
            raise KeyError(f"undeclared drafter counters {unknown}; declare them in COUNTERS")
        self.counts.update(increments)

    def per(self, name: str, unit: str) -> float:
        """``counts[name] / counts[unit]``, 0.0 while ``unit`` is zero (e.g. candidates per step)."""
        return self.counts[name] / self.counts[unit] if self.counts[unit] else 0.0

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Charge the block's wall time to the timer ``name`` (reported as ``<name>_s``)."""
        with stopwatch() as lap:
            yield
        self.seconds[name] = self.seconds.get(name, 0.0) + lap.seconds

    def report(self) -> dict[str, float]:
        """Counters and timers (as ``<name>_s`` seconds)."""
        return {**self.counts, **{f"{name}_s": round(seconds, 6) for name, seconds in self.seconds.items()}}


class Drafter:
    """Proposes a DraftTree each step and learns from what the target accepted.

    Subclasses override ``propose`` (and usually ``reset``/``observe``/``stats``) and call
    ``super().__init__()``. ``hidden_layers`` names the target's hidden states ``observe`` needs at the tree
    rows and ``observe_prompt`` at the prompt rows (indices into the model's hidden-states tuple, -1 = the last,
    after the final norm: Medusa, EAGLE; three layers for EAGLE-3, set in ``setup`` from the target's depth);
    aux-row logits arrive whenever the proposed tree carries an aux block.
    """

    hidden_layers: tuple[int, ...] = ()
    needs_dynamic_cache: bool = False
    """True for a drafter that runs the target on ``ctx.cache`` itself (self-speculation): it needs the eager path's
    dynamic cache, so its engine never runs compiled (``compile=true`` runs it eager, and the run says why)."""
    COUNTERS: ClassVar[tuple[str, ...]] = ()
    """The per-generation counters this drafter keeps in its books."""
    reads_sampling: ClassVar[bool] = False
    """Whether its drafts are drawn from the run's sampling at T > 0 (``DecodeContext.draft_law``). Runs stored before
    the decode context carried the sampling had it in this drafter's config node (``temperature``, ``top_p``), and
    the configuration digest puts it back there for these drafters (``runner.config_digest``)."""

    def __init__(self) -> None:
        self.books = DrafterBooks(self.COUNTERS)

    def setup(self, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> None:
        """Bind to the target model once per run (load draft models, build caches)."""

    def start(self, prompt_ids: list[int]) -> None:
        """Begin a generation: zero the books, then ``reset`` (called by the loop, not overridden)."""
        self.books.clear()
        self.reset(prompt_ids)

    def reset(self, prompt_ids: list[int]) -> None:
        """Start a new generation from ``prompt_ids`` (per-request state goes here)."""

    def forget(self) -> None:
        """Drop what this drafter learned across requests, back to how ``setup`` left it: the runner warms up on the
        engine it then times and forgets after, so the warm-up leaves no trace (default: nothing crosses requests; a
        drafter that overrides ``recall`` keeps a memory and overrides this too, which the conformance suite checks)."""

    def recall(self, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """Learn what this drafter keeps across requests from a generation it did not run: a resumed run calls it for
        each finished sample's turns, in run order, before the first pending sample, so the memory is what an
        uninterrupted run's would be. True when done from the prompt and the output alone (the default: nothing
        crosses requests); False when that memory also depends on what the target computed (verified logits, accepted
        drafts), and the engine must run the generation again, untimed, to rebuild it."""
        return True

    def prefill_tail(self, generator: torch.Generator | None) -> list[int]:
        """Tokens to run after the prompt in the prefill forward, under the plain causal mask (default:
        none). Their KV is dropped; their logits go to ``observe_prefill`` (LADE's window start)."""
        return []

    def observe_prefill(self, tail_logits: torch.Tensor) -> None:
        """The prefill's logits at the ``prefill_tail`` tokens ([tail_len, vocab], float32)."""

    def observe_prompt(self, hidden: torch.Tensor) -> None:
        """The prefill's hidden states at ``hidden_layers`` of every prompt row ([prompt_len, layers x hidden]); the
        loop calls it only for drafters with ``hidden_layers`` and no ``prefill_tail`` (EAGLE fills its draft cache
        from them)."""

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """The tree to verify this step; node 0 must be ``ctx.root``."""
        raise NotImplementedError

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified: VerifyOutput, accepted: Acceptance) -> None:
        """Learn from the verify pass (n-gram pools, tries, draft-cache rollback)."""

    def stats(self) -> dict[str, Any]:
        """Drafter internals for the per-sample record: the books, plus what a subclass derives from them."""
        return self.books.report()

    def artefacts(self) -> list[str]:
        """The parts this drafter loaded, named so runs made with different ones never count as one setting
        (``draft:<weights digest>`` for trained parts, ``draft:<Hub id>`` for published ones)."""
        return []


def knob_int(key: str, value: object, lowest: int, symbol: str | None = None) -> int:
    """``value`` if it is an integer >= ``lowest``, else a ConfigError naming ``method.drafter.<key>``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise ConfigError(f"{knob_name(key, symbol)} must be an integer >= {lowest}, got {value!r}")
    return value


def knob_number(
    key: str, value: object, lowest: float, highest: float | None = None, symbol: str | None = None
) -> float:
    """``value`` as a float in [lowest, highest], else a ConfigError naming ``method.drafter.<key>``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value < lowest
        or (highest is not None and value > highest)
    ):
        bounds = f">= {lowest}" if highest is None else f"in [{lowest}, {highest}]"
        raise ConfigError(f"{knob_name(key, symbol)} must be a number {bounds}, got {value!r}")
    return float(value)


def knob_choice(key: str, value: object, choices: Sequence[object], symbol: str | None = None) -> Any:
    """``value`` if it is one of ``choices``, else a ConfigError listing them."""
    if value not in choices:
        raise ConfigError(f"{knob_name(key, symbol)} must be one of {list(choices)}, got {value!r}")
    return value


def knob_name(key: str, symbol: str | None) -> str:
    """``method.drafter.<key>`` with the paper symbol in parentheses, as every knob error names it."""
    return f"method.drafter.{key}" + (f" ({symbol})" if symbol else "")
