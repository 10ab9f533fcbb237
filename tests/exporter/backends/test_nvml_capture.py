"""NvmlBackend without a GPU, part one: the read-only Backend contract (test_backend_contract.py and
test_backend_contract_mig.py) rerun on the real NVML backend over a fake pynvml that answers from the H200 capture
(``tests/fixtures/h200``, read at test time). Part two, test_nvml_capture_translation.py, checks what the card said
comes out of the backend translated as documented.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exporter.backends.nvml import NvmlBackend
from tests.exporter.backends.test_backend_contract import (
    test_close_twice_is_safe,
    test_counters_are_monotonic,
    test_device_count_is_positive,
    test_device_info_identity,
    test_device_info_is_stable,
    test_device_info_types,
    test_fault_injection_is_a_capability,
    test_implements_the_protocol,
    test_nvlinks,
    test_processes,
    test_processes_twice,
    test_reopen_after_close,
    test_sample_error_counters_are_not_negative,
    test_sample_memory_adds_up,
    test_sample_ratios_and_ranges,
    test_sample_types,
    test_system_info,
    test_unknown_device_index_is_a_backend_error,
    test_wait_event_returns_within_its_timeout,
    test_wait_event_zero_timeout,
)
from tests.exporter.backends.test_backend_contract_mig import (
    test_mig_instances,
    test_mig_profiles,
    test_mig_profiles_are_stable,
    test_pcie_throughput,
    test_profiling_brackets_an_interval,
    test_profiling_sooner_than_the_floor_reports_nothing_new,
)
from tests.support.nvml_capture_data import INVENTORY_PATH
from tests.support.nvml_capture_fake import install

# The contract's read-only tests, collected here against the `backend` fixture below. The MIG create/destroy
# tests (the `simulated` fixture) are left out: the fake models the captured card, which has no MIG instances.
CONTRACT_TESTS = (
    test_close_twice_is_safe,
    test_counters_are_monotonic,
    test_device_count_is_positive,
    test_device_info_identity,
    test_device_info_is_stable,
    test_device_info_types,
    test_fault_injection_is_a_capability,
    test_implements_the_protocol,
    test_mig_instances,
    test_mig_profiles,
    test_mig_profiles_are_stable,
    test_nvlinks,
    test_pcie_throughput,
    test_processes,
    test_processes_twice,
    test_profiling_brackets_an_interval,
    test_profiling_sooner_than_the_floor_reports_nothing_new,
    test_reopen_after_close,
    test_sample_error_counters_are_not_negative,
    test_sample_memory_adds_up,
    test_sample_ratios_and_ranges,
    test_sample_types,
    test_system_info,
    test_unknown_device_index_is_a_backend_error,
    test_wait_event_returns_within_its_timeout,
    test_wait_event_zero_timeout,
)


@pytest.fixture(
    params=[
        pytest.param({}, id="h200-as-captured"),
        pytest.param({"nvlinks": 18, "mig": True, "count": 2}, id="h200x2-nvlink18-mig"),
        pytest.param({"mig": True, "privileged": False}, id="h200-mig-unprivileged"),
    ]
)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[NvmlBackend]:
    """NvmlBackend over the fake; the contract tests above run on it (this fixture overrides theirs)."""
    state = install(monkeypatch, **request.param)
    b = NvmlBackend(monotonic=state.gpm.clock)
    b.open()
    try:
        yield b
    finally:
        b.close()


def test_capture_lives_in_the_repository() -> None:
    assert INVENTORY_PATH.parts[-4:] == ("tests", "fixtures", "h200", "nvml-inventory.json")
