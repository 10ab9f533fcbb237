"""XID watcher: NVML events and kernel-log lines, merged, mapped by the catalog, emitted as event findings.

The same XID usually reaches us twice (an NVML event and one or more ``NVRM: Xid`` lines; XID 13 alone prints
three lines per exception). Each (card, XID) counts once per merge window, whichever source saw it first; the
rest are counted as merged. kmsg names cards by PCI bus id, NVML by index/uuid: both map to the card in the
latest Snapshot's inventory so that the two sources meet on one key.

On a MIG card NVML names the instance an event happened in (GPU and compute instance ids); the finding names that
MIG device (profile and MIG UUID from the Snapshot). The same XID in another MIG instance of the card within the
window is another incident (another tenant) and gets its own finding; sightings that name no instance (kmsg) merge
with whichever came first.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import structlog

from exporter.backends.errors import BackendError
from exporter.backends.protocol import Backend
from exporter.backends.types import DeviceEvent, EventKind
from exporter.settings import ConfigError, option
from exporter.snapshot import Snapshot
from exporter.supervision import Workers
from healthd.findings import Finding, FindingKind, GpuRef
from healthd.xid.catalog import CatalogError, XidCatalog, XidOverride, load_catalog, parse_overrides
from healthd.xid.kmsg import KmsgReader, KmsgRecord, NvrmDecoder, NvrmEvent, normalize_pci
from healthd.xid.kmsg_cursor import KmsgCursor

log = structlog.get_logger("xid")

CHECK = "xid"


class EventSink(Protocol):
    def event(self, finding: Finding) -> None: ...


XID_SECTION = "xid"


def _overrides(raw: Any, name: str) -> Mapping[int, XidOverride]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: expected a table of [{name}.N] entries")
    try:
        return MappingProxyType(parse_overrides(raw, name))
    except CatalogError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class XidSettings:
    """[health.xid]: the merge window, and per-XID overrides of the catalog ([health.xid.overrides.N])."""

    # One XID usually arrives by NVML within milliseconds and by kmsg within the reader's poll; 10 s covers both
    # without merging separate incidents (NVSentinel links fallen-off-bus text to XIDs over 5 min, then dedups
    # for 3 min in its platform connector; our engine does the longer dedup).
    merge_window_seconds: float = option(10.0, above=0)
    overrides: Mapping[int, XidOverride] = option(default_factory=dict, parse=_overrides)


@dataclass(frozen=True, slots=True)
class MigRef:
    """The MIG device an NVML event names; uuid and profile are empty when the Snapshot does not list it yet."""

    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str = ""
    profile: str = ""

    def describe(self) -> str:
        ids = f"GPU instance {self.gpu_instance_id}"
        if self.compute_instance_id is not None:
            ids += f", compute instance {self.compute_instance_id}"
        if self.uuid:
            ids += f", {self.uuid}"
        return f"MIG {self.profile} ({ids})" if self.profile else f"MIG ({ids})"


@dataclass(frozen=True, slots=True)
class _Sighting:
    xid: int
    gpu: GpuRef | None
    pci: str  # normalised, "" when unknown
    source: str  # "nvml" or "kmsg"
    pid: int | None = None
    process: str | None = None
    text: str = ""
    mig: MigRef | None = None


class XidMerger:
    """Turns sightings from both sources into one finding per (card, XID) per merge window. Thread-safe."""

    def __init__(self, catalog: XidCatalog, sink: EventSink, clock: Callable[[], float], window_seconds: float) -> None:
        self._catalog = catalog
        self._sink = sink
        self._clock = clock
        self._window = window_seconds
        self._lock = threading.Lock()
        # (card, xid) -> (first sighting's time, MIG instances named in the window)
        self._last: dict[tuple[str, int], tuple[float, frozenset[tuple[int, int | None]]]] = {}
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (source, "reported" | "merged")

    def add(self, s: _Sighting) -> Finding | None:
        now = self._clock()
        # kmsg always names the PCI address and NVML events get it from the inventory: key on it first
        ident = (s.pci and f"pci:{s.pci}") or (s.gpu.uuid if s.gpu and s.gpu.uuid else "") or "node"
        key = (ident, s.xid)
        instance = (s.mig.gpu_instance_id, s.mig.compute_instance_id) if s.mig else None
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last[0] < self._window:
                seen = last[1]
                # another MIG instance than the ones already named is another incident; anything else merges
                if instance is None or not seen or instance in seen:
                    self._last[key] = (last[0], seen | {instance} if instance else seen)
                    self.outcomes[(s.source, "merged")] += 1
                    return None
                self._last[key] = (last[0], seen | {instance})
            else:
                self._last[key] = (now, frozenset({instance}) if instance else frozenset())
            if len(self._last) > 4096:
                self._last = {k: v for k, v in self._last.items() if now - v[0] < self._window}
            self.outcomes[(s.source, "reported")] += 1
            ours = self._last[key]
        finding = self._finding(s)
        try:
            self._sink.event(finding)
        except Exception:
            # not recorded: forget this sighting, so that the same incident seen again (a retry) is reported
            with self._lock:
                if self._last.get(key) is ours:
                    if last is None:
                        self._last.pop(key, None)
                    else:
                        self._last[key] = last
                self.outcomes[(s.source, "reported")] -= 1
            raise
        return finding

    def outcome_counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.outcomes)

    @property
    def emitted(self) -> int:
        """Findings reported, from every source."""
        return sum(n for (_, outcome), n in self.outcome_counts().items() if outcome == "reported")

    @property
    def merged(self) -> int:
        """Sightings merged into a finding already reported in its window, from every source."""
        return sum(n for (_, outcome), n in self.outcome_counts().items() if outcome == "merged")

    def _finding(self, s: _Sighting) -> Finding:
        entry = self._catalog.lookup(s.xid)
        where = f"GPU {s.gpu.index}" if s.gpu else f"PCI {s.pci or 'unknown'}"
        if s.mig is not None:
            where += f" {s.mig.describe()}"
        message = f"XID {s.xid} ({entry.name}) on {where}: {entry.description}"
        if s.text:
            message += f" [{s.text[:200]}]"
        ev: dict[str, str] = {
            "xid": str(s.xid),
            "xid_name": entry.name,
            "source": s.source,
            "catalog_version": self._catalog.version,
            "application_level": str(entry.application_level).lower(),
        }
        if entry.nvidia_bucket:
            ev["nvidia_bucket"] = entry.nvidia_bucket
        if s.pci:
            ev["pci_bus_id"] = s.pci
        if s.pid is not None:
            ev["pid"] = str(s.pid)
        if s.process:
            ev["process"] = s.process
        if s.text:
            ev["text"] = s.text[:500]
        if s.mig is not None:
            ev["gpu_instance_id"] = str(s.mig.gpu_instance_id)
            if s.mig.compute_instance_id is not None:
                ev["compute_instance_id"] = str(s.mig.compute_instance_id)
            if s.mig.uuid:
                ev["mig_uuid"] = s.mig.uuid
            if s.mig.profile:
                ev["mig_profile"] = s.mig.profile
        return Finding(
            check=CHECK,
            code=f"xid_{s.xid}",
            severity=entry.severity,
            action=entry.action,
            message=message,
            gpu=s.gpu,
            evidence=MappingProxyType(ev),
            kind=FindingKind.EVENT,
        )


class XidWatcher:
    """Runs the NVML event loop and the kmsg reader on their own threads and merges what they see.

    Only this component calls ``backend.wait_event``. ``snapshots`` returns the latest Snapshot (for the PCI bus
    id -> card map); ``kmsg_path`` None turns the kernel-log source off.

    Both threads are supervised (``workers``, exporter/supervision.py). An NVML event the sink could not record
    (the journal locked past its busy timeout, a full file system) makes the event loop fail; it is kept and is
    the first thing the restarted loop records, so a failed write delays an XID instead of losing it. After
    ``MAX_EVENT_ATTEMPTS`` failed attempts the event is dropped with an error in the log (``dropped_events``).
    """

    MAX_EVENT_ATTEMPTS = 8  # with the supervisor's back-off (1 s doubling to 30 s): about two minutes of retries

    def __init__(
        self,
        backend: Backend,
        kmsg_path: Path | None,
        catalog: XidCatalog,
        sink: EventSink,
        clock: Callable[[], float] = time.time,
        snapshots: Callable[[], Snapshot | None] = lambda: None,
        settings: XidSettings | None = None,
        *,
        kmsg_from_start: bool = False,
        nvml_wait_seconds: float = 1.0,  # one nvmlEventSetWait call (the H200 capture: a 200 ms wait times out cleanly)
        nvml_retry_seconds: float = 10.0,  # back-off after the event call fails (driver not loaded yet, GPU lost)
        kmsg_poll_seconds: float = 0.2,
        workers: Workers | None = None,
        kmsg_cursor: KmsgCursor | None = None,  # where the kernel-log reader left off (replay after a restart)
    ) -> None:
        self._workers = workers or Workers()
        self.settings = settings or XidSettings()
        self._nvml_wait_seconds = nvml_wait_seconds
        self._nvml_retry_seconds = nvml_retry_seconds
        self._backend = backend
        self._snapshots = snapshots
        self.merger = XidMerger(catalog, sink, clock, self.settings.merge_window_seconds)
        self._decoder = NvrmDecoder()
        self._decoder_lock = threading.Lock()
        self._uuid_by_pci: dict[str, str] = {}  # learned from "NVRM: GPU at PCI:..: GPU-..." lines
        self._stop = threading.Event()
        self._nvml_thread: threading.Thread | None = None
        self.reader = (
            KmsgReader(
                kmsg_path,
                self.on_kmsg_record,
                from_start=kmsg_from_start,
                poll_seconds=kmsg_poll_seconds,
                workers=self._workers,
                cursor=kmsg_cursor,
            )
            if kmsg_path is not None
            else None
        )
        self.nvml_errors = 0
        self.ignored_events = 0
        self.dropped_events = 0  # NVML events given up on after MAX_EVENT_ATTEMPTS failed attempts to record them
        self._unrecorded: DeviceEvent | None = None  # taken from the driver, not recorded yet (the sink raised)
        self._attempts = 0
        self._clock = clock
        self._rejected_logged = 0
        self._rejected_logged_at = float("-inf")

    # ----- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._nvml_thread is None:
            self._nvml_thread = self._workers.start("xid-nvml", self._nvml_loop, self._stop)
        if self.reader is not None:
            self.reader.start()

    def stop(self, timeout: float = 3.0) -> None:
        self._stop.set()
        if self.reader is not None:
            self.reader.stop(timeout)
        if self._nvml_thread is not None:
            self._nvml_thread.join(timeout)

    def _nvml_loop(self) -> None:
        """Wait for driver events and record them; a recording failure raises (the supervisor restarts the loop)."""
        last_error = ""
        while not self._stop.is_set():
            event = self._unrecorded
            if event is None:
                try:
                    event = self._backend.wait_event(self._nvml_wait_seconds)
                except BackendError as exc:
                    self.nvml_errors += 1
                    if str(exc) != last_error:
                        log.warning("NVML event wait failed", error=str(exc), code=exc.code)
                    last_error = str(exc)
                    self._stop.wait(self._nvml_retry_seconds)
                    continue
                last_error = ""
                if event is None:
                    continue
            self._record(event)

    def _record(self, event: DeviceEvent) -> None:
        self._unrecorded, self._attempts = event, self._attempts + 1
        try:
            self.on_device_event(event)
        except Exception:
            if self._attempts < self.MAX_EVENT_ATTEMPTS:
                raise  # kept in _unrecorded: the restarted loop tries it again
            self.dropped_events += 1
            self._unrecorded, self._attempts = None, 0
            log.error(
                "NVML event dropped: it could not be recorded", event=str(event), attempts=self.MAX_EVENT_ATTEMPTS
            )
            raise
        self._unrecorded, self._attempts = None, 0

    def event_counts(self) -> dict[tuple[str, str], int]:
        """XID sightings by (source, outcome): reported (became a finding), merged (the same incident seen again
        within the window), ignored (NVML events that are not XIDs: single-bit ECC), rejected (kernel-log lines that
        mention NVRM but are not the driver's)."""
        counts = self.merger.outcome_counts()
        counts[("nvml", "ignored")] = self.ignored_events
        counts[("kmsg", "rejected")] = self._decoder.rejected
        return counts

    def kmsg_overwritten(self) -> int:
        """Kernel-log records the kernel overwrote before they were read (XIDs in them were lost)."""
        return self.reader.overwritten if self.reader is not None else 0

    # ----- the two sources -----------------------------------------------------------------------------------

    def on_device_event(self, event: DeviceEvent) -> Finding | None:
        """An NVML event. SBE events are left to the ECC probe (rates, not single events); xid 0 is noise."""
        if event.kind is EventKind.ECC_SINGLE_BIT or event.xid <= 0:
            self.ignored_events += 1
            return None
        xid = 48 if event.kind is EventKind.ECC_DOUBLE_BIT else event.xid
        gpu = self._gpu_by_event(event)
        pci = normalize_pci(gpu.pci_bus_id) if gpu else ""
        return self.merger.add(_Sighting(xid, gpu, pci, "nvml", mig=self._mig_by_event(event, gpu)))

    def on_kmsg_record(self, record: KmsgRecord) -> Finding | None:
        with self._decoder_lock:
            event = self._decoder.feed(record)
            rejected, sample = self._decoder.rejected, self._decoder.last_rejected
        if rejected != self._rejected_logged:
            self._log_rejected(rejected, sample)
        if event is None:
            return None
        if event.kind == "identity":
            if event.uuid:
                self._uuid_by_pci[event.pci] = event.uuid
            return None
        return self._on_nvrm(event)

    def _log_rejected(self, rejected: int, sample: str) -> None:
        """At most one warning a minute: a flood of look-alike lines must not flood the journal too."""
        now = self._clock()
        if now - self._rejected_logged_at < 60.0:
            return
        log.warning(
            "kernel-log lines mention NVRM but are not the NVIDIA driver's (user-space writes or the prefix inside "
            "other text); ignored",
            count=rejected - self._rejected_logged,
            example=sample,
        )
        self._rejected_logged, self._rejected_logged_at = rejected, now

    def _on_nvrm(self, event: NvrmEvent) -> Finding | None:
        assert event.xid is not None
        gpu = self._gpu_by_pci(event.pci)
        mig = None
        if event.gpu_instance is not None:  # the driver names the MIG device in the line (GPU-I / GPU-CI)
            mig = MigRef(event.gpu_instance, event.compute_instance)
        sighting = _Sighting(event.xid, gpu, event.pci, "kmsg", event.pid, event.process, event.text, mig)
        return self.merger.add(sighting)

    # ----- card lookup -------------------------------------------------------------------------------------

    def _inventory(self) -> list[GpuRef]:
        snap = self._snapshots()
        if snap is None:
            return []
        return [GpuRef(g.index, g.info.uuid, g.info.pci_bus_id) for g in snap.gpus if g.info is not None]

    def _gpu_by_event(self, event: DeviceEvent) -> GpuRef | None:
        cards = self._inventory()
        found = next((g for g in cards if g.uuid == event.uuid), None) or next(
            (g for g in cards if g.index == event.gpu_index), None
        )
        if found is not None:
            return found
        return GpuRef(event.gpu_index, event.uuid, "") if event.uuid else None

    def _mig_by_event(self, event: DeviceEvent, gpu: GpuRef | None) -> MigRef | None:
        """The MIG device the event names, with its profile and UUID from the latest Snapshot where it is listed."""
        if event.gpu_instance_id is None:
            return None
        gi, ci = event.gpu_instance_id, event.compute_instance_id
        snap = self._snapshots()
        card = snap.gpu(gpu.index) if snap is not None and gpu is not None else None
        for m in card.mig_instances if card is not None else ():
            if m.gpu_instance_id == gi and (ci is None or m.compute_instance_id == ci):
                return MigRef(gi, m.compute_instance_id, m.uuid, m.profile_name)
        return MigRef(gi, ci)

    def _gpu_by_pci(self, pci: str) -> GpuRef | None:
        found = next((g for g in self._inventory() if normalize_pci(g.pci_bus_id) == pci), None)
        if found is not None:
            return found
        uuid = self._uuid_by_pci.get(pci)
        return None if uuid is None else next((g for g in self._inventory() if g.uuid == uuid), None)


def build_watcher(
    settings: XidSettings,
    backend: Backend,
    sink: EventSink,
    snapshots: Callable[[], Snapshot | None],
    kmsg_path: Path | None,
    clock: Callable[[], float] = time.time,
    workers: Workers | None = None,
    kmsg_cursor: KmsgCursor | None = None,
) -> XidWatcher:
    """The XID watcher with the catalog and the configured overrides; ``kmsg_path`` None: no kernel-log source."""
    catalog = load_catalog(overrides=settings.overrides)
    return XidWatcher(
        backend, kmsg_path, catalog, sink, clock, snapshots, settings, workers=workers, kmsg_cursor=kmsg_cursor
    )
