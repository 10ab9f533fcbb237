"""The node's ResourceSlices (resource.k8s.io/v1), built from the daemon's public inventory. Pure: no I/O.

One pool per node, named after the node. Each card is offered the way its partition mode says
(Partitions.GetCapacity):

- mode none: the whole card, one device ``gpu-<i>`` with its memory as capacity. A card whose MIG mode is on in
  hardware is not a whole card and is left out until it is set to MIG.
- TDM: one device ``gpu-<i>-tdm`` with consumable capacity (KEP-5075): ``allowMultipleAllocations`` and two
  capacities whose request policy admits exactly what the daemon admits: ``compute`` 1-100 percent in steps of 1
  and ``memory`` in 128 MiB steps up to the card's memory. A claim that leaves one out takes all of it (the
  policy's default), so a partition "without limit" never shares that dimension with a claim the scheduler packs.
- MIG: every (profile, placement) as a partitionable device (KEP-4815, ``container/dra/mig_devices.py``).

Every device carries the card's attributes: uuid (MIG: parentUUID), index, product, the standard
``resource.kubernetes.io/pciBusID``, ``pcieRoot`` and ``numaNode`` (KEP-6072), the NVLink domain (cards joined by
NVLink or one NVSwitch fabric share it; ``matchAttribute`` on it or on pcieRoot asks for a connected set), and,
when known, driverVersion (a semver) and architecture. A card with a fault gets a device taint (KEP-5055) keyed
``xpu-runtime-kit.io/fault`` whose value is the fault code; which faults taint a card is the caller's decision.

Limits of resource.k8s.io/v1 (k8s.io/api resource/v1/types.go): a slice holds either devices or shared counters,
at most 8 counter sets, and at most 64 devices once any device has taints or consumes counters; so the pool is
one counter slice (when a card is in MIG mode) and as many device slices of 64 as needed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from kubernetes.client import models as k

from container.dra import mig_devices, names
from container.dra.mig_devices import Profile
from container.dra.quantity import bytes_quantity
from healthd.api.v1 import partitions_pb2, topology_pb2

MIB = 1 << 20
TDM_MEMORY_STEP = 128 * MIB  # the daemon's memory granularity (proto/healthd/api/v1/partitions.proto)
MAX_DEVICES_PER_SLICE = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures
MAX_COUNTER_SETS_PER_SLICE = 8  # ResourceSliceMaxCounterSets
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
_BDF = re.compile(r"^(?:[0-9a-fA-F]{4}|[0-9a-fA-F]{8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


@dataclass(frozen=True, slots=True)
class CardTaint:
    value: str  # a fault code, or names.UNMONITORED
    effect: str = "NoSchedule"
    time_added: datetime | None = None  # keep it from the first publication so NoExecute timing does not restart

    def __post_init__(self) -> None:
        if self.effect not in TAINT_EFFECTS:
            raise ValueError(f"taint effect must be one of {', '.join(TAINT_EFFECTS)}, not {self.effect!r}")


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the slices need that the daemon's public API does not carry (yet). Without it the two attributes are
    left out and MIG cards offer no devices (their legal placements are not known)."""

    driver_version: str = ""  # e.g. 580.159.04; published as the semver 580.159.4
    architecture: str = ""  # e.g. Hopper
    mig_placements: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)  # GI profile id ->
    mig_memory_slices: int = 0  # memory slices of one card (8 on H100/H200)


@dataclass(frozen=True, slots=True)
class Pool:
    node_name: str
    slices: tuple[k.V1ResourceSlice, ...]


def slice_name(node_name: str, index: int) -> str:
    """Stable names, so a publisher can update in place; a DNS subdomain of at most 253 characters."""
    name = f"{node_name}-{names.DRIVER}-{index}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    return f"{node_name[: 253 - len(names.DRIVER) - 20]}-{digest}-{names.DRIVER}-{index}"


def semver(driver_version: str) -> str:
    """NVIDIA's 580.159.04 as semver 2.0 (no leading zeros): 580.159.4; "" when it is not three numbers."""
    parts = driver_version.strip().split(".")
    if len(parts) == 2:
        parts.append("0")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return ""
    return ".".join(str(int(p)) for p in parts)


def pci_bus_id(text: str) -> str:
    """The extended BDF deviceattribute expects (0000:18:00.0, lower case), from NVML's 00000000:18:00.0."""
    match = _BDF.match(text)
    if match is None:
        return ""
    domain = text.split(":", 1)[0][-4:]
    return f"{domain}:{match.group(1)}:{match.group(2)}.{match.group(3)}".lower()


def nvlink_domains(topology: topology_pb2.GetTopologyResponse) -> dict[int, str]:
    """Card index -> NVLink domain: cards joined by direct NVLinks or through NVSwitch, named by the fabric."""
    by_bus = {pci_bus_id(g.location.pci_bus_id): g.index for g in topology.gpus}
    parent: dict[int | str, int | str] = {}  # card index, or "nvswitch" for the fabric

    def find(x: int | str) -> int | str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    linked = set()
    for gpu in topology.gpus:
        if not gpu.nvlink_known or not gpu.nvlink_peers:
            continue
        linked.add(gpu.index)
        for peer in gpu.nvlink_peers:
            other = "nvswitch" if peer == "nvswitch" else by_bus.get(pci_bus_id(peer))
            if other is not None:
                parent[find(gpu.index)] = find(other)
    fabric = find("nvswitch") if "nvswitch" in parent else None
    groups: dict[int | str, list[int]] = {}
    for index in linked:
        groups.setdefault(find(index), []).append(index)
    out = {}
    for root, members in groups.items():
        out.update(dict.fromkeys(members, "nvswitch" if root == fabric else f"nvlink-{min(members)}"))
    return out


def _card_attributes(
    card: partitions_pb2.CardCapacity, gpu: topology_pb2.TopologyGpu | None, facts: NodeFacts, nvlink: str | None
) -> dict[str, k.V1DeviceAttribute]:
    attrs = {
        names.UUID: k.V1DeviceAttribute(string=card.gpu_uuid),
        names.INDEX: k.V1DeviceAttribute(int=card.gpu),
    }
    if gpu is not None:
        if gpu.name:
            attrs[names.PRODUCT] = k.V1DeviceAttribute(string=gpu.name)
        if bus := pci_bus_id(gpu.location.pci_bus_id):
            attrs[names.PCI_BUS_ID] = k.V1DeviceAttribute(string=bus)
        if gpu.location.host_bridge:
            attrs[names.PCIE_ROOT] = k.V1DeviceAttribute(string=gpu.location.host_bridge)
        if gpu.location.HasField("numa_node") and gpu.location.numa_node >= 0:
            attrs[names.NUMA_NODE] = k.V1DeviceAttribute(int=gpu.location.numa_node)
    if nvlink:
        attrs[names.NVLINK_DOMAIN] = k.V1DeviceAttribute(string=nvlink)
    if version := semver(facts.driver_version):
        attrs[names.DRIVER_VERSION] = k.V1DeviceAttribute(version=version)
    if facts.architecture:
        attrs[names.ARCHITECTURE] = k.V1DeviceAttribute(string=facts.architecture)
    return attrs


def _taints(taints: Sequence[CardTaint]) -> list[k.V1DeviceTaint] | None:
    if not taints:
        return None
    return [
        k.V1DeviceTaint(key=names.FAULT_TAINT_KEY, value=t.value, effect=t.effect, time_added=t.time_added)
        for t in taints
    ]


def _tdm_device(
    card: partitions_pb2.CardCapacity, attrs: dict[str, k.V1DeviceAttribute], taints: list[k.V1DeviceTaint] | None
) -> k.V1Device:
    top = card.memory_total_bytes // TDM_MEMORY_STEP * TDM_MEMORY_STEP
    attrs = {**attrs, names.MODE: k.V1DeviceAttribute(string="tdm")}
    if card.tdm_sharing:
        attrs[names.TDM_SHARING] = k.V1DeviceAttribute(string=card.tdm_sharing)
    compute = k.V1CapacityRequestPolicy(
        default="100", valid_range=k.V1CapacityRequestPolicyRange(min="1", max="100", step="1")
    )
    memory = k.V1CapacityRequestPolicy(
        default=bytes_quantity(top),
        valid_range=k.V1CapacityRequestPolicyRange(
            min=bytes_quantity(TDM_MEMORY_STEP), max=bytes_quantity(top), step=bytes_quantity(TDM_MEMORY_STEP)
        ),
    )
    return k.V1Device(
        name=f"gpu-{card.gpu}-tdm",
        attributes=attrs,
        allow_multiple_allocations=True,
        capacity={
            names.COMPUTE: k.V1DeviceCapacity(value="100", request_policy=compute),
            names.MEMORY: k.V1DeviceCapacity(value=bytes_quantity(card.memory_total_bytes), request_policy=memory),
        },
        taints=taints,
    )


def _profiles(card: partitions_pb2.CardCapacity, facts: NodeFacts) -> list[Profile]:
    return mig_devices.usable(
        [
            Profile(
                name=p.profile,
                profile_id=p.profile_id,
                memory_bytes=p.memory_bytes,
                sm_count=p.sm_count,
                instance_count=p.instance_count,
                placements=tuple(facts.mig_placements.get(p.profile_id, ())),
            )
            for p in card.mig_profiles
        ]
    )


def build_pool(
    node_name: str,
    capacity: partitions_pb2.GetCapacityResponse,
    topology: topology_pb2.GetTopologyResponse,
    facts: NodeFacts | None = None,
    *,
    taints: Mapping[int, Sequence[CardTaint]] | None = None,
    busy_placements: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    generation: int = 1,
    owner: k.V1OwnerReference | None = None,
) -> Pool:
    """The pool at ``generation``. ``taints``: card index -> its taints. ``busy_placements``: card index -> MIG
    (start, size) held by instances the driver does not own (the card's foreign instances are added here)."""
    facts = facts or NodeFacts()
    taints = taints or {}
    busy_placements = busy_placements or {}
    gpus = {g.index: g for g in topology.gpus}
    nvlink = nvlink_domains(topology)
    devices: list[k.V1Device] = []
    counter_sets: list[k.V1CounterSet] = []
    for card in sorted(capacity.cards, key=lambda c: c.gpu):
        attrs = _card_attributes(card, gpus.get(card.gpu), facts, nvlink.get(card.gpu))
        card_taints = _taints(taints.get(card.gpu, ()))
        if card.mode == partitions_pb2.PARTITION_MODE_NONE and not card.hardware_mig_enabled:
            attrs[names.MODE] = k.V1DeviceAttribute(string="none")
            devices.append(
                k.V1Device(
                    name=f"gpu-{card.gpu}",
                    attributes=attrs,
                    capacity={names.MEMORY: k.V1DeviceCapacity(value=bytes_quantity(card.memory_total_bytes))},
                    taints=card_taints,
                )
            )
        elif card.mode == partitions_pb2.PARTITION_MODE_TDM:
            devices.append(_tdm_device(card, attrs, card_taints))
        elif card.mode == partitions_pb2.PARTITION_MODE_MIG and facts.mig_memory_slices:
            profiles = _profiles(card, facts)
            if not profiles:
                continue
            taken = [*busy_placements.get(card.gpu, ())]
            taken += [(f.placement_start, f.placement_size) for f in card.foreign_mig_instances]
            parent = dict(attrs)
            parent[names.PARENT_UUID] = parent.pop(names.UUID)
            counter_sets.append(mig_devices.counter_set(card.gpu, facts.mig_memory_slices, profiles))
            devices += mig_devices.devices(
                card.gpu, parent, profiles, memory_slices=facts.mig_memory_slices, taken=taken, taints=card_taints
            )
    return Pool(node_name, _slices(node_name, devices, counter_sets, generation, owner))


def _slices(
    node_name: str,
    devices: list[k.V1Device],
    counter_sets: list[k.V1CounterSet],
    generation: int,
    owner: k.V1OwnerReference | None,
) -> tuple[k.V1ResourceSlice, ...]:
    if len(counter_sets) > MAX_COUNTER_SETS_PER_SLICE:
        raise ValueError(f"{len(counter_sets)} MIG cards: one slice holds at most {MAX_COUNTER_SETS_PER_SLICE}")
    chunks: list[tuple[list[k.V1Device] | None, list[k.V1CounterSet] | None]] = []
    if counter_sets:
        chunks.append((None, counter_sets))
    chunks += [(devices[i : i + MAX_DEVICES_PER_SLICE], None) for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)]
    if not chunks:
        chunks.append(([], None))  # the pool exists and offers nothing
    return tuple(
        k.V1ResourceSlice(
            api_version="resource.k8s.io/v1",
            kind="ResourceSlice",
            metadata=k.V1ObjectMeta(
                name=slice_name(node_name, i), owner_references=[owner] if owner is not None else None
            ),
            spec=k.V1ResourceSliceSpec(
                driver=names.DRIVER,
                node_name=node_name,
                pool=k.V1ResourcePool(name=node_name, generation=generation, resource_slice_count=len(chunks)),
                devices=chunk_devices,
                shared_counters=chunk_counters,
            ),
        )
        for i, (chunk_devices, chunk_counters) in enumerate(chunks)
    )


def node_owner(node_name: str, node_uid: str) -> k.V1OwnerReference:
    """Slices owned by their Node are garbage-collected with it (what the kubelet plugin helper does too)."""
    return k.V1OwnerReference(api_version="v1", kind="Node", name=node_name, uid=node_uid, controller=True)
