"""dcgm-exporter compatible series (opt-in), so dashboards and alerts written for dcgm-exporter keep working.

Names, units and labels follow dcgm-exporter's default counters (``etc/default-counters.csv``): clocks in MHz,
memory in MiB, utilization in percent, energy in millijoules, with the labels ``gpu``, ``UUID``, ``device``,
``modelName``, ``Hostname``, ``pci_bus_id`` and ``DCGM_FI_DRIVER_VERSION`` on every series. They are built from the
same Snapshot as the ``xpu_*`` metrics, so both agree. dcgm-exporter's counters have no ``_total`` suffix; to keep
the names exact they are exposed untyped (``rate()`` works the same). See docs/dcgm-compat.md for the mapping and
for what cannot be provided (the DCGM_FI_PROF_* profiling fields, encoder/decoder utilization, vGPU licensing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric

from exporter.backends.types import UNSUPPORTED, DeviceSample, Unsupported
from exporter.snapshot import GpuSnapshot, Snapshot

MIB = float(1 << 20)
LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "DCGM_FI_DRIVER_VERSION")


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    help: str
    read: Callable[[DeviceSample], float | None]
    counter: bool = False


def _opt(value: object, scale: float = 1.0) -> float | None:
    if value is UNSUPPORTED or value is None or isinstance(value, Unsupported):
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value) * scale
    return None


def _remap(s: DeviceSample, attr: str) -> float | None:
    rows = s.remapped_rows
    return None if isinstance(rows, Unsupported) else _opt(getattr(rows, attr))


def _nvlink_sum(s: DeviceSample, attr: str) -> float | None:
    if isinstance(s.nvlinks, Unsupported) or not s.nvlinks:
        return None
    values = [getattr(link, attr) for link in s.nvlinks]
    known = [v for v in values if not isinstance(v, Unsupported)]
    return float(sum(known)) if known else None


FIELDS: tuple[_Field, ...] = (
    _Field("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda s: _opt(s.sm_clock_mhz)),
    _Field("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda s: _opt(s.memory_clock_mhz)),
    _Field("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", lambda s: _opt(s.temperature_memory_celsius)),
    _Field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda s: _opt(s.temperature_gpu_celsius)),
    _Field("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda s: _opt(s.power_draw_watts)),
    _Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        lambda s: _opt(s.energy_joules, 1000.0),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", lambda s: _opt(s.pcie_replay_count), True
    ),
    _Field("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda s: _opt(s.gpu_utilization_ratio, 100.0)),
    _Field(
        "DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda s: _opt(s.memory_utilization_ratio, 100.0)
    ),
    _Field("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda s: s.memory_free_bytes / MIB),
    _Field("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda s: s.memory_used_bytes / MIB),
    _Field(
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB).",
        lambda s: _opt(s.memory_reserved_bytes, 1 / MIB),
    ),
    _Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        lambda s: _remap(s, "uncorrectable"),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        lambda s: _remap(s, "correctable"),
        counter=True,
    ),
    _Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", lambda s: _remap(s, "failure")),
    # shipped commented out in default-counters.csv; cheap here and used by common alert rules
    _Field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        lambda s: _opt(s.ecc.corrected_volatile),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        lambda s: _opt(s.ecc.uncorrected_volatile),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Total number of single-bit persistent ECC errors.",
        lambda s: _opt(s.ecc.corrected_aggregate),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
        lambda s: _opt(s.ecc.uncorrected_aggregate),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "Total number of NVLink retries.",
        lambda s: _nvlink_sum(s, "replay_errors"),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "Total number of NVLink recovery errors.",
        lambda s: _nvlink_sum(s, "recovery_errors"),
        counter=True,
    ),
)


def _family(field: _Field) -> Metric:
    # counters keep dcgm-exporter's exact name (no _total), so they are exposed untyped
    return Metric(field.name, field.help, "unknown" if field.counter else "gauge")


class DcgmCompatCollector:
    """dcgm-exporter's default series. ``last_xid`` (optional) gives the last XID per GPU index for
    DCGM_FI_DEV_XID_ERRORS; the exporter itself does not see XIDs (the daemon's fault pipeline does)."""

    name = "dcgm_compat"

    def __init__(self, hostname: str, last_xid: Callable[[], Mapping[int, int]] | None = None) -> None:
        self._hostname = hostname
        self._last_xid = last_xid

    def _labels(self, snapshot: Snapshot, gpu: GpuSnapshot) -> dict[str, str]:
        info = gpu.info
        assert info is not None
        minor = info.minor_number
        device = f"nvidia{minor}" if isinstance(minor, int) else f"nvidia{gpu.index}"
        driver = snapshot.system.driver_version if snapshot.system else ""
        values = (str(gpu.index), info.uuid, device, info.name, self._hostname, info.pci_bus_id, driver)
        return dict(zip(LABELS, values, strict=True))

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        return list(self._families(snapshot))

    def _families(self, snapshot: Snapshot) -> Iterator[Metric]:
        gpus = [g for g in snapshot.gpus if g.info is not None and g.fresh and g.sample is not None]
        for field in FIELDS:
            family = _family(field)
            for gpu in gpus:
                assert gpu.sample is not None
                value = field.read(gpu.sample)
                if value is not None:
                    family.add_sample(field.name, self._labels(snapshot, gpu), value)
            if field.name in ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"):
                self._add_mig(family, snapshot, gpus, used=field.name == "DCGM_FI_DEV_FB_USED")
            yield family
        if self._last_xid is not None:
            xid = Metric("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge")
            last = self._last_xid()
            for gpu in snapshot.gpus:
                if gpu.info is not None:
                    xid.add_sample(xid.name, self._labels(snapshot, gpu), float(last.get(gpu.index, 0)))
            yield xid

    def _add_mig(self, family: Metric, snapshot: Snapshot, gpus: list[GpuSnapshot], *, used: bool) -> None:
        """Per MIG device memory, labelled like dcgm-exporter's GPU-instance entities (GPU_I_PROFILE, GPU_I_ID)."""
        for gpu in gpus:
            for mig in gpu.mig_instances:
                if isinstance(mig.memory_used_bytes, Unsupported):
                    continue
                labels = {**self._labels(snapshot, gpu), "GPU_I_PROFILE": mig.profile_name,
                          "GPU_I_ID": str(mig.gpu_instance_id)}  # fmt: skip
                value = mig.memory_used_bytes if used else mig.memory_total_bytes - mig.memory_used_bytes
                family.add_sample(family.name, labels, value / MIB)
