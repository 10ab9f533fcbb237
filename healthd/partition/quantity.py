"""Compute and memory quantities: "8GiB" / "512MiB" with 128 MiB granularity, compute 1-100 %."""

from __future__ import annotations

import re

from healthd.partition.errors import invalid
from healthd.rpc.validation import quote

MEMORY_GRANULARITY_MIB = 128
MIB = 2**20
_MEMORY = re.compile(r"\s*([0-9]{1,9})\s*(GiB|MiB)\s*", re.ASCII)  # ASCII digits only: "٣GiB" is not 3 GiB


def parse_memory_mib(text: str) -> int:
    """Memory limit in MiB; 0 for "no limit" (empty or "0"). Raises PartitionError(INVALID) otherwise."""
    if text.strip() in ("", "0"):
        return 0
    match = _MEMORY.fullmatch(text)
    if match is None:
        raise invalid(f"memory: expected an integer with unit GiB or MiB (e.g. '8GiB', '512MiB'), got {quote(text)}")
    value, unit = int(match.group(1)), match.group(2)
    if value == 0:
        return 0
    mib = value * 1024 if unit == "GiB" else value
    if mib % MEMORY_GRANULARITY_MIB:
        raise invalid(f"memory: {quote(text)} is not a multiple of {MEMORY_GRANULARITY_MIB} MiB")
    return mib


def format_memory(mib: int) -> str:
    """The canonical text of a memory limit: GiB when whole, else MiB; "" for no limit."""
    if mib == 0:
        return ""
    return f"{mib // 1024}GiB" if mib % 1024 == 0 else f"{mib}MiB"


def check_compute_percent(value: int) -> int:
    """1-100, or 0 for no limit."""
    if not 0 <= value <= 100:
        raise invalid(f"compute_percent: must be 1-100 (percent of one card) or 0 for no limit, got {value}")
    return value
