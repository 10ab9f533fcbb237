"""Fault engine rules: dedup, flap damping, resolution, stale data, escalation across reboots, hook queueing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthd.faults.fault import FaultFilter, FaultRecord, FaultState, RecordKind
from healthd.findings import Action, CheckResult, CheckStatus, Finding, FindingKind, ProbeReport, Severity
from tests.support.clock import FakeClock
from tests.support.faults_helpers import GPU0, GPU1, SETTINGS, ecc_finding, ecc_report, make_engine, xid


def kinds(records: list[FaultRecord]) -> list[str]:
    return [r.kind.value for r in records]


def test_condition_opens_only_after_persisting_and_resolves_only_after_clearing(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = make_engine(tmp_path, clock)
    assert engine.accept_report(ecc_report(ecc_finding())) == []  # first sighting: pending, nothing journaled
    assert engine.active_faults() == []
    opened = engine.accept_report(ecc_report(ecc_finding()))
    assert kinds(opened) == ["opened"]
    fault = opened[0].fault
    assert (fault.gpu, fault.check, fault.code, fault.state) == (
        GPU0,
        "ecc",
        "ecc_uncorrectable_volatile",
        FaultState.ACTIVE,
    )
    assert engine.accept_report(ecc_report(ecc_finding())) == []  # still there: same fault, no new record
    assert engine.accept_report(ecc_report()) == []  # one clean evaluation is not enough
    resolved = engine.accept_report(ecc_report())
    assert kinds(resolved) == ["resolved"]
    assert resolved[0].fault.id == fault.id
    assert engine.active_faults() == []


def test_single_blip_never_opens(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock())
    engine.accept_report(ecc_report(ecc_finding()))
    engine.accept_report(ecc_report())
    engine.accept_report(ecc_report(ecc_finding()))
    assert engine.active_faults() == []
    assert engine.journal.last_seq == 0


def test_unknown_status_is_not_recovery(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock(), open_after_evaluations=1, resolve_after_evaluations=1)
    engine.accept_report(ecc_report(ecc_finding()))
    for _ in range(5):  # the probe lost sight of GPU0: no finding, but status unknown
        assert engine.accept_report(ecc_report(status={0: CheckStatus.UNKNOWN})) == []
    assert [f.gpu for f in engine.active_faults()] == [GPU0]
    # a report of another check never resolves it either
    engine.accept_report(ProbeReport("nvlink", (CheckResult("nvlink", GPU0, CheckStatus.OK),), ()))
    assert len(engine.active_faults()) == 1
    assert kinds(engine.accept_report(ecc_report())) == ["resolved"]


def test_missing_result_for_gpu_is_not_recovery(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock(), open_after_evaluations=1, resolve_after_evaluations=1)
    engine.accept_report(ecc_report(ecc_finding()))
    only_gpu1 = ProbeReport("ecc", (CheckResult("ecc", GPU1, CheckStatus.OK),), ())
    assert engine.accept_report(only_gpu1) == []
    assert len(engine.active_faults()) == 1


def test_flapping_condition_reopens_the_same_fault(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = make_engine(tmp_path, clock, open_after_evaluations=1, resolve_after_evaluations=1)
    first = engine.accept_report(ecc_report(ecc_finding()))[0].fault
    for _ in range(3):
        clock.advance(10)
        assert kinds(engine.accept_report(ecc_report())) == ["resolved"]
        clock.advance(10)
        again = engine.accept_report(ecc_report(ecc_finding()))
        assert kinds(again) == ["reopened"]
        assert again[0].fault.id == first.id
    assert engine.active_faults()[0].flaps == 3
    assert engine.active_faults()[0].count == 4
    # outside the window it is a new fault
    engine.accept_report(ecc_report())
    clock.advance(301)
    fresh = engine.accept_report(ecc_report(ecc_finding()))
    assert kinds(fresh) == ["opened"]
    assert fresh[0].fault.id != first.id


def test_worse_condition_is_an_update_record(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock(), open_after_evaluations=1)
    engine.accept_report(ecc_report(ecc_finding()))
    worse = engine.accept_report(ecc_report(ecc_finding(severity=Severity.FATAL, action=Action.REBOOT_NODE)))
    assert kinds(worse) == ["updated"]
    assert worse[0].fault.action == Action.REBOOT_NODE


def test_event_burst_is_one_fault_with_a_count(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = make_engine(tmp_path, clock)
    records: list[FaultRecord] = []
    for _ in range(100):
        records += engine.accept_event(xid(13))
        clock.advance(1)
    assert kinds(records) == ["opened", "updated"]  # one update record per 60 s dedup window
    (fault,) = engine.active_faults()
    assert fault.count == 100
    assert fault.evidence["xid"] == "13"
    # the count is durable, not only in memory
    reopened = make_engine(tmp_path, clock)
    assert reopened.active_faults()[0].count == 100
    assert engine.xid_counts() == {("0", GPU0.uuid, "13"): 100}


def test_events_on_different_gpus_or_codes_are_different_faults(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock())
    engine.accept_event(xid(13, GPU0))
    engine.accept_event(xid(13, GPU1))
    engine.accept_event(xid(31, GPU0))
    assert len(engine.active_faults()) == 3


def test_event_fault_resolves_after_quiet_period_unless_it_needs_action(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = make_engine(tmp_path, clock)
    engine.accept_event(xid(13))
    engine.accept_event(xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE))
    clock.advance(599)
    assert engine.tick() == []
    clock.advance(2)
    resolved = engine.tick()
    assert [(r.kind, r.fault.code) for r in resolved] == [(RecordKind.RESOLVED, "xid_13")]
    clock.advance(100_000)
    assert engine.tick() == []
    assert [f.code for f in engine.active_faults()] == ["xid_79"]


def test_reboot_resolves_reboot_faults_but_not_replace_faults(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = make_engine(tmp_path, clock, boot_id="boot-1")
    engine.accept_event(xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE))
    engine.accept_event(xid(48, GPU1, severity=Severity.FATAL, action=Action.REPLACE_NODE))
    engine.journal.close()
    same_boot = make_engine(tmp_path, clock, boot_id="boot-1")  # daemon restart, no reboot
    assert len(same_boot.active_faults()) == 2
    same_boot.journal.close()
    after_reboot = make_engine(tmp_path, clock, boot_id="boot-2")
    assert [f.code for f in after_reboot.active_faults()] == ["xid_48"]
    resolved = after_reboot.journal.list_faults(FaultFilter(state=FaultState.RESOLVED))
    assert [f.code for f in resolved] == ["xid_79"]
    assert "rebooted" in resolved[0].resolve_reason


def test_fatal_fault_returning_after_k_reboots_becomes_replace_node(tmp_path: Path) -> None:
    clock = FakeClock()
    fatal = xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE)
    opened: list[FaultRecord] = []
    for boot in ("boot-1", "boot-2", "boot-3"):
        engine = make_engine(tmp_path, clock, boot_id=boot, targets=("unix:/hook.sock",))
        opened += engine.accept_event(fatal)
        engine.journal.close()
        clock.advance(3600)
    assert [(r.kind.value, r.fault.action) for r in opened] == [
        ("opened", Action.REBOOT_NODE),
        ("opened", Action.REBOOT_NODE),
        ("escalated", Action.REPLACE_NODE),
    ]
    assert opened[2].fault.evidence["escalated_from_action"] == "reboot_node"
    assert len({r.fault.id for r in opened}) == 3


def test_escalation_of_a_condition_that_persists_across_reboots(tmp_path: Path) -> None:
    clock = FakeClock()
    fatal = ecc_finding(severity=Severity.FATAL, action=Action.REBOOT_NODE)
    records: list[FaultRecord] = []
    for boot in ("boot-1", "boot-2", "boot-3"):
        engine = make_engine(tmp_path, clock, boot_id=boot, open_after_evaluations=1, escalation_reboots=2)
        records += engine.accept_report(ecc_report(fatal))
        engine.journal.close()
    assert kinds(records) == ["opened", "resolved", "escalated"]
    assert records[1].fault.resolve_reason.startswith("superseded")
    assert records[2].fault.action == Action.REPLACE_NODE


def test_escalation_off_with_zero(tmp_path: Path) -> None:
    clock = FakeClock()
    for boot in ("b1", "b2", "b3", "b4"):
        engine = make_engine(tmp_path, clock, boot_id=boot, escalation_reboots=0)
        records = engine.accept_event(xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE))
        assert records[0].fault.action == Action.REBOOT_NODE
        engine.journal.close()


def test_hook_is_queued_once_per_fault_when_action_reaches_the_level(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock(), targets=("unix:/a.sock", "unix:/b.sock"), open_after_evaluations=1)
    engine.accept_event(xid(13))  # restart_app: below reboot_node
    engine.accept_report(ecc_report(ecc_finding()))  # reset_gpu: below
    engine.accept_report(
        ecc_report(ecc_finding(action=Action.REBOOT_NODE, severity=Severity.FATAL))
    )  # worse: now queued
    engine.accept_report(ecc_report(ecc_finding(action=Action.REBOOT_NODE, severity=Severity.FATAL)))
    engine.accept_event(xid(79, GPU1, severity=Severity.FATAL, action=Action.REBOOT_NODE))
    engine.accept_event(xid(79, GPU1, severity=Severity.FATAL, action=Action.REBOOT_NODE))
    assert engine.journal.outbox_depth() == {"unix:/a.sock": 2, "unix:/b.sock": 2}
    head = engine.journal.outbox_head("unix:/a.sock")
    assert head is not None
    assert head.fault_id == next(f.id for f in engine.active_faults() if f.check == "ecc")


def test_sequence_numbers_are_monotonic_across_restarts_and_retention(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = make_engine(tmp_path, clock)
    seqs = [r.seq for r in engine.accept_event(xid(13))]
    clock.advance(601)
    seqs += [r.seq for r in engine.tick()]
    engine.journal.prune(clock.now + 10 * 86400 * 100, 1, 1)  # delete everything resolved
    engine.journal.close()
    again = make_engine(tmp_path, clock)
    seqs += [r.seq for r in again.accept_event(xid(31))]
    assert seqs == [1, 2, 3]
    assert again.journal.first_retained_seq() == 3


def test_node_wide_condition_resolves_on_a_report_that_knows_every_gpu(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock(), open_after_evaluations=1, resolve_after_evaluations=1)
    driver = Finding("driver", "driver_unresponsive", Severity.CRITICAL, Action.REBOOT_NODE, "driver hangs")
    per_gpu = (CheckResult("driver", GPU0, CheckStatus.OK), CheckResult("driver", GPU1, CheckStatus.OK))
    assert kinds(engine.accept_report(ProbeReport("driver", per_gpu, (driver,)))) == ["opened"]
    partly_unknown = (CheckResult("driver", GPU0, CheckStatus.OK), CheckResult("driver", GPU1, CheckStatus.UNKNOWN))
    assert engine.accept_report(ProbeReport("driver", partly_unknown, ())) == []
    assert engine.accept_report(ProbeReport("driver", (), ())) == []  # no results at all: nothing known
    assert kinds(engine.accept_report(ProbeReport("driver", per_gpu, ()))) == ["resolved"]


FINDINGS = [
    ecc_finding(GPU0),
    ecc_finding(GPU1, severity=Severity.FATAL, action=Action.REBOOT_NODE),
    xid(13, GPU0),
    xid(79, GPU1, severity=Severity.FATAL, action=Action.REBOOT_NODE),
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["report", "event", "tick", "restart", "reboot"]),
            st.sets(st.integers(0, 3)),
            st.sampled_from(list(CheckStatus)),
            st.floats(0, 900),
        ),
        max_size=40,
    )
)
def test_engine_invariants_under_random_input(tmp_path_factory: pytest.TempPathFactory, steps: list[Any]) -> None:
    """Whatever happens: one active fault per identity, contiguous seqs, and memory always equals the journal."""
    state = tmp_path_factory.mktemp("engine")
    clock = FakeClock()
    boot = 1
    engine = make_engine(state, clock, targets=("unix:/h.sock",))
    for op, picks, status, dt in steps:
        clock.advance(dt)
        if op == "report":
            findings = [FINDINGS[i] for i in sorted(picks) if FINDINGS[i].kind is FindingKind.CONDITION]
            engine.accept_report(ecc_report(*findings, status={0: status}))
        elif op == "event":
            for i in sorted(picks):
                engine.accept_event(FINDINGS[i])
        elif op == "tick":
            engine.tick()
        else:
            boot += op == "reboot"
            active_before = {f.id for f in engine.active_faults()}
            engine.journal.close()
            engine = make_engine(state, clock, boot_id=f"boot-{boot}", targets=("unix:/h.sock",))
            if op == "restart":
                assert {f.id for f in engine.active_faults()} == active_before
        active = engine.active_faults()
        assert len({f.identity for f in active}) == len(active)
        assert {f.id: f.count for f in active} == {f.id: f.count for f in engine.journal.active_faults()}
    records = engine.journal.records_after(0, 10_000)
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    queued = engine.journal.outbox_depth().get("unix:/h.sock", 0)
    assert queued == len({r.fault.id for r in records if r.fault.action >= Action.REBOOT_NODE and r.fault.hooked})
    engine.journal.close()


def test_boot_id_comes_from_the_configured_file(tmp_path: Path) -> None:
    from healthd.daemon.health import HealthComponent
    from healthd.faults.journal import Journal
    from healthd.faults.settings import HookSettings

    boot_file = tmp_path / "boot_id"
    settings = replace(SETTINGS, boot_id_path=boot_file, escalation_reboots=1)
    fatal = xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE)
    actions = []
    for boot in ("0b5e-first\n", "0b5e-second\n"):
        boot_file.write_text(boot)
        health = HealthComponent(Journal(tmp_path / "faults.sqlite"), settings, HookSettings(), clock=FakeClock())
        assert health.engine.boot_id == boot.strip()
        actions += [r.fault.action for r in health.engine.accept_event(fatal) if r.fault.active]
        health.journal.close()
    assert actions == [Action.REBOOT_NODE, Action.REPLACE_NODE]


def test_unreadable_boot_id_never_resolves_by_reboot(tmp_path: Path) -> None:
    from healthd.faults.escalation import read_boot_id

    assert read_boot_id(tmp_path / "missing") == "unknown"
    clock = FakeClock()
    engine = make_engine(tmp_path, clock, boot_id="boot-1")
    engine.accept_event(xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE))
    engine.journal.close()
    assert len(make_engine(tmp_path, clock, boot_id="unknown").active_faults()) == 1


def test_retention_keeps_active_faults_and_undelivered_hook_items(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = make_engine(tmp_path, clock, targets=("unix:/h.sock",))
    engine.accept_event(xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE))  # active, queued
    for code in (13, 31, 43):
        engine.accept_event(xid(code))
    clock.advance(601)
    assert len(engine.tick()) == 3  # the three quiet ones resolve
    journal = engine.journal
    assert journal.prune(clock.now, 86400, 2) == 1  # over the count: the oldest resolved fault goes
    assert len(journal.list_faults(FaultFilter(state=FaultState.RESOLVED))) == 2
    assert journal.prune(clock.now + 2 * 86400, 86400, 100) == 2  # over the age: the rest go
    assert [f.code for f in journal.list_faults(FaultFilter())] == ["xid_79"]
    assert journal.outbox_depth() == {"unix:/h.sock": 1}
    assert journal.records_after(0, 100) == []  # records are history; the faults table is the state


def test_retention_bounds_the_number_of_records_whatever_their_age(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = make_engine(tmp_path, clock)
    for code in range(1, 41):  # 40 young records: none is past the age limit
        engine.accept_event(xid(code))
    journal = engine.journal
    newest = journal.last_seq
    journal.prune(clock.now, 86400, 100, max_records=10)
    kept = journal.records_after(0, 100)
    assert [r.seq for r in kept] == list(range(newest - 9, newest + 1))
    assert len(journal.active_faults()) == 40, "the faults themselves are state, not history"


def test_backoff_grows_exponentially_within_jitter_bounds() -> None:
    import random

    from healthd.faults.outbox import backoff_delay

    rng = random.Random(7)
    for attempts in range(12):
        step = min(30.0, 0.5 * 2**attempts)
        delays = [backoff_delay(attempts, 0.5, 30.0, rng) for _ in range(50)]
        assert all(step / 2 <= d <= step for d in delays)
        assert len(set(delays)) > 1  # jittered: retries of many nodes do not line up
    assert backoff_delay(10_000, 0.5, 30.0, rng) <= 30.0


def test_repeats_within_one_report_are_counted(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock())
    records = engine.accept_report(ProbeReport("xid", (), (xid(13), xid(13), xid(13))))
    assert kinds(records) == ["opened"]
    assert records[0].fault.count == 3
    assert engine.journal.active_faults()[0].count == 3


def test_worse_repeat_within_one_report_reaches_the_hook(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock(), targets=("unix:/h.sock",))
    fatal = xid(13, severity=Severity.FATAL, action=Action.REBOOT_NODE)
    records = engine.accept_report(ProbeReport("xid", (), (xid(13), fatal, fatal)))
    assert [(r.kind.value, r.fault.action, r.fault.count) for r in records] == [("opened", Action.REBOOT_NODE, 3)]
    assert engine.journal.outbox_depth() == {"unix:/h.sock": 1}


def test_the_check_status_version_moves_only_when_a_status_does(tmp_path: Path) -> None:
    """Every report makes new CheckStates; the version metrics keep their lines under stays while the statuses do."""
    engine = make_engine(tmp_path, FakeClock())
    version, states = engine.check_statuses()
    assert states == []
    engine.accept_report(ecc_report())
    first, states = engine.check_statuses()
    assert first != version and [s.result.gpu for s in states] == [GPU0, GPU1]
    engine.accept_report(ecc_report())  # the same statuses again
    again, repeated = engine.check_statuses()
    assert again == first and repeated[0] is not states[0]
    engine.accept_report(ecc_report(status={1: CheckStatus.WARNING}))
    warned, _ = engine.check_statuses()
    assert warned != again
    moved = replace(GPU0, index=5)  # the same card (uuid) under another index
    engine.accept_report(ProbeReport("ecc", (CheckResult("ecc", moved, CheckStatus.OK),), ()))
    renumbered, _ = engine.check_statuses()
    assert renumbered != warned
    engine.accept_report(ProbeReport("fabric", (CheckResult("fabric", None, CheckStatus.OK),), ()))  # a new check
    assert engine.check_statuses()[0] != renumbered
    assert [s.result for s in engine.check_statuses()[1]] == [s.result for s in engine.check_states()]
