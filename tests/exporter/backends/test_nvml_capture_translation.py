"""NvmlBackend without a GPU, part two: over a fake pynvml that answers from the H200 capture, what the card said
comes out of the backend translated as documented (identity, samples, counters, NVLink, errors, processes, MIG,
events, and the sampler over it). Part one, test_nvml_capture.py, reruns the Backend contract on the same fake.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from exporter.backends.errors import BackendError, DriverUnavailableError, GpuLostError, VersionMismatchError
from exporter.backends.nvml import NvmlBackend
from exporter.backends.types import (
    UNSUPPORTED,
    ComputeMode,
    DeviceEvent,
    DeviceInfo,
    DeviceSample,
    EventKind,
    GpuProcess,
    LinkState,
    MigProfile,
    RemappedRows,
    Unsupported,
)
from exporter.sampler import Sampler, SamplerSettings
from tests.support.clock import FakeClock
from tests.support.nvml_capture_fake import FakeNvml, install

# From nvml-inventory.json of the captured card.
CAPTURED_UUID = "GPU-00000000-1111-2222-3333-444444444444"
CAPTURED_ENERGY_FIELD_MJ = 20160557  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION in the field batch
CAPTURED_ENERGY_CALL_MJ = 20152824  # nvmlDeviceGetTotalEnergyConsumption, read a moment earlier
# README / mig-probe.log: profile id -> (name, slices, memory MiB, SMs, max instances, placements)
CAPTURED_MIG_PROFILES = {
    19: ("1g.18gb", 1, 16384, 16, 7, ((0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1))),
    20: ("1g.18gb+me", 1, 16384, 16, 1, ((0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1))),
    15: ("1g.35gb", 1, 33280, 26, 4, ((0, 2), (2, 2), (4, 2), (6, 2))),
    14: ("2g.35gb", 2, 33280, 32, 3, ((0, 2), (2, 2), (4, 2))),
    9: ("3g.71gb", 3, 71424, 60, 2, ((0, 4), (4, 4))),
    5: ("4g.71gb", 4, 71424, 64, 1, ((0, 4),)),
    0: ("7g.141gb", 7, 143360, 132, 1, ((0, 8),)),
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """The captured card as it was: one H200, no NVLink, MIG off."""
    return install(monkeypatch)


@pytest.fixture
def nvml(fake: FakeNvml) -> Iterator[NvmlBackend]:
    b = NvmlBackend()
    b.open()
    try:
        yield b
    finally:
        b.close()


# --- identity --------------------------------------------------------------------------------------------------


def test_system_info_is_the_captured_driver(nvml: NvmlBackend) -> None:
    info = nvml.system_info()
    assert (info.driver_version, info.nvml_version, info.cuda_driver_version) == ("580.159.04", "13.580.159.04", 13000)
    assert info.backend == "nvml"
    assert nvml.device_count() == 1


def test_device_info_is_the_captured_card(nvml: NvmlBackend) -> None:
    info = nvml.device_info(0)
    assert info == DeviceInfo(
        index=0,
        uuid=CAPTURED_UUID,
        name="NVIDIA H200",
        pci_bus_id="00000000:00:06.0",
        serial="0000000000000",
        minor_number=0,
        memory_total_bytes=150754820096,
        sm_clock_max_mhz=1980,
        memory_clock_max_mhz=3201,
        pcie_generation_max=5,
        pcie_width_max=16,
        power_limit_default_mw=700000,
        nvlink_count=0,
        mig_capable=True,
        compute_capability=(9, 0),
        vbios_version="96.00.A5.00.1A",
    )


# --- one sample ------------------------------------------------------------------------------------------------


def test_sample_translates_the_capture(nvml: NvmlBackend, fake: FakeNvml) -> None:
    s = nvml.sample(0)
    assert s.power_draw_watts == pytest.approx(78.721)  # 78721 mW
    assert s.power_limit_watts == pytest.approx(700.0)
    assert s.energy_joules == pytest.approx(CAPTURED_ENERGY_FIELD_MJ / 1000)  # the field batch, mJ -> J
    assert isinstance(s.energy_joules, float)
    assert s.temperature_gpu_celsius == 38.0
    assert s.temperature_memory_celsius == 40.0  # NVML_FI_DEV_MEMORY_TEMP
    assert (s.sm_clock_mhz, s.memory_clock_mhz) == (345, 3201)
    assert (s.gpu_utilization_ratio, s.memory_utilization_ratio) == (0.0, 0.0)
    assert s.clock_event_reasons == 1  # GPU idle
    assert s.performance_state == 0
    assert (s.pcie_generation, s.pcie_width) == (5, 16)
    assert s.pcie_replay_count == 0
    assert s.remapped_rows == RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False)
    assert s.ecc.enabled_current is True and s.ecc.enabled_pending is True
    assert (s.ecc.corrected_volatile, s.ecc.uncorrected_volatile) == (0, 0)
    assert (s.ecc.corrected_aggregate, s.ecc.uncorrected_aggregate) == (0, 0)
    assert s.recovery_action == 0
    assert s.nvlinks is UNSUPPORTED  # all 18 links NotSupported on the captured card
    assert s.compute_mode is ComputeMode(0)
    assert s.persistence_mode is True
    assert (s.mig_mode_current, s.mig_mode_pending) == (False, False)
    # memory: v1 used (driver-reserved on an idle card) is v2's reserved; the three add up to the total
    assert s.memory_reserved_bytes == 644939776
    assert s.memory_used_bytes == 0
    assert s.memory_used_bytes + s.memory_free_bytes + s.memory_reserved_bytes == 150754820096


def test_hot_path_avoids_the_slow_calls(nvml: NvmlBackend, fake: FakeNvml) -> None:
    nvml.device_info(0)
    before = fake.calls.copy()
    nvml.sample(0)
    made = fake.calls - before
    assert made["nvmlDeviceGetFieldValues"] == 1
    assert made["nvmlDeviceGetTotalEnergyConsumption"] == 0  # 4.5 ms; the field has it (capture: 20152824 mJ)
    assert made["nvmlDeviceGetMaxClockInfo"] == 0  # 1.4 ms; read once in device_info
    assert made["nvmlDeviceGetRemappedRows"] == 0  # the four REMAPPED fields answered
    assert made["nvmlDeviceGetNvLinkState"] == 0  # no links found at device_info: none asked per cycle


def test_the_energy_call_and_field_disagree_by_the_capture_gap(fake: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) == CAPTURED_ENERGY_CALL_MJ
    assert fake.energy_mj == CAPTURED_ENERGY_FIELD_MJ


def test_unsupported_readings_of_the_card_are_absent(nvml: NvmlBackend, fake: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for call in (pynvml.nvmlDeviceGetFanSpeed, pynvml.nvmlDeviceGetNumaNodeId):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(handle)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPages(handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    info, sample = nvml.device_info(0), nvml.sample(0)
    names = [f.name for f in dataclasses.fields(info) + dataclasses.fields(sample)]
    assert not [name for name in names if "fan" in name or "numa" in name]
    assert info.nvlink_count == 0
    assert nvml.nvlink_peers(0) is UNSUPPORTED
    assert fake.calls["nvmlDeviceGetNvLinkState"] == 1  # link 0 NotSupported: the probe stops there


# --- counters --------------------------------------------------------------------------------------------------


def test_the_32_bit_pcie_byte_counters_are_not_read(nvml: NvmlBackend, fake: FakeNvml) -> None:
    """They wrap about every 80 ms at Gen5 x16: no read interval can follow them. PCIe comes from GPM instead."""
    asked: list[int] = []
    real = pynvml.nvmlDeviceGetFieldValues

    def spy(handle: Any, field_ids: list[Any]) -> Any:
        asked.extend(f[0] if isinstance(f, tuple) else f for f in field_ids)
        return real(handle, field_ids)

    pynvml.nvmlDeviceGetFieldValues = spy
    try:
        nvml.sample(0)
    finally:
        pynvml.nvmlDeviceGetFieldValues = real
    assert asked, "the sample reads its counters in one field batch"
    assert pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES not in asked
    assert pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES not in asked


def test_a_counter_that_goes_down_is_a_reset_not_a_wrap(nvml: NvmlBackend, fake: FakeNvml) -> None:
    """A driver reload restarts the 32-bit replay counter: the sample shows the new, lower count (Prometheus
    treats a decrease as a counter reset), never the old value plus 2**32."""
    u32 = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    fake.field_overrides[pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER] = (u32, 4_000_000_000)
    assert nvml.sample(0).pcie_replay_count == 4_000_000_000
    fake.field_overrides[pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER] = (u32, 7)
    assert nvml.sample(0).pcie_replay_count == 7
    fake.energy_mj = 1000  # the energy counter restarts with the driver too
    assert nvml.sample(0).energy_joules == pytest.approx(1.0)


# --- NVLink (an HGX board, not the captured VM) -----------------------------------------------------------------


def test_eighteen_nvlinks_up(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, nvlinks=18)
    b = NvmlBackend()
    b.open()
    try:
        assert b.device_info(0).nvlink_count == 18
        links = b.sample(0).nvlinks
        assert not isinstance(links, Unsupported)
        assert [link.link for link in links] == list(range(18))
        assert all(link.state is LinkState.UP for link in links)
        assert all((link.crc_errors, link.replay_errors, link.recovery_errors) == (0, 0, 0) for link in links)
        assert all((link.tx_bytes, link.rx_bytes) == (0, 0) for link in links)
        assert b.nvlink_peers(0) == ("nvswitch",) * 18
    finally:
        b.close()


# --- errors ----------------------------------------------------------------------------------------------------

OPTIONAL_CALLS = (
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
)


@pytest.mark.parametrize(
    "code",
    [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND],
    ids=["NotSupported", "FunctionNotFound"],
)
def test_not_supported_never_raises(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """A card (or driver) that answers NotSupported to every optional reading still samples."""
    fake = install(monkeypatch, nvlinks=18)
    for call in OPTIONAL_CALLS:
        fake.fail(call, code)
    b = NvmlBackend()
    b.open()
    try:
        assert b.system_info().cuda_driver_version is UNSUPPORTED
        info = b.device_info(0)
        assert info.mig_capable is False
        assert info.serial is UNSUPPORTED and info.compute_capability is UNSUPPORTED
        s = b.sample(0)
        required = {"memory_used_bytes", "memory_free_bytes", "memory_reserved_bytes", "ecc", "remapped_rows"}
        for f in dataclasses.fields(s):
            if f.name not in required and f.name != "nvlinks":
                assert getattr(s, f.name) is UNSUPPORTED, f.name
        assert s.memory_reserved_bytes is UNSUPPORTED  # fell back to v1
        assert s.memory_used_bytes == 644939776
        assert s.remapped_rows is UNSUPPORTED
        assert all(getattr(s.ecc, f.name) is UNSUPPORTED for f in dataclasses.fields(s.ecc))
        assert not isinstance(s.nvlinks, Unsupported)
        assert all(link.tx_bytes is UNSUPPORTED and link.crc_errors == 0 for link in s.nvlinks)
        assert b.processes(0) == ()
        assert b.mig_profiles(0) == ()
        assert b.mig_instances(0) == ()
        assert b.wait_event(0.0) is None
    finally:
        b.close()


def test_gpu_lost_on_one_call_names_that_call(nvml: NvmlBackend, fake: FakeNvml) -> None:
    nvml.sample(0)
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(GpuLostError) as lost:
        nvml.sample(0)
    assert lost.value.call == "nvmlDeviceGetPowerUsage"
    assert lost.value.code == "gpu_lost"
    assert isinstance(lost.value.__cause__, pynvml.NVMLError_GpuIsLost)


def test_gpu_off_the_bus_fails_the_sample_at_its_first_call(nvml: NvmlBackend, fake: FakeNvml) -> None:
    nvml.sample(0)
    fake.lose_gpu()
    with pytest.raises(GpuLostError) as lost:
        nvml.sample(0)
    assert lost.value.call == "nvmlDeviceGetFieldValues"
    with pytest.raises(GpuLostError):
        nvml.processes(0)


def test_version_mismatch_at_init(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch)
    fake.fail("nvmlInit", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    b = NvmlBackend()
    with pytest.raises(VersionMismatchError) as mismatch:
        b.open()
    assert mismatch.value.call == "nvmlInit"
    assert mismatch.value.code == "version_mismatch"
    with pytest.raises(DriverUnavailableError):
        b.device_count()  # not open


def test_other_init_failures_are_backend_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch)
    fake.fail("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(BackendError) as failed:
        NvmlBackend().open()
    assert failed.value.call == "nvmlDeviceGetCount"
    assert fake.calls["nvmlShutdown"] == 1, "a failed open releases the library"


# --- processes -------------------------------------------------------------------------------------------------


def test_no_process_is_an_empty_list(nvml: NvmlBackend, fake: FakeNvml) -> None:
    assert nvml.processes(0) == ()


def test_the_probes_process(nvml: NvmlBackend, fake: FakeNvml) -> None:
    fake.add_captured_process()
    assert nvml.processes(0) == (
        GpuProcess(pid=847, used_memory_bytes=1990197248, sm_utilization_ratio=0.82, gpu_instance_id=UNSUPPORTED),
    )
    again = nvml.processes(0)  # no sample newer than the last one: SM use unknown, process still listed
    assert [(p.pid, p.sm_utilization_ratio) for p in again] == [(847, UNSUPPORTED)]


# --- MIG -------------------------------------------------------------------------------------------------------


def test_mig_profiles_are_the_captured_table(nvml: NvmlBackend) -> None:
    profiles = nvml.mig_profiles(0)
    assert all(isinstance(p, MigProfile) for p in profiles)
    table = {
        p.profile_id: (p.name, p.slice_count, p.memory_mib, p.sm_count, p.instance_count, p.placements)
        for p in profiles
    }
    assert table == CAPTURED_MIG_PROFILES
    assert [p.profile_id for p in profiles] == [19, 14, 9, 5, 0, 20, 15]  # NVML's profile-constant order
    assert nvml.mig_instances(0) == ()  # MIG off


def test_mig_on_without_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, mig=True)
    b = NvmlBackend()
    b.open()
    try:
        s = b.sample(0)
        assert (s.mig_mode_current, s.mig_mode_pending) == (True, True)
        assert b.mig_instances(0) == ()
        assert {p.profile_id for p in b.mig_profiles(0)} == set(CAPTURED_MIG_PROFILES)
    finally:
        b.close()


# --- events ----------------------------------------------------------------------------------------------------


def test_wait_event_with_nothing_pending_is_none(nvml: NvmlBackend, fake: FakeNvml) -> None:
    assert nvml.wait_event(0.2) is None
    assert fake.calls["nvmlEventSetWait_v2"] == 1
    assert fake.calls["nvmlDeviceRegisterEvents"] == 1


def test_wait_event_delivers_an_xid(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, count=2)
    b = NvmlBackend()
    b.open()
    try:
        assert b.wait_event(0) is None  # the first wait registers the cards; NVML queues only what comes after
        fake.post_xid(1, 79)
        event = b.wait_event(0.2)
        assert isinstance(event, DeviceEvent)
        assert (event.kind, event.gpu_index, event.xid) == (EventKind.XID, 1, 79)
        assert event.uuid == b.device_info(1).uuid != b.device_info(0).uuid
    finally:
        b.close()


# --- the sampler over the backend -------------------------------------------------------------------------------

GENEROUS = SamplerSettings(interval_seconds=60.0, call_deadline_seconds=60.0, open_deadline_seconds=60.0)


def _sampler_over_fake(monkeypatch: pytest.MonkeyPatch, **fake_options: Any) -> tuple[Sampler, FakeNvml, FakeClock]:
    fake = install(monkeypatch, **fake_options)
    clock = FakeClock()
    return Sampler(NvmlBackend(), GENEROUS, clock=clock), fake, clock


def test_sampler_publishes_a_fresh_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, _fake, clock = _sampler_over_fake(monkeypatch)
    try:
        snap = sampler.run_once()
        assert snap.backend_up and snap.backend_name == "nvml" and snap.backend_error is None
        assert snap.system is not None and snap.system.driver_version == "580.159.04"
        gpu = snap.gpu(0)
        assert gpu is not None and gpu.fresh and gpu.error is None
        assert gpu.uuid == CAPTURED_UUID
        assert isinstance(gpu.sample, DeviceSample)
        assert gpu.sample.power_draw_watts == pytest.approx(78.721)
        assert gpu.sampled_at == clock.now
        assert gpu.mig_instances == () and gpu.processes == ()
        assert snap.counters.calls["sample"] == 1
        assert sampler.latest() is snap
    finally:
        sampler.stop()
        sampler.backend.close()


def test_sampler_marks_a_lost_gpu_stale_and_keeps_its_last_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, fake, _clock = _sampler_over_fake(monkeypatch)
    try:
        good = sampler.run_once().gpu(0)
        fake.lose_gpu()
        gpu = sampler.run_once().gpu(0)
        assert good is not None and gpu is not None
        assert not gpu.fresh and gpu.error_code == "gpu_lost"
        assert gpu.error is not None and "nvmlDeviceGetFieldValues" in gpu.error
        assert gpu.sample == good.sample
    finally:
        sampler.stop()
        sampler.backend.close()
