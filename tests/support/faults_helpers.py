"""Shared builders for the fault-pipeline tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from healthd.faults.engine import FaultEngine
from healthd.faults.journal import Journal
from healthd.faults.settings import FaultsSettings
from healthd.findings import Action, CheckResult, CheckStatus, Finding, FindingKind, GpuRef, ProbeReport, Severity
from tests.support.clock import FakeClock

GPU0 = GpuRef(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "00000000:18:00.0")
GPU1 = GpuRef(1, "GPU-bbbbbbbb-1111-1111-1111-111111111111", "00000000:2A:00.0")

SETTINGS = FaultsSettings(
    dedup_window_seconds=60.0,
    open_after_evaluations=2,
    resolve_after_evaluations=2,
    reopen_window_seconds=300.0,
    event_quiet_seconds=600.0,
    escalation_reboots=2,
)


def make_engine(
    state: Path, clock: FakeClock, *, boot_id: str = "boot-1", targets: tuple[str, ...] = (), **overrides: object
) -> FaultEngine:
    settings = replace(SETTINGS, **overrides)  # type: ignore[arg-type]
    return FaultEngine(
        Journal(state / "faults.sqlite"),
        settings,
        boot_id=boot_id,
        hook_targets=targets,
        hook_min_action=Action.REBOOT_NODE,
        clock=clock,
    )


def ecc_finding(
    gpu: GpuRef = GPU0, *, severity: Severity = Severity.CRITICAL, action: Action = Action.RESET_GPU
) -> Finding:
    return Finding("ecc", "ecc_uncorrectable_volatile", severity, action, "uncorrectable ECC errors", gpu)


def xid(
    code: int, gpu: GpuRef = GPU0, *, severity: Severity = Severity.CRITICAL, action: Action = Action.RESTART_APP
) -> Finding:
    return Finding(
        "xid", f"xid_{code}", severity, action, f"XID {code}", gpu, evidence={"xid": str(code)}, kind=FindingKind.EVENT
    )


def ecc_report(*findings: Finding, status: dict[int, CheckStatus] | None = None) -> ProbeReport:
    status = status or {}
    results = tuple(
        CheckResult(
            "ecc", g, status.get(g.index, CheckStatus.FAILED if any(f.gpu == g for f in findings) else CheckStatus.OK)
        )
        for g in (GPU0, GPU1)
    )
    return ProbeReport("ecc", results, tuple(findings))


class DaemonThread:
    """The fault pipeline plus the daemon's real gRPC server, on an asyncio loop in a background thread.

    Tests talk to it with real (sync) gRPC channels over the unix socket and feed the engine from the test thread,
    as the probe runner would.
    """

    def __init__(
        self,
        state: Path,
        socket: Path,
        hook: object | None = None,
        journal: Journal | None = None,
        clock: Callable[[], float] = time.time,
        **fault_overrides: object,
    ) -> None:
        import asyncio
        import threading

        from healthd.daemon.health import HealthComponent
        from healthd.faults import service as health_service
        from healthd.faults.settings import HookSettings
        from healthd.rpc.server import GrpcServer, Service

        self.address = f"unix:{socket}"
        settings = replace(SETTINGS, **fault_overrides)  # type: ignore[arg-type]
        self.health = HealthComponent(
            journal or Journal(state / "faults.sqlite"),
            settings,
            hook if isinstance(hook, HookSettings) else HookSettings(),
            boot_id="boot-1",
            clock=clock,
        )
        self.engine = self.health.engine
        self._server = GrpcServer(
            [self.address],
            [Service(health_service.SERVICE_NAME, self.health.service, health_service.add_to_server)],
        )
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> DaemonThread:
        import asyncio

        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        await self.health.start()
        await self._server.start()

    async def _stop(self) -> None:
        await self._server.stop(0.5)
        await self.health.stop(flush_seconds=5.0)

    def __exit__(self, *exc: object) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
