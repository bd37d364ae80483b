"""Typed settings and files: every command declares the types of what it reads as dataclasses (the run settings,
each trainer's, the self-distilled prompts', the bench's earlier results format), and each value is checked
against its field's type before anything loads, so a string where a number belongs is one error line naming the
key, not a TypeError deep inside.

The check is strict: a quoted ``'0.5'`` is text, not a number, and ``'no'`` is not false (OmegaConf's own
structured configs would convert both). A field's type is a scalar (``int``, ``float``, ``bool``, ``str``),
``dict`` (any mapping), a dataclass (the mapping below the key), ``list[X]`` or ``dict[str, X]`` of those, or any
of them ``| None``. Ranges and choices are each command's own ``validate``.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, TypeGuard, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from specbench.schema import is_bool, is_integer, is_number

CHECKS = {
    int: is_integer,
    float: is_number,
    bool: is_bool,
    str: lambda value: isinstance(value, str),
    dict: lambda value: isinstance(value, dict),
}
WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping"}
PLURALS = {int: "integers", float: "numbers", bool: "booleans", str: "strings", dict: "mappings"}
"""How an error names each type a field may have."""


def is_schema(hint: Any) -> TypeGuard[type]:
    """Whether a type hint is a dataclass (the schema of the mapping below a key)."""
    return isinstance(hint, type) and is_dataclass(hint)


def is_optional(hint: Any) -> bool:
    """Whether a type hint admits None (``X | None``)."""
    return get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)


def base_type(hint: Any) -> Any:
    """The type a hint names, None taken out (``int | None`` -> ``int``)."""
    if is_optional(hint):
        (inner,) = [arg for arg in get_args(hint) if arg is not type(None)]
        return inner
    return hint


def type_words(hint: Any) -> str:
    """How an error names a type hint: ``an integer or null``, ``a list of strings``, ``a mapping``."""
    kind = base_type(hint)
    if get_origin(kind) is list:
        item = get_args(kind)[0]
        words = f"a list of {'mappings' if is_schema(item) else PLURALS[item]}"
    else:
        words = "a mapping" if is_schema(kind) or get_origin(kind) is dict else WORDS[kind]
    return f"{words} or null" if is_optional(hint) else words


def value_problems(value: object, hint: Any, key: str) -> list[str]:
    """What is wrong with a plain value (JSON-like data) as a ``hint``; ``key`` names it in each line."""
    kind, origin = base_type(hint), get_origin(base_type(hint))
    if value is None and is_optional(hint):
        return []
    if is_schema(kind) and isinstance(value, dict):
        return type_problems(value, kind, f"{key}.")
    if origin is list and isinstance(value, list):
        item_hint = get_args(kind)[0]
        if is_schema(item_hint):
            return [
                problem for i, item in enumerate(value) for problem in value_problems(item, item_hint, f"{key}[{i}]")
            ]
        if not any(value_problems(item, item_hint, key) for item in value):
            return []
    if origin is dict and isinstance(value, dict):
        item_hint = get_args(kind)[1]
        return [problem for name, item in value.items() for problem in value_problems(item, item_hint, f"{key}.{name}")]
    if origin is None and not is_schema(kind) and CHECKS[kind](value):
        return []
    return [f"{key} must be {type_words(hint)} (got {value!r})"]


def plain(node: Mapping, key: str) -> object:
    """The value of ``node[key]`` as plain data (a config's containers converted, interpolations resolved)."""
    value = node[key]
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def type_problems(node: Mapping, schema: type, prefix: str = "") -> list[str]:
    """One line per field of the ``schema`` dataclass that ``node`` (a config node or JSON data) holds a value of
    another type for, or lacks (a field with a default may be absent); keys the schema does not name are not
    checked."""
    hints = get_type_hints(schema)
    problems = []
    for item in fields(schema):
        key = f"{prefix}{item.name}"
        if item.name in node:
            problems += value_problems(plain(node, item.name), hints[item.name], key)
        elif item.default is MISSING and item.default_factory is MISSING:
            problems.append(f"{key} must be set")
    return problems


def constructor_hints(cls: type) -> dict[str, Any]:
    """The annotated parameters of a class's constructor and of the base constructors it passes ``**kwargs`` on to."""
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):  # object's constructor takes nothing
        if "__init__" in vars(klass):
            hints.update(get_type_hints(vars(klass)["__init__"]))
    hints.pop("return", None)
    return hints


def constructor_problems(node: DictConfig, cls: type, prefix: str) -> list[str]:
    """What keeps a config node from being a valid set of ``cls``'s constructor arguments (its schema): an
    unresolvable setting, a key the constructor does not take, a value of another type than its annotation."""
    problems = unresolved(node)
    if problems:
        return problems
    hints = constructor_hints(cls)
    for key in (str(key) for key in node if key != "_target_"):
        if key not in hints:
            problems.append(f"{prefix}{key} is not a setting of {cls.__name__}")
        else:
            problems += value_problems(plain(node, key), hints[key], f"{prefix}{key}")
    return problems


def unresolved(node: DictConfig) -> list[str]:
    """The first setting whose interpolation cannot be resolved (``${nope}``, an unset environment variable) or
    that is still missing (``???``), as one line; none: empty."""
    try:
        OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as error:
        return [f"{error.full_key} must be set"]
    except OmegaConfBaseException as error:
        return [f"cannot resolve {error.full_key or 'a setting'}: {str(error).splitlines()[0]}"]
    return []


def setting_problems(node: DictConfig, schema: type) -> list[str]:
    """What keeps a config from being read by its schema: an unresolvable setting, else every wrongly typed one."""
    return unresolved(node) or type_problems(node, schema)
