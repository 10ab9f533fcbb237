"""NvmlBackend semantics that must hold on a real node (issue 18), over the fake pynvml answering from the H200
capture: a refused process list is "unknown", not an error or an empty list; handles, minor numbers and the event
registration are renewed after a MIG mode change, a rejected handle, a reset or a lost card coming back; events
name the MIG instance they happened in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from exporter.backends.errors import BackendError, GpuLostError
from exporter.backends.nvml import NvmlBackend
from exporter.backends.nvml.cards import CardWatch
from exporter.backends.types import UNKNOWN, DeviceEvent, EventKind, GpuProcess
from exporter.sampler import Sampler, SamplerSettings
from tests.support.clock import FakeClock
from tests.support.nvml_capture_data import CAPTURED_PROCESS
from tests.support.nvml_capture_fake import FakeNvml, install


def _open(monkeypatch: pytest.MonkeyPatch, **fake_options: Any) -> tuple[NvmlBackend, FakeNvml]:
    fake = install(monkeypatch, **fake_options)
    backend = NvmlBackend(event_retry_seconds=0.0)  # a card that could not be registered is retried on every wait
    backend.open()
    return backend, fake


@pytest.fixture
def two_cards(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[NvmlBackend, FakeNvml]]:
    backend, fake = _open(monkeypatch, count=2)
    try:
        yield backend, fake
    finally:
        backend.close()


def _xid_arrives(backend: NvmlBackend, fake: FakeNvml, gpu: int, xid: int) -> DeviceEvent | None:
    """The XID watcher's loop: it waits all the time (so a renewal asked for is applied within one wait), an XID
    happens, the next wait takes it."""
    assert backend.wait_event(0) is None
    fake.post_xid(gpu, xid)
    for _ in range(3):
        event = backend.wait_event(0)
        if event is not None:
            return event
    return None


# --- processes -------------------------------------------------------------------------------------------------


def test_refused_process_list_with_mig_on_is_unknown_and_the_rest_of_the_card_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend, fake = _open(monkeypatch, mig=True)
    try:
        fake.unprivileged()
        fake.add_captured_process()
        assert backend.processes(0) is UNKNOWN  # not (): a process may well run
        sample = backend.sample(0)  # the card itself is fine
        assert sample.mig_mode_current is True
        assert backend.mig_instances(0) == ()
        assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
        assert fake.calls["nvmlDeviceGetProcessUtilization"] == 0  # no per-process SM call for an unknown list
    finally:
        backend.close()


def test_unprivileged_with_mig_off_still_lists_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, fake = _open(monkeypatch)
    try:
        fake.unprivileged()
        fake.add_captured_process()
        procs = backend.processes(0)
        assert isinstance(procs, tuple) and [p.pid for p in procs] == [CAPTURED_PROCESS[0]]
        assert all(isinstance(p, GpuProcess) for p in procs)
    finally:
        backend.close()


def test_other_process_listing_errors_still_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, fake = _open(monkeypatch, mig=True)
    try:
        fake.fail("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.NVML_ERROR_UNKNOWN)
        with pytest.raises(BackendError) as failed:
            backend.processes(0)
        assert failed.value.call == "nvmlDeviceGetComputeRunningProcesses_v3"
    finally:
        backend.close()


def test_sampler_never_publishes_an_unknown_process_list_as_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, mig=True)
    fake.unprivileged()
    fake.add_captured_process()
    backend = NvmlBackend()
    sampler = Sampler(backend, SamplerSettings(interval_seconds=60.0, call_deadline_seconds=60.0), clock=FakeClock())
    try:
        gpu = sampler.run_once().gpu(0)
        assert gpu is not None
        assert gpu.fresh, "the rest of the card's sample is good: the card stays fresh"
        assert not gpu.processes_known, "an unknown process list is not read as 'no process'"
        assert "processes" in gpu.partial_errors
    finally:
        sampler.stop()
        backend.close()


# --- handles and minor numbers ----------------------------------------------------------------------------------


def test_mig_mode_change_with_new_handles_renews_handle_and_minor(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, fake = _open(monkeypatch)
    try:
        before = backend.device_info(0).minor_number
        assert backend.sample(0).mig_mode_current is False
        fake.set_mig(True)  # applied by a reset: the cached handle is refused from now on
        with pytest.raises(BackendError):  # one cycle sees the stale handle (INVALID_ARGUMENT) ...
            backend.sample(0)
        sample = backend.sample(0)  # ... the next one works on a new handle
        assert sample.mig_mode_current is True
        after = backend.device_info(0).minor_number
        assert isinstance(before, int) and after == before + 8  # what the fake's reset did to the minor
        taken = fake.calls["nvmlDeviceGetHandleByIndex"]
        assert taken >= 2
        backend.sample(0)
        backend.sample(0)
        assert fake.calls["nvmlDeviceGetHandleByIndex"] == taken  # renewed, then cached again
    finally:
        backend.close()


def test_mig_mode_change_on_the_same_handle_rereads_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, fake = _open(monkeypatch)
    try:
        before = backend.device_info(0).minor_number
        backend.sample(0)
        fake.set_mig(True, new_handles=False)
        assert backend.sample(0).mig_mode_current is True  # the mode change itself is what is noticed
        after = backend.device_info(0).minor_number
        assert isinstance(before, int) and after == before + 8
        assert fake.calls["nvmlDeviceGetMinorNumber"] == 2
        assert backend.sample(0).mig_mode_current is True
        assert fake.calls["nvmlDeviceGetMinorNumber"] == 2  # renewed once, cached again after
    finally:
        backend.close()


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT])
def test_a_rejected_handle_is_taken_anew(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    backend, fake = _open(monkeypatch)
    try:
        backend.sample(0)
        fake.fail("nvmlDeviceGetFieldValues", code)
        with pytest.raises(BackendError):
            backend.sample(0)
        del fake.errors["nvmlDeviceGetFieldValues"]
        backend.sample(0)
        assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2
    finally:
        backend.close()


def test_other_failures_keep_the_cached_handle(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, fake = _open(monkeypatch)
    try:
        backend.sample(0)
        fake.fail("nvmlDeviceGetFieldValues", pynvml.NVML_ERROR_UNKNOWN)
        with pytest.raises(BackendError):
            backend.sample(0)
        del fake.errors["nvmlDeviceGetFieldValues"]
        backend.sample(0)
        assert fake.calls["nvmlDeviceGetHandleByIndex"] == 1
        assert fake.calls["nvmlDeviceGetMinorNumber"] == 1
    finally:
        backend.close()


# --- event registration -------------------------------------------------------------------------------------------


def test_events_keep_arriving_after_a_reset_between_samples(two_cards: tuple[NvmlBackend, FakeNvml]) -> None:
    backend, fake = two_cards
    backend.sample(1)
    assert _xid_arrives(backend, fake, 1, 31) is not None
    fake.reset_gpu(1)  # nvidia-smi -r between two cycles: no call failed, the energy counter restarted
    backend.sample(1)
    event = _xid_arrives(backend, fake, 1, 79)
    assert event is not None and (event.gpu_index, event.xid) == (1, 79)
    assert fake.undelivered == 0


def test_without_a_sample_the_reset_card_loses_its_events(two_cards: tuple[NvmlBackend, FakeNvml]) -> None:
    """The fake ends registrations on reset as NVML does: what the renewal above is there for."""
    backend, fake = two_cards
    assert backend.wait_event(0) is None
    fake.reset_gpu(1)
    assert _xid_arrives(backend, fake, 1, 79) is None
    assert fake.undelivered == 1


def test_events_after_a_mig_mode_change(two_cards: tuple[NvmlBackend, FakeNvml]) -> None:
    backend, fake = two_cards
    backend.sample(0)
    assert backend.wait_event(0) is None
    fake.set_mig(True, new_handles=False)
    backend.sample(0)
    event = _xid_arrives(backend, fake, 0, 43)
    assert event is not None and event.gpu_index == 0
    event = _xid_arrives(backend, fake, 1, 43)  # the other card was reset by the mode change too
    assert event is not None and event.gpu_index == 1


def test_a_lost_card_is_left_out_and_registered_again_when_it_comes_back(
    two_cards: tuple[NvmlBackend, FakeNvml],
) -> None:
    backend, fake = two_cards
    backend.sample(0)
    backend.sample(1)
    assert backend.wait_event(0) is None
    fake.lose_gpu(1)
    assert backend.wait_event(0) is None  # GPU_IS_LOST from the set: rebuilt with card 0 only
    assert fake.registered_gpus() == {0}
    event = _xid_arrives(backend, fake, 0, 13)
    assert event is not None and event.gpu_index == 0  # the healthy card's events still arrive
    with pytest.raises(GpuLostError):
        backend.sample(1)
    fake.recover_gpu(1)  # back after a reset
    backend.sample(1)
    event = _xid_arrives(backend, fake, 1, 94)
    assert event is not None and (event.gpu_index, event.xid) == (1, 94)
    assert fake.live_sets == 1  # the replaced sets were freed


def test_a_card_lost_at_registration_is_retried(two_cards: tuple[NvmlBackend, FakeNvml]) -> None:
    backend, fake = two_cards
    fake.lose_gpu(1)
    assert backend.wait_event(0) is None
    assert fake.registered_gpus() == {0}
    fake.lost.discard(1)  # answers again without any sample having seen it fail
    assert backend.wait_event(0) is None  # the retry (every wait with event_retry_seconds=0) registers it
    assert fake.registered_gpus() == {0, 1}


def test_a_set_still_lost_after_a_rebuild_raises_instead_of_spinning(
    two_cards: tuple[NvmlBackend, FakeNvml], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, fake = two_cards
    assert backend.wait_event(0) is None

    def always_lost(event_set: Any, timeoutms: int) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", always_lost)  # every card registers, the set says "lost"
    built = fake.calls["nvmlEventSetCreate"]
    assert backend.wait_event(0) is None  # rebuilt at once, no error
    with pytest.raises(GpuLostError):
        backend.wait_event(0)  # the rebuilt set is still lost: the caller backs off
    with pytest.raises(GpuLostError):
        backend.wait_event(0)  # rebuilt once more on the retry, still lost: raises again, never loops inside
    assert fake.calls["nvmlEventSetCreate"] - built == 2


def test_events_queued_in_the_old_set_survive_a_rebuild(two_cards: tuple[NvmlBackend, FakeNvml]) -> None:
    backend, fake = two_cards
    backend.sample(1)
    assert backend.wait_event(0) is None
    fake.post_xid(0, 48)  # queued in the live set ...
    fake.reset_gpu(1)
    backend.sample(1)  # ... which the next wait replaces
    first = backend.wait_event(0)
    assert first is not None and (first.gpu_index, first.xid) == (0, 48)
    assert fake.live_sets == 1


def test_event_names_the_mig_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, fake = _open(monkeypatch, mig=True)
    try:
        assert backend.wait_event(0) is None
        fake.post_xid(0, 13, gpu_instance=2, compute_instance=0)
        fake.post_xid(0, 79)
        inside = backend.wait_event(0)
        card = backend.wait_event(0)
        assert isinstance(inside, DeviceEvent) and isinstance(card, DeviceEvent)
        assert (inside.kind, inside.xid, inside.gpu_instance_id, inside.compute_instance_id) == (
            EventKind.XID,
            13,
            2,
            0,
        )
        assert (card.xid, card.gpu_instance_id, card.compute_instance_id) == (79, None, None)
    finally:
        backend.close()


def test_an_event_of_a_card_whose_identity_cannot_be_read_is_still_delivered(
    two_cards: tuple[NvmlBackend, FakeNvml],
) -> None:
    """XID 79 comes as the card fails: a failing identity lookup must not swallow it."""
    backend, fake = two_cards
    backend.sample(1)
    assert backend.wait_event(0) is None
    fake.post_xid(1, 79)  # queued in the live set ...
    fake.set_mig(True, new_handles=False)
    backend.sample(1)  # ... the mode change drops the card's cached identity ...
    fake.lose_gpu(1)  # ... and the card fails before the event is read
    event = backend.wait_event(0)
    assert event is not None and (event.gpu_index, event.xid, event.uuid) == (1, 79, "")


def test_a_failed_build_is_tried_again(two_cards: tuple[NvmlBackend, FakeNvml]) -> None:
    backend, fake = two_cards
    fake.fail("nvmlEventSetCreate", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(BackendError):
        backend.wait_event(0)
    del fake.errors["nvmlEventSetCreate"]
    assert backend.wait_event(0) is None
    assert fake.registered_gpus() == {0, 1}


def test_card_watch_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, _fake = _open(monkeypatch)
    try:
        sample = backend.sample(0)
    finally:
        backend.close()
    ecc = dataclasses.replace(sample.ecc, corrected_volatile=4, uncorrected_volatile=1)
    watch = CardWatch()
    assert watch.answered(0, dataclasses.replace(sample, ecc=ecc)) is None  # first sight: nothing to compare
    assert watch.answered(0, dataclasses.replace(sample, ecc=ecc)) is None
    cleared = dataclasses.replace(ecc, corrected_volatile=0)  # volatile counts only go back on a reset or reload
    refresh = watch.answered(0, dataclasses.replace(sample, ecc=cleared))
    assert refresh is not None and refresh.events and refresh.caches and "ECC" in refresh.reason
    assert watch.failed(1, "gpu_lost", pynvml.NVML_ERROR_GPU_IS_LOST, rejected_handle=False) is None
    back = watch.answered(1, sample)
    assert back is not None and back.events and "gpu_lost" in back.reason
    assert watch.answered(1, sample) is None  # once
    assert watch.failed(0, "error", pynvml.NVML_ERROR_UNKNOWN, rejected_handle=False) is None
    assert watch.handle_taken(2, 0x1000) is None and watch.handle_taken(2, 0x1000) is None
    moved = watch.handle_taken(2, 0x2000)
    assert moved is not None and moved.events and not moved.caches
