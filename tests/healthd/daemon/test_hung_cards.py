"""Hung cards stall nothing: the scenario of bench/hung_cards_bench.py, with its behaviour asserted.

GPUs 6 and 7 (MIG) hang in mig_instances and GPU 3 (TDM, with a partition) hangs in every call, for 120 s, while
real clients call the daemon about the other cards. Times are printed by the bench, not asserted here; what is
asserted is that nothing about the healthy cards fails, that an XID on a healthy card reaches the hook and the
fault stream while the others hang, that the hung cards cost no threads, that health names them, and that SIGTERM
ends the daemon (code 0) within systemd's patience although the calls never return.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.hung_cards_bench import MIG_CARDS, TDM_HUNG_CARD, report, run_scenario

pytestmark = pytest.mark.e2e
HUNG = sorted((*MIG_CARDS, TDM_HUNG_CARD))


@pytest.mark.timeout(400)
def test_hung_cards_stall_nothing(tmp_path: Path) -> None:
    result = run_scenario(tmp_path, hold_seconds=120.0, reconcile_seconds=1.0, stop_limit=10.0)
    print(report(result))  # the figures, for the CI log
    assert all(len(v) > 20 for v in result.calls.latencies.values()), "clients kept calling throughout"
    assert {k: dict(v) for k, v in result.calls.failures.items() if v} == {}, result.log_tail
    assert result.xid_to_hook_seconds is not None, "XID 79 on a healthy card reached the hook while cards hung"
    assert result.xid_to_watch_seconds is not None, "... and the WatchFaults stream"
    assert result.threads_during - result.threads_before <= len(HUNG), "at most one thread per hung card"
    code, text = result.healthz
    assert code == 200 and text.startswith("degraded:")
    for gpu in HUNG:
        assert f"GPU {gpu} (" in text, text
        assert result.grpc_health[f"xpu.runtime.v1.gpu/{gpu}"] == "NOT_SERVING"
    for gpu in set(range(8)) - set(HUNG) - {1}:  # GPU 1 has the XID fault, but answers
        assert result.grpc_health[f"xpu.runtime.v1.gpu/{gpu}"] == "SERVING"
    assert result.grpc_health["(overall)"] == "SERVING"
    assert result.exit_code == 0, f"SIGTERM did not end the daemon in time (or not with 0):\n{result.log_tail}"
    assert "exiting with driver calls that never returned" in result.log_tail
