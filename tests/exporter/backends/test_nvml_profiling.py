"""NvmlBackend's profiling readings over the capture fake: GPM brackets, unit conversion, MIG, buffer lifecycle.

The fake's GPM is modelled (the capture did not query it): counters integrate each metric over the fake's clock,
so a reading is the time-weighted average between two samples, as on the card.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pynvml
import pytest

from exporter.backends.errors import BackendError, GpuLostError
from exporter.backends.nvml import NvmlBackend
from exporter.backends.types import UNSUPPORTED, MediaEngine, MigInstance, ProfilingMetric
from tests.support.nvml_capture_data import GPM_PCIE_RX_KBS, GPM_PCIE_TX_KBS
from tests.support.nvml_capture_fake import FakeNvml, install

M = ProfilingMetric
SM_UTIL, ANY_TENSOR, DRAM_BW, PCIE_TX = 2, 5, 10, 20  # NVML_GPM_METRIC_* ids


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    state = install(monkeypatch)
    state.gpm.advance(0.0)  # freeze the fake's clock: the tests move it
    return state


@pytest.fixture
def nvml(fake: FakeNvml) -> Iterator[NvmlBackend]:
    b = NvmlBackend(monotonic=fake.gpm.clock)
    b.open()
    try:
        yield b
    finally:
        b.close()


def _instance(gi: int, uuid: str) -> MigInstance:
    return MigInstance(0, gi, 0, 9, "3g.71gb", 0, 4, uuid, 60, 71424 << 20, 0)


def test_the_captured_idle_card_over_one_interval(nvml: NvmlBackend, fake: FakeNvml) -> None:
    opened = nvml.profiling(0)
    assert opened.gpm_supported is True
    assert opened.card is None and not opened.mig, "the first sample only opens the interval"
    fake.gpm.advance(5.0)
    card = nvml.profiling(0).card
    assert card is not None
    assert card.interval_seconds == pytest.approx(5.0)
    for metric in (M.GRAPHICS_ACTIVE, M.SM_ACTIVE, M.SM_OCCUPANCY, M.TENSOR_ACTIVE, M.DRAM_ACTIVE, M.FP64_ACTIVE):
        assert card.metrics[metric] == 0.0, metric  # idle, and supported: 0 is a reading here, not a placeholder
    assert card.metrics[M.PCIE_TX_BYTES_PER_SECOND] == pytest.approx(GPM_PCIE_TX_KBS * 1024)  # MiB/s -> bytes/s
    assert card.metrics[M.PCIE_RX_BYTES_PER_SECOND] == pytest.approx(GPM_PCIE_RX_KBS * 1024)
    assert M.NVLINK_TX_BYTES_PER_SECOND not in card.metrics, "no NVLink on the captured card: absent, not 0"
    engines = sorted(card.engines)
    assert engines == [
        *((MediaEngine.NVDEC, n) for n in range(7)),
        *((MediaEngine.NVJPG, n) for n in range(7)),
        (MediaEngine.NVOFA, 0),
    ], "engines the card answers; the H200 has no NVENC, so none is listed"


def test_a_reading_is_the_time_weighted_average_between_samples(nvml: NvmlBackend, fake: FakeNvml) -> None:
    nvml.profiling(0)
    fake.gpm.set(0, {SM_UTIL: 80.0, ANY_TENSOR: 50.0})
    fake.gpm.advance(2.0)
    fake.gpm.set(0, {SM_UTIL: 20.0, ANY_TENSOR: 0.0})
    fake.gpm.advance(3.0)
    card = nvml.profiling(0).card
    assert card is not None
    assert card.metrics[M.SM_ACTIVE] == pytest.approx((0.8 * 2 + 0.2 * 3) / 5)
    assert card.metrics[M.TENSOR_ACTIVE] == pytest.approx(0.5 * 2 / 5)
    fake.gpm.advance(5.0)
    again = nvml.profiling(0).card  # the next interval starts where the last one ended
    assert again is not None and again.metrics[M.SM_ACTIVE] == pytest.approx(0.2)


def test_ratios_are_clamped_and_nan_is_absent(nvml: NvmlBackend, fake: FakeNvml) -> None:
    nvml.profiling(0)
    fake.gpm.set(0, {SM_UTIL: 100.4, DRAM_BW: math.nan, PCIE_TX: -1.0})
    fake.gpm.advance(1.0)
    card = nvml.profiling(0).card
    assert card is not None
    assert card.metrics[M.SM_ACTIVE] == 1.0
    assert M.DRAM_ACTIVE not in card.metrics
    assert card.metrics[M.PCIE_TX_BYTES_PER_SECOND] == 0.0


def test_samples_closer_than_100_ms_do_not_close_an_interval(nvml: NvmlBackend, fake: FakeNvml) -> None:
    nvml.profiling(0)
    fake.gpm.advance(0.05)
    assert nvml.profiling(0).card is None
    fake.gpm.advance(0.06)
    card = nvml.profiling(0).card
    assert card is not None and card.interval_seconds == pytest.approx(0.11), "measured from the first sample"


def test_a_card_without_gpm_has_no_readings_and_no_sample_calls(nvml: NvmlBackend, fake: FakeNvml) -> None:
    fake.gpm.supported = False
    for _ in range(2):
        reading = nvml.profiling(0)
        fake.gpm.advance(5.0)
        assert reading.gpm_supported is False
        assert reading.card is None and not reading.mig
        assert reading.encoder_utilization_ratio == 0.0  # captured: 0 %
    assert fake.calls["nvmlGpmSampleGet"] == 0
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 1, "support is asked once per card"


def test_pcie_throughput_fallback_reads_both_directions(nvml: NvmlBackend, fake: FakeNvml) -> None:
    reading = nvml.pcie_throughput(0)
    assert reading.tx_bytes_per_second == pytest.approx(GPM_PCIE_TX_KBS * 1024)
    assert reading.rx_bytes_per_second == pytest.approx(GPM_PCIE_RX_KBS * 1024)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 2


def test_codec_utilization_not_supported_is_absent(nvml: NvmlBackend, fake: FakeNvml) -> None:
    fake.fail("nvmlDeviceGetDecoderUtilization", pynvml.NVML_ERROR_NOT_SUPPORTED)
    reading = nvml.profiling(0)
    assert reading.decoder_utilization_ratio is UNSUPPORTED
    assert reading.encoder_utilization_ratio == 0.0


def test_mig_instances_get_their_own_activity_and_no_link_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, mig=True)
    fake.gpm.advance(0.0)
    fake.gpm.set(0, {SM_UTIL: 90.0}, gpu_instance=1)
    fake.gpm.set(0, {SM_UTIL: 10.0}, gpu_instance=2)
    nvml = NvmlBackend(monotonic=fake.gpm.clock)
    nvml.open()
    try:
        instances = (_instance(1, "MIG-a"), _instance(2, "MIG-b"))
        assert nvml.profiling(0, instances).mig == {}
        fake.gpm.advance(5.0)
        mig = nvml.profiling(0, instances).mig
        assert set(mig) == {1, 2}
        assert mig[1].metrics[M.SM_ACTIVE] == pytest.approx(0.9)
        assert mig[2].metrics[M.SM_ACTIVE] == pytest.approx(0.1)
        for reading in mig.values():
            assert not [m for m in reading.metrics if m.is_rate], "PCIe and NVLink are the card's, not an instance's"
            assert not reading.engines
        held = len(fake.gpm.allocated)
        fake.gpm.advance(5.0)
        assert set(nvml.profiling(0, instances[:1]).mig) == {1}
        assert len(fake.gpm.allocated) == held - 2, "the vanished instance's two sample buffers are freed"
        fake.gpm.advance(5.0)
        recreated = (_instance(1, "MIG-c"),)  # same GPU instance id, a new instance: a new interval
        assert nvml.profiling(0, recreated).mig == {}
    finally:
        nvml.close()
    assert not fake.gpm.allocated, "close frees every sample buffer"


def test_an_instance_destroyed_since_it_was_listed_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, mig=True)
    nvml = NvmlBackend(monotonic=fake.gpm.clock)
    nvml.open()
    try:
        reading = nvml.profiling(0, (_instance(5, "MIG-gone"),))  # NVML answers NotFound for it
        assert reading.mig == {}
    finally:
        nvml.close()


def test_a_lost_card_fails_the_call_naming_it(nvml: NvmlBackend, fake: FakeNvml) -> None:
    nvml.profiling(0)
    fake.gpm.advance(5.0)
    fake.lose_gpu()
    with pytest.raises(GpuLostError) as err:
        nvml.profiling(0)
    assert err.value.call == "nvmlGpmSampleGet"


def test_calls_per_cycle(nvml: NvmlBackend, fake: FakeNvml) -> None:
    nvml.profiling(0)
    fake.gpm.advance(5.0)
    before = fake.calls.copy()
    nvml.profiling(0)
    made = dict(fake.calls - before)
    assert made == {
        "nvmlGpmSampleGet": 1,
        "nvmlGpmMetricsGet": 1,
        "nvmlDeviceGetEncoderUtilization": 1,
        "nvmlDeviceGetDecoderUtilization": 1,
    }, "one sample and one metrics call per card per cycle, buffers reused"


def test_card_level_gpm_refused_with_mig_on_is_asked_again_once_mig_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, mig=True)
    fake.gpm.advance(0.0)
    fake.gpm.set(0, {SM_UTIL: 50.0}, gpu_instance=1)
    nvml = NvmlBackend(monotonic=fake.gpm.clock)
    nvml.open()
    try:
        fake.fail("nvmlGpmSampleGet", pynvml.NVML_ERROR_NOT_SUPPORTED)  # the card refuses card-level samples
        instances = (_instance(1, "MIG-a"),)
        nvml.profiling(0, instances)
        fake.gpm.advance(5.0)
        with_mig = nvml.profiling(0, instances)
        assert with_mig.card is None and set(with_mig.mig) == {1}, "the instances are still measured"
        del fake.errors["nvmlGpmSampleGet"]  # MIG off: the card answers again
        assert nvml.profiling(0, ()).card is None, "a new interval: none spans the mode change"
        assert len(fake.gpm.allocated) == 2, "the MIG-mode brackets are freed"
        fake.gpm.advance(5.0)
        card = nvml.profiling(0, ()).card
        assert card is not None and card.interval_seconds == pytest.approx(5.0)
    finally:
        nvml.close()


# --- metric ids by driver branch, and what a refused request costs -----------------------------------------------

DMMA, NVOFA_1, NVENC = 8, 51, {166, 167, 168, 169}


@pytest.mark.parametrize(
    ("cuda", "present", "absent"),
    [
        (12040, set(), {DMMA, NVOFA_1, *NVENC}),  # R550: nvml.h 12.4
        (12080, {NVOFA_1}, {DMMA, *NVENC}),  # R570: 12.8, NVML_GPM_METRIC_MAX still 98
        (13000, {NVOFA_1, *NVENC}, {DMMA}),  # R580: 13.0, no DMMA yet (the capture's driver)
        (13020, {DMMA, NVOFA_1, *NVENC}, set()),  # 13.2.1 defines DMMA
    ],
)
def test_only_the_ids_the_drivers_branch_defines_are_asked_for(
    fake: FakeNvml, cuda: int, present: set[int], absent: set[int]
) -> None:
    fake.cuda_driver_version = cuda
    nvml = NvmlBackend(monotonic=fake.gpm.clock)
    nvml.open()
    try:
        nvml.profiling(0)
        fake.gpm.advance(5.0)
        assert nvml.profiling(0).card is not None
    finally:
        nvml.close()
    (asked,) = fake.gpm.requested
    assert present <= set(asked)
    assert not absent & set(asked), f"CUDA {cuda}: asked for ids its nvml.h does not define: {absent & set(asked)}"
    assert {SM_UTIL, ANY_TENSOR, DRAM_BW, PCIE_TX} <= set(asked)


def test_a_refused_request_degrades_per_metric_not_per_card(nvml: NvmlBackend, fake: FakeNvml) -> None:
    """A driver that refuses the whole nvmlGpmMetricsGet over one id it does not take: that one metric is lost, the
    other series stay, and the id is not asked for again (one metrics call per cycle once more)."""
    nvenc_0 = 166
    fake.gpm.refused = {nvenc_0}
    fake.gpm.refuse_whole_request = True
    nvml.profiling(0)
    fake.gpm.set(0, {SM_UTIL: 40.0})
    fake.gpm.advance(5.0)
    card = nvml.profiling(0).card
    assert card is not None, "the card's GPM must not be lost over one refused id"
    assert card.metrics[M.SM_ACTIVE] == pytest.approx(0.4)
    assert card.metrics[M.PCIE_TX_BYTES_PER_SECOND] == pytest.approx(GPM_PCIE_TX_KBS * 1024)
    assert (MediaEngine.NVDEC, 0) in card.engines
    assert nvml.refused_gpm_metric_ids(0) == {nvenc_0}
    fake.gpm.requested.clear()
    fake.gpm.advance(5.0)
    again = nvml.profiling(0).card
    assert again is not None and again.metrics[M.SM_ACTIVE] == pytest.approx(0.4)
    (asked,) = fake.gpm.requested
    assert nvenc_0 not in asked and {167, 168, 169} <= set(asked), "only the refused id is left out"


def test_an_id_refused_in_its_own_slot_costs_only_that_metric(nvml: NvmlBackend, fake: FakeNvml) -> None:
    fake.gpm.refused = {PCIE_TX}
    fake.gpm.refuse_whole_request = False
    nvml.profiling(0)
    fake.gpm.advance(5.0)
    card = nvml.profiling(0).card
    assert card is not None
    assert M.PCIE_TX_BYTES_PER_SECOND not in card.metrics
    assert M.PCIE_RX_BYTES_PER_SECOND in card.metrics
    assert len(fake.gpm.requested) == 1, "nothing to probe: the driver answered per metric"


def test_a_request_refused_whatever_it_asks_is_a_card_failure(nvml: NvmlBackend, fake: FakeNvml) -> None:
    nvml.profiling(0)
    fake.gpm.advance(5.0)
    fake.fail("nvmlGpmMetricsGet", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(BackendError) as err:
        nvml.profiling(0)
    assert err.value.call == "nvmlGpmMetricsGet"
    assert nvml.refused_gpm_metric_ids(0) == frozenset(), "nothing is blamed on the ids"


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_INVALID_STATE])
def test_a_card_level_gpm_failure_keeps_the_mig_instances(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    fake = install(monkeypatch, mig=True)
    fake.gpm.advance(0.0)
    fake.gpm.set(0, {SM_UTIL: 70.0}, gpu_instance=1)
    nvml = NvmlBackend(monotonic=fake.gpm.clock)
    nvml.open()
    try:
        instances = (_instance(1, "MIG-a"),)
        nvml.profiling(0, instances)
        fake.gpm.advance(5.0)
        fake.fail("nvmlGpmSampleGet", code)  # the card level fails (not NotSupported); instances still answer
        reading = nvml.profiling(0, instances)
        assert reading.card is None
        assert set(reading.mig) == {1}
        assert reading.mig[1].metrics[M.SM_ACTIVE] == pytest.approx(0.7)
        with pytest.raises(BackendError):  # without MIG instances the failure is the card reading's, as before
            nvml.profiling(0, ())
        fake.lose_gpu()
        with pytest.raises(GpuLostError):
            nvml.profiling(0, instances)  # a lost card fails every part
    finally:
        nvml.close()
