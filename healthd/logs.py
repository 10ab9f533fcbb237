"""structlog set-up: journald with structured fields under systemd, JSON lines otherwise, readable lines on a terminal.

Under systemd (``JOURNAL_STREAM`` names our stdout or stderr, see systemd.exec(5)) each event goes to the journal
through ``systemd.journal.send``: MESSAGE is the event plus its key=value pairs, PRIORITY follows the level, and every
key is also its own field (``XPU_<KEY>``) so ``journalctl -u xpu-healthd XPU_GPU=3`` works. Values under keys that
look secret (passwords, keys, tokens) are replaced before any renderer sees them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "warn": 4, "error": 3, "critical": 2, "exception": 3}
SYSLOG_IDENTIFIER = "xpu-healthd"
_SECRET_KEY = re.compile(r"(passw(or)?d|secret|private_key|token|authorization|credential|bcrypt|hash$)", re.I)
REDACTED = "<redacted>"

JournalSend = Callable[..., None]


def redact_secrets(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event_dict):
        if key != "event" and _SECRET_KEY.search(key):
            event_dict[key] = REDACTED
    return event_dict


def journal_field_name(key: str) -> str:
    """journald field names: A-Z, 0-9 and '_', not starting with '_' or a digit, at most 64 characters."""
    name = re.sub(r"[^A-Z0-9_]", "_", key.upper())
    return ("XPU_" + name)[:64]


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(value)


class JournalRenderer:
    """Last processor: sends the event to journald and drops it from the structlog chain."""

    def __init__(self, send: JournalSend) -> None:
        self._send = send

    def __call__(self, _: Any, method: str, event_dict: MutableMapping[str, Any]) -> Mapping[str, Any]:
        event = str(event_dict.pop("event", ""))
        level = str(event_dict.pop("level", method))
        event_dict.pop("timestamp", None)  # the journal stamps entries itself
        exception = event_dict.pop("exception", None)
        pairs = " ".join(f"{k}={_text(v)}" for k, v in event_dict.items())
        message = f"{event} {pairs}".rstrip()
        if exception:
            message += "\n" + str(exception)
        fields = {journal_field_name(k): _text(v) for k, v in event_dict.items()}
        if exception:
            fields["XPU_EXCEPTION"] = str(exception)
        self._send(
            message,
            PRIORITY=str(_PRIORITY.get(level, 6)),
            SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER,
            XPU_EVENT=event,
            **fields,
        )
        raise structlog.DropEvent


def journal_stream_is_ours(env: Mapping[str, str] | None = None) -> bool:
    """True when JOURNAL_STREAM's device:inode is our stdout or stderr (not inherited by a child of a service)."""
    env = os.environ if env is None else env
    value = env.get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep or not dev.isdecimal() or not ino.isdecimal():
        return False
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if st.st_dev == int(dev) and st.st_ino == int(ino):
            return True
    return False


def journal_sender() -> JournalSend | None:
    try:
        from systemd import journal
    except ImportError:
        return None
    send: JournalSend = journal.send
    return send


def configure_logging(
    level: str = "info",
    *,
    json: bool | None = None,
    journal: JournalSend | bool | None = None,
) -> str:
    """Set up structlog; returns the sink chosen: "journal", "json" or "console".

    ``journal``: None = detect (JOURNAL_STREAM is ours and systemd-python is importable), False = never,
    a callable = send events through it (tests).
    """
    send: JournalSend | None
    if journal is None:
        send = journal_sender() if journal_stream_is_ours() else None
    elif journal is False or journal is True:
        send = journal_sender() if journal else None
    else:
        send = journal
    renderer: structlog.typing.Processor
    if send is not None:
        renderer, sink = JournalRenderer(send), "journal"
    elif (not sys.stderr.isatty()) if json is None else json:
        renderer, sink = structlog.processors.JSONRenderer(), "json"
    else:
        renderer, sink = structlog.dev.ConsoleRenderer(colors=False), "console"
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            redact_secrets,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        # no file argument: each logger takes sys.stdout when it is made, so a replaced stdout (a test's capture,
        # a reopened stream) is followed instead of writing to a closed one
        logger_factory=structlog.PrintLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    return sink
