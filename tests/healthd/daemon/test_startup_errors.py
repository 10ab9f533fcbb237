"""Every way xpu-healthd can fail to start: one line on stderr that names the option, file or address; status 2.

Failures found before the daemon builds anything are checked by calling its main() (what the console script
runs) in this process; those that need the daemon half-built (a bound port, a corrupt state file) run the real
program. Every case uses a port-0 metrics address and sockets under the test's directory.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from healthd.faults.journal import Journal
from healthd.main import main
from healthd.partition.store import Store
from tests.support.daemon_process import DaemonProcess

Healthd = Callable[..., subprocess.CompletedProcess[str]]

pytestmark = pytest.mark.e2e


def _base(tmp: Path, sockets: bool) -> list[str]:
    return ["--metrics-listen", "127.0.0.1:0", "--grpc-listen", f"unix:{tmp}/healthd.sock"] if sockets else []


def healthd_process(tmp: Path, *args: str, sockets: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "healthd", *_base(tmp, sockets), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def healthd(capsys: pytest.CaptureFixture[str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """main() in this process, for failures that come before it configures logging or starts anything."""

    def run(tmp: Path, *args: str, sockets: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [*_base(tmp, sockets), *args]
        code = main(argv)
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, captured.out, captured.err)

    return run


def one_line_failure(out: subprocess.CompletedProcess[str], *must_name: str) -> str:
    """The failure is exit status 2 and exactly one stderr line, with no traceback, naming everything given."""
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    line = lines[0]
    assert line.startswith("xpu-healthd: "), line
    assert "Traceback" not in out.stderr and "Errno" not in line, line
    for text in must_name:
        assert text in line, (text, line)
    return line


# ----- the config file --------------------------------------------------------------------------------------


def test_config_that_is_a_directory(healthd: Healthd, tmp_path: Path) -> None:
    one_line_failure(healthd(tmp_path, "--config", str(tmp_path), "--check-config"), str(tmp_path), "directory")


def test_config_that_is_missing(healthd: Healthd, tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    one_line_failure(healthd(tmp_path, "--config", str(path)), str(path), "not found")


def test_config_that_cannot_be_read(healthd: Healthd, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = blocker / "healthd.toml"  # a path through a regular file: ENOTDIR, whoever runs the test
    one_line_failure(healthd(tmp_path, "--config", str(path)), str(path), "cannot read")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_config_without_read_permission(healthd: Healthd, tmp_path: Path) -> None:
    path = tmp_path / "healthd.toml"
    path.write_text("")
    path.chmod(0)
    one_line_failure(healthd(tmp_path, "--config", str(path)), str(path), "permission denied")


@pytest.mark.parametrize(
    ("content", "names"),
    [
        (b"\xff\xfe[daemon]", ("not UTF-8",)),
        (b"[daemon\n", ("not valid TOML",)),
        (b'[sampler]\ninterval_seconds = "fast"\n', ("sampler.interval_seconds",)),
    ],
)
def test_config_that_is_invalid(healthd: Healthd, tmp_path: Path, content: bytes, names: tuple[str, ...]) -> None:
    path = tmp_path / "healthd.toml"
    path.write_bytes(content)
    one_line_failure(healthd(tmp_path, "--config", str(path), "--check-config"), str(path), *names)


# ----- addresses ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("check", [True, False], ids=["check-config", "start"])
def test_metrics_listen_garbage_names_the_option(healthd: Healthd, tmp_path: Path, check: bool) -> None:
    args = ["--simulate", "--state-dir", str(tmp_path / "state"), "--metrics-listen", "garbage"]
    out = healthd(tmp_path, "--grpc-listen", f"unix:{tmp_path}/s.sock", *args, *(["--check-config"] if check else []))
    one_line_failure(out, "--metrics-listen", "'garbage'", "cannot resolve")


def test_metrics_listen_from_the_file_names_the_key_and_the_file(healthd: Healthd, tmp_path: Path) -> None:
    path = tmp_path / "healthd.toml"
    path.write_text('[daemon]\nmetrics_listen = "garbage"\n')
    out = healthd(tmp_path, "--config", str(path), "--check-config", sockets=False)
    one_line_failure(out, "daemon.metrics_listen", "'garbage'", str(path))


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("127.0.0.1:99999", ("--metrics-listen", "port must be a number 0-65535")),
        ("::1:9410", ("--metrics-listen", "brackets")),
    ],
)
def test_metrics_listen_syntax_is_checked_by_check_config(
    healthd: Healthd, tmp_path: Path, value: str, names: tuple[str, ...]
) -> None:
    out = healthd(tmp_path, "--check-config", "--grpc-listen", f"unix:{tmp_path}/s.sock", "--metrics-listen", value)
    one_line_failure(out, *names)


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("relative.sock", ("--grpc-listen", "'relative.sock'", "unix:/path or HOST:PORT")),
        ("unix:relative.sock", ("--grpc-listen", "absolute")),
        ("no-such-host.invalid:50051", ("--grpc-listen", "cannot resolve")),
        ("127.0.0.1:" + "9" * 5000, ("--grpc-listen", "unix:/path or HOST:PORT")),  # not int()'s digit-limit text
    ],
)
def test_grpc_listen_is_checked_by_check_config(
    healthd: Healthd, tmp_path: Path, value: str, names: tuple[str, ...]
) -> None:
    out = healthd(tmp_path, "--check-config", "--metrics-listen", "127.0.0.1:0", "--grpc-listen", value, sockets=False)
    one_line_failure(out, *names)


@pytest.fixture
def occupied_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_occupied_metrics_port_says_the_address(tmp_path: Path, occupied_port: int) -> None:
    out = healthd_process(
        tmp_path,
        "--simulate",
        "--state-dir",
        str(tmp_path / "state"),
        "--grpc-listen",
        f"unix:{tmp_path}/s.sock",
        "--metrics-listen",
        f"127.0.0.1:{occupied_port}",
        sockets=False,
    )
    one_line_failure(out, "--metrics-listen", f"127.0.0.1:{occupied_port}", "in use")


def test_unix_socket_in_a_directory_that_cannot_exist(healthd: Healthd, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = healthd(
        tmp_path,
        "--simulate",
        "--state-dir",
        str(tmp_path / "state"),
        "--metrics-listen",
        "127.0.0.1:0",
        "--grpc-listen",
        f"unix:{blocker}/healthd.sock",
        sockets=False,
    )
    one_line_failure(out, "--grpc-listen", str(blocker))


# ----- scenario and state directory ------------------------------------------------------------------------


@pytest.mark.parametrize("check", [True, False], ids=["check-config", "start"])
def test_missing_scenario_file(healthd: Healthd, tmp_path: Path, check: bool) -> None:
    args = ["--simulate", "/nonexistent.toml", "--state-dir", str(tmp_path / "state")]
    out = healthd(tmp_path, *args, *(["--check-config"] if check else []))
    one_line_failure(out, "--simulate", "/nonexistent.toml")


def test_invalid_scenario_file(healthd: Healthd, tmp_path: Path) -> None:
    scenario = tmp_path / "node.toml"
    scenario.write_text("gpus = []\n")
    one_line_failure(healthd(tmp_path, "--simulate", str(scenario), "--check-config"), str(scenario))


@pytest.mark.parametrize("layout", ["a file", "below a file"])
def test_unusable_state_dir(healthd: Healthd, tmp_path: Path, layout: str) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    state = blocker if layout == "a file" else blocker / "state"
    one_line_failure(healthd(tmp_path, "--simulate", "--state-dir", str(state)), "--state-dir", str(state))


# ----- corrupt state files -----------------------------------------------------------------------------------


def _garbage(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not an SQLite database, " * 200)


@pytest.mark.parametrize(
    ("name", "kind", "lost", "start_after"),
    [
        ("faults.sqlite", "faults", "fault history", False),
        ("partitions.sqlite", "partitions", "MIG instances", True),
    ],
)
def test_corrupt_state_names_the_file_what_is_lost_and_the_way_out(
    healthd: Healthd, tmp_path: Path, name: str, kind: str, lost: str, start_after: bool
) -> None:
    state = tmp_path / "state"
    _garbage(state / name)
    line = one_line_failure(
        healthd_process(tmp_path, "--simulate", "--state-dir", str(state)),
        str(state / name),
        "corrupt",
        lost,
        f"xpu-healthd --state-dir {state} --move-aside {kind}",
    )
    assert line.count("xpu-healthd") == 2  # the prefix and the command to run

    # the operator's choice: the file is renamed, not deleted, and the daemon then starts
    moved = healthd(tmp_path, "--state-dir", str(state), "--move-aside", kind, sockets=False)
    assert moved.returncode == 0, moved.stderr
    assert f"moved {state / name} to {state / name}.corrupt-" in moved.stdout
    assert lost in moved.stdout
    assert not (state / name).exists()
    assert len(list(state.glob(f"{name}.corrupt-*"))) == 1
    if start_after:
        with DaemonProcess(tmp_path):  # the same state directory: starts, with a new empty file
            assert (state / name).exists()


@pytest.mark.parametrize(
    ("kind", "name", "opener"), [("faults", "faults.sqlite", Journal), ("partitions", "partitions.sqlite", Store)]
)
def test_move_aside_refuses_a_readable_file(
    healthd: Healthd, tmp_path: Path, kind: str, name: str, opener: Callable[[Path], Journal | Store]
) -> None:
    state = tmp_path / "state"
    opener(state / name).close()
    out = healthd(tmp_path, "--state-dir", str(state), "--move-aside", kind, sockets=False)
    one_line_failure(out, str(state / name), "nothing moved")
    assert (state / name).exists()
    missing = healthd(tmp_path, "--state-dir", str(tmp_path / "empty"), "--move-aside", kind, sockets=False)
    one_line_failure(missing, "--state-dir", f"no {name}")


@pytest.mark.parametrize(
    ("toml", "names"),
    [
        ('[health]\n"a\\nb" = 1\n', ("health.'a\\nb': unknown option",)),
        ('[health.ecc]\n"x\\ny" = 1\n', ("health.ecc.'x\\ny': unknown option",)),
        ('[health.xid.overrides."\u0663"]\naction = "none"\n', ("health.xid.overrides.'\u0663'", "positive integer")),
        (f'[health.xid.overrides."{"1" * 5000}"]\naction = "none"\n', ("positive integer",)),
        ('[health.xid.overrides.79]\n"a\\nb" = 1\n', ("health.xid.overrides.79.'a\\nb'",)),
    ],
    ids=["newline in a key", "newline in a nested key", "arabic-indic digit", "5000 digits", "newline in an override"],
)
def test_hostile_keys_in_the_file_stay_one_short_line(
    healthd: Healthd, tmp_path: Path, toml: str, names: tuple[str, ...]
) -> None:
    path = tmp_path / "healthd.toml"
    path.write_text(toml)
    line = one_line_failure(healthd(tmp_path, "--config", str(path), "--check-config"), *names)
    assert len(line) < 400
