"""Counts as Kubernetes quantities in canonical form, so what the driver writes reads back unchanged.

The API server re-encodes every quantity canonically (apimachinery pkg/api/resource/quantity.go, String and
CanonicalizeBytes): text with a binary suffix keeps the largest binary suffix that leaves an integer mantissa
("150754820096" bytes written as "143771Mi"); text without one is decimal and keeps the largest SI suffix that
leaves an integer ("1000" reads back as "1k"). Byte counts that are whole KiB are written with a binary suffix;
everything else as decimal.
"""

from __future__ import annotations

from decimal import Decimal

from kubernetes import utils

_BINARY = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))
_DECIMAL = (("E", 18), ("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3))


def decimal_quantity(value: int) -> str:
    if value < 0:
        raise ValueError(f"a count cannot be negative: {value}")
    for suffix, exponent in _DECIMAL:
        if value and value % 10**exponent == 0:
            return f"{value // 10**exponent}{suffix}"
    return str(value)


def bytes_quantity(value: int) -> str:
    if value < 0:
        raise ValueError(f"a byte count cannot be negative: {value}")
    for suffix, shift in _BINARY:
        if value and value % (1 << shift) == 0:
            return f"{value >> shift}{suffix}"
    return decimal_quantity(value)


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity ("2Gi", "30", "500m") as its exact value (ValueError when it is not one)."""
    return utils.parse_quantity(text)  # type: ignore[no-untyped-call,no-any-return]
