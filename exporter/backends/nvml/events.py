"""The NVML event set behind ``NvmlBackend.wait_event``: XID and ECC events of every card, kept registered.

A registration does not outlive its card: after a GPU reset, a MIG mode change (which may reset the device) or a
card lost and back, the card's events stop arriving although the set still waits. So the set is rebuilt when the
backend says a card was renewed (:meth:`EventSet.rebuild`, from any thread), and when a wait reports GPU_IS_LOST.
A rebuild first drains the old set, so no event already queued is lost. A card that cannot be registered (lost,
resetting) is retried every ``retry_seconds`` into the live set. Cards that do not support the events are left out
for good, as NVML says.

Only the thread that calls :meth:`EventSet.wait` touches the set (NVML frees it under that thread's feet
otherwise); other threads only ask for a rebuild.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import threading
import time
from collections.abc import Callable
from typing import Final, cast

import pynvml
import structlog

from exporter.backends.errors import BackendError
from exporter.backends.nvml.calls import call, error_code, optional, translate
from exporter.backends.nvml.handles import DeviceHandle, EventData, EventSetHandle
from exporter.backends.types import DeviceEvent, EventKind, Unsupported

log = structlog.get_logger("nvml.events")

EVENT_MASK: Final = (
    pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypeSingleBitEccError
)
_NO_INSTANCE: Final = 0xFFFFFFFF  # nvmlEventData_t gpuInstanceId / computeInstanceId of a whole-card event
_DRAIN_LIMIT: Final = 256  # events taken from a set being replaced (far more than a set queues between waits)


def handle_key(handle: DeviceHandle) -> int | None:
    """The address behind a device handle (what nvmlEventData_t.device points at): pynvml's handles are ctypes
    pointers."""
    return ctypes.cast(cast("ctypes.c_void_p", handle), ctypes.c_void_p).value


class EventSet:
    def __init__(
        self,
        count: Callable[[], int],
        handle: Callable[[int], DeviceHandle],
        uuid: Callable[[int], str],
        *,
        retry_seconds: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._count = count
        self._handle = handle
        self._uuid = uuid
        self._retry_seconds = retry_seconds
        self._monotonic = monotonic
        self._clock = clock
        self._lock = threading.Lock()  # guards the rebuild request only
        self._rebuild_reason: str | None = "first use"
        self._set: EventSetHandle | None = None
        self._gpus: dict[int, int] = {}  # handle address -> gpu index of every registered card
        self._missing: set[int] = set()  # cards to retry (lost or resetting when last tried)
        self._warned: set[int] = set()  # cards whose failed registration was logged
        self._retry_at = 0.0
        self._fresh = False  # rebuilt and not yet waited on successfully
        self._pending: collections.deque[DeviceEvent] = collections.deque()
        self.builds = 0  # sets built so far (first build included)

    # --- any thread ------------------------------------------------------------------------------------------

    def rebuild(self, reason: str) -> None:
        """Ask the waiting thread to build the set anew before its next wait."""
        with self._lock:
            if self._rebuild_reason is None:
                self._rebuild_reason = reason

    @property
    def registered(self) -> dict[int, int]:
        """Handle address -> gpu index of the cards whose events the live set carries."""
        return dict(self._gpus)

    @property
    def missing(self) -> frozenset[int]:
        return frozenset(self._missing)

    # --- the waiting thread ----------------------------------------------------------------------------------

    def wait(self, timeout_s: float) -> DeviceEvent | None:
        self._prepare()
        if self._pending:
            return self._pending.popleft()
        deadline = self._monotonic() + max(timeout_s, 0.0)
        while True:
            remaining_ms = max(int((deadline - self._monotonic()) * 1000), 0)
            if self._set is None or not self._gpus:  # nothing registered: behave like a quiet card
                time.sleep(remaining_ms / 1000)
                return None
            try:
                data = pynvml.nvmlEventSetWait_v2(self._set, remaining_ms)
            except pynvml.NVMLError as err:
                code = error_code(err)
                if code == pynvml.NVML_ERROR_TIMEOUT:
                    self._fresh = False
                    return None
                if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                    # A card in the set is gone: rebuild with the cards that still register. A set rebuilt for
                    # this already and still lost raises (the caller backs off) and is rebuilt on the next call.
                    self.rebuild("a card in the event set is lost")
                    if self._fresh:
                        raise translate(err, "nvmlEventSetWait_v2") from err
                    self._prepare()
                    return self._pending.popleft() if self._pending else None
                raise translate(err, "nvmlEventSetWait_v2") from err
            self._fresh = False
            event = self._to_event(data)
            if event is not None or remaining_ms == 0:
                return event

    def close(self) -> None:
        """Free the set (the library is being shut down); the next wait builds a new one."""
        if self._set is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._set)
        self._set, self._gpus, self._missing, self._warned = None, {}, set(), set()
        self._pending.clear()
        with self._lock:
            self._rebuild_reason = "reopened"

    # --- internals -------------------------------------------------------------------------------------------

    def _prepare(self) -> None:
        with self._lock:
            reason, self._rebuild_reason = self._rebuild_reason, None
        if reason is not None:
            try:
                self._build(reason)
            except BackendError:
                self.rebuild(reason)  # not built: the next wait tries again (after the caller's back-off)
                raise
        elif self._missing and self._monotonic() >= self._retry_at:
            self._register_missing()

    def _build(self, reason: str) -> None:
        old = self._set
        if old is not None:
            self._drain(old)
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(old)
            self._set = None
        self._gpus, self._missing = {}, set()
        self._set = call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
        for index in range(self._count()):
            self._register(index)
        if not self._gpus and not self._missing:  # no card has these events: nothing to wait on, ever
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._set)
            self._set = None
        self._retry_at = self._monotonic() + self._retry_seconds
        self._fresh = True
        self.builds += 1
        if self.builds > 1:
            log.info(
                "NVML event set rebuilt",
                reason=reason,
                registered=sorted(self._gpus.values()),
                retrying=sorted(self._missing),
            )

    def _register_missing(self) -> None:
        for index in sorted(self._missing):
            self._missing.discard(index)
            self._register(index)
        self._retry_at = self._monotonic() + self._retry_seconds

    def _register(self, index: int) -> None:
        """Register one card's XID/ECC events in the live set; a card that fails now is retried later."""
        try:
            h = self._handle(index)
            supported = optional("nvmlDeviceGetSupportedEventTypes", pynvml.nvmlDeviceGetSupportedEventTypes, h)
            mask = EVENT_MASK if isinstance(supported, Unsupported) else EVENT_MASK & int(supported)
            if not mask:
                return  # the card has none of these events
            ok = optional("nvmlDeviceRegisterEvents", pynvml.nvmlDeviceRegisterEvents, h, mask, self._set)
        except BackendError as err:
            self._missing.add(index)
            if index not in self._warned:  # once per outage, not on every retry
                self._warned.add(index)
                log.warning("NVML events not registered for a card; retrying", gpu=index, error=str(err), code=err.code)
            return
        self._warned.discard(index)
        key = handle_key(h)
        if not isinstance(ok, Unsupported) and key is not None:
            self._gpus[key] = index

    def _drain(self, event_set: EventSetHandle) -> None:
        for _ in range(_DRAIN_LIMIT):
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, 0)
            except pynvml.NVMLError:
                return  # empty (timeout), or the set is unusable: nothing more to take
            event = self._to_event(data)
            if event is not None:
                self._pending.append(event)

    def _to_event(self, data: EventData) -> DeviceEvent | None:
        event_type = int(data.eventType)
        if event_type & pynvml.nvmlEventTypeXidCriticalError:
            kind = EventKind.XID
        elif event_type & pynvml.nvmlEventTypeDoubleBitEccError:
            kind = EventKind.ECC_DOUBLE_BIT
        elif event_type & pynvml.nvmlEventTypeSingleBitEccError:
            kind = EventKind.ECC_SINGLE_BIT
        else:
            return None
        key = handle_key(data.device)
        index = self._gpus.get(key, -1) if key is not None else -1
        uuid = ""
        # An event of a card that is failing right now (XID 79) must not be lost to a failing lookup: it goes out
        # with what is known (the watcher then names the card by index, or by nothing).
        with contextlib.suppress(BackendError):
            if index < 0:
                index = int(call("nvmlDeviceGetIndex", pynvml.nvmlDeviceGetIndex, data.device))
            uuid = self._uuid(index)
        gi, ci = _instance_id(data, "gpuInstanceId"), _instance_id(data, "computeInstanceId")
        return DeviceEvent(
            kind=kind,
            gpu_index=index,
            uuid=uuid,
            xid=int(data.eventData),
            timestamp=self._clock(),
            gpu_instance_id=gi,
            compute_instance_id=ci if gi is not None else None,
        )


def _instance_id(data: EventData, name: str) -> int | None:
    value = getattr(data, name, None)
    return None if value is None or int(value) == _NO_INSTANCE else int(value)


__all__ = ["EVENT_MASK", "EventSet", "handle_key"]
