"""The reference ReplacementHook: dedup by fault id, run an operator's command with the fault as JSON on stdin.

This is the piece an operator adapts to call their standby-swap API. What it promises:

- A fault id whose command succeeded (exit 0) is never run again; a repeat delivery is acknowledged with
  ``duplicate=true``. The outcome is stored in SQLite (synchronous=FULL) *before* the acknowledgement.
- One condition, one run: a fault of the same node and *condition* as a fault whose command started within the
  dedup window (``--dedup-window``, 1 h by default) and succeeded or is still running is acknowledged with
  ``duplicate=true`` without running the command. The condition is the node, the card (by UUID; node-wide faults
  have none) and the action. So XID 79 and the ``gpu_lost`` that follows it on the same card are one node swap,
  and so are the daemon's own push and the Alertmanager webhook's alert for the same card, whichever comes first
  (both name the node by its canonical name). A command that failed does not count: the next fault of the
  condition runs it again.
- A command that fails (non-zero exit, or killed at the timeout) is recorded and answered with UNAVAILABLE, so
  the daemon retries with backoff; the command then runs again on the next delivery. We chose a retryable error
  over "ack and forget" because a swap that did not happen must not be lost; a command that should not be
  retried can exit 0 after logging the problem itself.
- A command outlives the delivery that started it: when the caller goes away mid-run (its deadline passed, the
  daemon died), the command runs to its end and its outcome is stored all the same; a delivery of the same id
  that arrives meanwhile waits for that run instead of starting a second one.
- If this server dies while the command runs, the id is recorded as started but not finished, and the next
  delivery runs it again: at-least-once. The command gets XPU_FAULT_ID in its environment to make it idempotent
  on the operator's side.

Deliveries are handled one at a time, and commands run one at a time (the daemon sends them in order and waits
for each acknowledgement).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from healthd.api.v1 import hook_pb2 as hpb
from healthd.api.v1 import hook_pb2_grpc as hpb_grpc
from healthd.hook.report import document_of
from healthd.rpc.errors import from_invalid_field, unavailable
from healthd.rpc.guard import RequestGuard
from healthd.rpc.transport import GrpcTls, is_tcp, server_credentials
from healthd.rpc.validation import InvalidField, check_text, quote
from healthd.state_files import CorruptStateError, open_state_db, salvage_rows

log = structlog.get_logger("hookserver")

SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
  fault_id TEXT PRIMARY KEY, node_name TEXT NOT NULL, seq INTEGER NOT NULL, action TEXT NOT NULL,
  received_at REAL NOT NULL, started_at REAL, finished_at REAL, exit_code INTEGER, outcome TEXT NOT NULL DEFAULT '',
  runs INTEGER NOT NULL DEFAULT 0, deliveries INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS conditions (condition TEXT PRIMARY KEY, fault_id TEXT NOT NULL, started_at REAL NOT NULL);
"""
DEFAULT_DEDUP_WINDOW = 3600.0
HOOK_WHAT = "hook state"
OUTPUT_TAIL = 2000
MAX_SEQ = 2**63 - 1  # SQLite's largest integer
# Caps far above anything the daemon sends (a refused report is retried forever), far below what hurts: the values
# named ENV_FIELDS go into the command's environment, where Linux allows 128 KiB per string.
MAX_KEY_CHARS = 256
MAX_NAME_CHARS = 1024
MAX_MESSAGE_CHARS = 65536
MAX_EVIDENCE_ITEMS = 256
MAX_FAULT_JSON_CHARS = 1 << 20
ENV_FIELDS = ("node_name", "check", "code", "severity", "action", "gpu_uuid", "pci_bus_id", "boot_id", "fault_id")


@dataclass(frozen=True, slots=True)
class Execution:
    fault_id: str
    exit_code: int | None
    outcome: str
    runs: int
    deliveries: int

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0


class ExecutionStore:
    def __init__(self, path: Path) -> None:
        """Opens (or creates) the file; raises CorruptStateError naming it when it is damaged."""
        self._lock = threading.Lock()
        self._db = open_state_db(path, HOOK_WHAT, SCHEMA, corrupt_hook_state, timeout=30.0)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def get(self, fault_id: str) -> Execution | None:
        with self._lock:
            row = self._db.execute(
                "SELECT exit_code, outcome, runs, deliveries FROM executions WHERE fault_id = ?", (fault_id,)
            ).fetchone()
        return None if row is None else Execution(fault_id, row[0], row[1], int(row[2]), int(row[3]))

    def received(self, fault_id: str, node: str, seq: int, action: str, now: float) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO executions (fault_id, node_name, seq, action, received_at, deliveries)"
                " VALUES (?, ?, ?, ?, ?, 1)"
                " ON CONFLICT (fault_id) DO UPDATE SET deliveries = deliveries + 1",
                (fault_id, node, seq, action, now),
            )

    def started(self, fault_id: str, now: float, condition: str = "") -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "UPDATE executions SET started_at = ?, finished_at = NULL, exit_code = NULL, outcome = 'running',"
                    " runs = runs + 1 WHERE fault_id = ?",
                    (now, fault_id),
                )
                if condition:
                    self._db.execute(
                        "INSERT INTO conditions (condition, fault_id, started_at) VALUES (?, ?, ?)"
                        " ON CONFLICT (condition) DO UPDATE SET fault_id = excluded.fault_id,"
                        " started_at = excluded.started_at",
                        (condition, fault_id, now),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def same_condition(self, condition: str, since: float) -> str | None:
        """The fault whose command for ``condition`` started after ``since`` and succeeded or is running."""
        with self._lock:
            row = self._db.execute(
                "SELECT c.fault_id FROM conditions c JOIN executions e ON e.fault_id = c.fault_id"
                " WHERE c.condition = ? AND c.started_at >= ? AND (e.exit_code = 0 OR e.outcome = 'running')",
                (condition, since),
            ).fetchone()
        return None if row is None else str(row[0])

    def deduplicated(self, fault_id: str, now: float, outcome: str) -> None:
        """Recorded as done without a run: a later delivery of this fault id is a plain duplicate."""
        with self._lock:
            self._db.execute(
                "UPDATE executions SET finished_at = ?, exit_code = 0, outcome = ? WHERE fault_id = ?",
                (now, outcome, fault_id),
            )

    def finished(self, fault_id: str, now: float, exit_code: int, outcome: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE executions SET finished_at = ?, exit_code = ?, outcome = ? WHERE fault_id = ?",
                (now, exit_code, outcome, fault_id),
            )


def check_report(request: hpb.FaultReport) -> None:
    """Every field of a FaultReport within its limits; InvalidField (-> INVALID_ARGUMENT) names the first bad one."""
    check_text(request.idempotency_key, "idempotency_key", max_chars=MAX_KEY_CHARS, required=True)
    if request.seq > MAX_SEQ:
        raise InvalidField("seq", f"at most {MAX_SEQ}")
    for field in ENV_FIELDS:
        check_text(getattr(request, field), field, max_chars=MAX_NAME_CHARS)
    if len(request.message) > MAX_MESSAGE_CHARS:
        raise InvalidField("message", f"at most {MAX_MESSAGE_CHARS} characters, got {len(request.message)}")
    if request.gpu_index < -1:
        raise InvalidField("gpu_index", f"a GPU index, or -1 for node-wide, got {request.gpu_index}")
    if len(request.evidence) > MAX_EVIDENCE_ITEMS:
        raise InvalidField("evidence", f"at most {MAX_EVIDENCE_ITEMS} entries, got {len(request.evidence)}")
    for key, value in request.evidence.items():
        check_text(key, "evidence", max_chars=MAX_KEY_CHARS)
        if len(value) > MAX_MESSAGE_CHARS:
            raise InvalidField(f"evidence[{quote(key, 40)}]", f"at most {MAX_MESSAGE_CHARS} characters")
    for field in ("first_seen", "last_seen"):
        if not math.isfinite(getattr(request, field)):
            raise InvalidField(field, "must be a finite unix time")
    if len(request.fault_json) > MAX_FAULT_JSON_CHARS:
        raise InvalidField("fault_json", f"at most {MAX_FAULT_JSON_CHARS} characters, got {len(request.fault_json)}")


def corrupt_hook_state(path: Path, reason: str) -> CorruptStateError:
    """The error for a damaged hook file: moving it aside forgets which faults' commands already ran."""
    rows = salvage_rows(path, "SELECT COUNT(*) FROM executions NOT INDEXED WHERE exit_code = 0")
    known = f" ({rows[0][0]} faults recorded as done)" if rows is not None else ""
    return CorruptStateError(
        path,
        what=HOOK_WHAT,
        kind="hook",
        reason=reason,
        lost=(
            f"Moving it aside forgets which faults' commands already succeeded{known}: a fault the daemon "
            "delivers again runs its command again (XPU_FAULT_ID lets the command notice)."
        ),
    )


def condition_of(request: hpb.FaultReport) -> str:
    """Node, card and action: faults of one condition need one run, whatever their code or channel."""
    node = request.node_name.strip().lower()
    card = request.gpu_uuid or (str(request.gpu_index) if request.gpu_index >= 0 else "node-wide")
    return f"{node}|{card}|{request.action}"


def stdin_document(request: hpb.FaultReport) -> bytes:
    """What the command reads: the delivery envelope plus the fault as the daemon stored it."""
    doc = {"idempotency_key": request.idempotency_key, "node_name": request.node_name, "seq": request.seq}
    doc["fault"] = document_of(request)
    return (json.dumps(doc, sort_keys=True) + "\n").encode()


class ReferenceHook(hpb_grpc.ReplacementHookServicer):
    def __init__(
        self,
        store: ExecutionStore,
        command: str,
        *,
        command_timeout: float = 300.0,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
    ) -> None:
        self._store = store
        self._command = command
        self._timeout = command_timeout
        self._dedup_window = dedup_window
        self._lock = asyncio.Lock()  # one delivery at a time
        self._command_lock = asyncio.Lock()  # one command at a time, also after its delivery was cancelled
        self._running: dict[str, asyncio.Task[tuple[int, str]]] = {}  # fault id -> its command, run to the end

    async def ReportFault(  # noqa: N802
        self, request: hpb.FaultReport, context: grpc.aio.ServicerContext[hpb.FaultReport, hpb.ReportFaultAck]
    ) -> hpb.ReportFaultAck:
        try:
            check_report(request)
        except InvalidField as exc:
            raise from_invalid_field(exc) from None
        key = request.idempotency_key
        async with self._lock:
            prior = await asyncio.to_thread(self._store.get, key)
            await asyncio.to_thread(
                self._store.received, key, request.node_name, request.seq, request.action, time.time()
            )
            if prior is not None and prior.succeeded:
                log.info("duplicate delivery", fault_id=key)
                return hpb.ReportFaultAck(duplicate=True, outcome=prior.outcome)
            task = self._running.get(key)
            condition = condition_of(request)
            if task is None and self._dedup_window > 0:
                now = time.time()
                other = await asyncio.to_thread(self._store.same_condition, condition, now - self._dedup_window)
                if other is not None and other != key:
                    outcome = f"same condition as fault {other} ({condition}): not run again"
                    await asyncio.to_thread(self._store.deduplicated, key, now, outcome)
                    log.info("duplicate condition", fault_id=key, same_as=other, condition=condition)
                    return hpb.ReportFaultAck(duplicate=True, outcome=outcome)
            if task is None:
                task = self._running[key] = asyncio.create_task(self._execute(request, key), name=f"hook {key}")
                task.add_done_callback(lambda _: self._running.pop(key, None))
            else:
                log.info("delivery of a fault whose command is running; waiting for that run", fault_id=key)
            # the caller going away cancels this handler, never the command (nor the storing of its outcome)
            code, outcome = await asyncio.shield(task)
        if code != 0:
            raise unavailable("HOOK_COMMAND_FAILED", f"hook command failed: {outcome[:500]}", exit_code=str(code))
        return hpb.ReportFaultAck(duplicate=False, outcome=outcome)

    async def _execute(self, request: hpb.FaultReport, key: str) -> tuple[int, str]:
        async with self._command_lock:
            await asyncio.to_thread(self._store.started, key, time.time(), condition_of(request))
            code, outcome = await self._run(request, key)
            await asyncio.to_thread(self._store.finished, key, time.time(), code, outcome)
        log.info("command finished", fault_id=key, exit_code=code, outcome=outcome)
        return code, outcome

    async def drain(self) -> None:
        """Let commands whose delivery went away finish and store their outcome (each is bounded by its timeout)."""
        running = list(self._running.values())
        if running:
            await asyncio.wait(running)

    async def _run(self, request: hpb.FaultReport, key: str) -> tuple[int, str]:
        env = {
            **os.environ,
            "XPU_FAULT_ID": key,
            "XPU_NODE_NAME": _env_safe(request.node_name),
            "XPU_FAULT_ACTION": _env_safe(request.action),
            "XPU_FAULT_CODE": _env_safe(request.code),
            "XPU_FAULT_SEQ": str(request.seq),
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                self._command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
            )
        except OSError as exc:
            return 127, f"cannot start command: {exc}"
        try:
            async with asyncio.timeout(self._timeout):
                out, _ = await proc.communicate(stdin_document(request))
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return -9, f"killed after {self._timeout:g}s"
        tail = out.decode(errors="replace").strip()[-OUTPUT_TAIL:]
        code = proc.returncode if proc.returncode is not None else -1
        return code, f"exit {code}" + (f": {tail}" if tail else "")


def _env_safe(value: str) -> str:
    return value.replace("\x00", "")  # an environment value cannot hold NUL; the JSON on stdin has it all


def _prepare_unix_socket(listen: str) -> None:
    if listen.startswith("unix:"):
        path = Path(listen[len("unix:") :])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a stale socket from a killed server


async def serve(
    listen: str,
    command: str,
    state: Path,
    *,
    command_timeout: float,
    stop: asyncio.Event,
    tls: GrpcTls | None = None,
    dedup_window: float = DEFAULT_DEDUP_WINDOW,
) -> None:
    """Run the reference hook on ``listen`` until ``stop`` is set: unix:PATH in plaintext, HOST:PORT only with mTLS
    (``tls``), as a hook that can swap nodes must not take orders from whoever reaches the port."""
    if is_tcp(listen) and tls is None:
        raise ValueError(f"--listen {listen}: a TCP hook needs mutual TLS (--tls-cert, --tls-key, --tls-client-ca)")
    store = ExecutionStore(state)
    server = grpc.aio.server(interceptors=[RequestGuard()])
    hook = ReferenceHook(store, command, command_timeout=command_timeout, dedup_window=dedup_window)
    hpb_grpc.add_ReplacementHookServicer_to_server(hook, server)
    _prepare_unix_socket(listen)
    try:
        port = server.add_secure_port(listen, server_credentials(tls)) if tls else server.add_insecure_port(listen)
    except RuntimeError as exc:  # how grpc reports a failed bind
        raise OSError(f"cannot listen on {listen}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    log.info("reference hook listening", address=listen, port=port, tls=tls is not None, state=str(state))
    try:
        await stop.wait()
    finally:
        await server.stop(5.0)
        await hook.drain()
        store.close()
