"""Fault injection on the simulated node: the fault kinds, their parameters, and what each does to a card.

:class:`SimulatedInjector` is the simulated backend's ``injector`` (the FaultInjector capability of the Backend
protocol). A fault changes the card's state the way the real fault shows through NVML: counters move, a lost card
answers GPU_IS_LOST, a hang blocks the named call until cleared, an XID or ECC error is queued as a driver event.
Injecting never waits on a card (a hang blocks the card's calls, not the injection), so it may be called from any
thread, the event loop included.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Callable, Mapping, Sequence

from exporter.backends.protocol import UnknownGpuError
from exporter.backends.simulated.card import Card, PodPlacement, Proc
from exporter.backends.types import ComputeMode, DeviceEvent, EventKind, LinkState

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
    "wait_event",  # the driver's event wait (node-wide; the card named is the one that stalls it)
    "*",  # every per-card call (not the event wait)
)


class SimulatedInjector:
    """Faults on the cards of one simulated node; thread-safe (each card's state is guarded by its lock)."""

    def __init__(
        self,
        cards: Sequence[Card],
        events: queue.Queue[DeviceEvent],
        *,
        clock: Callable[[], float],
        driver_version: str,
        workloads_changed: Callable[[], None] = lambda: None,  # a process started or exited
    ) -> None:
        self._cards = cards
        self._workloads_changed = workloads_changed
        self._events = events
        self._clock = clock
        self._driver_version = driver_version

    @property
    def kinds(self) -> Mapping[str, frozenset[str]]:
        """Fault kinds the simulated node accepts, with the parameters each takes."""
        return FAULT_PARAMS

    def inject(self, kind: str, gpu: int = 0, params: Mapping[str, str] | None = None) -> str:
        """Apply one fault by name; returns a one-line description. Raises UnknownGpuError for a card the node does
        not have, ValueError on any other bad input."""
        p = dict(params or {})
        if kind not in FAULT_PARAMS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(sorted(FAULT_PARAMS))}")
        card = self._card(gpu)
        unknown = set(p) - FAULT_PARAMS[kind]
        if unknown:
            accepted = ", ".join(sorted(FAULT_PARAMS[kind])) or "none"
            raise ValueError(f"fault {kind!r} does not take {', '.join(sorted(unknown))} (accepted: {accepted})")
        handler: Callable[[Card, dict[str, str]], str] = getattr(self, f"_fault_{kind}")
        return handler(card, p)

    def clear(self, gpu: int | None = None) -> str:
        """Remove the persistent faults (lost card, hangs, link down, orphan memory) on one card or all."""
        cards = self._cards if gpu is None else [self._card(gpu)]
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

    def _card(self, gpu: int) -> Card:
        if not 0 <= gpu < len(self._cards):
            raise UnknownGpuError(gpu, len(self._cards))
        return self._cards[gpu]

    def _emit(self, card: Card, kind: EventKind, xid: int, data: int = 0, mig: tuple[int, int] | None = None) -> None:
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

    def _fault_xid(self, card: Card, p: dict[str, str]) -> str:
        code = _int(p, "code", minimum=1)
        mig = self._event_instance(card, p)
        self._emit(card, EventKind.XID, code, mig=mig)
        where = f" MIG GPU instance {mig[0]} compute instance {mig[1]}" if mig else ""
        return f"XID {code} on GPU {card.index}{where}"

    @staticmethod
    def _event_instance(card: Card, p: dict[str, str]) -> tuple[int, int] | None:
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

    def _fault_ecc(self, card: Card, p: dict[str, str]) -> str:
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

    def _fault_remap_pending(self, card: Card, p: dict[str, str]) -> str:
        with card.lock:
            card.remap_pending = True
            card.remap_unc += 1
            card.recovery_action = 1  # reset
        return f"row remap pending on GPU {card.index}"

    def _fault_remap_failure(self, card: Card, p: dict[str, str]) -> str:
        with card.lock:
            card.remap_failure = True
            card.remap_unc += 1
        return f"row remap failure on GPU {card.index}"

    def _fault_nvlink_down(self, card: Card, p: dict[str, str]) -> str:
        link = self._link(card, p)
        with card.lock:
            card.links[link].state = LinkState.DOWN
        return f"NVLink {link} down on GPU {card.index}"

    def _fault_nvlink_errors(self, card: Card, p: dict[str, str]) -> str:
        link = self._link(card, p)
        crc = _int(p, "crc", default=0, minimum=0)
        replay = _int(p, "replay", default=0, minimum=0)
        recovery = _int(p, "recovery", default=0, minimum=0)
        with card.lock:
            card.links[link].crc += crc
            card.links[link].replay += replay
            card.links[link].recovery += recovery
        return f"NVLink {link} on GPU {card.index}: +{crc} CRC, +{replay} replay, +{recovery} recovery errors"

    def _fault_gpu_lost(self, card: Card, p: dict[str, str]) -> str:
        with card.lock:
            card.lost = True
        self._emit(card, EventKind.XID, 79)
        return f"GPU {card.index} fallen off the bus"

    def _fault_hang(self, card: Card, p: dict[str, str]) -> str:
        call = p.get("call", "*")
        if call not in HANGABLE_CALLS:
            raise ValueError(f"fault 'hang': call must be one of {', '.join(HANGABLE_CALLS)}")
        with card.lock:
            card.hangs.setdefault(call, threading.Event())
        return f"calls to {call} on GPU {card.index} hang until cleared"

    def _fault_process_start(self, card: Card, p: dict[str, str]) -> str:
        pid = _int(p, "pid", minimum=1)
        memory = _int(p, "memory_mib", default=1024, minimum=0) * 2**20
        load = _float(p, "load", default=0.5)
        gi = _int(p, "gpu_instance_id", default=0, minimum=0) or None
        pod = _pod_placement(p)
        with card.lock:
            if any(pid in c.procs for c in self._cards):
                raise ValueError(f"pid {pid} already runs on a simulated GPU")
            card.procs[pid] = Proc(pid, p.get("name", "python3"), memory, load, gi, pod)
        self._workloads_changed()
        where = f" in pod {pod.namespace}/{pod.pod} container {pod.container}" if pod else ""
        return f"process {pid} started on GPU {card.index} with {memory // 2**20} MiB{where}"

    def _fault_process_exit(self, card: Card, p: dict[str, str]) -> str:
        pid = _int(p, "pid", minimum=1)
        with card.lock:
            if card.procs.pop(pid, None) is None:
                raise ValueError(f"pid {pid} does not run on GPU {card.index}")
        self._workloads_changed()
        return f"process {pid} exited on GPU {card.index}"

    def _fault_orphan_memory(self, card: Card, p: dict[str, str]) -> str:
        memory = _int(p, "memory_mib", minimum=1) * 2**20
        with card.lock:
            card.orphan_memory += memory
        return f"{memory // 2**20} MiB used on GPU {card.index} that no process owns"

    def _fault_compute_mode(self, card: Card, p: dict[str, str]) -> str:
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

    def _fault_persistence_off(self, card: Card, p: dict[str, str]) -> str:
        with card.lock:
            card.persistence = False
        return f"persistence mode off on GPU {card.index}"

    def _fault_mig_pending(self, card: Card, p: dict[str, str]) -> str:
        with card.lock:
            card.mig_pending = not card.mig_current
        return f"MIG mode change pending on GPU {card.index}"

    def _fault_ecc_pending(self, card: Card, p: dict[str, str]) -> str:
        with card.lock:
            card.ecc_pending = False
        return f"ECC mode change pending on GPU {card.index}"

    def _fault_process_list_denied(self, card: Card, p: dict[str, str]) -> str:
        with card.lock:
            card.process_list_denied = True
        when = "" if card.mig_current else " once MIG is on"
        return f"GPU {card.index} refuses its process list{when} (NO_PERMISSION, as for an unprivileged caller)"

    def _fault_recovery_action(self, card: Card, p: dict[str, str]) -> str:
        """The raw NVML_FI_DEV_GET_GPU_RECOVERY_ACTION value, numbered as the scenario's driver branch numbers it
        (R580: 5 is a bus reset); code=0 takes it back."""
        code = _int(p, "code", minimum=0)
        with card.lock:
            card.recovery_action = code
        return f"GPU {card.index} reports recovery action {code} (driver {self._driver_version})"

    def _fault_pcie_replay(self, card: Card, p: dict[str, str]) -> str:
        count = _int(p, "count", default=1, minimum=1)
        with card.lock:
            card.pcie_replay += count
        return f"PCIe replay counter +{count} on GPU {card.index}"

    def _link(self, card: Card, p: dict[str, str]) -> int:
        if not card.links:
            raise ValueError(f"GPU {card.index} has no NVLink")
        link = _int(p, "link", default=0, minimum=0)
        if link >= len(card.links):
            raise ValueError(f"link {link} does not exist (GPU {card.index} has {len(card.links)})")
        return link


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


__all__ = ["FAULT_PARAMS", "HANGABLE_CALLS", "SimulatedInjector"]
