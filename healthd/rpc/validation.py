"""Request-field checks shared by the gRPC services and xpuctl: ASCII-only numbers, length caps, bounded quoting.

Python's ``str.isdigit()`` and ``int()`` accept any Unicode digit ("٣" is 3, "²" passes isdigit() and then fails
int()), and ``int()`` refuses more than 4300 digits with a ValueError whose text is not meant for users. Every
number a client sends as text goes through :func:`parse_ascii_uint` instead. Error messages quote at most
:data:`QUOTE_CHARS` characters of what the client sent, so an error never grows with the input (gRPC refuses
response metadata above 8-16 KiB, and a status message is metadata).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

QUOTE_CHARS = 100
MAX_GPU_REF_CHARS = 64  # "GPU-" + 36 characters of UUID, with room to spare
_ASCII_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_GPU_UUID = re.compile(r"[Gg][Pp][Uu]-[0-9A-Za-z_.-]{1,60}", re.ASCII)


class InvalidField(ValueError):  # noqa: N818 (a field that is invalid, raised as a value error)
    """One field of a request is wrong; the message starts with the field's name."""

    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}")
        self.field = field
        self.description = description


def quote(text: str, limit: int = QUOTE_CHARS) -> str:
    """``repr`` of at most ``limit`` characters of ``text``, saying how long it was when cut."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def parse_ascii_uint(text: str, field: str, *, maximum: int) -> int:
    """A non-negative integer written with ASCII digits only (surrounding spaces allowed), at most ``maximum``."""
    stripped = text.strip(" \t")
    digits = len(str(maximum))
    if not _ASCII_DIGITS.fullmatch(stripped):
        raise InvalidField(field, f"must be an integer written with the digits 0-9, got {quote(text)}")
    if len(stripped.lstrip("0")) > digits or int(stripped) > maximum:
        raise InvalidField(field, f"must be at most {maximum}, got {quote(stripped, 24)}")
    return int(stripped)


@dataclass(frozen=True, slots=True)
class GpuRef:
    """A reference to one card as a client writes it: an index, a UUID, or (where allowed) "any"."""

    index: int | None = None
    uuid: str = ""
    any: bool = False

    def __str__(self) -> str:
        if self.any:
            return "any"
        return self.uuid if self.index is None else str(self.index)


MAX_GPU_INDEX = 65535  # NVML indices are small; anything larger is a typo or an attack, not a card


def parse_gpu_ref(text: str, field: str = "gpu", *, allow_any: bool = False) -> GpuRef:
    """ "3", "GPU-<uuid>" or (with ``allow_any``) "any" -> GpuRef. Raises InvalidField for anything else.

    Only the syntax is checked here; whether the card exists is the caller's question (NOT_FOUND).
    """
    stripped = text.strip(" \t")
    if not stripped:
        raise InvalidField(field, "required: a GPU index" + (", a GPU UUID or 'any'" if allow_any else " or UUID"))
    if len(stripped) > MAX_GPU_REF_CHARS:
        raise InvalidField(field, f"at most {MAX_GPU_REF_CHARS} characters, got {quote(stripped)}")
    if allow_any and stripped.lower() == "any":
        return GpuRef(any=True)
    if _ASCII_DIGITS.fullmatch(stripped):
        return GpuRef(index=parse_ascii_uint(stripped, field, maximum=MAX_GPU_INDEX))
    if _GPU_UUID.fullmatch(stripped):
        return GpuRef(uuid=stripped)
    expected = "a GPU index (0, 1, ...), a GPU UUID (GPU-...) or 'any'" if allow_any else "a GPU index or UUID"
    raise InvalidField(field, f"expected {expected}, got {quote(stripped)}")


def check_text(value: str, field: str, *, max_chars: int, required: bool = False) -> str:
    """A printable string of at most ``max_chars`` characters (no control characters: they end up in logs)."""
    if not value:
        if required:
            raise InvalidField(field, "required")
        return value
    if len(value) > max_chars:
        raise InvalidField(field, f"at most {max_chars} characters, got {len(value)}")
    if not value.isprintable():
        raise InvalidField(field, f"must not contain control characters, got {quote(value)}")
    return value


def check_ascii_token(value: str, field: str, *, max_chars: int, required: bool = False) -> str:
    """Printable ASCII without spaces (ids, names and keys that other programs parse)."""
    check_text(value, field, max_chars=max_chars, required=required)
    if value and (not value.isascii() or " " in value):
        raise InvalidField(field, f"expected printable ASCII without spaces, got {quote(value)}")
    return value


def check_seconds(value: float, field: str, *, maximum: float) -> float:
    """A finite number of seconds in [0, maximum] (NaN and infinities are refused, not clamped)."""
    if not math.isfinite(value):
        raise InvalidField(field, f"must be a finite number of seconds, got {value}")
    if not 0 <= value <= maximum:
        raise InvalidField(field, f"must be between 0 and {maximum:g} seconds, got {value:g}")
    return value
