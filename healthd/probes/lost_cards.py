"""Lost cards: fewer GPUs than expected, and NVIDIA GPUs on the PCI bus that NVML does not list.

The expected count is configured, or learned at first start from a complete inventory and kept in
``<state_dir>/gpu-inventory.json`` (written atomically), so a card that is gone after a reboot is still missed.
sysfs: ``<sysfs>/bus/pci/devices/*`` with vendor 0x10de and class 0x0300xx (VGA) or 0x0302xx (3D controller);
NVSwitches (bridge class 0x0680) are not GPUs. A GPU bound to another driver on purpose (vfio-pci for a VM) is
not lost; one bound to no driver at all is (the nvidia driver failed to probe it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

from exporter.atomic_file import write_text_atomic
from exporter.settings import option
from exporter.snapshot import Snapshot
from healthd.findings import Action, CheckStatus, Finding, ProbeReport, Severity
from healthd.host.view import ProbeHost
from healthd.probes.common import ReportBuilder, evidence
from healthd.xid.kmsg import normalize_pci

log = structlog.get_logger("lost_cards")

CHECK = "lost_cards"
INVENTORY_FILE = "gpu-inventory.json"
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")


SECTION = "lost_cards"


@dataclass(frozen=True, slots=True)
class Settings:
    """[health.lost_cards]: ``expected_gpus`` unset (0) means learned at first start and kept in the state dir."""

    expected_gpus: int = option(0, min=0)


@dataclass(frozen=True, slots=True)
class PciGpu:
    address: str  # normalised dddd:bb:dd
    sysfs_name: str  # 0000:3b:00.0
    driver: str  # "" when no driver is bound


def scan_pci_gpus(sysfs_root: Path) -> list[PciGpu]:
    base = sysfs_root / "bus" / "pci" / "devices"
    out: list[PciGpu] = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    for name in names:
        dev = base / name
        try:
            vendor = (dev / "vendor").read_text().strip().lower()
            klass = (dev / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor != NVIDIA_VENDOR or not klass.startswith(GPU_CLASSES):
            continue
        try:
            driver = os.path.basename(os.readlink(dev / "driver"))
        except OSError:
            driver = ""
        out.append(PciGpu(normalize_pci(name), name, driver))
    return out


def write_json_atomic(path: Path, data: object) -> None:
    """Write, fsync, rename: a crash leaves the old file or the new one, never half of one. State: 0640."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=0o640)


@dataclass(frozen=True, slots=True)
class LearnedInventory:
    gpu_count: int
    uuids: tuple[str, ...]
    learned_at: float


class LostCardProbe:
    """``state_dir`` None (and no ``expected_gpus``): no count check; ``sysfs_root`` None: no PCI scan (a simulated
    node)."""

    name = CHECK

    def __init__(
        self, settings: Settings | None = None, *, state_dir: Path | None = None, sysfs_root: Path | None = None
    ) -> None:
        self.settings = settings or Settings()
        self.expected = self.settings.expected_gpus or None  # None: learned at first start, kept in state_dir
        self.state_dir = state_dir
        self.sysfs_root = sysfs_root
        self._learned: LearnedInventory | None = None
        self._state_error: str | None = None
        self._loaded = False

    @property
    def state_path(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / INVENTORY_FILE

    def _load(self) -> None:
        self._loaded = True
        path = self.state_path
        if path is None or not path.exists():
            return
        try:
            data = json.loads(path.read_text())
            self._learned = LearnedInventory(
                gpu_count=int(data["gpu_count"]),
                uuids=tuple(str(u) for u in data.get("uuids", [])),
                learned_at=float(data.get("learned_at", 0.0)),
            )
            if self._learned.gpu_count < 0:
                raise ValueError("gpu_count < 0")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Never relearn over a damaged file: that could hide a card lost since. An operator removes it.
            self._state_error = f"{path}: unreadable ({type(exc).__name__}: {exc}); remove it to learn again"
            log.error("GPU inventory state unreadable", path=str(path), error=str(exc))

    def _learn(self, snapshot: Snapshot, now: float) -> None:
        path = self.state_path
        if path is None or self._learned is not None or self._state_error is not None:
            return
        # Learn only from a complete inventory: the library is up and every card answered its identity call.
        if not snapshot.backend_up or not snapshot.gpus or any(g.info is None for g in snapshot.gpus):
            return
        learned = LearnedInventory(len(snapshot.gpus), tuple(g.uuid for g in snapshot.gpus), now)
        try:
            write_json_atomic(
                path,
                {"version": 1, "gpu_count": learned.gpu_count, "uuids": list(learned.uuids), "learned_at": now},
            )
        except OSError as exc:
            self._state_error = f"{path}: cannot write ({exc.strerror or exc})"
            return
        self._learned = learned
        log.info("learned GPU inventory", gpus=learned.gpu_count, path=str(path))

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        if not self._loaded:
            self._load()
        report = ReportBuilder(CHECK)
        findings: list[Finding] = []
        details: list[str] = []
        count_known = False
        if snapshot.backend_up:
            if self.expected is None:
                self._learn(snapshot, now)
            expected = self.expected
            source = "configured"
            if expected is None and self._learned is not None:
                expected, source = self._learned.gpu_count, "learned"
            if self._state_error is not None and self.expected is None:
                details.append(self._state_error)
            if expected is not None:
                count_known = True
                findings += self._count(snapshot, expected, source)
        else:
            details.append("driver library down: the driver probe reports it")
        pci_checked = False
        if self.sysfs_root is not None:
            pci_checked = True
            findings += self._pci(snapshot)
        for f in findings:
            report.finding(f)
        if findings:
            worst = max(f.severity for f in findings)
            st = CheckStatus.WARNING if worst <= Severity.WARNING else CheckStatus.FAILED
            report.result(None, st, "; ".join([f.message for f in findings] + details))
        elif count_known or (pci_checked and snapshot.backend_up):
            report.result(None, CheckStatus.OK, "; ".join([f"{len(snapshot.gpus)} GPUs present", *details]))
        else:
            report.result(None, CheckStatus.UNKNOWN, "; ".join(details) or "no expected GPU count yet")
        return report.build()

    def _count(self, snapshot: Snapshot, expected: int, source: str) -> list[Finding]:
        present = len(snapshot.gpus)
        if present >= expected:
            return []
        seen = {g.uuid for g in snapshot.gpus}
        missing = [u for u in (self._learned.uuids if self._learned else ()) if u not in seen]
        # GPUd gpu-counts: fewer GPUs than expected -> REBOOT_SYSTEM (then hardware inspection after 2 reboots).
        return [
            Finding(
                CHECK,
                "gpu_count_low",
                Severity.CRITICAL,
                Action.REBOOT_NODE,
                f"{present} GPUs visible, {expected} expected ({source})"
                + (f"; missing {', '.join(missing)}" if missing else ""),
                None,
                evidence(present=present, expected=expected, source=source, missing=",".join(missing)),
            )
        ]

    def _pci(self, snapshot: Snapshot) -> list[Finding]:
        assert self.sysfs_root is not None
        known = {normalize_pci(g.info.pci_bus_id) for g in snapshot.gpus if g.info is not None}
        out: list[Finding] = []
        for dev in scan_pci_gpus(self.sysfs_root):
            if dev.address in known or (dev.driver and dev.driver != "nvidia"):
                continue  # seen by NVML, or handed to another driver on purpose (vfio-pci passthrough)
            if dev.driver == "nvidia" and (not snapshot.backend_up or len(known) < len(snapshot.gpus)):
                continue  # NVML down (the driver probe reports that) or inventory incomplete: cannot tell
            out.append(
                Finding(
                    CHECK,
                    "gpu_not_visible",
                    Severity.CRITICAL,
                    Action.REBOOT_NODE,
                    f"NVIDIA GPU {dev.sysfs_name} is on the PCI bus but "
                    + ("no driver is bound to it" if not dev.driver else "NVML does not list it"),
                    None,
                    evidence(pci_bus_id=dev.address, driver=dev.driver or "none"),
                )
            )
        return out


def build(settings: Settings, host: ProbeHost) -> LostCardProbe:
    return LostCardProbe(settings, state_dir=host.state_dir, sysfs_root=host.sysfs_root)
