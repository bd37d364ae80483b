"""``python -m specbench.parity eagle2``: EAGLE-2's dynamic tree; the driver lives in ``specbench.parity.eagle``."""

from __future__ import annotations

from specbench.parity.eagle import EAGLE2
from specbench.parity.eagle import main_eagle2 as main

SIDE = EAGLE2.side

__all__ = ["SIDE", "main"]
