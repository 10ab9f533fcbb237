"""dcgm-exporter's names by release line (``[exporter] dcgm_compat_version``): 4.10 (the default: 4.9.0's standard
names and base units, 4.10.0's _BYTES_PER_SECOND profiling names, DCGM_FI_SYSTEM_DRIVER_VERSION) and 4.8 (the names
before). Both tables are in exporter/collectors/dcgm_fields.py with their sources; the golden files of both lines are
checked by test_golden_exposition.py."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.collectors.dcgm_compat import CARD_FIELDS, PROF_ACTIVITY, PROF_NVLINK, DcgmCompatCollector
from exporter.collectors.dcgm_fields import DEFAULT_VERSION, V4_8, V4_10, VERSIONS
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.daemon.cards import CardMetrics
from healthd.daemon.config import ConfigError, parse_config
from tests.support.clock import FakeClock

Series = list[tuple[str, dict[str, str], float]]
# dcgm-exporter 4.8's active rows (etc/default-counters.csv at 4.5.3-4.8.2) that a bare-metal card has, and the
# names 4.9.0/4.10.0 give them (DCGM's catalogue)
RENAMED_DEFAULTS = {
    "DCGM_FI_DEV_SM_CLOCK": "DCGM_FI_DEV_SM_CLOCK_HERTZ",
    "DCGM_FI_DEV_MEM_CLOCK": "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ",
    "DCGM_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
    "DCGM_FI_DEV_GPU_UTIL": "DCGM_FI_DEV_GPU_UTIL_RATIO",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "DCGM_FI_DEV_MEMORY_UTIL_RATIO",
    "DCGM_FI_DEV_ENC_UTIL": "DCGM_FI_DEV_ENC_UTIL_RATIO",
    "DCGM_FI_DEV_DEC_UTIL": "DCGM_FI_DEV_DEC_UTIL_RATIO",
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
    "DCGM_FI_DEV_FB_FREE": "DCGM_FI_DEV_FB_FREE_BYTES",
    "DCGM_FI_DEV_FB_USED": "DCGM_FI_DEV_FB_USED_BYTES",
    "DCGM_FI_DEV_FB_RESERVED": "DCGM_FI_DEV_FB_RESERVED_BYTES",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND",  # 4.10.0
    "DCGM_FI_PROF_PCIE_RX_BYTES": "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND",  # 4.10.0
}
# base-unit readings each unit-changing field agrees with (same card, same sample)
BASE_UNITS = {
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": ("xpu_gpu_sm_clock_hertz", {}),
    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": ("xpu_gpu_memory_clock_hertz", {}),
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": ("xpu_gpu_energy_joules_total", {}),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": ("xpu_gpu_utilization_ratio", {}),
    "DCGM_FI_DEV_MEMORY_UTIL_RATIO": ("xpu_gpu_memory_utilization_ratio", {}),
    "DCGM_FI_DEV_ENC_UTIL_RATIO": ("xpu_gpu_encoder_utilization_ratio", {}),
    "DCGM_FI_DEV_DEC_UTIL_RATIO": ("xpu_gpu_decoder_utilization_ratio", {}),
    "DCGM_FI_DEV_FB_FREE_BYTES": ("xpu_gpu_memory_free_bytes", {}),
    "DCGM_FI_DEV_FB_USED_BYTES": ("xpu_gpu_memory_used_bytes", {}),
    "DCGM_FI_DEV_FB_RESERVED_BYTES": ("xpu_gpu_memory_reserved_bytes", {}),
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": ("xpu_gpu_memory_total_bytes", {}),
    "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND": ("xpu_gpu_pcie_transmit_bytes_per_second", {}),
    "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND": ("xpu_gpu_nvlink_receive_bytes_per_second", {}),
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": ("xpu_gpu_tensor_active_ratio", {"pipe": "any"}),
}


@pytest.fixture
def snapshot(sim: SimulatedBackend, clock: FakeClock) -> Snapshot:
    s = Sampler(sim, SamplerSettings(interval_seconds=1.0, call_deadline_seconds=2.0), clock=clock)
    s.run_once()
    clock.advance(10)
    snap = s.run_once()
    s.stop()
    return snap


def series(snapshot: Snapshot, collectors: list[object]) -> Series:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(lambda: snapshot, collectors, clock=lambda: snapshot.taken_at))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def value(found: Series, name: str, gpu: str, **extra: str) -> float:
    values = [v for n, ls, v in found if n == name and ls.get("gpu") == gpu and "GPU_I_ID" not in ls
              and extra.items() <= ls.items()]  # fmt: skip
    assert len(values) == 1, (name, gpu, values)
    return values[0]


def test_the_default_is_the_newest_line() -> None:
    assert DEFAULT_VERSION == VERSIONS[-1] == "4.10"
    assert parse_config({}).exporter.dcgm_compat_version == "4.10"
    assert parse_config({"exporter": {"dcgm_compat_version": "4.8"}}).exporter.dcgm_compat_version == "4.8"
    with pytest.raises(ConfigError, match=r"^exporter\.dcgm_compat_version: must be one of"):
        parse_config({"exporter": {"dcgm_compat_version": "4.9"}})
    with pytest.raises(ValueError, match=r"4\.8, 4\.10"):
        DcgmCompatCollector("n", version="5.0")


def test_the_daemon_passes_the_setting_on(snapshot: Snapshot) -> None:
    for version, sm_clock in (("4.8", "DCGM_FI_DEV_SM_CLOCK"), ("4.10", "DCGM_FI_DEV_SM_CLOCK_HERTZ")):
        config = parse_config({"exporter": {"dcgm_compat": True, "dcgm_compat_version": version}})
        (collector,) = [c for c in CardMetrics(config.exporter).collectors() if c.name == "dcgm_compat"]
        assert {n for n, _, _ in series(snapshot, [collector])} >= {sm_clock}


def test_4_10_names_labels_and_units(snapshot: Snapshot) -> None:
    found = series(snapshot, [*default_collectors(), DcgmCompatCollector("node-a", last_xid=lambda: {3: 79})])
    names = {n for n, _, _ in found}
    assert names >= set(RENAMED_DEFAULTS.values()) | {"DCGM_FI_DEV_FB_CAPACITY_BYTES"}
    assert not names & set(RENAMED_DEFAULTS), "no 4.8 name is left"
    for name, labels, _ in found:
        if name.startswith("DCGM_"):
            assert labels["DCGM_FI_SYSTEM_DRIVER_VERSION"] == "580.159.04"
            assert "DCGM_FI_DRIVER_VERSION" not in labels and labels["hostname"] == "node-a"
    for g in ("0", "1", "5"):
        for dcgm, (xpu, extra) in BASE_UNITS.items():
            assert value(found, dcgm, g) == value(found, xpu, g, **extra), dcgm
        tx, rx = (value(found, f"xpu_gpu_nvlink_{d}_bytes_per_second", g) for d in ("transmit", "receive"))
        assert value(found, "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND", g) == tx + rx
    assert value(found, "DCGM_FI_DEV_XID_ERROR", "3") == 79


def test_both_lines_export_the_same_series_in_their_own_units(snapshot: Snapshot) -> None:
    """Every 4.8 series has its 4.10 counterpart with the same labels (but the driver label's name) and the same
    reading; only 4.10 adds the capacity."""
    old = [s for s in series(snapshot, [DcgmCompatCollector("n", last_xid=lambda: {3: 79}, version="4.8")])
           if s[0].startswith("DCGM_")]  # fmt: skip
    new = [s for s in series(snapshot, [DcgmCompatCollector("n", last_xid=lambda: {3: 79}, version="4.10")])
           if s[0].startswith("DCGM_")]  # fmt: skip
    by_key = {V4_8[k].name: V4_10[k] for k in V4_8}
    assert old and len(old) == len([s for s in new if s[0] != "DCGM_FI_DEV_FB_CAPACITY_BYTES"])
    new_index = {(n, tuple(sorted(ls.items()))): v for n, ls, v in new}
    for name, ls, v in old:
        old_spec = next(V4_8[k] for k in V4_8 if V4_8[k].name == name)
        new_spec = by_key[name]
        labels = dict(ls)
        labels["DCGM_FI_SYSTEM_DRIVER_VERSION"] = labels.pop("DCGM_FI_DRIVER_VERSION")
        got = new_index[(new_spec.name, tuple(sorted(labels.items())))]
        base = got * new_spec.divide / new_spec.multiply
        expected = base * old_spec.multiply / old_spec.divide
        assert v == (int(expected) if old_spec.integer else pytest.approx(expected)), name


def test_tables_cover_every_field_the_collector_reads() -> None:
    keys = {k for k, _ in CARD_FIELDS} | {k for k, _ in (*PROF_ACTIVITY, *PROF_NVLINK)}
    keys |= {"encoder_util", "decoder_util", "prof_pcie_tx", "prof_pcie_rx", "nvlink_total", "xid"}
    assert set(V4_10) == keys
    assert set(V4_8) == keys - {"fb_capacity"}  # 4.9.0 added it to the defaults
    for table in (V4_8, V4_10):
        assert len({spec.name for spec in table.values()}) == len(table), "two fields with one name"
    changed_unit = {V4_8[k].name for k in V4_8 if (V4_8[k].multiply, V4_8[k].divide) != (1.0, 1.0)}
    assert changed_unit == {
        "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    }, "the 11 default fields whose unit 4.9.0 changed"  # fmt: skip
    assert all((s.multiply, s.divide) == (1.0, 1.0) for s in V4_10.values()), "4.10: base units throughout"
    for old, new in RENAMED_DEFAULTS.items():
        assert any(V4_8[k].name == old and V4_10[k].name == new for k in V4_8), old
