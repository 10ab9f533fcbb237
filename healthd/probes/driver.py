"""Driver health: NVML init failure, kernel module vs library version, lost / reset-required cards, calls past their
deadline (a hung driver), the driver's own recovery-action verdict, and processes stuck in D state in the driver.

Reads, besides the Snapshot: ``<proc>/driver/nvidia/version`` (the loaded kernel module's version),
``<proc>/<pid>/stat`` of every process (state field), and for processes in state D only ``<proc>/<pid>/wchan`` and
``<proc>/<pid>/stack`` (the latter needs root; without it wchan and the process name are used).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from exporter.backends.recovery import RecoveryAction, decode_recovery_action, driver_branch
from exporter.backends.types import Unsupported
from exporter.settings import option
from exporter.snapshot import GpuSnapshot, Snapshot
from healthd.findings import Action, CheckStatus, Finding, GpuRef, ProbeReport, Severity
from healthd.host.view import ProbeHost
from healthd.probes.common import ReportBuilder, evidence, gpu_ref

CHECK = "driver"
_MODULE_VERSION_RE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")

# What each recovery action the driver asks for means here -> (severity, action). The raw field value is decoded by
# driver branch first (exporter/backends/recovery.py: raw 5 is a bus reset on R580, the IMEX domain from R595 on).
# DCGM MonitorGpuRecoveryAction: GPU_RESET / NODE_REBOOT / DRAIN_AND_RESET -> FAIL, DRAIN_P2P -> WARN.
RECOVERY_ACTIONS: dict[RecoveryAction, tuple[Severity, Action]] = {
    RecoveryAction.GPU_RESET: (Severity.CRITICAL, Action.RESET_GPU),
    RecoveryAction.NODE_REBOOT: (Severity.CRITICAL, Action.REBOOT_NODE),
    RecoveryAction.DRAIN_P2P: (Severity.WARNING, Action.NONE),
    RecoveryAction.DRAIN_AND_RESET: (Severity.CRITICAL, Action.RESET_GPU),
    RecoveryAction.RECOVER_IMEX_DOMAIN: (Severity.WARNING, Action.NONE),
    RecoveryAction.BUS_RESET: (Severity.CRITICAL, Action.RESET_GPU),
    RecoveryAction.SYSTEM_REBOOT: (Severity.CRITICAL, Action.REBOOT_NODE),
}


SECTION = "driver"


@dataclass(frozen=True, slots=True)
class Settings:
    """[health.driver]"""

    # A call past its deadline is a warning at once and critical when the card stays stuck this long; GPUd reboots
    # after a D-state nvidia process persists 5 one-minute checks.
    hang_after_seconds: float = option(300.0, above=0)
    dstate_after_seconds: float = option(300.0, above=0)
    # The /proc walk costs ~30 us per process (bench/probes.py); once every 30 s is plenty for a 300 s threshold.
    dstate_scan_seconds: float = option(30.0, min=0, max=3600)


def read_module_version(proc_root: Path) -> str | None:
    """The loaded NVIDIA kernel module's version from /proc/driver/nvidia/version, None when absent."""
    try:
        text = (proc_root / "driver" / "nvidia" / "version").read_text(errors="replace")
    except OSError:
        return None
    m = _MODULE_VERSION_RE.search(text)
    return m.group(1) if m else None


@dataclass(frozen=True, slots=True)
class StuckProcess:
    pid: int
    start_ticks: int  # stat field 22: tells a reused pid apart
    comm: str
    where: str  # wchan or the matching stack frame


def scan_dstate(proc_root: Path) -> list[StuckProcess]:
    """Processes in uninterruptible sleep (D) inside the NVIDIA driver, best effort (races are skipped)."""
    out: list[StuckProcess] = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        base = proc_root / name
        try:
            stat = (base / "stat").read_text(errors="replace")
        except OSError:
            continue
        lparen, rparen = stat.find("("), stat.rfind(")")
        if lparen < 0 or rparen < lparen:
            continue
        comm = stat[lparen + 1 : rparen]
        rest = stat[rparen + 2 :].split()
        if not rest or rest[0] != "D":
            continue
        try:
            start = int(rest[19])  # field 22 overall; rest starts at field 3
        except (IndexError, ValueError):
            start = 0
        where = _nvidia_frame(base)
        if where or comm.startswith("nvidia"):
            out.append(StuckProcess(int(name), start, comm, where or "(process name)"))
    return out


def _nvidia_frame(base: Path) -> str:
    for part in ("wchan", "stack"):
        try:
            text = (base / part).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines() or [text]:
            if "[nvidia" in line or "nvidia" in line.split("+")[0] or line.startswith(("nv_", "os_", "uvm_")):
                return line.strip()[:200]
    return ""


class DriverProbe:
    """``proc_root`` None: no kernel-module or D-state checks (a simulated node)."""

    name = CHECK

    def __init__(self, settings: Settings | None = None, *, proc_root: Path | None = None) -> None:
        self.settings = settings or Settings()
        self.proc_root = proc_root
        self._stuck_since: dict[str, float] = {}
        self._dstate_since: dict[tuple[int, int], float] = {}
        self._dstate_current: dict[tuple[int, int], StuckProcess] = {}
        self._dstate_scanned_at: float | None = None

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        report = ReportBuilder(CHECK)
        node: list[Finding] = []
        if not snapshot.backend_up:
            node.append(self._library_down(snapshot.backend_error or "driver library not initialised"))
        node += self._module_version(snapshot)
        node += self._dstate(now)
        self._node_result(report, node, snapshot)
        driver = snapshot.system.driver_version if snapshot.system else None
        stuck = {call.lane: (call.call, snapshot.taken_at - call.seconds) for call in snapshot.stuck_calls}
        for g in snapshot.gpus:
            self._gpu(report, g, now, driver, stuck.get(str(g.index)))
        return report.build()

    def _node_result(self, report: ReportBuilder, node: list[Finding], snapshot: Snapshot) -> None:
        for f in node:
            report.finding(f)
        if node:
            worst = max(f.severity for f in node)
            status = CheckStatus.WARNING if worst <= Severity.WARNING else CheckStatus.FAILED
            report.result(None, status, "; ".join(f.message for f in node))
        elif snapshot.backend_up:
            version = snapshot.system.driver_version if snapshot.system else "unknown"
            report.result(None, CheckStatus.OK, f"driver {version} loaded and answering")

    def _library_down(self, error: str) -> Finding:
        code, _, _ = error.partition(":")
        if code == "version_mismatch":
            kind, message = "driver_version_mismatch", "the NVIDIA kernel module and library versions differ"
        elif code == "timeout":
            kind, message = "driver_init_timeout", "NVML initialisation did not return in time (driver hang)"
        else:
            kind, message = "driver_unavailable", "NVML cannot be initialised"
        # GPUd: NVML init error -> REBOOT_SYSTEM in every NVIDIA component (a reboot loads a consistent driver).
        return Finding(
            CHECK, kind, Severity.CRITICAL, Action.REBOOT_NODE, f"{message}: {error}", None, evidence(error=error)
        )

    def _module_version(self, snapshot: Snapshot) -> list[Finding]:
        root = self.proc_root
        if root is None or snapshot.system is None or not snapshot.backend_up:
            return []
        module = read_module_version(root)
        library = snapshot.system.driver_version
        if module is None or module == library:
            return []
        return [
            Finding(
                CHECK,
                "driver_version_mismatch",
                Severity.CRITICAL,
                Action.REBOOT_NODE,
                f"kernel module {module} is loaded but the user-space driver is {library} (upgraded without reboot?)",
                None,
                evidence(kernel_module=module, library=library),
            )
        ]

    def _dstate(self, now: float) -> list[Finding]:
        root = self.proc_root
        if root is None:
            return []
        last = self._dstate_scanned_at
        if last is None or now - last >= self.settings.dstate_scan_seconds or now < last:
            self._dstate_current = {(p.pid, p.start_ticks): p for p in scan_dstate(root)}
            self._dstate_since = {k: self._dstate_since.get(k, now) for k in self._dstate_current}
            self._dstate_scanned_at = now
        current = self._dstate_current
        out: list[Finding] = []
        for key, p in sorted(current.items()):
            held = now - self._dstate_since[key]
            if held < self.settings.dstate_after_seconds:
                continue
            out.append(
                Finding(
                    CHECK,
                    "driver_process_stuck",
                    Severity.CRITICAL,
                    Action.REBOOT_NODE,
                    f"process {p.comm} (pid {p.pid}) has been in uninterruptible sleep in the NVIDIA driver since "
                    f"{utc_text(self._dstate_since[key])} at the latest",
                    None,
                    evidence(pid=p.pid, comm=p.comm, where=p.where, seconds=round(held)),
                )
            )
        return out

    def _gpu(
        self, report: ReportBuilder, g: GpuSnapshot, now: float, driver: str | None, stuck: tuple[str, float] | None
    ) -> None:
        ref = gpu_ref(g)
        key = g.uuid or str(g.index)
        if g.error_code != "timeout":
            self._stuck_since.pop(key, None)
        if not g.fresh:
            finding = self._gpu_error(ref, key, g, now, stuck)
            if finding is None:
                report.stale(g)
            else:
                report.gpu_done(ref, [finding])
            return
        raw = g.sample.recovery_action if g.sample else 0
        if isinstance(raw, Unsupported):
            report.gpu_done(ref, [], "answering; this driver does not report a recovery action")
            return
        report.gpu_done(
            ref, self._recovery_action(ref, raw, driver), "answering; the driver asks for no recovery action"
        )

    @staticmethod
    def _recovery_action(ref: GpuRef, raw: int, driver: str | None) -> list[Finding]:
        """The driver's recovery-action field, decoded by its branch; a value the branch does not define is reported
        as unknown (a warning naming the raw value), never guessed."""
        if raw == 0:
            return []
        decoded = decode_recovery_action(raw, driver)
        branch = driver_branch(driver)
        ev = evidence(recovery_action=raw, driver_version=driver or "unknown")
        if decoded is None:
            where = f"driver branch R{branch}" if branch is not None else "an unknown driver version"
            message = f"the driver asks for recovery action {raw}, which {where} does not define"
            return [Finding(CHECK, "recovery_action_unknown", Severity.WARNING, Action.NONE, message, ref, ev)]
        if decoded is RecoveryAction.NONE:
            return []
        severity, action = RECOVERY_ACTIONS[decoded]
        message = f"the driver asks for recovery action {decoded.text} (raw {raw})"
        return [Finding(CHECK, f"recovery_action_{decoded.label}", severity, action, message, ref, ev)]

    def _gpu_error(
        self, ref: GpuRef, key: str, g: GpuSnapshot, now: float, stuck: tuple[str, float] | None
    ) -> Finding | None:
        error = g.error or ""
        if g.error_code == "gpu_lost":
            # NVML_ERROR_GPU_IS_LOST: the same card state as XID 79 (NVIDIA: RESTART_BM; GPUd: REBOOT_SYSTEM).
            # replace_node, as for XID 79 in the catalog: swap the node for a standby, reboot it in repair.
            return Finding(
                CHECK,
                "gpu_lost",
                Severity.FATAL,
                Action.REPLACE_NODE,
                f"the GPU is lost: {error}",
                ref,
                evidence(error=error),
            )
        if g.error_code == "reset_required":
            return Finding(
                CHECK,
                "gpu_reset_required",
                Severity.CRITICAL,
                Action.RESET_GPU,
                f"the GPU needs a reset: {error}",
                ref,
                evidence(error=error),
            )
        if g.error_code == "timeout":
            # the start is taken once, so the message (which names it) stays the same while the fault is open
            since = self._stuck_since.setdefault(key, min(now, stuck[1]) if stuck else now)
            held = now - since
            hung = held >= self.settings.hang_after_seconds
            return Finding(
                CHECK,
                "driver_call_timeout",
                Severity.CRITICAL if hung else Severity.WARNING,
                Action.REBOOT_NODE if hung else Action.NONE,
                hang_message(stuck[0] if stuck else None, since),
                ref,
                evidence(error=error, stuck_seconds=round(held)),
            )
        return None


def utc_text(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(unix))


def hang_message(call: str | None, since: float) -> str:
    """What a hung card's fault says. It names the moment the call went into the driver, not a duration: the
    fault's message is kept while the fault is open and shown long after, and a count of seconds would be wrong by
    then. ``call``: the call still in the driver (None: it returned, late, and calls keep missing their deadline)."""
    if call is None:
        return f"driver calls for this GPU have been missing their deadline since {utc_text(since)}"
    return (
        f"driver call {call} has not returned since {utc_text(since)}; "
        "every other call to this GPU fails at once until it does"
    )


def build(settings: Settings, host: ProbeHost) -> DriverProbe:
    return DriverProbe(settings, proc_root=host.proc_root)
