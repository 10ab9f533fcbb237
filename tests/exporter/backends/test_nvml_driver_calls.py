"""How many driver calls a sampling cycle makes, counted over the fake pynvml that answers from the H200 capture.
The MIG mode is read after a reset, a rejected handle, a pending change or a change in whether the utilization rates
answer, and once every RECHECK_CYCLES cycles, not on every cycle. The per-process utilization call (2.9 ms on an
H200) is made only on cards that run processes."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from exporter.backends.nvml import NvmlBackend
from exporter.backends.nvml.migmode import RECHECK_CYCLES
from exporter.sampler import Sampler, SamplerSettings
from tests.support.clock import FakeClock
from tests.support.nvml_capture_fake import FakeNvml, install

CARDS = 2
MIG_MODE = "nvmlDeviceGetMigMode"
PROCESS_UTIL = "nvmlDeviceGetProcessUtilization"


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Sampler, FakeNvml]]:
    fake = install(monkeypatch, count=CARDS)
    backend = NvmlBackend(event_retry_seconds=0.0)
    sampler = Sampler(backend, SamplerSettings(interval_seconds=60.0, call_deadline_seconds=60.0), clock=FakeClock())
    try:
        yield sampler, fake
    finally:
        sampler.stop()
        backend.close()


def _cycles(sampler: Sampler, fake: FakeNvml, n: int, call: str) -> int:
    before = fake.calls[call]
    for _ in range(n):
        snapshot = sampler.run_once()
        assert all(g.fresh for g in snapshot.gpus)
    return fake.calls[call] - before


def test_the_mig_mode_is_read_once_per_recheck_period_not_every_cycle(node: tuple[Sampler, FakeNvml]) -> None:
    sampler, fake = node
    _cycles(sampler, fake, 1, MIG_MODE)  # start-up: identity (mig_capable) and the first reading
    assert _cycles(sampler, fake, 2 * RECHECK_CYCLES, MIG_MODE) == 2 * CARDS  # was one per card per cycle


def test_a_reset_between_samples_makes_the_next_cycle_read_the_mig_mode(node: tuple[Sampler, FakeNvml]) -> None:
    sampler, fake = node
    _cycles(sampler, fake, 2, MIG_MODE)
    fake.reset_gpu(1)  # nvidia-smi -r: the energy counter starts over
    # the cycle that sees the reset drops card 1's caches: the identity read again in the next reads the mode
    assert _cycles(sampler, fake, 2, MIG_MODE) == 1


def test_a_pending_mig_mode_is_read_every_cycle_until_it_applies(
    node: tuple[Sampler, FakeNvml], monkeypatch: pytest.MonkeyPatch
) -> None:
    sampler, fake = node
    _cycles(sampler, fake, 1, MIG_MODE)
    pending = [0, 1]  # nvidia-smi -mig 1 on a busy card: pending until the card is reset
    monkeypatch.setattr(pynvml, MIG_MODE, fake._guard(MIG_MODE, lambda handle: pending))
    _cycles(sampler, fake, RECHECK_CYCLES, MIG_MODE)  # each card's next scheduled reading finds the change pending
    assert _cycles(sampler, fake, 3, MIG_MODE) == 3 * CARDS
    pending[:] = [1, 1]  # applied: this cycle reads it, the change renews the cards' caches, the next reads the
    _cycles(sampler, fake, 2, MIG_MODE)  # identity again (and the mode with it)
    assert _cycles(sampler, fake, RECHECK_CYCLES - 2, MIG_MODE) == 0


def test_process_utilization_only_on_cards_with_processes(node: tuple[Sampler, FakeNvml]) -> None:
    sampler, fake = node
    assert _cycles(sampler, fake, 3, PROCESS_UTIL) == 0  # the captured cards run nothing
    fake.add_captured_process()  # the fake lists it on every card
    assert _cycles(sampler, fake, 3, PROCESS_UTIL) == 3 * CARDS


def test_a_mode_change_on_the_same_handle_is_read_in_the_cycle_it_shows(node: tuple[Sampler, FakeNvml]) -> None:
    sampler, fake = node
    _cycles(sampler, fake, 2, MIG_MODE)
    fake.set_mig(True, new_handles=False)  # no call fails and the handle holds; the utilization rates stop answering
    snapshot = sampler.run_once()
    assert all(g.sample is not None and g.sample.mig_mode_current is True for g in snapshot.gpus)
