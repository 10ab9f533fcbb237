"""SimulatedBackend: the Backend protocol over a scenario file, with fault injection at run time.

It stands in for the GPU only: it behaves as NVML does (errors, NotSupported, MIG placement rules, hangs) so the
rest of the daemon runs unchanged. Every method is thread-safe; one lock per card keeps cards independent, and a
hang injected on one card blocks only calls to that card.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import exporter.backends.simulated.card as model
import exporter.backends.simulated.mig as mig
import exporter.backends.simulated.profiling as profiling_model
from exporter.backends.errors import (
    BackendError,
    DriverUnavailableError,
    GpuLostError,
    NotFoundError,
    VersionMismatchError,
)
from exporter.backends.scenario import Scenario, load_scenario
from exporter.backends.simulated.card import Card, PodPlacement, Proc, SimulatedWorkload
from exporter.backends.simulated.injector import SimulatedInjector
from exporter.backends.types import (
    UNKNOWN,
    UNSUPPORTED,
    ClockEventReason,
    DeviceEvent,
    DeviceInfo,
    DeviceProfiling,
    DeviceSample,
    EccCounts,
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
        self._events: queue.Queue[DeviceEvent] = queue.Queue()
        self._cards = [model.new_card(scenario, i) for i in range(len(scenario.cards))]
        self._watchers: list[Callable[[], None]] = []
        self._watchers_lock = threading.Lock()
        self.injector = SimulatedInjector(
            self._cards,
            self._events,
            clock=clock,
            driver_version=scenario.driver_version,
            workloads_changed=self._workloads_changed,
        )
        for spec in scenario.processes:
            card = self._cards[spec.gpu]
            pod = PodPlacement(spec.namespace, spec.pod, spec.container or "main") if spec.pod else None
            card.procs[spec.pid] = Proc(spec.pid, spec.name, spec.memory_bytes, spec.load, spec.gpu_instance_id, pod)
        for inst in scenario.mig_instances:
            mig.create_gi(self._cards[inst.gpu], scenario.mig_profiles, inst.profile_id, inst.placement_start)

    @classmethod
    def from_name(cls, name_or_path: str, *, clock: Callable[[], float] = time.time) -> SimulatedBackend:
        return cls(load_scenario(name_or_path), clock=clock)

    # ----- lifecycle ---------------------------------------------------------------------------------------

    def open(self) -> None:
        if self._version_mismatch:
            raise VersionMismatchError(
                "Driver/library version mismatch (simulated): kernel module 580.159.04, library 580.142.00"
            )
        self._open = True

    def close(self) -> None:
        self._open = False

    def set_version_mismatch(self, enabled: bool) -> None:
        """Make the next open() fail as NVML does after a driver upgrade without reboot."""
        self._version_mismatch = enabled

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
            load = model.load(s, card, now)
            model.advance_counters(s, card, now, load)
            used = model.memory_used(card)
            busy = load > 0.02
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
                power_draw_watts=round(model.power_watts(s, load), 3),
                power_limit_watts=s.power_limit_watts,
                energy_joules=round(card.energy, 3),
                sm_clock_mhz=(s.sm_clock_max_mhz - int(60 * load)) if busy else s.sm_clock_idle_mhz,
                memory_clock_mhz=s.memory_clock_mhz,
                clock_event_reasons=0 if busy else int(ClockEventReason.GPU_IDLE),
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
            wobble = model.wobble(self.scenario, card, now)
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
        """GPM as profiling.py models it; the first call per card or instance only opens the interval."""
        card = self._enter(index, "profiling", "nvmlGpmSampleGet")
        s = self.scenario
        now = self._clock()
        with card.lock:
            if not self._gpm:
                return DeviceProfiling(False, None, {}, 0.0, 0.0)
            loads = {gi: model.instance_load(s, card, gi, now) for gi in card.mig} if card.mig_current else {}
            links_up = sum(1 for link in card.links if link.state is LinkState.UP)
            interval = card.gpm.close((-1, ""), now)
            whole: ProfilingSample | None = None
            if interval is not None and card.mig_current:
                by_gi = {gi: (loads[gi], g.profile.sm_count) for gi, g in card.mig.items()}
                sms = mig.card_sms(s.mig_profiles)
                whole = profiling_model.mig_card_sample(by_gi, sms, links_up, len(card.links), interval)
            elif interval is not None:
                whole = profiling_model.card_sample(model.load(s, card, now), links_up, len(card.links), interval)
            per_instance: dict[int, ProfilingSample] = {}
            live = {(m.gpu_instance_id, m.uuid) for m in mig_instances if m.gpu_instance_id in loads}
            for gi, uuid in sorted(live):
                if card.mig[gi].uuid != uuid:
                    continue  # an instance of that id was recreated since it was listed
                span = card.gpm.close((gi, uuid), now)
                if span is not None:
                    per_instance[gi] = profiling_model.instance_sample(loads[gi], span)
            card.gpm.keep(live)
            return DeviceProfiling(True, whole, per_instance, 0.0, 0.0)

    def pcie_throughput(self, index: int) -> PcieThroughput:
        card = self._enter(index, "pcie_throughput", "nvmlDeviceGetPcieThroughput")
        now = self._clock()
        with card.lock:
            tx, rx = profiling_model.pcie_rates(model.load(self.scenario, card, now))
        return PcieThroughput(tx_bytes_per_second=tx, rx_bytes_per_second=rx, measured_at=now)

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

    def watch_workloads(self, changed: Callable[[], None]) -> Callable[[], None]:
        """Simulation only: call ``changed`` after a simulated process starts or exits or a MIG instance comes or
        goes (on the thread that made the change, with no card locked); returns what stops the calls."""
        with self._watchers_lock:
            self._watchers.append(changed)

        def unwatch() -> None:
            with self._watchers_lock:
                if changed in self._watchers:
                    self._watchers.remove(changed)

        return unwatch

    def _workloads_changed(self) -> None:
        with self._watchers_lock:
            watchers = list(self._watchers)
        for changed in watchers:
            changed()

    # ----- MIG: mig.py -------------------------------------------------------------------------------------

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        self._enter(index, "mig_profiles", "nvmlDeviceGetGpuInstanceProfileInfo")
        return self.scenario.mig_profiles

    def mig_instances(self, index: int) -> tuple[MigInstance, ...]:
        card = self._enter(index, "mig_instances", "nvmlDeviceGetGpuInstances")
        with card.lock:
            if not card.mig_current:
                return ()
            return tuple(mig.mig_instance(card, gi) for gi in sorted(card.mig.values(), key=lambda g: g.start))

    def create_mig_instance(self, index: int, profile_id: int, placement_start: int) -> MigInstance:
        card = self._enter(index, "create_mig_instance", "nvmlDeviceCreateGpuInstanceWithPlacement")
        with card.lock:
            gi = mig.create_gi(card, self.scenario.mig_profiles, profile_id, placement_start)
            created = mig.mig_instance(card, gi)
        self._workloads_changed()
        return created

    def destroy_mig_instance(self, index: int, gpu_instance_id: int) -> None:
        card = self._enter(index, "destroy_mig_instance", "nvmlGpuInstanceDestroy")
        with card.lock:
            mig.destroy_gi(card, gpu_instance_id)
        self._workloads_changed()

    def mig_layout(self) -> dict[int, tuple[tuple[int, int, int], ...]]:
        """Simulation only: each MIG card's GPU instances as (gpu instance id, profile id, placement start)."""
        layout = {}
        for card in self._cards:
            with card.lock:
                if card.mig_current:
                    gis = sorted(card.mig.values(), key=lambda g: g.gpu_instance_id)
                    layout[card.index] = tuple((g.gpu_instance_id, g.profile.profile_id, g.start) for g in gis)
        return layout

    def restore_mig_layout(self, layout: Mapping[int, Sequence[tuple[int, int, int]]]) -> list[str]:
        """Simulation only: make each listed card's GPU instances what ``layout`` says (same ids, so the same
        UUIDs), as the driver keeps them across a daemon restart: instances not listed go (unless a process uses
        them), listed ones are made. What cannot be done is skipped and said in the list returned."""
        skipped = []
        for index, instances in layout.items():
            if not 0 <= index < len(self._cards):
                skipped.append(f"GPU {index}: no such card")
                continue
            card = self._cards[index]
            wanted = set(instances)
            with card.lock:
                for gi in list(card.mig.values()):
                    if (gi.gpu_instance_id, gi.profile.profile_id, gi.start) not in wanted:
                        try:
                            mig.destroy_gi(card, gi.gpu_instance_id)
                        except BackendError as exc:
                            skipped.append(f"GPU {index} GPU instance {gi.gpu_instance_id}: {exc}")
                have = {(g.gpu_instance_id, g.profile.profile_id, g.start) for g in card.mig.values()}
                for gi_id, profile_id, start in instances:
                    if (gi_id, profile_id, start) in have:
                        continue
                    try:
                        mig.create_gi(card, self.scenario.mig_profiles, profile_id, start, gi_id)
                    except BackendError as exc:
                        skipped.append(f"GPU {index} GPU instance {gi_id}: {exc}")
        self._workloads_changed()
        return skipped

    # ----- events and faults: injector.py ------------------------------------------------------------------

    def wait_event(self, timeout_s: float) -> DeviceEvent | None:
        self._require_open("nvmlEventSetWait_v2")
        for card in self._cards:  # the event set spans every card: a stall on any one blocks the wait
            with card.lock:
                hang = card.hangs.get("wait_event")
            if hang is not None:
                hang.wait()  # stuck like the driver's wait; once cleared it returns the event queued first
        try:
            return self._events.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None

    def inject(self, kind: str, gpu: int = 0, params: Mapping[str, str] | None = None) -> str:
        """``self.injector.inject``, for tests and benchmarks that hold the simulated backend itself."""
        return self.injector.inject(kind, gpu, params)

    def clear(self, gpu: int | None = None) -> str:
        """``self.injector.clear``, for tests and benchmarks that hold the simulated backend itself."""
        return self.injector.clear(gpu)

    # ----- internals ---------------------------------------------------------------------------------------

    def _require_open(self, call: str) -> None:
        if not self._open:
            raise DriverUnavailableError("NVML is not initialised", call=call)

    def _enter(self, index: int, what: str, call: str) -> Card:
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


__all__ = ["SimulatedBackend"]
