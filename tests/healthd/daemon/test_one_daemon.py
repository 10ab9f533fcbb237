"""One daemon per node: a second xpu-healthd on the same state directory or the same sockets exits 2 with one line
naming the first one's pid and sockets, and the first is untouched (its sockets answer, its simulated node's files
are not rewritten). Real daemon processes on the simulated node throughout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from healthd.api.v1 import health_pb2, health_pb2_grpc
from healthd.rpc.sockets import SocketInUseError, claim_socket_path, serving_pid
from tests.support.daemon_process import DaemonProcess

pytestmark = pytest.mark.e2e


def second_daemon(*, socket_path: Path, state_dir: Path) -> subprocess.CompletedProcess[str]:
    """A second xpu-healthd; before one-daemon-per-node it started and ran, so the timeout fails the test."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "healthd",
            "--simulate",
            "--metrics-listen",
            "127.0.0.1:0",
            "--grpc-listen",
            f"unix:{socket_path}",
            "--state-dir",
            str(state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def daemon_in(directory: Path) -> DaemonProcess:
    directory.mkdir(exist_ok=True)
    return DaemonProcess(directory)


def refused(out: subprocess.CompletedProcess[str], *must_name: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xpu-healthd: "), out.stderr
    for text in must_name:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def answers(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).GetNodeHealth(health_pb2.GetNodeHealthRequest(), timeout=10)
    return bool(reply.boot_id)


def simulated_files(state_dir: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every file of the simulated node's sysfs and driver tables."""
    out = {}
    for top in ("simulated-sysfs", "simulated-driver"):
        for path in (state_dir / top).rglob("*"):
            if path.is_file() and not path.is_symlink():
                st = path.stat()
                out[str(path)] = (st.st_ino, st.st_mtime_ns)
    assert out, "the simulated node writes its files"
    return out


def test_second_daemon_on_the_same_state_dir_exits_2_and_the_first_is_untouched(tmp_path: Path) -> None:
    with daemon_in(tmp_path / "a") as first:
        assert first.proc is not None
        state = tmp_path / "a" / "state"
        before = simulated_files(state)
        out = second_daemon(socket_path=tmp_path / "b.sock", state_dir=state)
        line = refused(out, str(state), f"pid {first.proc.pid}", str(first.socket), "in use")
        assert "healthd-admin.sock" in line
        assert simulated_files(state) == before
        assert answers(first.address)
        assert first.get("/healthz")[0] == 200


def test_second_daemon_on_the_same_socket_exits_2_and_leaves_the_sockets(tmp_path: Path) -> None:
    with daemon_in(tmp_path / "a") as first:
        assert first.proc is not None
        admin = first.socket.parent / "healthd-admin.sock"
        inodes = {p: p.stat().st_ino for p in (first.socket, admin)}
        out = second_daemon(socket_path=first.socket, state_dir=tmp_path / "b-state")
        refused(out, str(first.socket), f"pid {first.proc.pid}")
        assert {p: p.stat().st_ino for p in inodes} == inodes  # not unlinked, not rebound
        assert answers(first.address)
        assert serving_pid(admin) == first.proc.pid
        # the second one never built its node: nothing in its state directory but the lock
        assert [p.name for p in (tmp_path / "b-state").iterdir()] == ["healthd.lock"]


def test_main_sockets_in_one_directory_do_not_share_the_admin_socket(tmp_path: Path) -> None:
    """Two daemons whose main sockets share a directory would share healthd-admin.sock beside them: refused."""
    with daemon_in(tmp_path / "a") as first:
        assert first.proc is not None
        other = first.socket.parent / "other.sock"
        out = second_daemon(socket_path=other, state_dir=tmp_path / "b-state")
        refused(out, "admin_socket", "healthd-admin.sock", f"pid {first.proc.pid}")
        assert not other.exists()
        assert answers(first.address)


def test_move_aside_is_refused_while_the_daemon_runs(tmp_path: Path) -> None:
    with daemon_in(tmp_path / "a") as first:
        assert first.proc is not None
        state = tmp_path / "a" / "state"
        out = subprocess.run(
            [sys.executable, "-m", "healthd", "--state-dir", str(state), "--move-aside", "faults"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        refused(out, f"pid {first.proc.pid}")
        assert (state / "faults.sqlite").exists()


def test_the_lock_goes_with_the_daemon_and_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    """After a kill -9 the lock is gone with the process and the socket files are stale: the next start takes them."""
    first = daemon_in(tmp_path / "a").start()
    assert first.proc is not None
    first.proc.kill()
    first.proc.wait(10)
    first._log_file.close()
    assert first.socket.exists()  # left behind
    with daemon_in(tmp_path / "a") as again:
        assert answers(again.address)


def test_claim_socket_path_removes_a_stale_socket_and_refuses_a_live_one(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()  # the file stays, nobody listens
    claim_socket_path(stale)
    assert not stale.exists()

    live = tmp_path / "live.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(live))
    listener.listen(1)
    try:
        with pytest.raises(SocketInUseError) as err:
            claim_socket_path(live)
        assert err.value.pid == os.getpid()
        assert live.exists()
    finally:
        listener.close()

    plain = tmp_path / "plain"
    plain.write_text("not a socket")
    with pytest.raises(SocketInUseError, match="not a socket"):
        claim_socket_path(plain)
    assert plain.exists()
