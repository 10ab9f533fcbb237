"""Logging sinks: journald fields (through a recording stand-in for systemd.journal.send), JSON lines, redaction."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from healthd.logs import REDACTED, configure_logging, journal_field_name, journal_stream_is_ours


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def test_journal_gets_priority_identifier_and_one_field_per_key() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    assert configure_logging("debug", journal=lambda message, **fields: sent.append((message, fields))) == "journal"
    log = structlog.get_logger("t")
    log.warning("gpu fell off the bus", gpu=3, uuid="GPU-1", pids=[1, 2])
    log.debug("details", password="hunter2")
    (message, fields), (debug_message, debug_fields) = sent
    assert message == "gpu fell off the bus gpu=3 uuid=GPU-1 pids=[1,2]"
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "xpu-healthd"
    assert fields["XPU_EVENT"] == "gpu fell off the bus"
    assert fields["XPU_GPU"] == "3"
    assert fields["XPU_PIDS"] == "[1,2]"
    assert "XPU_TIMESTAMP" not in fields  # journald stamps entries itself
    assert debug_fields["PRIORITY"] == "7"
    assert "hunter2" not in debug_message
    assert debug_fields["XPU_PASSWORD"] == REDACTED


def test_journal_carries_exceptions() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    configure_logging("info", journal=lambda message, **fields: sent.append((message, fields)))
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        structlog.get_logger("t").exception("handler failed")
    message, fields = sent[0]
    assert fields["PRIORITY"] == "3"
    assert "RuntimeError: boom" in fields["XPU_EXCEPTION"]
    assert "RuntimeError: boom" in message


def test_json_lines_without_systemd(capsys: pytest.CaptureFixture[str]) -> None:
    assert configure_logging("info", json=True, journal=False) == "json"
    structlog.get_logger("t").info("hello", gpu=1, authorization="Basic abc", private_key="PEM")
    structlog.get_logger("t").debug("filtered out")
    (line,) = capsys.readouterr().out.splitlines()
    event = json.loads(line)
    assert event["event"] == "hello"
    assert event["gpu"] == 1
    assert event["level"] == "info"
    assert event["authorization"] == REDACTED
    assert event["private_key"] == REDACTED


def test_field_names_follow_journald_rules() -> None:
    assert journal_field_name("gpu") == "XPU_GPU"
    assert journal_field_name("needs-restart.x") == "XPU_NEEDS_RESTART_X"
    assert len(journal_field_name("k" * 100)) == 64


def test_journal_stream_must_be_our_own_stdout_or_stderr(tmp_path: Any) -> None:
    st = os.fstat(2)
    assert journal_stream_is_ours({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    other = os.stat(tmp_path)
    assert not journal_stream_is_ours({"JOURNAL_STREAM": f"{other.st_dev}:{other.st_ino}"})
    assert not journal_stream_is_ours({"JOURNAL_STREAM": "garbage"})
    assert not journal_stream_is_ours({})
