"""The Backend contract: invariants every backend holds, checked against each one (identity, samples, processes,
events; MIG and profiling are in test_backend_contract_mig.py).

Params: the simulated backend on the ``h200x8`` and ``h200x1`` scenarios (always), and the real NVML backend
when ``XPU_TEST_REAL_NVML=1`` (on a machine with an NVIDIA GPU). Tests never change a real card: the MIG
create/destroy contract runs on simulated backends only. The ``backend`` fixture is in conftest.py.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from exporter.backends.errors import BackendError
from exporter.backends.protocol import Backend, UnknownGpuError
from exporter.backends.recovery import decode_recovery_action
from exporter.backends.types import (
    UNKNOWN,
    UNSUPPORTED,
    DeviceEvent,
    DeviceInfo,
    DeviceSample,
    EventKind,
    GpuProcess,
    LinkState,
    NvLinkSample,
    Unsupported,
)
from tests.exporter.backends.contract import (
    BOOL,
    INFO_TYPES,
    INT,
    NUMBER,
    PCI_BUS_ID,
    REQUIRED_INFO_FIELDS,
    REQUIRED_SAMPLE_FIELDS,
    SAMPLE_TYPES,
    check_type,
    indexes,
)

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
    check_type("SystemInfo", "cuda_driver_version", info.cuda_driver_version, INT)
    if not isinstance(info.cuda_driver_version, Unsupported):
        assert info.cuda_driver_version > 0
    assert isinstance(info.backend, str)
    assert info.backend


def test_device_count_is_positive(backend: Backend) -> None:
    count = backend.device_count()
    assert isinstance(count, int)
    assert count >= 1


def test_device_info_types(backend: Backend) -> None:
    for index in indexes(backend):
        info = backend.device_info(index)
        assert isinstance(info, DeviceInfo)
        for field in dataclasses.fields(info):
            value = getattr(info, field.name)
            check_type("DeviceInfo", field.name, value, INFO_TYPES[field.name])
            if field.name in REQUIRED_INFO_FIELDS:
                assert value is not UNSUPPORTED, f"DeviceInfo.{field.name} is required"


def test_device_info_identity(backend: Backend) -> None:
    infos = [backend.device_info(index) for index in indexes(backend)]
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
    for index in indexes(backend):
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
    for index in indexes(backend):
        s = backend.sample(index)
        assert isinstance(s, DeviceSample)
        for field in dataclasses.fields(s):
            value = getattr(s, field.name)
            check_type("DeviceSample", field.name, value, SAMPLE_TYPES[field.name])
            if field.name in REQUIRED_SAMPLE_FIELDS:
                assert value is not UNSUPPORTED, f"DeviceSample.{field.name} is required"
        for field in dataclasses.fields(s.ecc):
            kinds = BOOL if field.name.startswith("enabled") else INT
            check_type("EccCounts", field.name, getattr(s.ecc, field.name), kinds)
        if not isinstance(s.remapped_rows, Unsupported):
            rows = s.remapped_rows
            assert isinstance(rows.correctable, int)
            assert isinstance(rows.uncorrectable, int)
            assert isinstance(rows.pending, bool)
            assert isinstance(rows.failure, bool)


def test_sample_memory_adds_up(backend: Backend) -> None:
    for index in indexes(backend):
        total = backend.device_info(index).memory_total_bytes
        s = backend.sample(index)
        assert s.memory_used_bytes >= 0
        assert s.memory_free_bytes >= 0
        assert s.memory_used_bytes + s.memory_free_bytes <= total
        if not isinstance(s.memory_reserved_bytes, Unsupported):
            assert s.memory_reserved_bytes >= 0
            assert s.memory_used_bytes + s.memory_free_bytes + s.memory_reserved_bytes <= total * 1.01


def test_sample_ratios_and_ranges(backend: Backend) -> None:
    for index in indexes(backend):
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
    for index in indexes(backend):
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
    for index in indexes(backend):
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
    for index in indexes(backend):
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
                check_type("NvLinkSample", name, value, INT)
                if not isinstance(value, Unsupported):
                    assert value >= 0, name


# --- processes -------------------------------------------------------------------------------------------------


def test_processes(backend: Backend) -> None:
    for index in indexes(backend):
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
            check_type("GpuProcess", "used_memory_bytes", p.used_memory_bytes, INT)
            check_type("GpuProcess", "sm_utilization_ratio", p.sm_utilization_ratio, NUMBER)
            check_type("GpuProcess", "gpu_instance_id", p.gpu_instance_id, INT)
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
    for index in indexes(backend):
        backend.processes(index)
        again = backend.processes(index)
        if again is UNKNOWN:
            continue
        assert isinstance(again, tuple)
        assert len({p.pid for p in again}) == len(again)
        for p in again:
            check_type("GpuProcess", "sm_utilization_ratio", p.sm_utilization_ratio, NUMBER)


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
