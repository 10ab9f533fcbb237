"""Which cards are out of service, followed from the daemon's resumable fault stream (Health.WatchFaults).

A card is out of service while it has an active fault of action reset_gpu or stronger, or one that says it hangs
or is lost (``driver_call_timeout``, ``gpu_lost``); a node-wide fault of action reset_gpu or stronger takes every
card out (the node is about to be reset, rebooted or replaced). The card is back when the fault resolves, whatever
resolved it (a condition that cleared, a reboot, an operator's ``xpuctl faults resolve``).

Start: ListFaults(active) with the journal's last seq read before the listing, then WatchFaults after that seq.
Records carry the whole fault, so replaying one already reflected changes nothing. After a lost connection the
watch resumes after the last seq seen; after a gap (retention) or OUT_OF_RANGE (the journal was reset) it starts
over from ListFaults. While the daemon is unreachable the last known state is kept here; ``on_contact`` tells the
front end's liveness (container/core/liveness.py) each time the daemon spoke, so it can stop trusting that state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import structlog

from container.core.daemon_client import DaemonClient
from healthd.api.v1 import health_pb2

log = structlog.get_logger("container.core.faults")

HUNG_OR_LOST_CODES = frozenset({"driver_call_timeout", "gpu_lost"})
ALL_CARDS = -1  # the key of a node-wide fault


@dataclass(frozen=True, slots=True)
class CardFault:
    id: str
    gpu: int  # index, or ALL_CARDS for a node-wide fault
    code: str
    action: int


def takes_out_of_service(fault: health_pb2.Fault) -> bool:
    if fault.state != health_pb2.FAULT_STATE_ACTIVE:
        return False
    if not fault.HasField("gpu"):
        return bool(fault.action >= health_pb2.ACTION_RESET_GPU)
    return bool(fault.action >= health_pb2.ACTION_RESET_GPU or fault.code in HUNG_OR_LOST_CODES)


class FaultTracker:
    def __init__(
        self,
        client: DaemonClient,
        on_change: Callable[[], None],
        *,
        retry_max: float = 5.0,
        on_contact: Callable[[], None] = lambda: None,
    ) -> None:
        self._client = client
        self._on_change = on_change
        self._on_contact = on_contact
        self._retry_max = retry_max
        self._faults: dict[str, CardFault] = {}
        self.last_seq = 0
        self.synced = asyncio.Event()  # set once the first listing arrived
        self.connected = False

    def out_of_service(self, card_count: int) -> frozenset[int]:
        cards: set[int] = set()
        for fault in self._faults.values():
            if fault.gpu == ALL_CARDS:
                return frozenset(range(card_count))
            cards.add(fault.gpu)
        return frozenset(cards)

    def codes(self, gpu: int) -> list[str]:
        """The codes of the faults that take this card out of service (node-wide ones included), sorted."""
        return sorted({f.code for f in self._faults.values() if f.gpu in (gpu, ALL_CARDS)})

    def reasons(self, gpu: int) -> list[str]:
        return sorted(f"{f.code} ({f.id})" for f in self._faults.values() if f.gpu in (gpu, ALL_CARDS))

    def apply(self, fault: health_pb2.Fault) -> bool:
        """Take one fault as the daemon last described it; True when the set of out-of-service faults changed."""
        before = self._faults.get(fault.id)
        if takes_out_of_service(fault):
            entry = CardFault(
                fault.id, fault.gpu.index if fault.HasField("gpu") else ALL_CARDS, fault.code, fault.action
            )
            self._faults[fault.id] = entry
            return before != entry
        return self._faults.pop(fault.id, None) is not None

    async def _resync(self) -> None:
        faults, last_seq = await self._client.active_faults()
        previous = dict(self._faults)
        self._faults.clear()
        for fault in faults:
            self.apply(fault)
        self.last_seq = last_seq
        self._on_contact()
        self.synced.set()
        if self._faults != previous:
            self._on_change()

    async def run(self) -> None:
        """Follow the stream until cancelled."""
        delay = 0.2
        need_resync = True
        while True:
            try:
                if need_resync:
                    await self._resync()
                    need_resync = False
                async for item in self._client.watch_faults(self.last_seq):
                    if not self.connected:
                        log.info("following the daemon's faults", after_seq=self.last_seq)
                    self.connected = True
                    self._on_contact()
                    delay = 0.2
                    if item.HasField("gap"):
                        log.warning("fault records lost to retention; reading the active faults again")
                        need_resync = True
                        break
                    record = item.record
                    self.last_seq = record.seq
                    if self.apply(record.fault):
                        log.info(
                            "card health changed",
                            fault=record.fault.id,
                            code=record.fault.code,
                            gpu=record.fault.gpu.index if record.fault.HasField("gpu") else None,
                            record=record.kind,
                        )
                        self._on_change()
                else:
                    await asyncio.sleep(delay)  # the daemon ended the stream (shutting down): ask again shortly
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                    log.warning("the daemon's fault journal was reset; reading the active faults again")
                    need_resync = True
                    continue
                if self.connected:
                    log.warning("fault stream lost; keeping the last known health", error=exc.code().name)
                self.connected = False
                await asyncio.sleep(delay)
                delay = min(self._retry_max, delay * 2)
