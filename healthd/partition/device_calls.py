"""Driver calls of the partition manager: awaited through the device-access layer, errors made PartitionErrors.

The calls themselves run on their card's lane (exporter/backends/lanes.py); nothing here runs a driver call or
waits for one on a thread. A card that is hung answers at once with UNAVAILABLE naming the card and the stuck call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TypeVar

from exporter.backends.errors import BackendError, InsufficientResourcesError, InUseError
from exporter.backends.lanes import CallTimeoutError, CardHungError
from exporter.backends.types import MigInstance
from healthd.partition.errors import Kind, PartitionError, exhausted, not_found, unavailable
from healthd.partition.model import MigPlacement

T = TypeVar("T")


class MigInUseError(PartitionError):
    """A MIG instance still has processes (delete is retried)."""

    def __init__(self, message: str) -> None:
        super().__init__(Kind.PRECONDITION, message)


async def driver(call: Awaitable[T]) -> T:
    """Await a device-layer call; failures become the PartitionError a client can act on."""
    try:
        return await call
    except CardHungError as exc:
        raise unavailable(f"{exc}; try again once it answers") from None
    except CallTimeoutError as exc:
        raise unavailable(str(exc)) from None
    except InUseError as exc:
        raise MigInUseError(str(exc)) from exc
    except InsufficientResourcesError as exc:
        raise exhausted(f"the GPU refused: {exc}") from exc
    except BackendError as exc:
        if exc.code == "not_found":
            raise not_found(str(exc)) from exc
        raise unavailable(f"GPU driver call failed: {exc}") from exc


def find_instance(instances: Sequence[MigInstance], mig: MigPlacement, claimed: set[int]) -> MigInstance | None:
    for inst in instances:
        if inst.gpu_instance_id in claimed:
            continue
        if mig.uuid and inst.uuid == mig.uuid:
            return inst
        same_place = inst.profile_id == mig.profile_id and inst.placement_start == mig.placement_start
        if same_place and (not mig.uuid or inst.gpu_instance_id == mig.gpu_instance_id):
            return inst
    return None


def placement_of(inst: MigInstance) -> MigPlacement:
    return MigPlacement(
        profile_id=inst.profile_id,
        profile_name=inst.profile_name,
        placement_start=inst.placement_start,
        placement_size=inst.placement_size,
        gpu_instance_id=inst.gpu_instance_id,
        compute_instance_id=inst.compute_instance_id,
        uuid=inst.uuid,
    )
