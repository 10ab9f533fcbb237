"""Kernel-log records for the XID tests."""

from __future__ import annotations

from healthd.xid.kmsg import KmsgRecord


def kernel_record(message: str, priority: int = 4) -> KmsgRecord:
    """A record as the kernel writes it: facility 0 (kern), level 4 (warning) unless told."""
    return KmsgRecord(priority, 1, 1, "-", message)
