"""Nothing the engine accepted is lost when the daemon is killed with SIGKILL mid-stream.

A child process feeds events into a real engine over a real journal and prints the sequence number of each
record as soon as ``event()`` returns (that is the acceptance point). We SIGKILL it while it is writing, reopen
the journal, and check that every acknowledged record is there, in order, with no hole, and that sequence
numbers carry on from where they stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from healthd.faults.fault import FaultFilter
from tests.support.clock import FakeClock
from tests.support.faults_helpers import make_engine, xid
from tests.support.paths import REPO, TESTS

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from tests.support.clock import FakeClock
    from tests.support.faults_helpers import make_engine, xid
    clock = FakeClock()
    engine = make_engine(Path({state!r}), clock, dedup_window_seconds=0.0)
    i = 0
    while True:
        for record in engine.accept_event(xid(1000 + i % 50)):
            print(record.seq, record.fault.id, flush=True)
        clock.advance(1)
        i += 1
    """
)


def test_sigkill_mid_stream_loses_nothing_acknowledged(tmp_path: Path) -> None:
    tests_dir = str(TESTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), tests_dir])}
    acknowledged: list[tuple[int, str]] = []
    with subprocess.Popen(
        [sys.executable, "-c", WRITER.format(tests=tests_dir, state=str(tmp_path))],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            seq, fault_id = line.split()
            acknowledged.append((int(seq), fault_id))
            if len(acknowledged) >= 300:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        rest = proc.stdout.read()  # acknowledgements already in the pipe when it died count too
    acknowledged += [(int(a), b) for a, b in (ln.split() for ln in rest.splitlines() if len(ln.split()) == 2)]
    assert proc.returncode == -signal.SIGKILL

    clock = FakeClock(2_000_000_000.0)
    engine = make_engine(tmp_path, clock)
    stored = engine.journal.records_after(0, 1_000_000)
    stored_seqs = [r.seq for r in stored]
    assert stored_seqs == list(range(1, len(stored) + 1))  # no hole, no reordering
    assert len(stored) >= len(acknowledged)  # at most the one in flight beyond what was acknowledged
    by_seq = {r.seq: r.fault.id for r in stored}
    assert all(by_seq[seq] == fault_id for seq, fault_id in acknowledged)
    assert len(engine.journal.list_faults(FaultFilter(limit=10_000))) == 50
    # sequence numbers continue after the last stored record
    new = engine.accept_event(xid(31))
    assert new[0].seq == stored_seqs[-1] + 1
