"""Answer accuracy of GSM8K / GSM-100 outputs: the output's last number against the reference's ``#### N``.

A number is an optional minus sign, digits with optional single commas between digit groups, and an
optional decimal part (``NUMBER``): ``1,234.50`` reads 1234.50, ``-7`` reads -7. A minus sign right after
a word character or a closing parenthesis is a subtraction, not a sign (``5-3`` holds 5 and 3). Commas
are removed and the two numbers compared as decimals (``18`` equals ``18.00``). An output without any
number is wrong (accuracy 0), not left out.
"""

from __future__ import annotations

import re
from decimal import Decimal

from specbench.errors import DataError

NUMBER = re.compile(r"(?:(?<![\w)])-)?\d+(?:,\d+)*(?:\.\d+)?")
ANSWER_MARK = "####"


def parse_number(text: str) -> Decimal:
    """A matched number as a Decimal, its commas removed."""
    return Decimal(text.replace(",", ""))


def last_number(text: str) -> Decimal | None:
    """The last number written in ``text``, or None when there is none."""
    numbers = NUMBER.findall(text)
    return parse_number(numbers[-1]) if numbers else None


def reference_number(reference: str) -> Decimal:
    """The final answer of a GSM8K worked solution: the number after ``####``."""
    _, mark, answer = reference.rpartition(ANSWER_MARK)
    match = NUMBER.search(answer) if mark else None
    if match is None:
        raise DataError(f"a GSM8K reference must end in '#### <number>'; got {reference[-80:]!r}")
    return parse_number(match.group())


def answer_accuracy(output: str, reference: str) -> tuple[float, str]:
    """1.0 when the output's last number equals the reference answer, else 0.0; with what was compared."""
    expected = reference_number(reference)
    found = last_number(output)
    if found is None:
        return 0.0, f"no number in the output (expected {expected})"
    return float(found == expected), f"answered {found}, expected {expected}"
