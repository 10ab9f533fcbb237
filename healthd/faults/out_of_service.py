"""Which cards new work should not be placed on: the rule shared by ``any`` placement and PreferredAllocation.

A card is out of service while it has an active fault whose action is reset_gpu or stronger (the card needs at
least a reset before it can be trusted), or one that says it hangs or is lost (``driver_call_timeout``, which
starts as a warning with action none, and ``gpu_lost``). Node-wide faults name no card and are not counted here:
placement is per card. The device plugin applies the same rule to the fault stream, plus node-wide faults.
"""

from __future__ import annotations

from collections.abc import Iterable

from healthd.faults.fault import Fault
from healthd.findings import Action

HUNG_OR_LOST_CODES = frozenset({"driver_call_timeout", "gpu_lost"})


def takes_card_out_of_service(fault: Fault) -> bool:
    return fault.active and (fault.action >= Action.RESET_GPU or fault.code in HUNG_OR_LOST_CODES)


def gpus_out_of_service(active_faults: Iterable[Fault]) -> frozenset[int]:
    """GPU indices with at least one active fault that takes the card out of service."""
    return frozenset(f.gpu.index for f in active_faults if f.gpu is not None and takes_card_out_of_service(f))
