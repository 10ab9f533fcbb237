"""The one error a kubelet call answers with."""

from __future__ import annotations

import grpc


class AllocationError(Exception):
    """Answered to kubelet with ``code``; kubelet fails the pod's admission with the message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
