"""Kubernetes byte quantities: what parses to how many bytes, and what is rejected."""
from __future__ import annotations

import pytest

from contract.quantity import QuantityError, format_bytes, parse_bytes

GI, MI = 2**30, 2**20

VALID = [
    ("4Gi", 4 * GI),
    ("4096Mi", 4 * GI),
    ("1.5Gi", 1536 * MI),
    ("16G", 16 * 10**9),
    ("500M", 500 * 10**6),
    ("100k", 100_000),
    ("1Ki", 1024),
    ("0.5Ki", 512),
    ("1Ti", 2**40),
    ("143771Mi", 143771 * MI),
    ("1e9", 10**9),
    ("1E3", 1000),
    ("2048", 2048),
    (2048, 2048),
    ("1.0000001Ki", 1025),  # a fraction of a byte rounds up, as Kubernetes does
]

INVALID = [
    ("upper-case-kilo-is-not-kubernetes", "4K"),
    ("decimal-unit-with-B", "4GB"),
    ("lower-case-binary-suffix", "4gi"),
    ("suffix-without-number", "Gi"),
    ("negative-string", "-1Gi"),
    ("two-decimal-points", "1.5.5Gi"),
    ("empty", ""),
    ("space-before-suffix", "1 Gi"),
    ("words", "four"),
    ("exponent-without-digits", "1e"),
    ("hexadecimal", "0x10"),
    ("milli-suffix-is-not-bytes", "1m"),
    ("bits-suffix", "1Mb"),
    ("negative-int", -1),
    ("bool", True),
    ("null", None),
]


@pytest.mark.parametrize("text,expected", VALID, ids=[str(v[0]) for v in VALID])
def test_valid_quantity_parses_to_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("value", [v for _, v in INVALID], ids=[i for i, _ in INVALID])
def test_invalid_quantity_is_rejected_with_the_fix(value):
    with pytest.raises(QuantityError) as err:
        parse_bytes(value)
    assert repr(value) in str(err.value) or str(value) in str(err.value)


def test_rejection_message_names_the_suffixes_to_use():
    with pytest.raises(QuantityError, match=r"Ki, Mi, Gi, Ti .* e\.g\. 4Gi"):
        parse_bytes("4GB")


@pytest.mark.parametrize("n,text", [(4 * GI, "4.0Gi"), (512 * MI, "512.0Mi"), (900, "900B"), (None, "-"),
                                    (-3 * GI, "-3.0Gi")], ids=["gi", "mi", "bytes", "none", "negative"])
def test_format_bytes(n, text):
    assert format_bytes(n) == text
