from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InjectFaultRequest(_message.Message):
    __slots__ = ("kind", "gpu", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    gpu: int
    params: _containers.ScalarMap[str, str]
    def __init__(self, kind: _Optional[str] = ..., gpu: _Optional[int] = ..., params: _Optional[_Mapping[str, str]] = ...) -> None: ...

class InjectFaultResponse(_message.Message):
    __slots__ = ("description",)
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    description: str
    def __init__(self, description: _Optional[str] = ...) -> None: ...

class ClearFaultsRequest(_message.Message):
    __slots__ = ("gpu",)
    GPU_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    def __init__(self, gpu: _Optional[int] = ...) -> None: ...

class ClearFaultsResponse(_message.Message):
    __slots__ = ("description",)
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    description: str
    def __init__(self, description: _Optional[str] = ...) -> None: ...

class ListFaultKindsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FaultParameter(_message.Message):
    __slots__ = ("name", "meaning", "allowed", "default_value", "required")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEANING_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    meaning: str
    allowed: str
    default_value: str
    required: bool
    def __init__(self, name: _Optional[str] = ..., meaning: _Optional[str] = ..., allowed: _Optional[str] = ..., default_value: _Optional[str] = ..., required: _Optional[bool] = ...) -> None: ...

class FaultKind(_message.Message):
    __slots__ = ("kind", "params", "summary", "parameters")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    params: _containers.RepeatedScalarFieldContainer[str]
    summary: str
    parameters: _containers.RepeatedCompositeFieldContainer[FaultParameter]
    def __init__(self, kind: _Optional[str] = ..., params: _Optional[_Iterable[str]] = ..., summary: _Optional[str] = ..., parameters: _Optional[_Iterable[_Union[FaultParameter, _Mapping]]] = ...) -> None: ...

class ListFaultKindsResponse(_message.Message):
    __slots__ = ("kinds",)
    KINDS_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedCompositeFieldContainer[FaultKind]
    def __init__(self, kinds: _Optional[_Iterable[_Union[FaultKind, _Mapping]]] = ...) -> None: ...
