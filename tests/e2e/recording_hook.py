"""A ReplacementHook that records every report it accepts, for end-to-end tests.

It speaks the real gRPC protocol on a unix socket, dedups by idempotency key as a hook must (a report whose key it
has seen is answered ``duplicate=true``), and appends every report as one JSON line (all FaultReport fields, plus
``duplicate``), so a test sees each channel's delivery even when both carry the same key. The operator-facing
reference hook (`xpuctl hook serve`) runs a command per fault instead; it has its own tests.

    python -m tests.e2e.recording_hook --listen unix:/tmp/hook.sock --out /tmp/faults.jsonl
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from healthd.api.v1 import hook_pb2, hook_pb2_grpc


class RecordingHook(hook_pb2_grpc.ReplacementHookServicer):
    def __init__(self, out: Path) -> None:
        self._out = out
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def ReportFault(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            duplicate = request.idempotency_key in self._seen
            record = MessageToDict(request, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
            record["seq"], record["count"] = int(record["seq"]), int(record["count"])
            record["duplicate"] = duplicate
            with self._out.open("a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
            self._seen.add(request.idempotency_key)
        return hook_pb2.ReportFaultAck(duplicate=duplicate, outcome="seen before" if duplicate else "recorded")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    hook_pb2_grpc.add_ReplacementHookServicer_to_server(RecordingHook(args.out), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(args.listen)
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(1).wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
