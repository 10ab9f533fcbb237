"""xpuctl against a real daemon on the simulated node: every command that prints a result takes --json (and -o
json) and prints valid JSON in one style; `gpus`, `--version`, and `health` with its reasons and xid row."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from healthd.cli import build_parser
from healthd.commands.output import leaf_parsers, prints_result
from tests.support.daemon_process import DaemonProcess

pytestmark = pytest.mark.e2e

RAW_ENUM = re.compile(r"^(SEVERITY|ACTION|FAULT_STATE|PARTITION_MODE|TDM_SHARING|LINK_KIND)_[A-Z_]+$")
SNAKE_KEY = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)+$")
FREE_KEYS = {"evidence", "env", "params"}  # maps: their keys are data (evidence names, variables), not fields


def walk(value: Any, where: str = "") -> Iterator[tuple[str, str | None, Any]]:
    """(path, key, value) of every value in a JSON document; key is None inside a free-form map."""
    if isinstance(value, dict):
        for key, inner in value.items():
            free = where.rsplit(".", 1)[-1] in FREE_KEYS
            yield f"{where}.{key}", None if free else key, inner
            yield from walk(inner, f"{where}.{key}")
    elif isinstance(value, list):
        for inner in value:
            yield from walk(inner, where)


def assert_one_style(document: Any, command: str) -> None:
    for path, key, value in walk(document):
        assert key is None or not SNAKE_KEY.match(key), f"{command}: {path} is snake_case, not lowerCamelCase"
        assert not (isinstance(value, str) and RAW_ENUM.match(value)), f"{command}: {path} = {value} (raw enum)"


def parse(out: subprocess.CompletedProcess[str], command: str, *, lines: bool = False) -> Any:
    assert out.returncode == 0, (command, out.stderr)
    if lines:
        return [json.loads(line) for line in out.stdout.splitlines()]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with DaemonProcess(tmp_path_factory.mktemp("xpuctl")) as d:
        d.xpuctl("simulate", "inject", "xid", "--gpu", "2", "code=79")
        yield d


def test_every_command_that_prints_a_result_prints_json(daemon: DaemonProcess, tmp_path: Path) -> None:
    d = daemon
    for _ in range(100):  # the XID reaches the journal within a few cycles
        faults = parse(d.xpuctl("faults", "list", "--json"), "faults list")["faults"]
        if faults:
            break
    fault_id = faults[0]["id"]
    corrupt = tmp_path / "hook.sqlite"
    corrupt.write_bytes(b"not a database" * 100)
    mode = parse(d.xpuctl("partitions", "mode", "4", "tdm", "--json"), "partitions mode")
    created = parse(
        d.xpuctl("partitions", "create", "--gpu", "4", "--compute", "10", "--memory", "1GiB", "-o", "json"),
        "partitions create",
    )
    pid = created["id"]
    runs: dict[str, list[str]] = {
        "gpus": ["gpus"],
        "simulate inject": ["simulate", "inject", "ecc", "--gpu", "1", "corrected=1"],
        "simulate clear": ["simulate", "clear", "--gpu", "1"],
        "simulate kinds": ["simulate", "kinds"],
        "faults list": ["faults", "list"],
        "faults watch": ["faults", "watch", "--after", "0", "--count", "1"],
        "faults resolve": ["faults", "resolve", fault_id, "--reason", "card reseated"],
        "health": ["health"],
        "hook move-aside": ["hook", "move-aside", "--state", str(corrupt)],
        "partitions get": ["partitions", "get", pid],
        "partitions list": ["partitions", "list"],
        "partitions capacity": ["partitions", "capacity", "--gpu", "4"],
        "partitions renew": ["partitions", "renew", pid],
        "partitions delete": ["partitions", "delete", pid],
        "topology": ["topology"],
        "web hash-password": ["web", "hash-password", "--cost", "4"],
    }
    documents = {"partitions mode": mode, "partitions create": created}
    for name, argv in runs.items():
        if name == "web hash-password":
            out = subprocess.run(
                [sys.executable, "-m", "healthd.cli", *argv, "--json"],
                input="pw\n",
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        else:
            out = d.xpuctl(*argv, "--json")
        documents[name] = parse(out, name, lines=name == "faults watch")
    documents["topology --preferred"] = parse(d.xpuctl("topology", "--preferred", "2", "--json"), "preferred")

    leaves = dict(leaf_parsers(build_parser()))
    printing = {name for name, parser in leaves.items() if prints_result(parser)}
    assert printing == set(documents) - {"topology --preferred"}, "a command without a --json case here"
    for name, document in documents.items():
        assert_one_style(document, name)
    assert documents["faults list"]["faults"][0]["severity"] == "fatal"
    assert documents["faults list"]["faults"][0]["action"] == "replace_node"
    assert documents["faults resolve"]["record"]["fault"]["state"] == "resolved"
    assert documents["partitions create"]["mode"] == "tdm"
    assert documents["partitions capacity"]["cards"][0]["partitions"] == 1  # zero values are not left out either
    assert documents["faults watch"][0]["record"]["seq"] == "1"  # 64-bit integers as strings: the proto3 mapping
    assert {k["kind"] for k in documents["simulate kinds"]["kinds"]} >= {"xid", "hang"}
    assert len(documents["gpus"]["gpus"]) == 8
    assert documents["web hash-password"]["hash"].startswith("$2b$04$")

    for name, parser in leaves.items():  # a server or exec has no result: --json is refused, not ignored
        if name not in printing:
            assert not any("--json" in a.option_strings for a in parser._actions), name


def test_gpus_lists_each_card_like_nvidia_smi(daemon: DaemonProcess) -> None:
    out = daemon.xpuctl("gpus")
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split("  ")[0] == "GPU" and "PCI BUS ID" in header and "SERIAL" in header
    assert len(rows) == 8
    cards = parse(daemon.xpuctl("gpus", "--json"), "gpus")["gpus"]
    serials = {c["serial"] for c in cards}
    assert len(serials) == 8 and "" not in serials, "each card has its own serial"
    assert len({c["pciBusId"] for c in cards}) == 8
    for card, row in zip(cards, rows, strict=True):
        assert card["uuid"] in row and card["serial"] in row and card["pciBusId"] in row
    assert {c["migMode"] for c in cards} <= {"enabled", "disabled"}
    assert {c["partitionMode"] for c in cards} <= {"none", "tdm", "mig"}


def test_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "healthd.cli", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0
    assert re.fullmatch(r"xpuctl \S+\n", out.stdout), out.stdout


def test_health_gives_reasons_and_an_xid_row(daemon: DaemonProcess) -> None:
    assert daemon.xpuctl("simulate", "inject", "xid", "--gpu", "6", "code=79").returncode == 0

    def reason_line(stdout: str) -> str | None:
        return next((line for line in stdout.splitlines() if line.startswith("GPU6") and " xid " in line), None)

    out = daemon.xpuctl("health")
    for _ in range(100):  # the XID reaches the fault engine within a few cycles
        if reason_line(out.stdout):
            break
        out = daemon.xpuctl("health")
    lines = out.stdout.splitlines()
    header = lines[0].split()
    xid = next(line.split() for line in lines if line.startswith("xid "))
    assert xid[header.index("GPU6")] == "failed", "a card with an active XID 79 does not read ok everywhere"
    assert xid[header.index("GPU3")] == "ok"
    reason = reason_line(out.stdout) or ""
    assert "failed" in reason and "xid_79" in reason and "fallen off the bus" in reason
