"""Where the kernel-log reader left off: the last record's sequence number, per boot, in the state directory.

/dev/kmsg numbers its records from 0 at each boot and keeps the newest ones in a ring buffer. The reader saves the
sequence number of the last record it handled with the boot id it belongs to; when the daemon starts again in the
same boot it reads from the oldest record still in the buffer and hands on only those after that number, so the
XIDs the kernel logged while the daemon was down (a crash, a package upgrade, systemd's restart delay) are not lost.
Records the ring buffer dropped meanwhile are counted as overwritten. In another boot the saved number means
nothing, and the reader starts at the end as on a first start.

The file is written at most once a second while records arrive and when the reader stops (write, fsync, rename):
after a kill -9 the last second's records may be handed on again, which the fault engine counts as repeats of the
faults they already opened.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("kmsg")

CURSOR_FILE = "kmsg-cursor.json"


@dataclass(frozen=True, slots=True)
class KmsgCursor:
    path: Path
    boot_id: str

    def load(self) -> int | None:
        """The saved sequence number when it is of this boot; None for a first start, another boot or a bad file."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("kernel-log position unreadable; starting at the end", path=str(self.path), error=str(exc))
            return None
        seq = doc.get("seq") if isinstance(doc, dict) else None
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or doc.get("boot_id") != self.boot_id:
            return None
        return seq

    def save(self, seq: int) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = json.dumps({"boot_id": self.boot_id, "seq": seq}).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


__all__ = ["CURSOR_FILE", "KmsgCursor"]
