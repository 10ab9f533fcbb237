"""The Backend contract, part two: profiling (GPM) and PCIe throughput, MIG profiles and instances, and MIG
create/destroy on simulated backends (never on a real card). Part one is test_backend_contract.py."""

from __future__ import annotations

import time

import pytest

from exporter.backends.errors import BackendError, InsufficientResourcesError, InUseError, NotFoundError
from exporter.backends.protocol import Backend
from exporter.backends.types import (
    DeviceProfiling,
    MediaEngine,
    MigInstance,
    PcieThroughput,
    ProfilingMetric,
    ProfilingSample,
    Unsupported,
)
from tests.exporter.backends.contract import (
    H200_STYLE_MEMORY_SLICES,
    INT,
    NUMBER,
    PROFILE_NAME,
    check_type,
    indexes,
)

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
    instances = {index: backend.mig_instances(index) for index in indexes(backend)}
    first = {index: backend.profiling(index, instances[index]) for index in indexes(backend)}
    time.sleep(GPM_MIN_INTERVAL_S)
    for index in indexes(backend):
        opened, closed = first[index], backend.profiling(index, instances[index])
        for reading in (opened, closed):
            assert isinstance(reading, DeviceProfiling)
            assert isinstance(reading.gpm_supported, bool)
            for name in ("encoder_utilization_ratio", "decoder_utilization_ratio"):
                value = getattr(reading, name)
                check_type("DeviceProfiling", name, value, NUMBER)
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
    for index in indexes(backend):
        reading = backend.pcie_throughput(index)
        assert isinstance(reading, PcieThroughput)
        for name in ("tx_bytes_per_second", "rx_bytes_per_second"):
            value = getattr(reading, name)
            check_type("PcieThroughput", name, value, NUMBER)
            if not isinstance(value, Unsupported):
                assert value >= 0.0, f"GPU {index} {name}={value}"
        assert abs(reading.measured_at - time.time()) < 60


# --- MIG -------------------------------------------------------------------------------------------------------


def _memory_slices(backend: Backend, index: int) -> int | None:
    name = backend.device_info(index).name
    return H200_STYLE_MEMORY_SLICES if ("H100" in name or "H200" in name) else None


def test_mig_profiles(backend: Backend) -> None:
    for index in indexes(backend):
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
    for index in indexes(backend):
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
        check_type("MigInstance", "memory_used_bytes", m.memory_used_bytes, INT)
        if not isinstance(m.memory_used_bytes, Unsupported):
            assert 0 <= m.memory_used_bytes <= m.memory_total_bytes
        for memory_slice in range(m.placement_start, m.placement_start + m.placement_size):
            owner = used_slices.setdefault(memory_slice, m.gpu_instance_id)
            assert owner == m.gpu_instance_id, f"GPU instances {owner} and {m.gpu_instance_id} overlap"


def test_mig_instances(backend: Backend) -> None:
    for index in indexes(backend):
        s = backend.sample(index)
        instances = backend.mig_instances(index)
        assert isinstance(instances, tuple)
        if s.mig_mode_current is not True:
            assert instances == (), f"GPU {index}: MIG is off but instances are listed"
            continue
        _check_instances(backend, index, instances)


# --- MIG changes (simulated backends only) ----------------------------------------------------------------------


def _mig_gpu(backend: Backend, *, empty: bool) -> int:
    for index in indexes(backend):
        if backend.sample(index).mig_mode_current is True and (backend.mig_instances(index) == ()) == empty:
            return index
    pytest.skip(f"no MIG-enabled GPU {'without' if empty else 'with'} instances in this scenario")


def _mig_off_gpu(backend: Backend) -> int:
    for index in indexes(backend):
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
    for index in indexes(simulated):
        busy = {p.gpu_instance_id for p in simulated.processes(index) if not isinstance(p.gpu_instance_id, Unsupported)}
        if busy and simulated.sample(index).mig_mode_current is True:
            gi = sorted(busy)[0]
            with pytest.raises(InUseError):
                simulated.destroy_mig_instance(index, gi)
            assert gi in {m.gpu_instance_id for m in simulated.mig_instances(index)}
            return
    pytest.skip("no MIG instance with a running process in this scenario")
