"""Acceptance rules by config name (``method.acceptance``), with their config-given keyword arguments.

A rule is ``rule(tree, logits, sampling, generator, **acceptance_kwargs) -> Acceptance``; register
each new rule in ``ACCEPTANCE_RULES`` and say in its docstring whether it is lossless.
"""

from __future__ import annotations

import functools
import inspect

from specbench.core.acceptance import accept_match
from specbench.core.block import accept_block
from specbench.core.speculative import accept_speculative
from specbench.core.traversal import accept_traversal
from specbench.core.typical import accept_typical, check_typical_kwargs
from specbench.errors import ConfigError

ACCEPTANCE_RULES = {
    "match": accept_match,
    "speculative": accept_speculative,
    "block": accept_block,
    "traversal": accept_traversal,
    "typical": accept_typical,
}

KWARG_CHECKS = {
    "typical": check_typical_kwargs,
}
"""Per-rule validation of the bound keyword arguments (defaults filled in), run once at startup."""


def acceptance_rule(name: str, kwargs: dict | None = None):
    """The rule called ``name`` with ``kwargs`` bound; a clear error for unknown names or arguments."""
    if name not in ACCEPTANCE_RULES:
        raise ConfigError(f"method.acceptance must be one of {sorted(ACCEPTANCE_RULES)}; got {name!r}")
    rule = ACCEPTANCE_RULES[name]
    kwargs = dict(kwargs or {})
    fixed = {"tree", "logits", "sampling", "generator"}
    allowed = [p for p in inspect.signature(rule).parameters if p not in fixed]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ConfigError(
            f"method.acceptance_kwargs {unknown} not accepted by rule {name!r}; "
            f"it takes {allowed or 'no keyword arguments'}"
        )
    if name in KWARG_CHECKS:
        bound = inspect.signature(rule).bind_partial(**kwargs)
        bound.apply_defaults()
        KWARG_CHECKS[name](**{key: value for key, value in bound.arguments.items() if key not in fixed})
    return functools.partial(rule, **kwargs) if kwargs else rule
