"""The Backend contract: invariants every backend holds, checked against each one.

Params: the simulated backend on the ``h200x8`` and ``h200x1`` scenarios (always), and the real NVML backend
when ``XPU_TEST_REAL_NVML=1`` (on a machine with an NVIDIA GPU). Tests never change a real card: the MIG
create/destroy contract runs on simulated backends only.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from exporter.backends.errors import BackendError, InsufficientResourcesError, InUseError, NotFoundError
from exporter.backends.protocol import Backend, UnknownGpuError
from exporter.backends.recovery import decode_recovery_action
from exporter.backends.types import (
    UNKNOWN,
    UNSUPPORTED,
    ComputeMode,
    DeviceEvent,
    DeviceInfo,
    DeviceProfiling,
    DeviceSample,
    EccCounts,
    EventKind,
    GpuProcess,
    LinkState,
    MediaEngine,
    MigInstance,
    NvLinkSample,
    PcieThroughput,
    ProfilingMetric,
    ProfilingSample,
    RemappedRows,
    Unsupported,
)

REAL_NVML = os.environ.get("XPU_TEST_REAL_NVML") == "1"
PCI_BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]$")
PROFILE_NAME = re.compile(r"^(\d+)g\.\d+gb")
H200_STYLE_MEMORY_SLICES = 8  # Hopper (H100/H200) cards split memory into 8 MIG slices

BACKENDS = [
    pytest.param("simulated:h200x8", id="simulated-h200x8"),
    pytest.param("simulated:h200x1", id="simulated-h200x1"),
    pytest.param(
        "nvml",
        id="nvml",
        marks=[
            pytest.mark.real_nvml,
            pytest.mark.skipif(not REAL_NVML, reason="real NVML: set XPU_TEST_REAL_NVML=1 on a machine with a GPU"),
        ],
    ),
]


def _make(kind: str) -> Backend:
    if kind == "nvml":
        from exporter.backends.nvml import NvmlBackend

        return NvmlBackend()
    from exporter.backends.scenario import load_scenario
    from exporter.backends.simulated import SimulatedBackend

    return SimulatedBackend(load_scenario(kind.removeprefix("simulated:")))


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    b = _make(request.param)
    b.open()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def simulated(backend: Backend) -> Backend:
    """The same backend, for tests that change state: never run on a real card."""
    if backend.name == "nvml":
        pytest.skip("mutating contract tests run on simulated backends only")
    return backend


def _indexes(backend: Backend) -> range:
    return range(backend.device_count())


def _check_type(owner: str, name: str, value: Any, kinds: tuple[type, ...]) -> None:
    """``value`` is UNSUPPORTED or one of ``kinds``; a bool never passes for a number."""
    assert value is not None, f"{owner}.{name} is None (must be a value or UNSUPPORTED)"
    if value is UNSUPPORTED:
        return
    assert isinstance(value, kinds), f"{owner}.{name}={value!r} is {type(value).__name__}, want {kinds}"
    if bool not in kinds:
        assert not isinstance(value, bool), f"{owner}.{name}={value!r} is a bool, want a number"


INT = (int,)
NUMBER = (int, float)
BOOL = (bool,)

SAMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "gpu_utilization_ratio": NUMBER,
    "memory_utilization_ratio": NUMBER,
    "memory_used_bytes": INT,
    "memory_free_bytes": INT,
    "memory_reserved_bytes": INT,
    "temperature_gpu_celsius": NUMBER,
    "temperature_memory_celsius": NUMBER,
    "power_draw_watts": NUMBER,
    "power_limit_watts": NUMBER,
    "energy_joules": NUMBER,
    "sm_clock_mhz": INT,
    "memory_clock_mhz": INT,
    "clock_event_reasons": INT,
    "performance_state": INT,
    "pcie_generation": INT,
    "pcie_width": INT,
    "pcie_replay_count": INT,
    "ecc": (EccCounts,),
    "remapped_rows": (RemappedRows,),
    "recovery_action": INT,
    "nvlinks": (tuple,),
    "compute_mode": (ComputeMode,),
    "persistence_mode": BOOL,
    "mig_mode_current": BOOL,
    "mig_mode_pending": BOOL,
}
REQUIRED_SAMPLE_FIELDS = {"memory_used_bytes", "memory_free_bytes", "ecc"}

INFO_TYPES: dict[str, tuple[type, ...]] = {
    "index": INT,
    "uuid": (str,),
    "name": (str,),
    "pci_bus_id": (str,),
    "serial": (str,),
    "minor_number": INT,
    "memory_total_bytes": INT,
    "sm_clock_max_mhz": INT,
    "memory_clock_max_mhz": INT,
    "pcie_generation_max": INT,
    "pcie_width_max": INT,
    "power_limit_default_mw": INT,
    "nvlink_count": INT,
    "mig_capable": BOOL,
    "compute_capability": (tuple,),
    "vbios_version": (str,),
}
REQUIRED_INFO_FIELDS = {"index", "uuid", "name", "pci_bus_id", "memory_total_bytes", "nvlink_count", "mig_capable"}


# --- lifecycle and identity ------------------------------------------------------------------------------------


def test_implements_the_protocol(backend: Backend) -> None:
    assert isinstance(backend, Backend)
    assert isinstance(backend.name, str)
    assert backend.name


def test_fault_injection_is_a_capability(backend: Backend) -> None:
    """Real cards offer no injector; an injector names its kinds and refuses cards the node does not have, before it
    touches any card."""
    injector = backend.injector
    if backend.name == "nvml":
        assert injector is None
        return
    assert injector is not None
    assert injector.kinds, "an injector with no fault kinds"
    for kind, params in injector.kinds.items():
        assert isinstance(kind, str) and kind
        assert isinstance(params, frozenset) and all(isinstance(p, str) for p in params)
    count = backend.device_count()
    kind = sorted(injector.kinds)[0]
    for gpu in (count, count + 7, -1):
        with pytest.raises(UnknownGpuError) as err:
            injector.inject(kind, gpu, {})
        assert err.value.gpu == gpu and err.value.count == count
        assert isinstance(err.value, ValueError)  # a caller's mistake, as any other bad parameter
        with pytest.raises(UnknownGpuError):
            injector.clear(gpu)
    assert isinstance(injector.clear(), str)


def test_system_info(backend: Backend) -> None:
    info = backend.system_info()
    assert isinstance(info.driver_version, str)
    assert info.driver_version
    assert isinstance(info.nvml_version, str)
    _check_type("SystemInfo", "cuda_driver_version", info.cuda_driver_version, INT)
    if not isinstance(info.cuda_driver_version, Unsupported):
        assert info.cuda_driver_version > 0
    assert isinstance(info.backend, str)
    assert info.backend


def test_device_count_is_positive(backend: Backend) -> None:
    count = backend.device_count()
    assert isinstance(count, int)
    assert count >= 1


def test_device_info_types(backend: Backend) -> None:
    for index in _indexes(backend):
        info = backend.device_info(index)
        assert isinstance(info, DeviceInfo)
        for field in dataclasses.fields(info):
            value = getattr(info, field.name)
            _check_type("DeviceInfo", field.name, value, INFO_TYPES[field.name])
            if field.name in REQUIRED_INFO_FIELDS:
                assert value is not UNSUPPORTED, f"DeviceInfo.{field.name} is required"


def test_device_info_identity(backend: Backend) -> None:
    infos = [backend.device_info(index) for index in _indexes(backend)]
    for index, info in enumerate(infos):
        assert info.index == index
        assert info.uuid.startswith("GPU-"), info.uuid
        assert info.name
        assert PCI_BUS_ID.match(info.pci_bus_id), info.pci_bus_id
        assert info.memory_total_bytes > 0
        assert info.nvlink_count >= 0
        if not isinstance(info.compute_capability, Unsupported):
            major, minor = info.compute_capability
            assert isinstance(major, int)
            assert isinstance(minor, int)
            assert major >= 1
        for name in ("sm_clock_max_mhz", "memory_clock_max_mhz", "pcie_generation_max", "pcie_width_max"):
            value = getattr(info, name)
            if not isinstance(value, Unsupported):
                assert value > 0, name
    assert len({info.uuid for info in infos}) == len(infos), "UUIDs must be unique"
    assert len({info.pci_bus_id for info in infos}) == len(infos), "PCI bus ids must be unique"


def test_device_info_is_stable(backend: Backend) -> None:
    for index in _indexes(backend):
        assert backend.device_info(index) == backend.device_info(index)


@pytest.mark.parametrize(
    "call",
    [
        lambda b, i: b.device_info(i),
        lambda b, i: b.sample(i),
        lambda b, i: b.processes(i),
        lambda b, i: b.mig_profiles(i),
        lambda b, i: b.mig_instances(i),
        lambda b, i: b.profiling(i),
        lambda b, i: b.pcie_throughput(i),
    ],
    ids=["device_info", "sample", "processes", "mig_profiles", "mig_instances", "profiling", "pcie_throughput"],
)
def test_unknown_device_index_is_a_backend_error(backend: Backend, call: Any) -> None:
    for index in (backend.device_count(), backend.device_count() + 7, -1):
        with pytest.raises(BackendError):
            call(backend, index)


def test_close_twice_is_safe(backend: Backend) -> None:
    backend.close()
    backend.close()


def test_reopen_after_close(backend: Backend) -> None:
    uuid = backend.device_info(0).uuid
    backend.close()
    backend.open()
    assert backend.device_info(0).uuid == uuid
    assert isinstance(backend.sample(0), DeviceSample)


# --- samples ---------------------------------------------------------------------------------------------------


def test_sample_types(backend: Backend) -> None:
    for index in _indexes(backend):
        s = backend.sample(index)
        assert isinstance(s, DeviceSample)
        for field in dataclasses.fields(s):
            value = getattr(s, field.name)
            _check_type("DeviceSample", field.name, value, SAMPLE_TYPES[field.name])
            if field.name in REQUIRED_SAMPLE_FIELDS:
                assert value is not UNSUPPORTED, f"DeviceSample.{field.name} is required"
        for field in dataclasses.fields(s.ecc):
            kinds = BOOL if field.name.startswith("enabled") else INT
            _check_type("EccCounts", field.name, getattr(s.ecc, field.name), kinds)
        if not isinstance(s.remapped_rows, Unsupported):
            rows = s.remapped_rows
            assert isinstance(rows.correctable, int)
            assert isinstance(rows.uncorrectable, int)
            assert isinstance(rows.pending, bool)
            assert isinstance(rows.failure, bool)


def test_sample_memory_adds_up(backend: Backend) -> None:
    for index in _indexes(backend):
        total = backend.device_info(index).memory_total_bytes
        s = backend.sample(index)
        assert s.memory_used_bytes >= 0
        assert s.memory_free_bytes >= 0
        assert s.memory_used_bytes + s.memory_free_bytes <= total
        if not isinstance(s.memory_reserved_bytes, Unsupported):
            assert s.memory_reserved_bytes >= 0
            assert s.memory_used_bytes + s.memory_free_bytes + s.memory_reserved_bytes <= total * 1.01


def test_sample_ratios_and_ranges(backend: Backend) -> None:
    for index in _indexes(backend):
        info = backend.device_info(index)
        s = backend.sample(index)
        for name in ("gpu_utilization_ratio", "memory_utilization_ratio"):
            value = getattr(s, name)
            if not isinstance(value, Unsupported):
                assert 0.0 <= value <= 1.0, f"{name}={value}"
        for name in ("temperature_gpu_celsius", "temperature_memory_celsius"):
            value = getattr(s, name)
            if not isinstance(value, Unsupported):
                assert 0 <= value <= 120, f"{name}={value}"
        if not isinstance(s.power_limit_watts, Unsupported):
            assert s.power_limit_watts > 0
            if not isinstance(s.power_draw_watts, Unsupported):
                assert 0 < s.power_draw_watts <= s.power_limit_watts * 1.2
        elif not isinstance(s.power_draw_watts, Unsupported):
            assert s.power_draw_watts > 0
        if not isinstance(s.energy_joules, Unsupported):
            assert s.energy_joules >= 0
        if not isinstance(s.sm_clock_mhz, Unsupported) and not isinstance(info.sm_clock_max_mhz, Unsupported):
            assert 0 <= s.sm_clock_mhz <= info.sm_clock_max_mhz
        if not isinstance(s.memory_clock_mhz, Unsupported) and not isinstance(info.memory_clock_max_mhz, Unsupported):
            assert 0 <= s.memory_clock_mhz <= info.memory_clock_max_mhz
        if not isinstance(s.pcie_generation, Unsupported) and not isinstance(info.pcie_generation_max, Unsupported):
            assert 1 <= s.pcie_generation <= info.pcie_generation_max
        if not isinstance(s.pcie_width, Unsupported) and not isinstance(info.pcie_width_max, Unsupported):
            assert 0 <= s.pcie_width <= info.pcie_width_max
        if not isinstance(s.performance_state, Unsupported):
            assert 0 <= s.performance_state <= 15
        if not isinstance(s.clock_event_reasons, Unsupported):
            assert s.clock_event_reasons >= 0
        if not isinstance(s.recovery_action, Unsupported):
            # a raw value the driver's own branch defines (the numbering differs between branches)
            driver = backend.system_info().driver_version
            assert decode_recovery_action(s.recovery_action, driver) is not None, (s.recovery_action, driver)


def test_sample_error_counters_are_not_negative(backend: Backend) -> None:
    for index in _indexes(backend):
        s = backend.sample(index)
        for field in dataclasses.fields(s.ecc):
            value = getattr(s.ecc, field.name)
            if not field.name.startswith("enabled") and not isinstance(value, Unsupported):
                assert value >= 0, field.name
        if not isinstance(s.ecc.corrected_volatile, Unsupported) and not isinstance(
            s.ecc.corrected_aggregate, Unsupported
        ):
            assert s.ecc.corrected_volatile <= s.ecc.corrected_aggregate
        if not isinstance(s.ecc.uncorrected_volatile, Unsupported) and not isinstance(
            s.ecc.uncorrected_aggregate, Unsupported
        ):
            assert s.ecc.uncorrected_volatile <= s.ecc.uncorrected_aggregate
        if not isinstance(s.remapped_rows, Unsupported):
            assert s.remapped_rows.correctable >= 0
            assert s.remapped_rows.uncorrectable >= 0
        if not isinstance(s.pcie_replay_count, Unsupported):
            assert s.pcie_replay_count >= 0


COUNTERS = ("energy_joules", "pcie_replay_count")


def test_counters_are_monotonic(backend: Backend) -> None:
    for index in _indexes(backend):
        first = backend.sample(index)
        time.sleep(0.02)
        second = backend.sample(index)
        for name in COUNTERS:
            a, b = getattr(first, name), getattr(second, name)
            if not isinstance(a, Unsupported) and not isinstance(b, Unsupported):
                assert b >= a, f"GPU {index} {name} went back: {a} -> {b}"
        for name in ("corrected_aggregate", "uncorrected_aggregate"):
            a, b = getattr(first.ecc, name), getattr(second.ecc, name)
            if not isinstance(a, Unsupported) and not isinstance(b, Unsupported):
                assert b >= a, f"GPU {index} ecc.{name} went back: {a} -> {b}"
        if not isinstance(first.nvlinks, Unsupported) and not isinstance(second.nvlinks, Unsupported):
            before = {link.link: link for link in first.nvlinks}
            for link in second.nvlinks:
                if link.link not in before:
                    continue
                for name in ("crc_errors", "replay_errors", "recovery_errors", "tx_bytes", "rx_bytes"):
                    a, b = getattr(before[link.link], name), getattr(link, name)
                    if not isinstance(a, Unsupported) and not isinstance(b, Unsupported):
                        assert b >= a, f"GPU {index} link {link.link} {name} went back: {a} -> {b}"


def test_nvlinks(backend: Backend) -> None:
    for index in _indexes(backend):
        count = backend.device_info(index).nvlink_count
        links = backend.sample(index).nvlinks
        if count == 0:
            assert links is UNSUPPORTED or links == ()
            continue
        if isinstance(links, Unsupported):
            continue
        assert isinstance(links, tuple)
        numbers = [link.link for link in links]
        assert len(set(numbers)) == len(numbers), "link indexes must be unique"
        for link in links:
            assert isinstance(link, NvLinkSample)
            assert isinstance(link.link, int)
            assert 0 <= link.link < count
            assert isinstance(link.state, LinkState)
            for name in ("crc_errors", "replay_errors", "recovery_errors", "tx_bytes", "rx_bytes"):
                value = getattr(link, name)
                _check_type("NvLinkSample", name, value, INT)
                if not isinstance(value, Unsupported):
                    assert value >= 0, name


# --- profiling (GPM) and PCIe throughput ------------------------------------------------------------------------

GPM_MIN_INTERVAL_S = 0.15  # NVML wants >= 100 ms between the two samples of an interval


def _check_profiling_sample(where: str, reading: ProfilingSample, *, card: bool) -> None:
    assert isinstance(reading, ProfilingSample), where
    assert reading.interval_seconds >= 0.1, f"{where}: interval {reading.interval_seconds}"
    for metric, value in reading.metrics.items():
        assert isinstance(metric, ProfilingMetric), where
        assert isinstance(value, float), f"{where} {metric}={value!r}"
        if metric.is_rate:
            assert card, f"{where}: {metric} is a card metric, not a GPU instance's"
            assert value >= 0.0, f"{where} {metric}={value}"
        else:
            assert 0.0 <= value <= 1.0, f"{where} {metric}={value}"
    for (engine, n), busy in reading.engines.items():
        assert isinstance(engine, MediaEngine), where
        assert isinstance(n, int) and n >= 0, where
        assert 0.0 <= busy <= 1.0, f"{where} {engine}{n}={busy}"
    if not card:
        assert not reading.engines, f"{where}: engines are reported per card"


def test_profiling_brackets_an_interval(backend: Backend) -> None:
    """The first call only opens the interval; the next one, at least 100 ms later, reports it."""
    instances = {index: backend.mig_instances(index) for index in _indexes(backend)}
    first = {index: backend.profiling(index, instances[index]) for index in _indexes(backend)}
    time.sleep(GPM_MIN_INTERVAL_S)
    for index in _indexes(backend):
        opened, closed = first[index], backend.profiling(index, instances[index])
        for reading in (opened, closed):
            assert isinstance(reading, DeviceProfiling)
            assert isinstance(reading.gpm_supported, bool)
            for name in ("encoder_utilization_ratio", "decoder_utilization_ratio"):
                value = getattr(reading, name)
                _check_type("DeviceProfiling", name, value, NUMBER)
                if not isinstance(value, Unsupported):
                    assert 0.0 <= value <= 1.0, f"GPU {index} {name}={value}"
        assert opened.card is None and not opened.mig, f"GPU {index}: the first call has no interval yet"
        assert closed.gpm_supported == opened.gpm_supported
        if not closed.gpm_supported:
            assert closed.card is None and not closed.mig, f"GPU {index}: readings without GPM"
            continue
        if closed.card is not None:
            _check_profiling_sample(f"GPU {index}", closed.card, card=True)
        known = {m.gpu_instance_id for m in instances[index]}
        assert set(closed.mig) <= known, f"GPU {index}: readings for instances not asked for"
        for gi, reading in closed.mig.items():
            _check_profiling_sample(f"GPU {index} instance {gi}", reading, card=False)


def test_profiling_sooner_than_the_floor_reports_nothing_new(backend: Backend) -> None:
    backend.profiling(0)
    time.sleep(GPM_MIN_INTERVAL_S)
    backend.profiling(0)
    assert backend.profiling(0).card is None, "a second sample within 100 ms must not close an interval"


def test_pcie_throughput(backend: Backend) -> None:
    for index in _indexes(backend):
        reading = backend.pcie_throughput(index)
        assert isinstance(reading, PcieThroughput)
        for name in ("tx_bytes_per_second", "rx_bytes_per_second"):
            value = getattr(reading, name)
            _check_type("PcieThroughput", name, value, NUMBER)
            if not isinstance(value, Unsupported):
                assert value >= 0.0, f"GPU {index} {name}={value}"
        assert abs(reading.measured_at - time.time()) < 60


# --- processes -------------------------------------------------------------------------------------------------


def test_processes(backend: Backend) -> None:
    for index in _indexes(backend):
        total = backend.device_info(index).memory_total_bytes
        mig_on = backend.sample(index).mig_mode_current is True
        gpu_instances = {m.gpu_instance_id for m in backend.mig_instances(index)}
        procs = backend.processes(index)
        if procs is UNKNOWN:  # NVML refuses the parent's list to an unprivileged caller, and only with MIG on
            assert mig_on, f"GPU {index}: process list unknown with MIG off"
            continue
        assert isinstance(procs, tuple)
        pids = [p.pid for p in procs]
        assert len(set(pids)) == len(pids), f"GPU {index}: duplicate PIDs {pids}"
        for p in procs:
            assert isinstance(p, GpuProcess)
            assert isinstance(p.pid, int)
            assert not isinstance(p.pid, bool)
            assert p.pid > 0
            assert isinstance(p.name, str)
            _check_type("GpuProcess", "used_memory_bytes", p.used_memory_bytes, INT)
            _check_type("GpuProcess", "sm_utilization_ratio", p.sm_utilization_ratio, NUMBER)
            _check_type("GpuProcess", "gpu_instance_id", p.gpu_instance_id, INT)
            if not isinstance(p.used_memory_bytes, Unsupported):
                assert 0 <= p.used_memory_bytes <= total
            if not isinstance(p.sm_utilization_ratio, Unsupported):
                assert 0.0 <= p.sm_utilization_ratio <= 1.0
            if not mig_on:
                assert p.gpu_instance_id is UNSUPPORTED, "gpu_instance_id is UNSUPPORTED while MIG is off"
            elif not isinstance(p.gpu_instance_id, Unsupported):
                assert p.gpu_instance_id in gpu_instances


def test_processes_twice(backend: Backend) -> None:
    """A second call (SM utilization counts only samples newer than the first call's) keeps the invariants."""
    for index in _indexes(backend):
        backend.processes(index)
        again = backend.processes(index)
        if again is UNKNOWN:
            continue
        assert isinstance(again, tuple)
        assert len({p.pid for p in again}) == len(again)
        for p in again:
            _check_type("GpuProcess", "sm_utilization_ratio", p.sm_utilization_ratio, NUMBER)


# --- MIG -------------------------------------------------------------------------------------------------------


def _memory_slices(backend: Backend, index: int) -> int | None:
    name = backend.device_info(index).name
    return H200_STYLE_MEMORY_SLICES if ("H100" in name or "H200" in name) else None


def test_mig_profiles(backend: Backend) -> None:
    for index in _indexes(backend):
        info = backend.device_info(index)
        profiles = backend.mig_profiles(index)
        assert isinstance(profiles, tuple)
        if not info.mig_capable:
            assert profiles == ()
            continue
        ids = [p.profile_id for p in profiles]
        assert len(set(ids)) == len(ids), "profile ids must be unique"
        slices = _memory_slices(backend, index)
        all_ends = [start + size for p in profiles for start, size in p.placements]
        limit = slices if slices is not None else max(all_ends, default=0)
        for p in profiles:
            assert isinstance(p.profile_id, int)
            assert p.profile_id >= 0
            assert not p.name.startswith("MIG "), p.name
            match = PROFILE_NAME.match(p.name)
            assert match, p.name
            assert int(match.group(1)) == p.slice_count, p
            assert p.slice_count >= 1
            assert p.memory_mib > 0
            assert p.memory_mib * 1024 * 1024 <= info.memory_total_bytes
            assert p.sm_count > 0
            assert p.instance_count >= 1
            assert p.placements, f"profile {p.name} has no placement"
            assert len(p.placements) >= p.instance_count
            assert len(set(p.placements)) == len(p.placements)
            sizes = {size for _, size in p.placements}
            assert len(sizes) == 1, f"profile {p.name}: placements of different sizes {p.placements}"
            for start, size in p.placements:
                assert start >= 0
                assert size >= 1
                assert start + size <= limit, f"{p.name} placement {start}:{size} beyond {limit} memory slices"
        if profiles:
            biggest = max(profiles, key=lambda p: (p.memory_mib, p.sm_count))
            assert biggest.placements == ((0, limit),), "the full-card profile spans every memory slice"
            for p in profiles:
                assert p.sm_count <= biggest.sm_count
                assert p.memory_mib <= biggest.memory_mib


def test_mig_profiles_are_stable(backend: Backend) -> None:
    for index in _indexes(backend):
        assert backend.mig_profiles(index) == backend.mig_profiles(index)


def _check_instances(backend: Backend, index: int, instances: tuple[MigInstance, ...]) -> None:
    profiles = {p.profile_id: p for p in backend.mig_profiles(index)}
    keys = [(m.gpu_instance_id, m.compute_instance_id) for m in instances]
    assert len(set(keys)) == len(keys)
    uuids = [m.uuid for m in instances]
    assert len(set(uuids)) == len(uuids)
    used_slices: dict[int, int] = {}
    for m in instances:
        assert isinstance(m, MigInstance)
        assert m.parent_index == index
        assert m.uuid.startswith("MIG-"), m.uuid
        assert m.profile_id in profiles, m
        profile = profiles[m.profile_id]
        assert m.profile_name == profile.name
        assert (m.placement_start, m.placement_size) in profile.placements
        assert m.sm_count > 0
        assert m.memory_total_bytes > 0
        _check_type("MigInstance", "memory_used_bytes", m.memory_used_bytes, INT)
        if not isinstance(m.memory_used_bytes, Unsupported):
            assert 0 <= m.memory_used_bytes <= m.memory_total_bytes
        for memory_slice in range(m.placement_start, m.placement_start + m.placement_size):
            owner = used_slices.setdefault(memory_slice, m.gpu_instance_id)
            assert owner == m.gpu_instance_id, f"GPU instances {owner} and {m.gpu_instance_id} overlap"


def test_mig_instances(backend: Backend) -> None:
    for index in _indexes(backend):
        s = backend.sample(index)
        instances = backend.mig_instances(index)
        assert isinstance(instances, tuple)
        if s.mig_mode_current is not True:
            assert instances == (), f"GPU {index}: MIG is off but instances are listed"
            continue
        _check_instances(backend, index, instances)


# --- events ----------------------------------------------------------------------------------------------------


def test_wait_event_returns_within_its_timeout(backend: Backend) -> None:
    start = time.monotonic()
    event = backend.wait_event(0.2)
    elapsed = time.monotonic() - start
    assert elapsed < 0.2 + 1.0, f"wait_event(0.2) took {elapsed:.2f}s"
    if event is None:
        return
    assert isinstance(event, DeviceEvent)
    assert isinstance(event.kind, EventKind)
    assert 0 <= event.gpu_index < backend.device_count()
    assert event.uuid == backend.device_info(event.gpu_index).uuid
    assert isinstance(event.xid, int)
    assert event.xid >= 0
    assert abs(event.timestamp - time.time()) < 60
    if event.gpu_instance_id is None:
        assert event.compute_instance_id is None
    else:  # an event inside a MIG instance: only on a card with MIG on
        assert isinstance(event.gpu_instance_id, int) and event.gpu_instance_id >= 0
        assert event.compute_instance_id is None or event.compute_instance_id >= 0
        assert backend.sample(event.gpu_index).mig_mode_current is True


def test_wait_event_zero_timeout(backend: Backend) -> None:
    start = time.monotonic()
    event = backend.wait_event(0.0)
    assert time.monotonic() - start < 1.0
    assert event is None or isinstance(event, DeviceEvent)


# --- MIG changes (simulated backends only) ----------------------------------------------------------------------


def _mig_gpu(backend: Backend, *, empty: bool) -> int:
    for index in _indexes(backend):
        if backend.sample(index).mig_mode_current is True and (backend.mig_instances(index) == ()) == empty:
            return index
    pytest.skip(f"no MIG-enabled GPU {'without' if empty else 'with'} instances in this scenario")


def _mig_off_gpu(backend: Backend) -> int:
    for index in _indexes(backend):
        if backend.device_info(index).mig_capable and backend.sample(index).mig_mode_current is False:
            return index
    pytest.skip("no MIG-capable GPU with MIG off in this scenario")


def test_create_and_destroy_mig_instance(simulated: Backend) -> None:
    index = _mig_gpu(simulated, empty=True)
    profile = min(simulated.mig_profiles(index), key=lambda p: p.memory_mib)
    start, size = profile.placements[-1]
    created = simulated.create_mig_instance(index, profile.profile_id, start)
    assert created.parent_index == index
    assert created.profile_id == profile.profile_id
    assert created.profile_name == profile.name
    assert (created.placement_start, created.placement_size) == (start, size)
    listed = simulated.mig_instances(index)
    assert created in listed
    _check_instances(simulated, index, listed)
    simulated.destroy_mig_instance(index, created.gpu_instance_id)
    assert all(m.gpu_instance_id != created.gpu_instance_id for m in simulated.mig_instances(index))


def test_fill_card_with_mig_instances(simulated: Backend) -> None:
    index = _mig_gpu(simulated, empty=True)
    profile = next(p for p in simulated.mig_profiles(index) if p.instance_count > 1)
    made = [simulated.create_mig_instance(index, profile.profile_id, start) for start, _ in profile.placements]
    _check_instances(simulated, index, simulated.mig_instances(index))
    assert len({m.gpu_instance_id for m in made}) == len(made)
    for m in made:
        simulated.destroy_mig_instance(index, m.gpu_instance_id)
    assert simulated.mig_instances(index) == ()


def test_overlapping_placement_is_insufficient_resources(simulated: Backend) -> None:
    index = _mig_gpu(simulated, empty=True)
    full = max(simulated.mig_profiles(index), key=lambda p: p.memory_mib)
    created = simulated.create_mig_instance(index, full.profile_id, full.placements[0][0])
    try:
        small = min(simulated.mig_profiles(index), key=lambda p: p.memory_mib)
        with pytest.raises(InsufficientResourcesError):
            simulated.create_mig_instance(index, small.profile_id, small.placements[0][0])
    finally:
        simulated.destroy_mig_instance(index, created.gpu_instance_id)


def test_illegal_mig_requests_are_backend_errors(simulated: Backend) -> None:
    index = _mig_gpu(simulated, empty=True)
    profiles = simulated.mig_profiles(index)
    unknown_profile = max(p.profile_id for p in profiles) + 100
    with pytest.raises(BackendError):
        simulated.create_mig_instance(index, unknown_profile, 0)
    big = max(profiles, key=lambda p: p.memory_mib)
    with pytest.raises(BackendError):
        simulated.create_mig_instance(index, big.profile_id, 1)  # the full-card profile starts at slice 0 only
    with pytest.raises(NotFoundError):
        simulated.destroy_mig_instance(index, 999)
    assert simulated.mig_instances(index) == ()


def test_mig_calls_with_mig_off_are_backend_errors(simulated: Backend) -> None:
    index = _mig_off_gpu(simulated)
    profile = simulated.mig_profiles(index)[0]
    with pytest.raises(BackendError):
        simulated.create_mig_instance(index, profile.profile_id, profile.placements[0][0])
    assert simulated.mig_instances(index) == ()


def test_destroying_a_busy_instance_is_in_use(simulated: Backend) -> None:
    for index in _indexes(simulated):
        busy = {p.gpu_instance_id for p in simulated.processes(index) if not isinstance(p.gpu_instance_id, Unsupported)}
        if busy and simulated.sample(index).mig_mode_current is True:
            gi = sorted(busy)[0]
            with pytest.raises(InUseError):
                simulated.destroy_mig_instance(index, gi)
            assert gi in {m.gpu_instance_id for m in simulated.mig_instances(index)}
            return
    pytest.skip("no MIG instance with a running process in this scenario")
