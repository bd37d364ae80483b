"""``python -m specbench.parity METHOD [options]``: official code vs specbench, same prompts and settings.

``python -m specbench.parity setup METHOD`` builds the method's side env and fetches its official code.
"""

from __future__ import annotations

import importlib
import sys

METHODS = (
    "lade",
    "medusa",
    "opt_tree",
    "anpd",
    "lookahead",
    "eagle",
    "eagle2",
    "self_draft",
    "swift",
    "pard",
    "dflash",
)
USAGE = f"usage: python -m specbench.parity [setup] {{{','.join(METHODS)}}} [options] (--help after the method)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup = bool(argv) and argv[0] == "setup"
    method = (argv[1] if len(argv) > 1 else "") if setup else (argv[0] if argv else "")
    if method not in METHODS:
        print(f"{USAGE}\nunknown method {method!r}; valid: {', '.join(METHODS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"specbench.parity.{method}")
    if setup:
        module.SIDE.setup()
        return 0
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
