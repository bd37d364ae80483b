"""``python -m specbench.train <kind> [overrides...]``: build a method's parts once (kinds: specbench.models.parts)."""

from __future__ import annotations

import importlib
import sys

from specbench.cli import interrupted, user_errors
from specbench.models.parts import PART_KINDS

COMMANDS = {name: (kind.trainer, kind.summary) for name, kind in PART_KINDS.items()}
"""Subcommand -> (trainer module, one-line summary), one per part kind (``specbench.models.parts``)."""


def usage() -> str:
    """The command line and the list of subcommands."""
    lines = ["usage: python -m specbench.train {" + ",".join(COMMANDS) + "} [hydra overrides...]", "", "subcommands:"]
    width = max(map(len, COMMANDS)) + 2
    lines += [f"  {name:{width}s}{help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "example: python -m specbench.train draft model=smollm2_135m train.steps=300"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Dispatch to ``<module>.main(overrides)``; exit 2 with the subcommand list or a one-line error."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    command, overrides = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown subcommand {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    with user_errors(argv):
        try:
            module.main(overrides)
        except KeyboardInterrupt as stop:
            interrupted(stop, "finished work is cached; rerun the same command to resume")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
