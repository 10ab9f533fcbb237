from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PartitionMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARTITION_MODE_UNSPECIFIED: _ClassVar[PartitionMode]
    PARTITION_MODE_NONE: _ClassVar[PartitionMode]
    PARTITION_MODE_TDM: _ClassVar[PartitionMode]
    PARTITION_MODE_MIG: _ClassVar[PartitionMode]

class TdmSharing(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TDM_SHARING_DEFAULT: _ClassVar[TdmSharing]
    TDM_SHARING_ISOLATED: _ClassVar[TdmSharing]
    TDM_SHARING_SHARED: _ClassVar[TdmSharing]
PARTITION_MODE_UNSPECIFIED: PartitionMode
PARTITION_MODE_NONE: PartitionMode
PARTITION_MODE_TDM: PartitionMode
PARTITION_MODE_MIG: PartitionMode
TDM_SHARING_DEFAULT: TdmSharing
TDM_SHARING_ISOLATED: TdmSharing
TDM_SHARING_SHARED: TdmSharing

class Owner(_message.Message):
    __slots__ = ("container", "pod", "process", "lease", "claim")
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    container: ContainerOwner
    pod: PodOwner
    process: ProcessOwner
    lease: LeaseOwner
    claim: ClaimOwner
    def __init__(self, container: _Optional[_Union[ContainerOwner, _Mapping]] = ..., pod: _Optional[_Union[PodOwner, _Mapping]] = ..., process: _Optional[_Union[ProcessOwner, _Mapping]] = ..., lease: _Optional[_Union[LeaseOwner, _Mapping]] = ..., claim: _Optional[_Union[ClaimOwner, _Mapping]] = ...) -> None: ...

class ClaimOwner(_message.Message):
    __slots__ = ("namespace", "name", "uid")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    uid: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ...) -> None: ...

class ContainerOwner(_message.Message):
    __slots__ = ("id", "cgroup_path")
    ID_FIELD_NUMBER: _ClassVar[int]
    CGROUP_PATH_FIELD_NUMBER: _ClassVar[int]
    id: str
    cgroup_path: str
    def __init__(self, id: _Optional[str] = ..., cgroup_path: _Optional[str] = ...) -> None: ...

class PodOwner(_message.Message):
    __slots__ = ("namespace", "name", "container", "kubelet_device")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    KUBELET_DEVICE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    container: str
    kubelet_device: KubeletDevice
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., container: _Optional[str] = ..., kubelet_device: _Optional[_Union[KubeletDevice, _Mapping]] = ...) -> None: ...

class KubeletDevice(_message.Message):
    __slots__ = ("resource_name", "device_id")
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    resource_name: str
    device_id: str
    def __init__(self, resource_name: _Optional[str] = ..., device_id: _Optional[str] = ...) -> None: ...

class ProcessOwner(_message.Message):
    __slots__ = ("pid",)
    PID_FIELD_NUMBER: _ClassVar[int]
    pid: int
    def __init__(self, pid: _Optional[int] = ...) -> None: ...

class LeaseOwner(_message.Message):
    __slots__ = ("holder", "ttl_seconds", "kubelet_device")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KUBELET_DEVICE_FIELD_NUMBER: _ClassVar[int]
    holder: str
    ttl_seconds: float
    kubelet_device: KubeletDevice
    def __init__(self, holder: _Optional[str] = ..., ttl_seconds: _Optional[float] = ..., kubelet_device: _Optional[_Union[KubeletDevice, _Mapping]] = ...) -> None: ...

class CreatePartitionRequest(_message.Message):
    __slots__ = ("owner", "gpu", "compute_percent", "memory", "request_id", "allow_faulty_gpus", "client_uid", "mig_profile", "mig_placement_start")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FAULTY_GPUS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_UID_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    MIG_PLACEMENT_START_FIELD_NUMBER: _ClassVar[int]
    owner: Owner
    gpu: str
    compute_percent: int
    memory: str
    request_id: str
    allow_faulty_gpus: bool
    client_uid: int
    mig_profile: str
    mig_placement_start: int
    def __init__(self, owner: _Optional[_Union[Owner, _Mapping]] = ..., gpu: _Optional[str] = ..., compute_percent: _Optional[int] = ..., memory: _Optional[str] = ..., request_id: _Optional[str] = ..., allow_faulty_gpus: _Optional[bool] = ..., client_uid: _Optional[int] = ..., mig_profile: _Optional[str] = ..., mig_placement_start: _Optional[int] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("host_path", "container_path", "options")
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    host_path: str
    container_path: str
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host_path: _Optional[str] = ..., container_path: _Optional[str] = ..., options: _Optional[_Iterable[str]] = ...) -> None: ...

class DeviceNode(_message.Message):
    __slots__ = ("path", "host_path", "permissions")
    PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    path: str
    host_path: str
    permissions: str
    def __init__(self, path: _Optional[str] = ..., host_path: _Optional[str] = ..., permissions: _Optional[str] = ...) -> None: ...

class MigDevice(_message.Message):
    __slots__ = ("profile", "profile_id", "gpu_instance_id", "compute_instance_id", "placement_start", "placement_size", "uuid")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_START_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_SIZE_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    profile: str
    profile_id: int
    gpu_instance_id: int
    compute_instance_id: int
    placement_start: int
    placement_size: int
    uuid: str
    def __init__(self, profile: _Optional[str] = ..., profile_id: _Optional[int] = ..., gpu_instance_id: _Optional[int] = ..., compute_instance_id: _Optional[int] = ..., placement_start: _Optional[int] = ..., placement_size: _Optional[int] = ..., uuid: _Optional[str] = ...) -> None: ...

class Partition(_message.Message):
    __slots__ = ("id", "gpu", "gpu_uuid", "mode", "compute_percent", "memory_limit_bytes", "owner", "state", "created_at", "lease_expires_at", "env", "mounts", "device_nodes", "cdi_device", "mig", "request_id", "client_uid")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NODES_FIELD_NUMBER: _ClassVar[int]
    CDI_DEVICE_FIELD_NUMBER: _ClassVar[int]
    MIG_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_UID_FIELD_NUMBER: _ClassVar[int]
    id: str
    gpu: int
    gpu_uuid: str
    mode: PartitionMode
    compute_percent: int
    memory_limit_bytes: int
    owner: Owner
    state: str
    created_at: float
    lease_expires_at: float
    env: _containers.ScalarMap[str, str]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    device_nodes: _containers.RepeatedCompositeFieldContainer[DeviceNode]
    cdi_device: str
    mig: MigDevice
    request_id: str
    client_uid: int
    def __init__(self, id: _Optional[str] = ..., gpu: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., mode: _Optional[_Union[PartitionMode, str]] = ..., compute_percent: _Optional[int] = ..., memory_limit_bytes: _Optional[int] = ..., owner: _Optional[_Union[Owner, _Mapping]] = ..., state: _Optional[str] = ..., created_at: _Optional[float] = ..., lease_expires_at: _Optional[float] = ..., env: _Optional[_Mapping[str, str]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., device_nodes: _Optional[_Iterable[_Union[DeviceNode, _Mapping]]] = ..., cdi_device: _Optional[str] = ..., mig: _Optional[_Union[MigDevice, _Mapping]] = ..., request_id: _Optional[str] = ..., client_uid: _Optional[int] = ...) -> None: ...

class GetPartitionRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListPartitionsRequest(_message.Message):
    __slots__ = ("gpu",)
    GPU_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    def __init__(self, gpu: _Optional[str] = ...) -> None: ...

class ListPartitionsResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[Partition]
    def __init__(self, partitions: _Optional[_Iterable[_Union[Partition, _Mapping]]] = ...) -> None: ...

class DeletePartitionRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeletePartitionResponse(_message.Message):
    __slots__ = ("id", "deleted")
    ID_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    id: str
    deleted: bool
    def __init__(self, id: _Optional[str] = ..., deleted: _Optional[bool] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("id", "ttl_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    ttl_seconds: float
    def __init__(self, id: _Optional[str] = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class SetCardModeRequest(_message.Message):
    __slots__ = ("gpu", "mode", "sharing")
    GPU_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    mode: PartitionMode
    sharing: TdmSharing
    def __init__(self, gpu: _Optional[str] = ..., mode: _Optional[_Union[PartitionMode, str]] = ..., sharing: _Optional[_Union[TdmSharing, str]] = ...) -> None: ...

class ForeignMigInstance(_message.Message):
    __slots__ = ("gpu_instance_id", "profile", "placement_start", "placement_size", "uuid")
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_START_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_SIZE_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    gpu_instance_id: int
    profile: str
    placement_start: int
    placement_size: int
    uuid: str
    def __init__(self, gpu_instance_id: _Optional[int] = ..., profile: _Optional[str] = ..., placement_start: _Optional[int] = ..., placement_size: _Optional[int] = ..., uuid: _Optional[str] = ...) -> None: ...

class CardCapacity(_message.Message):
    __slots__ = ("gpu", "gpu_uuid", "mode", "partitions", "compute_percent_allocated", "memory_allocated_bytes", "memory_total_bytes", "mig_memory_slices_free", "foreign_mig_instances", "hardware_mig_enabled", "mig_profiles", "tdm_sharing", "mig_memory_slices", "driver_version", "architecture", "cuda_compute_capability")
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PERCENT_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIG_MEMORY_SLICES_FREE_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_MIG_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_MIG_ENABLED_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILES_FIELD_NUMBER: _ClassVar[int]
    TDM_SHARING_FIELD_NUMBER: _ClassVar[int]
    MIG_MEMORY_SLICES_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    CUDA_COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    gpu_uuid: str
    mode: PartitionMode
    partitions: int
    compute_percent_allocated: int
    memory_allocated_bytes: int
    memory_total_bytes: int
    mig_memory_slices_free: int
    foreign_mig_instances: _containers.RepeatedCompositeFieldContainer[ForeignMigInstance]
    hardware_mig_enabled: bool
    mig_profiles: _containers.RepeatedCompositeFieldContainer[MigProfileRoom]
    tdm_sharing: str
    mig_memory_slices: int
    driver_version: str
    architecture: str
    cuda_compute_capability: str
    def __init__(self, gpu: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., mode: _Optional[_Union[PartitionMode, str]] = ..., partitions: _Optional[int] = ..., compute_percent_allocated: _Optional[int] = ..., memory_allocated_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., mig_memory_slices_free: _Optional[int] = ..., foreign_mig_instances: _Optional[_Iterable[_Union[ForeignMigInstance, _Mapping]]] = ..., hardware_mig_enabled: _Optional[bool] = ..., mig_profiles: _Optional[_Iterable[_Union[MigProfileRoom, _Mapping]]] = ..., tdm_sharing: _Optional[str] = ..., mig_memory_slices: _Optional[int] = ..., driver_version: _Optional[str] = ..., architecture: _Optional[str] = ..., cuda_compute_capability: _Optional[str] = ...) -> None: ...

class MigPlacementRange(_message.Message):
    __slots__ = ("start", "size")
    START_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    start: int
    size: int
    def __init__(self, start: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class MediaEngines(_message.Message):
    __slots__ = ("decoders", "encoders", "jpeg_decoders", "optical_flow", "copy_engines")
    DECODERS_FIELD_NUMBER: _ClassVar[int]
    ENCODERS_FIELD_NUMBER: _ClassVar[int]
    JPEG_DECODERS_FIELD_NUMBER: _ClassVar[int]
    OPTICAL_FLOW_FIELD_NUMBER: _ClassVar[int]
    COPY_ENGINES_FIELD_NUMBER: _ClassVar[int]
    decoders: int
    encoders: int
    jpeg_decoders: int
    optical_flow: int
    copy_engines: int
    def __init__(self, decoders: _Optional[int] = ..., encoders: _Optional[int] = ..., jpeg_decoders: _Optional[int] = ..., optical_flow: _Optional[int] = ..., copy_engines: _Optional[int] = ...) -> None: ...

class MigProfileRoom(_message.Message):
    __slots__ = ("profile", "profile_id", "memory_bytes", "sm_count", "instance_count", "placeable", "placements", "media")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SM_COUNT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PLACEABLE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    profile: str
    profile_id: int
    memory_bytes: int
    sm_count: int
    instance_count: int
    placeable: int
    placements: _containers.RepeatedCompositeFieldContainer[MigPlacementRange]
    media: MediaEngines
    def __init__(self, profile: _Optional[str] = ..., profile_id: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., sm_count: _Optional[int] = ..., instance_count: _Optional[int] = ..., placeable: _Optional[int] = ..., placements: _Optional[_Iterable[_Union[MigPlacementRange, _Mapping]]] = ..., media: _Optional[_Union[MediaEngines, _Mapping]] = ...) -> None: ...

class GetCapacityRequest(_message.Message):
    __slots__ = ("gpu",)
    GPU_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    def __init__(self, gpu: _Optional[str] = ...) -> None: ...

class GetCapacityResponse(_message.Message):
    __slots__ = ("cards",)
    CARDS_FIELD_NUMBER: _ClassVar[int]
    cards: _containers.RepeatedCompositeFieldContainer[CardCapacity]
    def __init__(self, cards: _Optional[_Iterable[_Union[CardCapacity, _Mapping]]] = ...) -> None: ...
