"""dcgm-exporter's series names, help texts and units for each release line that ``[exporter] dcgm_compat_version``
selects. The collector (dcgm_compat.py) reads every value in base units (Hz, J, 0-1 ratios, bytes, bytes/s); a
version's ``scale`` turns that into its own unit.

Sources:

- "4.8": dcgm-exporter's ``etc/default-counters.csv`` at tag 4.5.3-4.8.2 (github.com/NVIDIA/dcgm-exporter, commit
  691c92762eb5; the profiling preset ``etc/dcp-metrics-included.csv`` there has the same active rows): names, types
  and units as written in its help column. The host-name label is the collector's setting, the driver-version label
  is ``DCGM_FI_DRIVER_VERSION`` (a ``label`` row of the CSV: the field's name is the label's name).
  DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL is what DCGM computes in
  ``dcgmlib/src/DcgmCacheManager.cpp`` ReadAndCacheNvLinkBandwidth (github.com/NVIDIA/DCGM, tag v4.6.0): NVML's
  KiB counters differenced per second, divided by 1000 and truncated to an integer.
- "4.10": dcgm-exporter 4.9.0 (DCGM 4.7) renamed its 23 default and profiling-preset fields to DCGM's
  standard names and moved 11 of them to base units (clocks in Hz, energy in J, utilization as a 0-1 ratio, memory
  in bytes, NVLink throughput in bytes/s), renamed the driver-version label to DCGM_FI_SYSTEM_DRIVER_VERSION and
  added DCGM_FI_DEV_FB_CAPACITY_BYTES to the defaults; 4.10.0 (DCGM 4.8) renamed DCGM_FI_PROF_{PCIE,NVLINK}_{TX,RX}_
  BYTES to ..._BYTES_PER_SECOND (release notes of github.com/NVIDIA/dcgm-exporter tags 4.9.0 and 4.10.0). The new
  names are DCGM's field catalogue: the "Deprecated ... renamed per DCGM Field Naming Standard" table and the base
  unit fields 1600-1612 of ``dcgmlib/dcgm_fields.h`` (NVIDIA/DCGM tag v4.6.0; go-dcgm commit b7fa3154 for DCGM
  4.6.1), and for the fields DCGM 4.7 added (1613-1616 utilization ratios, 1625-1628 framebuffer bytes, 1648 NVLink
  bytes per second) DCGM's Field Identifiers reference (docs.nvidia.com/datacenter/dcgm/latest/reference/
  field-identifiers.html). The dcgm-exporter sources of tags 4.9.0 and 4.10.0 themselves were not available to
  read; their help texts are therefore DCGM's field descriptions, not dcgm-exporter's CSV wording.

docs/dcgm-compat.md has the mapping as a table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

VERSIONS = ("4.8", "4.10")
DEFAULT_VERSION = "4.10"
MIB = float(1 << 20)


@dataclass(frozen=True, slots=True)
class Name:
    """One series in one release line: its name, help text and the factor from the base unit to its unit."""

    name: str
    help: str
    multiply: float = 1.0  # value = base value * multiply / divide (two exact factors: 1e-6 is not exact in binary)
    divide: float = 1.0
    counter: bool = False  # a CSV "counter": exposed untyped, so the name keeps no _total suffix
    integer: bool = False  # DCGM stores it as an integer (truncated)


# Keys are what the collector reads, each in its base unit.
V4_8: Mapping[str, Name] = {
    "sm_clock": Name("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", divide=1e6),
    "memory_clock": Name("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", divide=1e6),
    "memory_temp": Name("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),
    "gpu_temp": Name("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    "power": Name("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    "energy": Name(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", 1e3, counter=True
    ),
    "pcie_replays": Name("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", counter=True),
    "gpu_util": Name("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 100.0),
    "memory_util": Name("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 100.0),
    "encoder_util": Name("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", 100.0),
    "decoder_util": Name("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", 100.0),
    "fb_free": Name("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", divide=MIB),
    "fb_used": Name("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", divide=MIB),
    "fb_reserved": Name("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", divide=MIB),
    "remap_uncorrectable": Name(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors", counter=True
    ),
    "remap_correctable": Name(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors", counter=True
    ),
    "remap_failure": Name("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed"),
    # shipped commented out in default-counters.csv; cheap here and used by common alert rules
    "ecc_sbe_volatile": Name(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", counter=True
    ),
    "ecc_dbe_volatile": Name(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", counter=True
    ),
    "ecc_sbe_aggregate": Name(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors.", counter=True
    ),
    "ecc_dbe_aggregate": Name(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors.", counter=True
    ),
    "nvlink_replays": Name(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries.", counter=True
    ),
    "nvlink_recoveries": Name(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "Total number of NVLink recovery errors.", counter=True
    ),
    "nvlink_total": Name(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "Total number of NVLink bandwidth counters for all lanes.",
        divide=1024 * 1000,  # bytes/s -> KiB/s -> DCGM's "MB/s" (KiB/s / 1000)
        counter=True,
        integer=True,
    ),
    "xid": Name("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
    "prof_graphics": Name("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active."),
    "prof_sm_active": Name("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least one warp assigned."),
    "prof_sm_occupancy": Name("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of resident warps to the SM's maximum."),
    "prof_tensor": Name("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "prof_dram": Name(
        "DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data."
    ),
    "prof_fp64": Name("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the fp64 pipes are active."),
    "prof_fp32": Name("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the fp32 pipes are active."),
    "prof_fp16": Name("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the fp16 pipes are active."),
    "prof_nvlink_tx": Name("DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLink bytes sent per second."),
    "prof_nvlink_rx": Name("DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLink bytes received per second."),
    "prof_pcie_tx": Name(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in"
        " bytes per second.",
    ),
    "prof_pcie_rx": Name(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes"
        " per second.",
    ),
}

V4_10: Mapping[str, Name] = {
    "sm_clock": Name("DCGM_FI_DEV_SM_CLOCK_HERTZ", "SM clock for the device in hertz."),
    "memory_clock": Name("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "Memory clock for the device in hertz."),
    "memory_temp": Name("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "Memory temperature for the device, in degrees C."),
    "gpu_temp": Name("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "Current temperature readings for the device, in degrees C."),
    "power": Name("DCGM_FI_DEV_BOARD_POWER_WATTS", "Power usage for the device in Watts."),
    "energy": Name(
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
        "Total GPU energy consumption in joules since the driver was last reloaded.",
        counter=True,
    ),
    "pcie_replays": Name("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "PCIe replay counter.", counter=True),
    "gpu_util": Name("DCGM_FI_DEV_GPU_UTIL_RATIO", "GPU utilization as a ratio (0.0-1.0)."),
    "memory_util": Name("DCGM_FI_DEV_MEMORY_UTIL_RATIO", "Memory utilization as a ratio (0.0-1.0)."),
    "encoder_util": Name("DCGM_FI_DEV_ENC_UTIL_RATIO", "Encoder utilization as a ratio (0.0-1.0)."),
    "decoder_util": Name("DCGM_FI_DEV_DEC_UTIL_RATIO", "Decoder utilization as a ratio (0.0-1.0)."),
    "fb_capacity": Name("DCGM_FI_DEV_FB_CAPACITY_BYTES", "Total framebuffer memory of the GPU in bytes."),
    "fb_free": Name("DCGM_FI_DEV_FB_FREE_BYTES", "Free framebuffer memory in bytes."),
    "fb_used": Name("DCGM_FI_DEV_FB_USED_BYTES", "Used framebuffer memory in bytes."),
    "fb_reserved": Name("DCGM_FI_DEV_FB_RESERVED_BYTES", "Reserved framebuffer memory in bytes."),
    "remap_uncorrectable": Name(
        "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", "Number of remapped rows for uncorrectable errors.", counter=True
    ),
    "remap_correctable": Name(
        "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", "Number of remapped rows for correctable errors.", counter=True
    ),
    "remap_failure": Name("DCGM_FI_DEV_ROW_REMAP_FAILED", "Whether remapping of rows has failed."),
    # not renamed by DCGM (fields 310-313)
    "ecc_sbe_volatile": V4_8["ecc_sbe_volatile"],
    "ecc_dbe_volatile": V4_8["ecc_dbe_volatile"],
    "ecc_sbe_aggregate": V4_8["ecc_sbe_aggregate"],
    "ecc_dbe_aggregate": V4_8["ecc_dbe_aggregate"],
    "nvlink_replays": Name("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL", "Total number of NVLink retries.", counter=True),
    "nvlink_recoveries": Name(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL", "Total number of NVLink recovery errors.", counter=True
    ),
    "nvlink_total": Name(
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND", "NVLink throughput of all links in bytes per second."
    ),
    "xid": Name("DCGM_FI_DEV_XID_ERROR", "Value of the last XID error encountered."),
    "prof_graphics": Name("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", V4_8["prof_graphics"].help),
    "prof_sm_active": Name("DCGM_FI_PROF_SM_UTIL_RATIO", V4_8["prof_sm_active"].help),
    "prof_sm_occupancy": Name("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", V4_8["prof_sm_occupancy"].help),
    "prof_tensor": Name("DCGM_FI_PROF_TENSOR_UTIL_RATIO", V4_8["prof_tensor"].help),
    "prof_dram": Name("DCGM_FI_PROF_DRAM_UTIL_RATIO", V4_8["prof_dram"].help),
    "prof_fp64": Name("DCGM_FI_PROF_FP64_UTIL_RATIO", V4_8["prof_fp64"].help),
    "prof_fp32": Name("DCGM_FI_PROF_FP32_UTIL_RATIO", V4_8["prof_fp32"].help),
    "prof_fp16": Name("DCGM_FI_PROF_FP16_UTIL_RATIO", V4_8["prof_fp16"].help),
    "prof_nvlink_tx": Name("DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND", V4_8["prof_nvlink_tx"].help),
    "prof_nvlink_rx": Name("DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND", V4_8["prof_nvlink_rx"].help),
    "prof_pcie_tx": Name("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", V4_8["prof_pcie_tx"].help),
    "prof_pcie_rx": Name("DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND", V4_8["prof_pcie_rx"].help),
}


@dataclass(frozen=True, slots=True)
class Naming:
    version: str
    names: Mapping[str, Name]
    driver_label: str


NAMINGS: Mapping[str, Naming] = {
    "4.8": Naming("4.8", V4_8, "DCGM_FI_DRIVER_VERSION"),
    "4.10": Naming("4.10", V4_10, "DCGM_FI_SYSTEM_DRIVER_VERSION"),
}


def naming(version: str) -> Naming:
    if version not in NAMINGS:
        raise ValueError(f"dcgm-exporter version must be one of {', '.join(VERSIONS)}, got {version!r}")
    return NAMINGS[version]
