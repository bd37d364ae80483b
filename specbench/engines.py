"""Generation engines the runner can drive: the shared decode loop, or HF ``generate`` as a reference."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig
from transformers import GenerationConfig

from specbench.config import instantiate_checked
from specbench.core.acceptance import Sampling
from specbench.core.drafter import Drafter
from specbench.core.loop import AcceptFn, Decoder, Engine, Generation, synchronize
from specbench.core.rules import acceptance_rule
from specbench.core.verify import Verifier
from specbench.errors import ConfigError
from specbench.models.draft import load_draft, vocab_width
from specbench.models.loading import LoadedModel

ENGINES = ("loop", "hf_generate")


class HFGenerate:
    """transformers' ``generate`` on the same prompts; forwards are counted with a hook."""

    def __init__(
        self,
        model,
        eos_ids: frozenset[int],
        sampling: Sampling,
        generate_kwargs: dict,
        call_kwargs: dict | None = None,
        parts: list[str] | None = None,
    ):
        self.model = model
        self.call_kwargs = call_kwargs or {}  # generate() arguments that are not GenerationConfig fields
        assistant = self.call_kwargs.get("assistant_model")
        self.assistant_start = copy.deepcopy(assistant.generation_config) if assistant is not None else None
        self.parts = parts or []  # the assistant draft of assisted generation
        self.settings = dict(
            do_sample=not sampling.greedy,
            temperature=sampling.temperature if not sampling.greedy else None,
            top_p=sampling.top_p if not sampling.greedy else None,
            top_k=0 if not sampling.greedy else None,  # 0 = no top-k cut (HF defaults to 50)
            eos_token_id=sorted(eos_ids) or None,
            pad_token_id=min(eos_ids) if eos_ids else None,
            **generate_kwargs,
        )

    compiled = False  # transformers' own generate: never the compiled path

    def stats(self) -> dict:
        """HF generate exposes no drafter internals."""
        return {}

    def artefacts(self) -> list[str]:
        """The assistant draft, for assisted generation."""
        return self.parts

    def forget(self) -> None:
        """Assisted generation: the assistant's generation config (its heuristic number of draft tokens) back to how
        the run started; plain ``generate`` keeps nothing across requests."""
        if self.assistant_start is not None:
            self.call_kwargs["assistant_model"].generation_config = copy.deepcopy(self.assistant_start)

    def replay(
        self, prompt_ids: list[int], output_ids: list[int], max_new_tokens: int, generator: torch.Generator | None
    ) -> list[int] | None:
        """Plain ``generate`` keeps nothing across requests; assisted generation runs again (the assistant's heuristic
        number of draft tokens, kept in its generation config, follows the acceptance of every call)."""
        if "assistant_model" not in self.call_kwargs:
            return None
        return self.generate(prompt_ids, max_new_tokens, generator).output_ids

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, generator: torch.Generator | None = None
    ) -> Generation:
        """Run ``model.generate``; prefill time is the end of its first forward."""
        if generator is not None:
            torch.manual_seed(generator.initial_seed())
        device = self.model.device
        ids = torch.tensor([prompt_ids], device=device)  # [1, prompt_len]
        forward_ends: list[float] = []

        def on_forward(*_):
            synchronize(device)
            forward_ends.append(time.perf_counter())

        hook = self.model.register_forward_hook(on_forward)
        try:
            synchronize(device)
            start = time.perf_counter()
            config = GenerationConfig(max_new_tokens=max_new_tokens, **self.settings)
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=config, **self.call_kwargs
            )
            synchronize(device)
        finally:
            hook.remove()
        output = out[0, len(prompt_ids) :].tolist()
        stop = "eos" if output and output[-1] in (config.eos_token_id or []) else "max_new_tokens"
        return Generation(output, forward_ends[0] - start, len(forward_ends) - 1, stop)


def hf_assistant(assistant_cfg: DictConfig, lm: LoadedModel) -> tuple[dict[str, Any], str]:
    """generate() arguments for HF assisted generation with ``method.assistant.draft`` as the assistant, and
    the draft's part name.

    transformers reads num_assistant_tokens & co. from the ASSISTANT's generation config, so the other
    ``method.assistant`` keys are set there. A draft with another vocabulary size goes with both
    tokenizers (HF refuses it otherwise).
    """
    settings = {str(key): value for key, value in assistant_cfg.items() if key != "draft"}
    draft = load_draft(assistant_cfg.get("draft"), lm.name, lm.model, lm.tokenizer)
    model = copy.deepcopy(draft.model) if draft.model is lm.model else draft.model  # own forwards, own hook count
    unknown = model.generation_config.update(**settings)
    if unknown:
        raise ConfigError(f"method.assistant keys {sorted(unknown)} are not generation-config fields")
    kwargs: dict[str, Any] = {"assistant_model": model}
    if vocab_width(model) != vocab_width(lm.model):
        kwargs.update(tokenizer=lm.tokenizer, assistant_tokenizer=draft.tokenizer)
    return kwargs, draft.part


@dataclass
class Method:
    """A method config made ready to run once: its drafter constructed (the knobs validated, not yet set up) and its
    acceptance rule resolved; both None under ``engine: hf_generate``. One engine takes it (``build_engine``)."""

    drafter: Drafter | None
    accept_fn: AcceptFn | None


def prepare_method(method_cfg: DictConfig) -> Method:
    """Catch a bad method setting before any model loads: the engine, the acceptance rule, and the drafter's knobs (its
    constructor validates them)."""
    if method_cfg.engine not in ENGINES:
        raise ConfigError(f"method.engine must be one of {ENGINES}; got {method_cfg.engine!r}")
    if method_cfg.engine == "hf_generate":
        return Method(None, None)
    accept_fn = acceptance_rule(method_cfg.get("acceptance", "match"), method_cfg.get("acceptance_kwargs"))
    return Method(instantiate_checked(method_cfg.drafter), accept_fn)


def check_method(method_cfg: DictConfig) -> Drafter | None:
    """``prepare_method``'s checks; returns the drafter (not yet set up), if any."""
    return prepare_method(method_cfg).drafter


def eager_because(method_cfg: DictConfig, drafter: Drafter | None) -> str | None:
    """Why a method runs eager even with ``compile`` on (None: it can run compiled); ``drafter`` is
    ``check_method``'s."""
    if drafter is None:
        return f"engine {method_cfg.engine} runs transformers' own generate, outside the shared loop"
    if drafter.needs_dynamic_cache:
        return f"{type(drafter).__name__} runs the target on its KV cache itself (needs_dynamic_cache)"
    return None


def build_engine(
    method_cfg: DictConfig,
    lm: LoadedModel,
    sampling: Sampling,
    step_breakdown: bool | str = "auto",
    verifier: Verifier | None = None,
    method: Method | None = None,
) -> Engine:
    """The object whose ``generate(prompt_ids, max_new_tokens, generator)`` the runner times.

    ``step_breakdown`` switches the loop's per-phase timing (see ``specbench.core.loop``); ``verifier`` is the
    compiled path's (``specbench.core.compiled``), which a method that cannot take it (``eager_because``) leaves;
    ``method`` is ``prepare_method(method_cfg)`` where the caller checked the method before loading the model (its
    drafter is set up here, so it serves this one engine), else prepared here.
    """
    method = method or prepare_method(method_cfg)
    if method.drafter is None or method.accept_fn is None:
        assistant = method_cfg.get("assistant")
        kwargs, part = hf_assistant(assistant, lm) if assistant is not None else (None, None)
        generate_kwargs = dict(method_cfg.get("generate_kwargs") or {})
        return HFGenerate(lm.model, lm.eos_ids, sampling, generate_kwargs, kwargs, [part] if part else None)
    method.drafter.setup(lm.model, lm.tokenizer)
    if eager_because(method_cfg, method.drafter) is not None:
        verifier = None
    return Decoder(lm.model, method.drafter, lm.eos_ids, sampling, method.accept_fn, step_breakdown, verifier)
