"""Partition failures a caller can act on; the service maps each kind to one gRPC status."""

from __future__ import annotations

import enum


class Kind(enum.StrEnum):
    INVALID = "invalid_argument"
    NOT_FOUND = "not_found"
    PRECONDITION = "failed_precondition"
    EXHAUSTED = "resource_exhausted"
    CONFLICT = "already_exists"
    UNAVAILABLE = "unavailable"  # the GPU or MPS did not do what we asked; retry may work
    PERMISSION = "permission_denied"


class PartitionError(Exception):
    def __init__(self, kind: Kind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class UidConflictError(PartitionError):
    """FAILED_PRECONDITION: the card's MPS control daemon serves another uid's clients (sharing.py, admit_uid)."""

    def __init__(self, message: str) -> None:
        super().__init__(Kind.PRECONDITION, message)


def invalid(message: str) -> PartitionError:
    return PartitionError(Kind.INVALID, message)


def not_found(message: str) -> PartitionError:
    return PartitionError(Kind.NOT_FOUND, message)


def precondition(message: str) -> PartitionError:
    return PartitionError(Kind.PRECONDITION, message)


def exhausted(message: str) -> PartitionError:
    return PartitionError(Kind.EXHAUSTED, message)


def unavailable(message: str) -> PartitionError:
    return PartitionError(Kind.UNAVAILABLE, message)
