"""``python -m specbench.parity METHOD [options]``: official code vs specbench, same prompts and settings."""

from __future__ import annotations

import sys

METHODS = ("lade",)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in METHODS:
        print(
            f"usage: python -m specbench.parity {{{','.join(METHODS)}}} [options] (--help after the method)",
            file=sys.stderr,
        )
        return 2
    from specbench.parity import lade

    return lade.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
