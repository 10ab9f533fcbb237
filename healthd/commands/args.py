"""xpuctl's argument types: the same rules as the daemon's request checks (healthd/rpc/validation.py), applied before
anything is sent, so a bad value gets one clear line and exit code 2, never a traceback or Python's own text.

argparse's ``type=int`` would take "٣" as 3 and "1_000" as 1000, and a value past a protobuf field's range would
surface later as protobuf's "Value out of range"; these types refuse both with the flag's name.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from typing import NoReturn

from healthd.partition.errors import PartitionError
from healthd.partition.quantity import parse_memory_mib
from healthd.rpc.validation import InvalidField, check_ascii_token, parse_ascii_uint, parse_gpu_ref, quote

_DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{0,9})?|\.[0-9]{1,9}", re.ASCII)
MAX_PARTITION_ID_CHARS = 64
MAX_MEMORY_CHARS = 32


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``xpuctl partitions list: argument --gpu: ... (see --help)``."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _fail(exc: InvalidField) -> NoReturn:
    raise argparse.ArgumentTypeError(exc.description) from None


def uint(maximum: int, minimum: int = 0) -> Callable[[str], int]:
    """An integer in ASCII digits from ``minimum`` to ``maximum``."""

    def parse(text: str) -> int:
        try:
            value = parse_ascii_uint(text, "", maximum=maximum)
        except InvalidField as exc:
            _fail(exc)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in some messages
    return parse


def seconds(text: str) -> float:
    """A number of seconds: ASCII digits with an optional fraction ("nan", "inf", "-1" and "1e9" are refused)."""
    stripped = text.strip()
    if not _DECIMAL.fullmatch(stripped):
        raise argparse.ArgumentTypeError(f"expected seconds such as 30 or 2.5, got {quote(text, 40)}")
    return float(stripped)


def check_positive_seconds(value: float, flag: str) -> None:
    """For float options parsed elsewhere (e.g. --timeout): finite and above 0, else ValueError naming the flag."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{flag}: must be a positive number of seconds, got {value}")


def gpu_ref(*, allow_any: bool = False, optional: bool = False) -> Callable[[str], str]:
    """A GPU index (ASCII digits), a GPU UUID, or (with ``allow_any``) "any"; returned in canonical form.
    ``optional``: "" (the filter's default: every GPU) is accepted as it is."""

    def parse(text: str) -> str:
        if optional and text == "":
            return ""
        try:
            return str(parse_gpu_ref(text, "", allow_any=allow_any))
        except InvalidField as exc:
            _fail(exc)

    parse.__name__ = "GPU"
    return parse


def gpu_ids(text: str) -> list[str]:
    """A comma-separated list of GPU indices or UUIDs ("" for none)."""
    parse = gpu_ref()
    return [parse(part.strip()) for part in text.split(",") if part.strip()]


def partition_id(text: str) -> str:
    try:
        return check_ascii_token(text, "", max_chars=MAX_PARTITION_ID_CHARS, required=True)
    except InvalidField as exc:
        _fail(exc)


def memory(text: str) -> str:
    """A memory cap as the daemon takes it ("8GiB", "512MiB", "" or "0")."""
    if len(text) > MAX_MEMORY_CHARS:
        raise argparse.ArgumentTypeError(f"at most {MAX_MEMORY_CHARS} characters, got {quote(text, 40)}")
    try:
        parse_memory_mib(text)
    except PartitionError as exc:
        raise argparse.ArgumentTypeError(exc.message.removeprefix("memory: ")) from None
    return text
