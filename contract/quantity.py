"""Kubernetes resource quantities (`4Gi`, `1.5Gi`, `16G`, `500M`, `1e9`) to bytes.

Owns parsing and formatting of byte quantities. Called by the loader (budgets,
GPU memory) and by every output that prints bytes.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "": 1}
_PATTERN = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(?:([eE][0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E))?$")


MAX_BYTES = 2**63 - 1  # Kubernetes quantities are int64


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity of bytes."""


def parse_bytes(value: int | str) -> int:
    """Bytes in a Kubernetes quantity, rounded up to a whole byte (as Kubernetes does)."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        if value < 0:
            raise QuantityError(f"{value} is negative")
        return _bounded(value, value)
    text = str(value)
    if text != text.strip():
        raise QuantityError(f"{_shown(text)} has leading or trailing whitespace; write the quantity alone, "
                            f"e.g. {text.strip()[:40]!r}")
    match = _PATTERN.match(text)
    if not match:
        raise QuantityError(
            f"{_shown(text)} is not a Kubernetes quantity; write a number with an optional suffix "
            "Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T (powers of 1000), e.g. 4Gi or 500M"
        )
    number, exponent, suffix = match.groups()
    try:
        amount = Decimal(number)
        if exponent:
            amount *= Decimal(10) ** int(exponent[1:])
        else:
            amount *= _BINARY.get(suffix or "", None) or _DECIMAL[suffix or ""]
    except (ArithmeticError, InvalidOperation):  # an exponent beyond Decimal's range
        raise QuantityError(f"{_shown(text)} is more than {MAX_BYTES} bytes (8Ei - 1), the largest quantity") from None
    if amount > MAX_BYTES:
        raise QuantityError(f"{_shown(text)} is more than {MAX_BYTES} bytes (8Ei - 1), the largest quantity")
    return _bounded(int(amount.to_integral_value(rounding="ROUND_CEILING")), text)


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}… ({len(text)} characters)"


def _bounded(amount: int, given: object) -> int:
    if amount > MAX_BYTES:
        raise QuantityError(f"{_shown(str(given))} is more than {MAX_BYTES} bytes (8Ei - 1), the largest quantity")
    return amount


def format_bytes(n: int | None) -> str:
    """Human form with binary units: 4.0Gi, 512Mi, 900B."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= size:
            return f"{sign}{n / size:.1f}{unit}"
    return f"{sign}{n}B"
