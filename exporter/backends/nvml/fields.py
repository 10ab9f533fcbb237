"""The field-value batch: one ``nvmlDeviceGetFieldValues`` call per card and cycle for every counter it can carry.

ECC totals, memory temperature, energy, PCIe replays, row remapping, the recovery action and per-link NVLink
counters come from this one batch instead of a dozen separate calls (and instead of the 4.5 ms
``nvmlDeviceGetTotalEnergyConsumption``). A field the card does not answer is left out of the result; the readings
built from it fall back to the dedicated call where there is one (row remapping, NVLink error counters).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import pynvml

from exporter.backends.nvml.calls import as_int, optional, scaled
from exporter.backends.nvml.handles import DeviceHandle, FieldValue
from exporter.backends.types import UNSUPPORTED, LinkState, NvLinkSample, RemappedRows, Unsupported

FieldKey = tuple[int, int]  # (fieldId, scopeId)
FieldValues = Mapping[FieldKey, int | float]

_KIB: Final = 1024

# nvmlFieldValue_t.valueType -> the nvmlValue_t union member holding the value.
_VALUE_MEMBERS: Final[Mapping[int, str]] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

FI_ECC_CURRENT: Final = pynvml.NVML_FI_DEV_ECC_CURRENT
FI_ECC_PENDING: Final = pynvml.NVML_FI_DEV_ECC_PENDING
FI_SBE_VOL: Final = pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL
FI_DBE_VOL: Final = pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL
FI_SBE_AGG: Final = pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL
FI_DBE_AGG: Final = pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL
FI_MEMORY_TEMP: Final = pynvml.NVML_FI_DEV_MEMORY_TEMP
FI_ENERGY: Final = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION  # mJ since driver load
FI_PCIE_REPLAY: Final = pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER
FI_REMAP_COR: Final = pynvml.NVML_FI_DEV_REMAPPED_COR
FI_REMAP_UNC: Final = pynvml.NVML_FI_DEV_REMAPPED_UNC
FI_REMAP_PENDING: Final = pynvml.NVML_FI_DEV_REMAPPED_PENDING
FI_REMAP_FAILURE: Final = pynvml.NVML_FI_DEV_REMAPPED_FAILURE
FI_RECOVERY_ACTION: Final = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
# NVLink throughput counters take the link in scopeId (nvml.h); values are KiB.
FI_NVLINK_TX: Final = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
FI_NVLINK_RX: Final = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX

DEVICE_FIELDS: Final[tuple[int, ...]] = (
    FI_ECC_CURRENT,
    FI_ECC_PENDING,
    FI_SBE_VOL,
    FI_DBE_VOL,
    FI_SBE_AGG,
    FI_DBE_AGG,
    FI_MEMORY_TEMP,
    FI_ENERGY,
    FI_PCIE_REPLAY,
    FI_REMAP_COR,
    FI_REMAP_UNC,
    FI_REMAP_PENDING,
    FI_REMAP_FAILURE,
    FI_RECOVERY_ACTION,
)


def _per_link_ids(kind: str) -> tuple[int, ...]:
    """Field IDs of a per-link NVLink error counter for links 0..11 (NVML defines no per-link IDs past 11)."""
    ids = []
    for link in range(12):
        value = getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}", None)
        if value is None:
            break
        ids.append(int(value))
    return tuple(ids)


FI_LINK_CRC_FLIT: Final = _per_link_ids("CRC_FLIT")
FI_LINK_CRC_DATA: Final = _per_link_ids("CRC_DATA")
FI_LINK_REPLAY: Final = _per_link_ids("REPLAY")
FI_LINK_RECOVERY: Final = _per_link_ids("RECOVERY")


def decode_field(fv: FieldValue) -> int | float | Unsupported:
    """The value of one ``c_nvmlFieldValue_t``: UNSUPPORTED unless its own nvmlReturn is SUCCESS."""
    if fv.nvmlReturn != pynvml.NVML_SUCCESS:
        return UNSUPPORTED
    member = _VALUE_MEMBERS.get(int(fv.valueType))
    if member is None:
        return UNSUPPORTED
    value = getattr(fv.value, member)
    return float(value) if member == "dVal" else int(value)


def field_request(links: tuple[int, ...]) -> tuple[FieldKey, ...]:
    """The batch for a card with these NVLinks: the device fields, then each link's throughput and error counters."""
    keys: list[FieldKey] = [(fid, 0) for fid in DEVICE_FIELDS]
    for link in links:
        keys += [(FI_NVLINK_TX, link), (FI_NVLINK_RX, link)]
        if link < len(FI_LINK_CRC_FLIT):
            keys += [
                (FI_LINK_CRC_FLIT[link], 0),
                (FI_LINK_CRC_DATA[link], 0),
                (FI_LINK_REPLAY[link], 0),
                (FI_LINK_RECOVERY[link], 0),
            ]
    return tuple(keys)


def read_fields(h: DeviceHandle, request: tuple[FieldKey, ...]) -> dict[FieldKey, int | float]:
    """One ``nvmlDeviceGetFieldValues`` batch; fields the card does not answer are left out."""
    values = optional("nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, h, list(request))
    if values is UNSUPPORTED:
        return {}
    out: dict[FieldKey, int | float] = {}
    for key, fv in zip(request, values, strict=True):
        value = decode_field(fv)
        if value is not UNSUPPORTED:
            out[key] = value  # raw: a counter that goes down was reset (driver reload), which Prometheus handles
    return out


def device_field(fields: FieldValues, fid: int) -> int | float | Unsupported:
    """A card-scoped field of the batch (scopeId 0), or UNSUPPORTED."""
    return fields.get((fid, 0), UNSUPPORTED)


def remapped_rows(h: DeviceHandle, fields: FieldValues) -> RemappedRows | Unsupported:
    """Row remapping from the batch; ``nvmlDeviceGetRemappedRows`` when the card left any of its fields out."""
    parts = [device_field(fields, fid) for fid in (FI_REMAP_COR, FI_REMAP_UNC, FI_REMAP_PENDING, FI_REMAP_FAILURE)]
    values: list[int] = [int(part) for part in parts if not isinstance(part, Unsupported)]
    if len(values) != len(parts):
        rows = optional("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows, h)
        if isinstance(rows, Unsupported):
            return UNSUPPORTED
        values = [int(part) for part in rows]
    cor, unc, pending, failure = values
    return RemappedRows(correctable=cor, uncorrectable=unc, pending=bool(pending), failure=bool(failure))


def nvlink_samples(h: DeviceHandle, links: tuple[int, ...], fields: FieldValues) -> tuple[NvLinkSample, ...]:
    """State, error counters and traffic of each link; the error-counter call where the batch has no answer."""
    samples = []
    for link in links:
        state = optional("nvmlDeviceGetNvLinkState", pynvml.nvmlDeviceGetNvLinkState, h, link)
        if isinstance(state, Unsupported):
            continue
        flit: int | float | Unsupported
        data: int | float | Unsupported
        replay: int | float | Unsupported
        recovery: int | float | Unsupported
        if link < len(FI_LINK_CRC_FLIT):
            flit = fields.get((FI_LINK_CRC_FLIT[link], 0), UNSUPPORTED)
            data = fields.get((FI_LINK_CRC_DATA[link], 0), UNSUPPORTED)
            replay = fields.get((FI_LINK_REPLAY[link], 0), UNSUPPORTED)
            recovery = fields.get((FI_LINK_RECOVERY[link], 0), UNSUPPORTED)
        else:
            flit = data = replay = recovery = UNSUPPORTED
        # Links past 11 have no per-link field IDs; a driver may also refuse them. Ask the error-counter call.
        if flit is UNSUPPORTED and data is UNSUPPORTED:
            flit = _link_error(h, link, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
            data = _link_error(h, link, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
        if replay is UNSUPPORTED:
            replay = _link_error(h, link, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
        if recovery is UNSUPPORTED:
            recovery = _link_error(h, link, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)
        crc = [part for part in (flit, data) if not isinstance(part, Unsupported)]
        samples.append(
            NvLinkSample(
                link=link,
                state=LinkState.UP if state else LinkState.DOWN,
                crc_errors=sum(int(part) for part in crc) if crc else UNSUPPORTED,
                replay_errors=as_int(replay),
                recovery_errors=as_int(recovery),
                tx_bytes=as_int(scaled(fields.get((FI_NVLINK_TX, link), UNSUPPORTED), _KIB)),
                rx_bytes=as_int(scaled(fields.get((FI_NVLINK_RX, link), UNSUPPORTED), _KIB)),
            )
        )
    return tuple(samples)


def _link_error(h: DeviceHandle, link: int, counter: int) -> int | Unsupported:
    return as_int(optional("nvmlDeviceGetNvLinkErrorCounter", pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter))


__all__ = [
    "DEVICE_FIELDS",
    "FieldKey",
    "FieldValues",
    "decode_field",
    "device_field",
    "field_request",
    "nvlink_samples",
    "read_fields",
    "remapped_rows",
]
