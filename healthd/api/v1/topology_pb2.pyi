from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LinkKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LINK_KIND_UNSPECIFIED: _ClassVar[LinkKind]
    LINK_KIND_SELF: _ClassVar[LinkKind]
    LINK_KIND_NVLINK: _ClassVar[LinkKind]
    LINK_KIND_PIX: _ClassVar[LinkKind]
    LINK_KIND_PXB: _ClassVar[LinkKind]
    LINK_KIND_PHB: _ClassVar[LinkKind]
    LINK_KIND_NODE: _ClassVar[LinkKind]
    LINK_KIND_SKT: _ClassVar[LinkKind]
    LINK_KIND_SYS: _ClassVar[LinkKind]
LINK_KIND_UNSPECIFIED: LinkKind
LINK_KIND_SELF: LinkKind
LINK_KIND_NVLINK: LinkKind
LINK_KIND_PIX: LinkKind
LINK_KIND_PXB: LinkKind
LINK_KIND_PHB: LinkKind
LINK_KIND_NODE: LinkKind
LINK_KIND_SKT: LinkKind
LINK_KIND_SYS: LinkKind

class GetTopologyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PcieLocation(_message.Message):
    __slots__ = ("pci_bus_id", "host_bridge", "bridges", "pcie_switch", "numa_node", "socket", "cpu_affinity")
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_BRIDGE_FIELD_NUMBER: _ClassVar[int]
    BRIDGES_FIELD_NUMBER: _ClassVar[int]
    PCIE_SWITCH_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODE_FIELD_NUMBER: _ClassVar[int]
    SOCKET_FIELD_NUMBER: _ClassVar[int]
    CPU_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    pci_bus_id: str
    host_bridge: str
    bridges: _containers.RepeatedScalarFieldContainer[str]
    pcie_switch: str
    numa_node: int
    socket: int
    cpu_affinity: str
    def __init__(self, pci_bus_id: _Optional[str] = ..., host_bridge: _Optional[str] = ..., bridges: _Optional[_Iterable[str]] = ..., pcie_switch: _Optional[str] = ..., numa_node: _Optional[int] = ..., socket: _Optional[int] = ..., cpu_affinity: _Optional[str] = ...) -> None: ...

class TopologyGpu(_message.Message):
    __slots__ = ("index", "uuid", "name", "location", "nvlink_peers", "nvlink_known", "serial")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    NVLINK_PEERS_FIELD_NUMBER: _ClassVar[int]
    NVLINK_KNOWN_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    location: PcieLocation
    nvlink_peers: _containers.RepeatedScalarFieldContainer[str]
    nvlink_known: bool
    serial: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., location: _Optional[_Union[PcieLocation, _Mapping]] = ..., nvlink_peers: _Optional[_Iterable[str]] = ..., nvlink_known: _Optional[bool] = ..., serial: _Optional[str] = ...) -> None: ...

class TopologyNic(_message.Message):
    __slots__ = ("name", "netdevs", "location", "model", "link_layer", "state")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NETDEVS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    netdevs: _containers.RepeatedScalarFieldContainer[str]
    location: PcieLocation
    model: str
    link_layer: str
    state: str
    def __init__(self, name: _Optional[str] = ..., netdevs: _Optional[_Iterable[str]] = ..., location: _Optional[_Union[PcieLocation, _Mapping]] = ..., model: _Optional[str] = ..., link_layer: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class TopologyLink(_message.Message):
    __slots__ = ("a", "b", "kind", "nvlinks", "label", "distance")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NVLINKS_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_FIELD_NUMBER: _ClassVar[int]
    a: str
    b: str
    kind: LinkKind
    nvlinks: int
    label: str
    distance: int
    def __init__(self, a: _Optional[str] = ..., b: _Optional[str] = ..., kind: _Optional[_Union[LinkKind, str]] = ..., nvlinks: _Optional[int] = ..., label: _Optional[str] = ..., distance: _Optional[int] = ...) -> None: ...

class GetTopologyResponse(_message.Message):
    __slots__ = ("gpus", "nics", "gpu_links", "nic_links", "numa_nodes", "sockets", "collected_at", "source", "warnings")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    GPU_LINKS_FIELD_NUMBER: _ClassVar[int]
    NIC_LINKS_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODES_FIELD_NUMBER: _ClassVar[int]
    SOCKETS_FIELD_NUMBER: _ClassVar[int]
    COLLECTED_AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[TopologyGpu]
    nics: _containers.RepeatedCompositeFieldContainer[TopologyNic]
    gpu_links: _containers.RepeatedCompositeFieldContainer[TopologyLink]
    nic_links: _containers.RepeatedCompositeFieldContainer[TopologyLink]
    numa_nodes: _containers.RepeatedScalarFieldContainer[int]
    sockets: _containers.RepeatedScalarFieldContainer[int]
    collected_at: float
    source: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, gpus: _Optional[_Iterable[_Union[TopologyGpu, _Mapping]]] = ..., nics: _Optional[_Iterable[_Union[TopologyNic, _Mapping]]] = ..., gpu_links: _Optional[_Iterable[_Union[TopologyLink, _Mapping]]] = ..., nic_links: _Optional[_Iterable[_Union[TopologyLink, _Mapping]]] = ..., numa_nodes: _Optional[_Iterable[int]] = ..., sockets: _Optional[_Iterable[int]] = ..., collected_at: _Optional[float] = ..., source: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class PreferredAllocationRequest(_message.Message):
    __slots__ = ("count", "available", "must_include", "include_faulty_gpus")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MUST_INCLUDE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FAULTY_GPUS_FIELD_NUMBER: _ClassVar[int]
    count: int
    available: _containers.RepeatedScalarFieldContainer[str]
    must_include: _containers.RepeatedScalarFieldContainer[str]
    include_faulty_gpus: bool
    def __init__(self, count: _Optional[int] = ..., available: _Optional[_Iterable[str]] = ..., must_include: _Optional[_Iterable[str]] = ..., include_faulty_gpus: _Optional[bool] = ...) -> None: ...

class NicChoice(_message.Message):
    __slots__ = ("name", "netdevs", "gpu", "link", "level")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NETDEVS_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    name: str
    netdevs: _containers.RepeatedScalarFieldContainer[str]
    gpu: int
    link: str
    level: str
    def __init__(self, name: _Optional[str] = ..., netdevs: _Optional[_Iterable[str]] = ..., gpu: _Optional[int] = ..., link: _Optional[str] = ..., level: _Optional[str] = ...) -> None: ...

class PreferredAllocationResponse(_message.Message):
    __slots__ = ("gpus", "uuids", "nics", "worst_link", "total_distance", "exact", "excluded_faulty_gpus")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    UUIDS_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    WORST_LINK_FIELD_NUMBER: _ClassVar[int]
    TOTAL_DISTANCE_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FAULTY_GPUS_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedScalarFieldContainer[int]
    uuids: _containers.RepeatedScalarFieldContainer[str]
    nics: _containers.RepeatedCompositeFieldContainer[NicChoice]
    worst_link: str
    total_distance: int
    exact: bool
    excluded_faulty_gpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, gpus: _Optional[_Iterable[int]] = ..., uuids: _Optional[_Iterable[str]] = ..., nics: _Optional[_Iterable[_Union[NicChoice, _Mapping]]] = ..., worst_link: _Optional[str] = ..., total_distance: _Optional[int] = ..., exact: _Optional[bool] = ..., excluded_faulty_gpus: _Optional[_Iterable[int]] = ...) -> None: ...
