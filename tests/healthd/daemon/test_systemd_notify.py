"""sd_notify against a real NOTIFY_SOCKET: READY after the first sample with sockets bound, WATCHDOG while the loop
turns (and not when it is blocked), STATUS, RELOADING on SIGHUP, STOPPING on SIGTERM; and the pieces in-process."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from healthd.daemon.systemd import Notifier, Progress, SamplerProgress, Watchdog, watchdog_interval
from tests.support.servicehelpers import NotifySocket, running_daemon

WATCHDOG_USEC = 400_000  # pings every 0.2 s


@pytest.fixture
def notify(tmp_path: Path) -> NotifySocket:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def daemon_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--simulate",
        "h200x1",
        "--metrics-listen",
        "127.0.0.1:0",
        "--grpc-listen",
        f"unix:{tmp_path}/healthd.sock",
        "--state-dir",
        str(tmp_path / "state"),
        *extra,
    ]


def daemon_env(notify: NotifySocket, **extra: str) -> dict[str, str]:
    return {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": str(WATCHDOG_USEC), **extra}


def healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
        return int(reply.status)


@pytest.mark.e2e
def test_ready_watchdog_status_then_stopping(tmp_path: Path, notify: NotifySocket) -> None:
    with running_daemon(daemon_args(tmp_path), daemon_env(notify)) as daemon:
        ready = notify.wait_for("READY")
        # at READY every socket is bound and the first sample exists: /healthz is already 200
        assert (tmp_path / "healthd.sock").is_socket()
        assert healthz(daemon.metrics_port()) == 200
        assert ready["READY"] == "1"
        assert "1 GPUs (simulated:h200x1)" in ready["STATUS"]
        assert not any("READY" in m for m in notify.received[:-1]), "READY sent twice or early"

        pings = [notify.wait_for("WATCHDOG") for _ in range(3)]
        assert all(p["WATCHDOG"] == "1" for p in pings)
        statuses = [m["STATUS"] for m in notify.received if "STATUS" in m]
        assert any("last sample" in s for s in statuses[1:])

        daemon.signal(signal.SIGTERM)
        stopping = notify.wait_for("STOPPING")
        assert stopping["STOPPING"] == "1"
        assert daemon.proc.wait(20) == 0
        after = notify.drain(0.3)
        assert not any("WATCHDOG" in m for m in after), "pinged the watchdog after STOPPING"
        names = [e.get("event") for e in daemon.events()]
        assert names.index("stopping") < names.index("stopped")


@pytest.mark.e2e
def test_blocked_event_loop_stops_the_watchdog(tmp_path: Path, notify: NotifySocket) -> None:
    blocker = [sys.executable, "-m", "tests.support.loop_blocker"]  # SIGUSR2 blocks its event loop
    with running_daemon(daemon_args(tmp_path), daemon_env(notify), python=blocker) as daemon:
        notify.wait_for("READY")
        notify.wait_for("WATCHDOG")
        notify.wait_for("WATCHDOG")
        daemon.signal(signal.SIGUSR2)  # a synchronous sleep on the event loop
        daemon.wait_event("test hook: blocking the event loop")
        notify.drain(0.3)  # a ping already on its way before the block
        window = notify.drain(2.0)  # ten ping intervals
        assert not any("WATCHDOG" in m for m in window), window
        assert daemon.proc.poll() is None, "blocked, not dead: systemd's watchdog is what ends it"


@pytest.mark.e2e
def test_without_notify_socket_the_daemon_runs_and_says_nothing(tmp_path: Path) -> None:
    with running_daemon(daemon_args(tmp_path), {}) as daemon:
        assert daemon.wait_event("ready")["notify"] == "none"
        assert healthz(daemon.metrics_port()) == 200
        assert daemon.stop() == 0


@pytest.mark.e2e
def test_sighup_reloads_log_level_and_names_what_needs_a_restart(tmp_path: Path, notify: NotifySocket) -> None:
    config = tmp_path / "healthd.toml"
    config.write_text('[daemon]\nlog_level = "info"\n[sampler]\ninterval_seconds = 5\n')
    with running_daemon(daemon_args(tmp_path, "--config", str(config)), daemon_env(notify)) as daemon:
        notify.wait_for("READY")
        config.write_text('[daemon]\nlog_level = "debug"\n[sampler]\ninterval_seconds = 2\n')
        daemon.signal(signal.SIGHUP)
        assert notify.wait_for("RELOADING")["RELOADING"] == "1"
        notify.wait_for("READY")
        event = daemon.wait_event("configuration reloaded")
        assert event["applied"] == ["daemon.log_level"]
        assert event["needs_restart"] == ["sampler.interval_seconds"]

        config.write_text("[daemon]\nlog_level = 7\n")  # broken: the running settings stay
        daemon.signal(signal.SIGHUP)
        notify.wait_for("RELOADING")
        assert "reload failed (daemon.log_level" in notify.wait_for("READY")["STATUS"]
        assert (
            "daemon.log_level: expected a string"
            in daemon.wait_event("reload failed; the running settings stay")["error"]
        )
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0


# ----- in-process ----------------------------------------------------------------------------------------------


class RecordingNotifier(Notifier):
    def __init__(self) -> None:
        super().__init__({})
        self.sent: list[dict[str, str | int]] = []

    def notify(self, **fields: str | int) -> bool:
        self.sent.append(fields)
        return True


def test_stalled_sampler_stops_pings_and_says_why() -> None:
    now = [0.0]
    seq = [1]

    class Snap:
        @property
        def seq(self) -> int:
            return seq[0]

    progress = SamplerProgress(lambda: Snap(), limit=20.0, monotonic=lambda: now[0])  # type: ignore[arg-type,return-value]
    notifier = RecordingNotifier()
    watchdog = Watchdog(notifier, 1.0, progress, lambda: "fine")
    for t in (0.0, 5.0, 10.0):  # new snapshots keep coming
        now[0] = t
        seq[0] += 1
        watchdog.tick()
    assert sum(1 for m in notifier.sent if "WATCHDOG" in m) == 3
    notifier.sent.clear()
    for t in (15.0, 25.0, 31.0, 40.0):  # no new snapshot after t=10
        now[0] = t
        watchdog.tick()
    pings = [m for m in notifier.sent if "WATCHDOG" in m]
    assert len(pings) == 2  # 15 and 25 are within the 20 s limit; 31 and 40 are not
    assert notifier.sent[-1]["STATUS"] == "stalled: sampler made no progress for 30s (limit 20s)"
    seq[0] += 1
    now[0] = 41.0
    watchdog.tick()
    assert notifier.sent[-2:] == [{"WATCHDOG": 1}, {"STATUS": "fine"}]


def test_progress_reports_a_stall_without_watchdog_configured() -> None:
    notifier = RecordingNotifier()
    watchdog = Watchdog(notifier, None, lambda: Progress(False, "stuck"), lambda: "fine")
    watchdog.tick()
    assert notifier.sent == [{"STATUS": "stalled: stuck"}]


def test_watchdog_interval_reads_the_environment() -> None:
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "junk"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}) == 1.0
    assert watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}, pid=4242) is None


def test_notifier_is_silent_without_notify_socket() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.ready("x") is False


def test_notifier_sends_datagrams(tmp_path: Path) -> None:
    sock = NotifySocket(tmp_path / "n.sock")
    notifier = Notifier({"NOTIFY_SOCKET": str(sock.path)})
    try:
        assert notifier.via == "datagram"
        assert notifier.ready("two\nlines")
        assert sock.next(5) == {"READY": "1", "STATUS": "two lines"}
        assert notifier.stopping()
        assert sock.next(5) == {"STOPPING": "1", "STATUS": "stopping"}
        assert notifier.delivered == 2
    finally:
        notifier.close()
        sock.close()


def test_a_notify_socket_that_went_away_is_not_an_error(tmp_path: Path) -> None:
    sock = NotifySocket(tmp_path / "n.sock")
    notifier = Notifier({"NOTIFY_SOCKET": str(sock.path)})
    sock.close()
    (tmp_path / "n.sock").unlink(missing_ok=True)
    assert notifier.stopping() is False  # said, not raised: stopping must go on
    assert notifier.dropped == {"queue_full": 0, "unreachable": 1}
    notifier.close()


def test_a_listener_that_never_reads_costs_dropped_messages_not_a_blocked_sender(tmp_path: Path) -> None:
    """The kernel queues a few datagrams for an unread socket (net.unix.max_dgram_qlen); after that a blocking send
    would wait for ever. Sends go on from a thread here so that a blocked one fails the join instead of the run."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "n.sock"))
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "n.sock")})
    results: list[bool] = []
    sender = threading.Thread(target=lambda: results.extend(notifier.status(f"tick {i}") for i in range(200)))
    sender.start()
    sender.join(30)  # a bound, not a measurement: 200 non-blocking sends take microseconds
    try:
        assert not sender.is_alive(), "a send blocked on a listener that does not read"
        assert len(results) == 200
        assert notifier.dropped["queue_full"] == results.count(False) > 0
        assert notifier.delivered == results.count(True) > 0
        listener.setblocking(False)
        while True:  # the listener catches up: the next message goes through again
            try:
                listener.recv(65536)
            except BlockingIOError:
                break
        assert notifier.watchdog()
        assert listener.recv(100) == b"WATCHDOG=1"
    finally:
        listener.close()
        notifier.close()


@pytest.mark.e2e
def test_a_notify_socket_that_never_reads_does_not_slow_metrics_or_healthz(tmp_path: Path) -> None:
    """A proxy or harness that stops reading its NOTIFY_SOCKET: the daemon's pings fill the queue within a second
    (every 0.2 s here), then every later message is dropped; /metrics and /healthz go on answering and say so."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify.sock"))
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    try:
        with running_daemon(daemon_args(tmp_path), env) as daemon:
            port = daemon.metrics_port()
            dropped = 0.0
            for _ in range(300):  # the queue fills after about 11 messages: 2-3 s at a ping every 0.2 s
                dropped = _dropped(_metrics(port))
                if dropped > 0:
                    break
                time.sleep(0.1)
            assert dropped > 0, "the daemon's messages were never dropped: the listener's queue did not fill"
            for _ in range(10):  # well past the moment the old blocking send froze the daemon
                assert healthz(port) == 200
                assert _dropped(_metrics(port)) >= dropped
                time.sleep(0.3)
            assert daemon.stop() == 0
    finally:
        listener.close()


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def _dropped(text: str) -> float:
    for line in text.splitlines():
        if line.startswith('xpu_sd_notify_dropped_total{reason="queue_full"}'):
            return float(line.split()[-1])
    raise AssertionError("no xpu_sd_notify_dropped_total series on /metrics")


def test_datagram_fallback_reaches_an_abstract_socket() -> None:
    name = f"xpu-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.watchdog()
        notifier.close()
        server.settimeout(5)
        assert server.recv(100) == b"WATCHDOG=1"


def test_a_failing_status_summary_does_not_stop_the_pings() -> None:
    def broken() -> str:
        raise RuntimeError("summary bug")

    notifier = RecordingNotifier()
    Watchdog(notifier, 1.0, lambda: Progress(True, "ok"), broken).tick()
    assert notifier.sent == [{"WATCHDOG": 1}, {"STATUS": "running (status summary failed; see the log)"}]
