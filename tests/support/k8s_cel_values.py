"""Kubernetes' Quantity and Semver values, as the DRA CEL environment sees them, for tests/support/dra_cel.py.

Quantity follows k8s.io/apimachinery pkg/api/resource (quantity.go ParseQuantity and parseQuantityString,
suffix.go, @eed236c, 2026-07-23): ``<sign><digits>[.<digits>]<suffix>`` with the suffixes n u m "" k M G T P E,
Ki Mi Gi Ti Pi Ei or e<int>/E<int>; a non-zero value is rounded up (away from zero) to a whole nano; a binary
(Ki..Ei) value is capped at 2^63-1. Values are exact (Fraction), as inf.Dec is.

Semver follows github.com/blang/semver/v4 (Parse, Version.Compare), which k8s.io/apiserver pkg/cel/library
semverlib.go uses, and that file's normalizeAndParse for ``semver(s, true)``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

MAX_INT64 = (1 << 63) - 1
NANO = Fraction(1, 10**9)
_DECIMAL = {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


class QuantityError(ValueError):
    pass


def _split(text: str) -> tuple[str, str]:
    """parseQuantityString: the numeric part (sign, digits, one '.') and the suffix."""
    pos = 1 if text[:1] in "+-" else 0
    while pos < len(text) and text[pos].isdigit():
        pos += 1
    if pos < len(text) and text[pos] == ".":
        pos += 1
        while pos < len(text) and text[pos].isdigit():
            pos += 1
    value, rest = text[:pos], text[pos:]
    match = re.fullmatch(r"([eEinumkKMGTP]*)([-+]?[0-9]*)", rest)
    if match is None:
        raise QuantityError(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    return value, rest


def parse_quantity(text: str) -> Fraction:
    if not text:
        raise QuantityError(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    if text == "0":
        return Fraction(0)
    value, suffix = _split(text)
    binary = suffix in _BINARY
    if suffix in _DECIMAL:
        scale = Fraction(10) ** _DECIMAL[suffix]
    elif binary:
        scale = Fraction(2) ** _BINARY[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[-+]?[0-9]+", suffix[1:]):
        scale = Fraction(10) ** int(suffix[1:])
    else:
        raise QuantityError("unable to parse quantity's suffix")
    try:
        amount = Fraction(Decimal(value)) * scale
    except InvalidOperation as e:
        raise QuantityError("unable to parse quantity's numeric part") from e
    sign, magnitude = (-1 if amount < 0 else 1), abs(amount)
    if magnitude:
        magnitude = math.ceil(magnitude / NANO) * NANO  # inf.RoundUp to Nano
    if binary and magnitude > MAX_INT64:
        magnitude = Fraction(MAX_INT64)
    return sign * magnitude


def as_int64(value: Fraction) -> int | None:
    """Quantity.AsInt64: the value when it is an integer that fits in int64."""
    if value.denominator != 1 or not -(1 << 63) <= value.numerator <= MAX_INT64:
        return None
    return value.numerator


def compare(a: Fraction, b: Fraction) -> int:
    return (a > b) - (a < b)


@dataclass(frozen=True, order=False)
class Semver:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    def compare(self, other: Semver) -> int:
        for mine, theirs in ((self.major, other.major), (self.minor, other.minor), (self.patch, other.patch)):
            if mine != theirs:
                return 1 if mine > theirs else -1
        if not self.pre or not other.pre:
            return (not self.pre) - (not other.pre)
        for mine_pr, theirs_pr in zip(self.pre, other.pre, strict=False):
            if (c := _compare_pre(mine_pr, theirs_pr)) != 0:
                return c
        return compare(Fraction(len(self.pre)), Fraction(len(other.pre)))


def _compare_pre(a: str, b: str) -> int:
    a_num, b_num = a.isdigit(), b.isdigit()
    if a_num and b_num:
        return compare(Fraction(int(a)), Fraction(int(b)))
    if a_num != b_num:
        return -1 if a_num else 1  # numeric identifiers have lower precedence
    return (a > b) - (a < b)


_NUMBER = re.compile(r"0|[1-9][0-9]*")
_ALNUM = re.compile(r"[0-9A-Za-z-]+")


def parse_semver(text: str, normalize: bool = False) -> Semver:
    if normalize:
        text = _normalize(text)
    if not text:
        raise ValueError("Version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise ValueError("No Major.Minor.Patch elements found")
    patch, build, pre = parts[2], "", ""
    if "+" in patch:
        patch, build = patch.split("+", 1)
    if "-" in patch:
        patch, pre = patch.split("-", 1)
    numbers = [parts[0], parts[1], patch]
    for n in numbers:
        if not n.isdigit() or not n.isascii():
            raise ValueError(f"Invalid character(s) found in {n!r}")
        if not _NUMBER.fullmatch(n):
            raise ValueError(f"leading zeroes are not allowed in {n!r}")
    prerelease = tuple(pre.split(".")) if "-" in parts[2].split("+", 1)[0] else ()
    for p in prerelease:
        if not p or not _ALNUM.fullmatch(p) or (p.isdigit() and not _NUMBER.fullmatch(p)):
            raise ValueError(f"invalid prerelease identifier {p!r}")
    if "+" in parts[2] and any(not b or not _ALNUM.fullmatch(b) for b in build.split(".")):
        raise ValueError(f"invalid build metadata {build!r}")
    return Semver(int(numbers[0]), int(numbers[1]), int(numbers[2]), prerelease)


def _normalize(text: str) -> str:
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for i, p in enumerate(parts):
        if len(p) > 1:
            p = p.lstrip("0")
            if not p or not p[0].isdigit():
                p = "0" + p
            parts[i] = p
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise ValueError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)
