"""The prepared claims, kept in the plugin directory so a restarted driver answers kubelet as before.

One JSON file, replaced whole on every change: written beside it, flushed to disk, renamed over it, and the
directory flushed, so a crash at any point leaves either the old file or the new one. A claim is recorded as
``preparing`` before its first partition is asked for and ``prepared`` once every device is ready; the daemon's
partitions carry the claim's uid as their owner, so whatever a crash leaves half-done is found again from them.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("dra.checkpoint")

VERSION = 1
PREPARING = "preparing"
PREPARED = "prepared"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str = ""
    partition_id: str = ""  # empty for a whole card


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    namespace: str
    name: str
    state: str  # PREPARING or PREPARED
    devices: tuple[PreparedDevice, ...] = field(default_factory=tuple)


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, ClaimEntry] = {}  # claim uid -> entry

    def load(self) -> None:
        """Read the file; a missing one is empty, an unreadable one is set aside (its partitions are found again
        through the daemon) rather than stopping the driver."""
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {VERSION}")
            self.claims = {uid: _entry(raw) for uid, raw in data["claims"].items()}
        except FileNotFoundError:
            self.claims = {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.error("checkpoint unreadable; set aside, reconciling from the daemon", error=str(exc), moved=str(aside))
            self.path.replace(aside)
            self.claims = {}

    def put(self, uid: str, entry: ClaimEntry) -> None:
        self.claims[uid] = entry
        self._write()

    def drop(self, uid: str) -> None:
        if self.claims.pop(uid, None) is not None:
            self._write()

    def _write(self) -> None:
        body = {"version": VERSION, "claims": {uid: asdict(e) for uid, e in sorted(self.claims.items())}}
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with temporary.open("w") as f:
            json.dump(body, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        temporary.replace(self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _entry(raw: dict[str, Any]) -> ClaimEntry:
    devices = tuple(
        PreparedDevice(
            request_names=tuple(str(r) for r in d["request_names"]),
            pool=str(d["pool"]),
            device=str(d["device"]),
            cdi_device_ids=tuple(str(c) for c in d["cdi_device_ids"]),
            share_id=str(d.get("share_id", "")),
            partition_id=str(d.get("partition_id", "")),
        )
        for d in raw.get("devices", ())
    )
    state = str(raw["state"])
    if state not in (PREPARING, PREPARED):
        raise ValueError(f"claim state {state!r}")
    return ClaimEntry(namespace=str(raw["namespace"]), name=str(raw["name"]), state=state, devices=devices)
