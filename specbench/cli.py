"""One error path for every command line: a user mistake is one ``error:`` line and exit code 2.

Every ``python -m specbench...`` entry point runs its work inside ``user_errors``: a ``UserError``
(bad setting, missing data or weights, a locked or unwritable run folder) prints ``error: <one line>``
and exits 2; SIGTERM is turned into an interrupt, so a killed run records its status like Ctrl-C.
``HYDRA_FULL_ERROR=1`` or the word ``debug=true`` on the command line shows the traceback instead.
The Hydra apps first compose their config from the command line (``check_overrides``), so an
unknown key or option fails here, in one line, before Hydra starts or a model loads.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

from specbench.config import (
    add_user_config_dirs,
    compose_config,
    composition_problem,
    group_options,
    is_group,
    search_path_override,
    without_search_path,
)
from specbench.errors import ConfigError, UserError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as an interrupt so runs stop the way Ctrl-C stops them (status, summary)."""


def debug_requested(argv: Sequence[str]) -> bool:
    """Show tracebacks: ``HYDRA_FULL_ERROR=1`` in the environment or ``debug=true`` among the arguments."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1" or "debug=true" in argv


def one_line(message: str) -> str:
    """A message on one line (Hydra's and OmegaConf's span several)."""
    return " ".join(message.split())


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with the user-error code."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors (an unknown option, a value of the wrong type) are the one ``error:`` line
    and exit 2 of every other user mistake, naming ``--help`` instead of printing the usage."""

    def error(self, message: str) -> NoReturn:
        """Print ``error: <prog>: message`` and exit 2."""
        fail(f"{self.prog}: {message} (see {self.prog} --help)")


def interrupted(stop: KeyboardInterrupt, what_is_kept: str) -> NoReturn:
    """Report a Ctrl-C or SIGTERM (what was kept, how to resume) and exit 130 / 143."""
    print(f"\ninterrupted: {what_is_kept}", file=sys.stderr)
    sys.exit(EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED)


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM handler: raise ``Terminated`` in the main thread."""
    raise Terminated()


@contextmanager
def user_errors(argv: Sequence[str] | None = None) -> Iterator[None]:
    """Run a command's work: UserError -> one ``error:`` line and exit 2; SIGTERM -> ``Terminated``."""
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    except UserError as error:
        if debug_requested(argv):
            raise
        fail(str(error))


FLAGS_WITH_VALUE = ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd", "--experimental-rerun")
CONFIG_DIR_FLAGS = ("--config-dir", "-cd")


def hydra_overrides(argv: Sequence[str]) -> list[str]:
    """The config overrides of a Hydra command line (its ``--flags`` and their values left out)."""
    overrides, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = word in FLAGS_WITH_VALUE
        else:
            overrides.append(word)
    return overrides


def command_line_config_dirs(argv: Sequence[str]) -> list[str]:
    """The config folders a Hydra command line names: ``--config-dir``/``-cd`` values and the entries of
    ``hydra.searchpath=[...]``, in order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    folders = []
    for index, word in enumerate(argv):
        if word in CONFIG_DIR_FLAGS and index + 1 < len(argv):
            folders.append(argv[index + 1])
        elif word.startswith(tuple(f"{flag}=" for flag in CONFIG_DIR_FLAGS)):
            folders.append(word.split("=", 1)[1])
    for word in hydra_overrides(argv):
        if word.lstrip("+~").startswith("hydra.searchpath="):
            try:
                (override,) = OverridesParser.create().parse_overrides([word])
            except HydraException as error:
                raise ConfigError(composition_problem(error)) from error
            value = override.value()
            folders.extend(str(entry) for entry in (value if isinstance(value, list) else [value]))
    return folders


def adopt_config_dirs(argv: Sequence[str]) -> None:
    """Add the command line's config folders to ``SPECBENCH_CONFIG_PATH`` (every later step sees them)."""
    folders = command_line_config_dirs(argv)
    if folders:
        add_user_config_dirs(folders)


def first_job(overrides: Sequence[str]) -> list[str]:
    """The overrides of a sweep's first job (each sweep at its first value); every value a sweep gives a
    config group (``method=ar,pld``) must name one of the group's configs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Transformer
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as error:
        raise ConfigError(composition_problem(error)) from error
    first = []
    for override in parsed:
        if not override.is_sweep_override():
            assert override.input_line is not None  # the parser keeps every override's text
            first.append(override.input_line)
            continue
        try:
            values = list(override.sweep_iterator(transformer=Transformer.encode))
        except HydraException:
            continue  # glob() sweeps need Hydra's own loader: left for Hydra to check
        group = override.key_or_group
        if is_group(group):
            unknown = [value for value in values if value not in group_options(group)]
            if unknown:
                raise ConfigError(f"unknown {group} {unknown[0]!r}; choose one of {group_options(group)}")
        first.append(f"{override.get_key_element()}={values[0]}")
    return first


def check_overrides(config_name: str, argv: Sequence[str]) -> None:
    """Compose ``config_name`` with the command line's overrides (a sweep's first job), raising a ConfigError
    for an unknown key, group option or malformed override; the user's config folders count."""
    adopt_config_dirs(argv)
    compose_config(*first_job(without_search_path(hydra_overrides(argv))), config_name=config_name)


def with_search_path(argv: list[str]) -> list[str]:
    """A Hydra command line whose ``hydra.searchpath`` names every user config folder (none: unchanged)."""
    search_path = search_path_override()
    return without_search_path(argv) + [search_path] if search_path else argv


def run_hydra_app(app: Callable[[], None], config_name: str) -> None:
    """Start a ``@hydra.main`` app after checking its command line (one ``error:`` line for a bad one);
    the user's config folders (``SPECBENCH_CONFIG_PATH``, ``-cd``, ``hydra.searchpath``) reach Hydra."""
    with user_errors():
        check_overrides(config_name, sys.argv[1:])
        sys.argv = [sys.argv[0], *with_search_path(sys.argv[1:])]
    app()
