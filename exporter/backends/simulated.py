"""A simulated GPU node driven by a scenario file, with fault injection at run time.

It stands in for the GPU only: it behaves as NVML does (errors, NotSupported, MIG placement rules, hangs) so the
rest of the daemon runs unchanged. Every method is thread-safe; one lock per card keeps cards independent, and a
hang injected on one card blocks only calls to that card.
"""

from __future__ import annotations

import hashlib
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from exporter.backends import simulated_profiling as profiling_model
from exporter.backends.errors import (
    DriverUnavailableError,
    GpuLostError,
    InsufficientResourcesError,
    InUseError,
    InvalidStateError,
    NotFoundError,
    VersionMismatchError,
)
from exporter.backends.scenario import Scenario, load_scenario
from exporter.backends.types import (
    UNKNOWN,
    UNSUPPORTED,
    ComputeMode,
    DeviceEvent,
    DeviceInfo,
    DeviceProfiling,
    DeviceSample,
    EccCounts,
    EventKind,
    GpuProcess,
    LinkState,
    MigInstance,
    MigProfile,
    NvLinkSample,
    PcieThroughput,
    ProfilingSample,
    RemappedRows,
    SystemInfo,
    Unknown,
    Unsupported,
)

MEMORY_SLICES = 8
COMPUTE_SLICES = 7
NVLINK_BYTES_PER_SECOND_BUSY = profiling_model.NVLINK_BYTES_PER_SECOND_BUSY  # per card, all links, at full load
HANGABLE_CALLS = (
    "device_info",
    "sample",
    "processes",
    "mig_instances",
    "mig_profiles",
    "nvlink_peers",
    "create_mig_instance",
    "destroy_mig_instance",
    "profiling",
    "pcie_throughput",
    "*",
)


@dataclass
class _Link:
    state: LinkState = LinkState.UP
    crc: int = 0
    replay: int = 0
    recovery: int = 0
    tx: float = 0.0
    rx: float = 0.0


@dataclass
class _Proc:
    pid: int
    name: str
    memory_bytes: int
    load: float
    gpu_instance_id: int | None
    pod: PodPlacement | None = None


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Simulation only: the Kubernetes pod a simulated process runs in (read by the simulated node's proc tree)."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class SimulatedWorkload:
    """Simulation only: one simulated GPU process and where it lives, for the simulated proc tree and kubelet."""

    gpu: int
    uuid: str
    pid: int
    name: str
    gpu_instance_id: int | None
    mig_uuid: str | None
    pod: PodPlacement | None


@dataclass
class _MigGi:
    gpu_instance_id: int
    profile: MigProfile
    start: int
    uuid: str


@dataclass
class _Card:
    """Mutable state of one simulated card, guarded by ``lock``."""

    index: int
    uuid: str
    pci_bus_id: str
    serial: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    procs: dict[int, _Proc] = field(default_factory=dict)
    links: list[_Link] = field(default_factory=list)
    orphan_memory: int = 0
    ecc_sbe_vol: int = 0
    ecc_dbe_vol: int = 0
    ecc_sbe_agg: int = 0
    ecc_dbe_agg: int = 0
    ecc_pending: bool = True
    remap_cor: int = 0
    remap_unc: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    recovery_action: int = 0
    pcie_replay: int = 0
    compute_mode: ComputeMode = ComputeMode.DEFAULT
    persistence: bool = True
    mig_current: bool = False
    mig_pending: bool = False
    mig: dict[int, _MigGi] = field(default_factory=dict)
    lost: bool = False
    process_list_denied: bool = False  # as an unprivileged caller: NVML refuses the parent's list with MIG on
    hangs: dict[str, threading.Event] = field(default_factory=dict)
    energy: float = 0.0
    last_t: float | None = None
    gpm: profiling_model.Brackets = field(default_factory=profiling_model.Brackets)
    phase: float = 0.0


class SimulatedBackend:
    """The Backend protocol over a scenario. ``clock`` drives the moving values (inject a fake one in tests)."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        clock: Callable[[], float] = time.time,
        version_mismatch: bool = False,
        gpm: bool = True,
    ) -> None:
        self.scenario = scenario
        self._gpm = gpm  # False: a card without GPM (before Hopper), for the PCIe throughput fallback
        self.name = f"simulated:{scenario.name}"
        self._clock = clock
        self._version_mismatch = version_mismatch
        self._open = False
        self._node_lock = threading.Lock()
        self._events: queue.Queue[DeviceEvent] = queue.Queue()
        self._cards = [self._new_card(i) for i in range(len(scenario.cards))]
        for spec in scenario.processes:
            card = self._cards[spec.gpu]
            pod = PodPlacement(spec.namespace, spec.pod, spec.container or "main") if spec.pod else None
            card.procs[spec.pid] = _Proc(spec.pid, spec.name, spec.memory_bytes, spec.load, spec.gpu_instance_id, pod)
        for inst in scenario.mig_instances:
            self._create_gi(self._cards[inst.gpu], inst.profile_id, inst.placement_start)

    @classmethod
    def from_name(cls, name_or_path: str, *, clock: Callable[[], float] = time.time) -> SimulatedBackend:
        return cls(load_scenario(name_or_path), clock=clock)

    def _new_card(self, index: int) -> _Card:
        spec = self.scenario.cards[index]
        card = _Card(index=index, uuid=spec.uuid, pci_bus_id=spec.pci_bus_id, serial=spec.serial)
        card.links = [_Link() for _ in range(self.scenario.nvlink_count)]
        card.energy = self.scenario.energy_joules_at_start + 1000.0 * index
        card.mig_current = card.mig_pending = spec.mig_enabled
        card.phase = (index * 0.7) % (2 * math.pi)
        return card

    # ----- lifecycle ---------------------------------------------------------------------------------------

    def open(self) -> None:
        if self._version_mismatch:
            raise VersionMismatchError(
                "Driver/library version mismatch (simulated): kernel module 580.159.04, library 580.142.00"
            )
        self._open = True

    def close(self) -> None:
        self._open = False

    def system_info(self) -> SystemInfo:
        self._require_open("nvmlSystemGetDriverVersion")
        s = self.scenario
        return SystemInfo(
            driver_version=s.driver_version,
            nvml_version=s.nvml_version,
            cuda_driver_version=s.cuda_driver_version,
            backend=self.name,
        )

    def device_count(self) -> int:
        self._require_open("nvmlDeviceGetCount")
        return len(self._cards)

    # ----- reads -------------------------------------------------------------------------------------------

    def device_info(self, index: int) -> DeviceInfo:
        card = self._enter(index, "device_info", "nvmlDeviceGetHandleByIndex")
        s = self.scenario
        return DeviceInfo(
            index=index,
            uuid=card.uuid,
            name=s.model,
            pci_bus_id=card.pci_bus_id,
            serial=card.serial or UNSUPPORTED,
            minor_number=index,
            memory_total_bytes=s.memory_total_bytes,
            sm_clock_max_mhz=s.sm_clock_max_mhz,
            memory_clock_max_mhz=s.memory_clock_mhz,
            pcie_generation_max=s.pcie_generation,
            pcie_width_max=s.pcie_width,
            power_limit_default_mw=int(s.power_limit_watts * 1000),
            nvlink_count=s.nvlink_count,
            mig_capable=bool(s.mig_profiles),
            compute_capability=s.compute_capability,
            vbios_version=s.vbios_version,
        )

    def sample(self, index: int) -> DeviceSample:
        card = self._enter(index, "sample", "nvmlDeviceGetFieldValues")
        s = self.scenario
        now = self._clock()
        with card.lock:
            load = self._load(card, now)
            self._advance_counters(card, now, load)
            used = self._memory_used(card)
            busy = load > 0.02
            power = s.idle_power_watts + (s.power_limit_watts * 0.92 - s.idle_power_watts) * load
            links: tuple[NvLinkSample, ...] | Unsupported = UNSUPPORTED
            if card.links:
                links = tuple(
                    NvLinkSample(
                        link=i,
                        state=link.state,
                        crc_errors=link.crc,
                        replay_errors=link.replay,
                        recovery_errors=link.recovery,
                        tx_bytes=int(link.tx),
                        rx_bytes=int(link.rx),
                    )
                    for i, link in enumerate(card.links)
                )
            reserved = s.memory_reserved_bytes
            return DeviceSample(
                gpu_utilization_ratio=UNSUPPORTED if card.mig_current else round(load, 4),
                memory_utilization_ratio=UNSUPPORTED if card.mig_current else round(load * 0.55, 4),
                memory_used_bytes=used,
                memory_free_bytes=max(0, s.memory_total_bytes - reserved - used),
                memory_reserved_bytes=reserved,
                temperature_gpu_celsius=round(s.temperature_idle_celsius + 42.0 * load, 1),
                temperature_memory_celsius=round(s.temperature_idle_celsius + 3.0 + 38.0 * load, 1),
                power_draw_watts=round(power, 3),
                power_limit_watts=s.power_limit_watts,
                energy_joules=round(card.energy, 3),
                sm_clock_mhz=(s.sm_clock_max_mhz - int(60 * load)) if busy else s.sm_clock_idle_mhz,
                memory_clock_mhz=s.memory_clock_mhz,
                clock_event_reasons=0 if busy else 1,  # bit 0: GPU idle
                performance_state=0,
                pcie_generation=s.pcie_generation,
                pcie_width=s.pcie_width,
                pcie_replay_count=card.pcie_replay,
                ecc=EccCounts(
                    enabled_current=True,
                    enabled_pending=card.ecc_pending,
                    corrected_volatile=card.ecc_sbe_vol,
                    uncorrected_volatile=card.ecc_dbe_vol,
                    corrected_aggregate=card.ecc_sbe_agg,
                    uncorrected_aggregate=card.ecc_dbe_agg,
                ),
                remapped_rows=RemappedRows(
                    correctable=card.remap_cor,
                    uncorrectable=card.remap_unc,
                    pending=card.remap_pending,
                    failure=card.remap_failure,
                ),
                recovery_action=card.recovery_action,
                nvlinks=links,
                compute_mode=card.compute_mode,
                persistence_mode=card.persistence,
                mig_mode_current=card.mig_current,
                mig_mode_pending=card.mig_pending,
            )

    def processes(self, index: int) -> tuple[GpuProcess, ...] | Unknown:
        card = self._enter(index, "processes", "nvmlDeviceGetComputeRunningProcesses")
        now = self._clock()
        with card.lock:
            if card.process_list_denied and card.mig_current:
                return UNKNOWN
            wobble = self._wobble(card, now)
            return tuple(
                GpuProcess(
                    pid=p.pid,
                    used_memory_bytes=p.memory_bytes,
                    sm_utilization_ratio=round(min(1.0, p.load * wobble), 4),
                    gpu_instance_id=(
                        p.gpu_instance_id if card.mig_current and p.gpu_instance_id is not None else UNSUPPORTED
                    ),
                    name=p.name,
                )
                for p in sorted(card.procs.values(), key=lambda p: p.pid)
            )

    def profiling(self, index: int, mig_instances: tuple[MigInstance, ...] = ()) -> DeviceProfiling:
        """GPM as simulated_profiling models it; the first call per card or instance only opens the interval."""
        card = self._enter(index, "profiling", "nvmlGpmSampleGet")
        now = self._clock()
        with card.lock:
            if not self._gpm:
                return DeviceProfiling(False, None, {}, 0.0, 0.0)
            loads = {gi: self._instance_load(card, gi, now) for gi in card.mig} if card.mig_current else {}
            links_up = sum(1 for link in card.links if link.state is LinkState.UP)
            interval = card.gpm.close((-1, ""), now)
            whole: ProfilingSample | None = None
            if interval is not None and card.mig_current:
                by_gi = {gi: (loads[gi], g.profile.sm_count) for gi, g in card.mig.items()}
                whole = profiling_model.mig_card_sample(by_gi, self._card_sms(), links_up, len(card.links), interval)
            elif interval is not None:
                whole = profiling_model.card_sample(self._load(card, now), links_up, len(card.links), interval)
            mig: dict[int, ProfilingSample] = {}
            live = {(m.gpu_instance_id, m.uuid) for m in mig_instances if m.gpu_instance_id in loads}
            for gi, uuid in sorted(live):
                if card.mig[gi].uuid != uuid:
                    continue  # an instance of that id was recreated since it was listed
                span = card.gpm.close((gi, uuid), now)
                if span is not None:
                    mig[gi] = profiling_model.instance_sample(loads[gi], span)
            card.gpm.keep(live)
            return DeviceProfiling(True, whole, mig, 0.0, 0.0)

    def pcie_throughput(self, index: int) -> PcieThroughput:
        card = self._enter(index, "pcie_throughput", "nvmlDeviceGetPcieThroughput")
        now = self._clock()
        with card.lock:
            tx, rx = profiling_model.pcie_rates(self._load(card, now))
        return PcieThroughput(tx_bytes_per_second=tx, rx_bytes_per_second=rx, measured_at=now)

    def _instance_load(self, card: _Card, gpu_instance_id: int, now: float) -> float:
        demand = sum(p.load for p in card.procs.values() if p.gpu_instance_id == gpu_instance_id)
        return max(0.0, min(1.0, demand * self._wobble(card, now)))

    def _card_sms(self) -> int:
        return max((p.sm_count for p in self.scenario.mig_profiles), default=1)

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        self._enter(index, "mig_profiles", "nvmlDeviceGetGpuInstanceProfileInfo")
        return self.scenario.mig_profiles

    def mig_instances(self, index: int) -> tuple[MigInstance, ...]:
        card = self._enter(index, "mig_instances", "nvmlDeviceGetGpuInstances")
        with card.lock:
            if not card.mig_current:
                return ()
            return tuple(self._mig_instance(card, gi) for gi in sorted(card.mig.values(), key=lambda g: g.start))

    def _mig_instance(self, card: _Card, gi: _MigGi) -> MigInstance:
        used = sum(p.memory_bytes for p in card.procs.values() if p.gpu_instance_id == gi.gpu_instance_id)
        return MigInstance(
            parent_index=card.index,
            gpu_instance_id=gi.gpu_instance_id,
            compute_instance_id=0,
            profile_id=gi.profile.profile_id,
            profile_name=gi.profile.name,
            placement_start=gi.start,
            placement_size=self._placement_size(gi.profile, gi.start),
            uuid=gi.uuid,
            sm_count=gi.profile.sm_count,
            memory_total_bytes=gi.profile.memory_mib * 2**20,
            memory_used_bytes=used,
        )

    def nvlink_peers(self, index: int) -> tuple[str, ...] | Unsupported:
        """From the scenario's ``[topology] nvlink``: "nvswitch" puts every link that is up on an NVSwitch."""
        card = self._enter(index, "nvlink_peers", "nvmlDeviceGetNvLinkRemoteDeviceType")
        topology = self.scenario.extra.get("topology")
        mode = topology.get("nvlink", "none") if isinstance(topology, dict) else "none"
        with card.lock:
            if not card.links or mode != "nvswitch":
                return UNSUPPORTED
            return tuple("nvswitch" for link in card.links if link.state is LinkState.UP)

    def workloads(self) -> tuple[SimulatedWorkload, ...]:
        """Simulation only: every simulated process with its card, MIG device and pod."""
        out: list[SimulatedWorkload] = []
        for card in self._cards:
            with card.lock:
                for p in sorted(card.procs.values(), key=lambda p: p.pid):
                    gi = card.mig.get(p.gpu_instance_id) if card.mig_current and p.gpu_instance_id else None
                    out.append(
                        SimulatedWorkload(
                            gpu=card.index,
                            uuid=card.uuid,
                            pid=p.pid,
                            name=p.name,
                            gpu_instance_id=gi.gpu_instance_id if gi else None,
                            mig_uuid=gi.uuid if gi else None,
                            pod=p.pod,
                        )
                    )
        return tuple(out)

    # ----- MIG writes --------------------------------------------------------------------------------------

    def create_mig_instance(self, index: int, profile_id: int, placement_start: int) -> MigInstance:
        card = self._enter(index, "create_mig_instance", "nvmlDeviceCreateGpuInstanceWithPlacement")
        with card.lock:
            gi = self._create_gi(card, profile_id, placement_start)
            return self._mig_instance(card, gi)

    def destroy_mig_instance(self, index: int, gpu_instance_id: int) -> None:
        card = self._enter(index, "destroy_mig_instance", "nvmlGpuInstanceDestroy")
        with card.lock:
            if gpu_instance_id not in card.mig:
                raise NotFoundError(f"GPU {index} has no GPU instance {gpu_instance_id}", call="nvmlGpuInstanceDestroy")
            users = [p.pid for p in card.procs.values() if p.gpu_instance_id == gpu_instance_id]
            if users:
                raise InUseError(
                    f"GPU instance {gpu_instance_id} on GPU {index} is in use by pids {users}",
                    call="nvmlGpuInstanceDestroy",
                )
            del card.mig[gpu_instance_id]

    def _create_gi(self, card: _Card, profile_id: int, start: int) -> _MigGi:
        call = "nvmlDeviceCreateGpuInstanceWithPlacement"
        if not card.mig_current:
            raise InvalidStateError(f"MIG mode is disabled on GPU {card.index}", call=call)
        profile = next((p for p in self.scenario.mig_profiles if p.profile_id == profile_id), None)
        if profile is None:
            raise NotFoundError(f"GPU {card.index} has no MIG profile {profile_id}", call=call)
        size = self._placement_size(profile, start)
        if size == 0:
            legal = ", ".join(str(s) for s, _ in profile.placements)
            raise InsufficientResourcesError(
                f"profile {profile.name} cannot start at slice {start} (legal starts: {legal})", call=call
            )
        same = sum(1 for g in card.mig.values() if g.profile.profile_id == profile_id)
        if same >= profile.instance_count:
            raise InsufficientResourcesError(
                f"profile {profile.name} allows {profile.instance_count} instance(s) per card", call=call
            )
        used = {slice_ for g in card.mig.values() for slice_ in self._slices(g)}
        wanted = set(range(start, start + size))
        if used & wanted:
            raise InsufficientResourcesError(
                f"memory slices {sorted(used & wanted)} on GPU {card.index} are taken", call=call
            )
        compute = sum(g.profile.slice_count for g in card.mig.values())
        if compute + profile.slice_count > COMPUTE_SLICES:
            raise InsufficientResourcesError(f"not enough compute slices left on GPU {card.index}", call=call)
        gi_id = next(i for i in range(1, 64) if i not in card.mig)
        digest = hashlib.sha1(f"{card.uuid}/{gi_id}/{start}/{profile_id}".encode()).hexdigest()
        uuid = f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        gi = _MigGi(gpu_instance_id=gi_id, profile=profile, start=start, uuid=uuid)
        card.mig[gi_id] = gi
        return gi

    def _slices(self, gi: _MigGi) -> range:
        return range(gi.start, gi.start + self._placement_size(gi.profile, gi.start))

    @staticmethod
    def _placement_size(profile: MigProfile, start: int) -> int:
        return next((size for s, size in profile.placements if s == start), 0)

    # ----- events ------------------------------------------------------------------------------------------

    def wait_event(self, timeout_s: float) -> DeviceEvent | None:
        self._require_open("nvmlEventSetWait_v2")
        try:
            return self._events.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None

    # ----- fault injection ---------------------------------------------------------------------------------

    def inject(self, kind: str, gpu: int = 0, params: Mapping[str, str] | None = None) -> str:
        """Apply one fault by name; returns a one-line description. Raises ValueError on bad input."""
        p = dict(params or {})
        if kind not in FAULT_PARAMS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(sorted(FAULT_PARAMS))}")
        if not 0 <= gpu < len(self._cards):
            raise ValueError(f"gpu {gpu} does not exist (this node has {len(self._cards)})")
        unknown = set(p) - FAULT_PARAMS[kind]
        if unknown:
            accepted = ", ".join(sorted(FAULT_PARAMS[kind])) or "none"
            raise ValueError(f"fault {kind!r} does not take {', '.join(sorted(unknown))} (accepted: {accepted})")
        handler: Callable[[_Card, dict[str, str]], str] = getattr(self, f"_fault_{kind}")
        return handler(self._cards[gpu], p)

    def clear(self, gpu: int | None = None) -> str:
        """Remove the persistent faults (lost card, hangs, link down, orphan memory) on one card or all."""
        cards = self._cards if gpu is None else [self._cards[gpu]]
        for card in cards:
            with card.lock:
                card.lost = False
                card.process_list_denied = False
                card.orphan_memory = 0
                for link in card.links:
                    link.state = LinkState.UP
                hangs, card.hangs = card.hangs, {}
            for release in hangs.values():
                release.set()
        return "cleared faults on " + ("all GPUs" if gpu is None else f"GPU {gpu}")

    def set_version_mismatch(self, enabled: bool) -> None:
        """Make the next open() fail as NVML does after a driver upgrade without reboot."""
        self._version_mismatch = enabled

    def _emit(self, card: _Card, kind: EventKind, xid: int, data: int = 0, mig: tuple[int, int] | None = None) -> None:
        self._events.put(
            DeviceEvent(
                kind=kind,
                gpu_index=card.index,
                uuid=card.uuid,
                xid=xid,
                timestamp=self._clock(),
                data=data,
                gpu_instance_id=mig[0] if mig else None,
                compute_instance_id=mig[1] if mig else None,
            )
        )

    def _fault_xid(self, card: _Card, p: dict[str, str]) -> str:
        code = _int(p, "code", minimum=1)
        mig = self._event_instance(card, p)
        self._emit(card, EventKind.XID, code, mig=mig)
        where = f" MIG GPU instance {mig[0]} compute instance {mig[1]}" if mig else ""
        return f"XID {code} on GPU {card.index}{where}"

    @staticmethod
    def _event_instance(card: _Card, p: dict[str, str]) -> tuple[int, int] | None:
        """gpu_instance_id=N [compute_instance_id=M]: an event inside a MIG instance, as NVML names one in
        nvmlEventData_t; only an instance that exists (each simulated GPU instance has compute instance 0)."""
        if "gpu_instance_id" not in p:
            if "compute_instance_id" in p:
                raise ValueError("parameter 'compute_instance_id' needs 'gpu_instance_id'")
            return None
        gi = _int(p, "gpu_instance_id", minimum=0)
        ci = _int(p, "compute_instance_id", default=0, minimum=0)
        with card.lock:
            if not card.mig_current or gi not in card.mig or ci != 0:
                raise ValueError(f"GPU {card.index} has no MIG GPU instance {gi} with compute instance {ci}")
        return gi, ci

    def _fault_ecc(self, card: _Card, p: dict[str, str]) -> str:
        corrected = _int(p, "corrected", default=0, minimum=0)
        uncorrected = _int(p, "uncorrected", default=0, minimum=0)
        if corrected == 0 and uncorrected == 0:
            raise ValueError("fault 'ecc' needs corrected=N or uncorrected=N (N > 0)")
        with card.lock:
            card.ecc_sbe_vol += corrected
            card.ecc_sbe_agg += corrected
            card.ecc_dbe_vol += uncorrected
            card.ecc_dbe_agg += uncorrected
        if corrected:
            self._emit(card, EventKind.ECC_SINGLE_BIT, 0, corrected)
        if uncorrected:
            self._emit(card, EventKind.ECC_DOUBLE_BIT, 48, uncorrected)
        return f"ECC +{corrected} corrected, +{uncorrected} uncorrected on GPU {card.index}"

    def _fault_remap_pending(self, card: _Card, p: dict[str, str]) -> str:
        with card.lock:
            card.remap_pending = True
            card.remap_unc += 1
            card.recovery_action = 1  # reset
        return f"row remap pending on GPU {card.index}"

    def _fault_remap_failure(self, card: _Card, p: dict[str, str]) -> str:
        with card.lock:
            card.remap_failure = True
            card.remap_unc += 1
        return f"row remap failure on GPU {card.index}"

    def _fault_nvlink_down(self, card: _Card, p: dict[str, str]) -> str:
        link = self._link(card, p)
        with card.lock:
            card.links[link].state = LinkState.DOWN
        return f"NVLink {link} down on GPU {card.index}"

    def _fault_nvlink_errors(self, card: _Card, p: dict[str, str]) -> str:
        link = self._link(card, p)
        crc = _int(p, "crc", default=0, minimum=0)
        replay = _int(p, "replay", default=0, minimum=0)
        recovery = _int(p, "recovery", default=0, minimum=0)
        with card.lock:
            card.links[link].crc += crc
            card.links[link].replay += replay
            card.links[link].recovery += recovery
        return f"NVLink {link} on GPU {card.index}: +{crc} CRC, +{replay} replay, +{recovery} recovery errors"

    def _fault_gpu_lost(self, card: _Card, p: dict[str, str]) -> str:
        with card.lock:
            card.lost = True
        self._emit(card, EventKind.XID, 79)
        return f"GPU {card.index} fallen off the bus"

    def _fault_hang(self, card: _Card, p: dict[str, str]) -> str:
        call = p.get("call", "*")
        if call not in HANGABLE_CALLS:
            raise ValueError(f"fault 'hang': call must be one of {', '.join(HANGABLE_CALLS)}")
        with card.lock:
            card.hangs.setdefault(call, threading.Event())
        return f"calls to {call} on GPU {card.index} hang until cleared"

    def _fault_process_start(self, card: _Card, p: dict[str, str]) -> str:
        pid = _int(p, "pid", minimum=1)
        memory = _int(p, "memory_mib", default=1024, minimum=0) * 2**20
        load = _float(p, "load", default=0.5)
        gi = _int(p, "gpu_instance_id", default=0, minimum=0) or None
        pod = _pod_placement(p)
        with card.lock:
            if any(pid in c.procs for c in self._cards):
                raise ValueError(f"pid {pid} already runs on a simulated GPU")
            card.procs[pid] = _Proc(pid, p.get("name", "python3"), memory, load, gi, pod)
        where = f" in pod {pod.namespace}/{pod.pod} container {pod.container}" if pod else ""
        return f"process {pid} started on GPU {card.index} with {memory // 2**20} MiB{where}"

    def _fault_process_exit(self, card: _Card, p: dict[str, str]) -> str:
        pid = _int(p, "pid", minimum=1)
        with card.lock:
            if card.procs.pop(pid, None) is None:
                raise ValueError(f"pid {pid} does not run on GPU {card.index}")
        return f"process {pid} exited on GPU {card.index}"

    def _fault_orphan_memory(self, card: _Card, p: dict[str, str]) -> str:
        memory = _int(p, "memory_mib", minimum=1) * 2**20
        with card.lock:
            card.orphan_memory += memory
        return f"{memory // 2**20} MiB used on GPU {card.index} that no process owns"

    def _fault_compute_mode(self, card: _Card, p: dict[str, str]) -> str:
        name = p.get("mode", "")
        try:
            mode = ComputeMode[name.upper()]
        except KeyError:
            raise ValueError(
                f"fault 'compute_mode': mode must be one of {', '.join(m.name.lower() for m in ComputeMode)}"
            ) from None
        with card.lock:
            card.compute_mode = mode
        return f"compute mode of GPU {card.index} set to {mode.name.lower()}"

    def _fault_persistence_off(self, card: _Card, p: dict[str, str]) -> str:
        with card.lock:
            card.persistence = False
        return f"persistence mode off on GPU {card.index}"

    def _fault_mig_pending(self, card: _Card, p: dict[str, str]) -> str:
        with card.lock:
            card.mig_pending = not card.mig_current
        return f"MIG mode change pending on GPU {card.index}"

    def _fault_ecc_pending(self, card: _Card, p: dict[str, str]) -> str:
        with card.lock:
            card.ecc_pending = False
        return f"ECC mode change pending on GPU {card.index}"

    def _fault_process_list_denied(self, card: _Card, p: dict[str, str]) -> str:
        with card.lock:
            card.process_list_denied = True
        when = "" if card.mig_current else " once MIG is on"
        return f"GPU {card.index} refuses its process list{when} (NO_PERMISSION, as for an unprivileged caller)"

    def _fault_recovery_action(self, card: _Card, p: dict[str, str]) -> str:
        """The raw NVML_FI_DEV_GET_GPU_RECOVERY_ACTION value, numbered as the scenario's driver branch numbers it
        (R580: 5 is a bus reset); code=0 takes it back."""
        code = _int(p, "code", minimum=0)
        with card.lock:
            card.recovery_action = code
        return f"GPU {card.index} reports recovery action {code} (driver {self.scenario.driver_version})"

    def _fault_pcie_replay(self, card: _Card, p: dict[str, str]) -> str:
        count = _int(p, "count", default=1, minimum=1)
        with card.lock:
            card.pcie_replay += count
        return f"PCIe replay counter +{count} on GPU {card.index}"

    def _link(self, card: _Card, p: dict[str, str]) -> int:
        if not card.links:
            raise ValueError(f"GPU {card.index} has no NVLink")
        link = _int(p, "link", default=0, minimum=0)
        if link >= len(card.links):
            raise ValueError(f"link {link} does not exist (GPU {card.index} has {len(card.links)})")
        return link

    # ----- internals ---------------------------------------------------------------------------------------

    def _require_open(self, call: str) -> None:
        if not self._open:
            raise DriverUnavailableError("NVML is not initialised", call=call)

    def _enter(self, index: int, what: str, call: str) -> _Card:
        self._require_open(call)
        if not 0 <= index < len(self._cards):
            raise NotFoundError(f"no GPU with index {index}", call="nvmlDeviceGetHandleByIndex")
        card = self._cards[index]
        with card.lock:
            lost = card.lost
            hang = card.hangs.get(what) or card.hangs.get("*")
        if hang is not None:
            hang.wait()  # blocks like a stuck ioctl until the fault is cleared
        if lost:
            raise GpuLostError(f"GPU {index} is lost", call=call)
        return card

    def _wobble(self, card: _Card, now: float) -> float:
        if not self.scenario.dynamic:
            return 1.0
        return 0.9 + 0.1 * math.sin(2 * math.pi * now / 97.0 + card.phase)

    def _load(self, card: _Card, now: float) -> float:
        demand = sum(p.load for p in card.procs.values())
        return max(0.0, min(1.0, demand * self._wobble(card, now)))

    def _memory_used(self, card: _Card) -> int:
        return card.orphan_memory + sum(p.memory_bytes for p in card.procs.values())

    def _advance_counters(self, card: _Card, now: float, load: float) -> None:
        if card.last_t is None or now <= card.last_t:
            card.last_t = now if card.last_t is None else card.last_t
            return
        dt = now - card.last_t
        card.last_t = now
        s = self.scenario
        power = s.idle_power_watts + (s.power_limit_watts * 0.92 - s.idle_power_watts) * load
        card.energy += power * dt
        per_link = NVLINK_BYTES_PER_SECOND_BUSY * load / max(1, len(card.links)) * dt
        for link in card.links:
            if link.state is LinkState.UP:
                link.tx += per_link
                link.rx += per_link


FAULT_PARAMS: Mapping[str, frozenset[str]] = {
    "xid": frozenset({"code", "gpu_instance_id", "compute_instance_id"}),
    "ecc": frozenset({"corrected", "uncorrected"}),
    "remap_pending": frozenset(),
    "remap_failure": frozenset(),
    "nvlink_down": frozenset({"link"}),
    "nvlink_errors": frozenset({"link", "crc", "replay", "recovery"}),
    "gpu_lost": frozenset(),
    "hang": frozenset({"call"}),
    "process_start": frozenset(
        {"pid", "name", "memory_mib", "load", "gpu_instance_id", "pod", "namespace", "container"}
    ),
    "process_exit": frozenset({"pid"}),
    "orphan_memory": frozenset({"memory_mib"}),
    "compute_mode": frozenset({"mode"}),
    "persistence_off": frozenset(),
    "mig_pending": frozenset(),
    "ecc_pending": frozenset(),
    "pcie_replay": frozenset({"count"}),
    "recovery_action": frozenset({"code"}),
    "process_list_denied": frozenset(),
}
"""Fault kinds the simulated node accepts, with the parameters each takes."""


def _int(p: Mapping[str, str], key: str, *, default: int | None = None, minimum: int | None = None) -> int:
    raw = p.get(key)
    if raw is None:
        if default is None:
            raise ValueError(f"missing parameter {key!r}")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"parameter {key!r} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"parameter {key!r} must be >= {minimum}, got {value}")
    return value


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _pod_placement(p: Mapping[str, str]) -> PodPlacement | None:
    """pod=NAME [namespace=NS] [container=NAME] -> where the process runs; names must be valid Kubernetes names."""
    if "pod" not in p:
        if "namespace" in p or "container" in p:
            raise ValueError("parameters 'namespace' and 'container' need 'pod'")
        return None
    placement = PodPlacement(p.get("namespace", "default"), p["pod"], p.get("container", "main"))
    for key, value in (("pod", placement.pod), ("namespace", placement.namespace), ("container", placement.container)):
        if not _DNS_LABEL.match(value):
            raise ValueError(f"parameter {key!r} must be a lowercase DNS label (a-z, 0-9, '-'), got {value!r}")
    return placement


def _float(p: Mapping[str, str], key: str, *, default: float) -> float:
    raw = p.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"parameter {key!r} must be a number, got {raw!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"parameter {key!r} must be within 0..1, got {value}")
    return value


__all__ = ["FAULT_PARAMS", "PodPlacement", "SimulatedBackend", "SimulatedWorkload"]
