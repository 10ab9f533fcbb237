"""SQLite state files that cannot be read: tell corruption from other failures, say what is lost, move aside.

The daemon never drops a state file by itself: a corrupt ``faults.sqlite`` or ``partitions.sqlite`` stops the
start with a message that names the file, what moving it aside would lose and the command that does it
(``xpu-healthd --move-aside faults|partitions``); the hook's file works the same way with
``xpuctl hook move-aside``. Moving aside renames the file and its WAL and shared-memory companions to
``<name>.corrupt-<UTC time>``, so nothing is deleted and the file can still be examined or repaired.

Two kinds of damage SQLite itself takes for "nothing there" are caught before SQLite sees the file: a state file
of zero bytes (the daemon's files always hold at least their header once created; SQLite would open an empty
file as a new, empty database) and a write-ahead log whose header is not intact (SQLite discards such a WAL
silently, and with it every commit not yet checkpointed into the main file). A WAL with an intact header but a
torn last frame is not damage: SQLite keeps the commits before it, which is what a crash mid-write leaves.
"""

from __future__ import annotations

import sqlite3
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# SQLite's primary result codes for a damaged file (https://sqlite.org/rescode.html)
SQLITE_CORRUPT = 11
SQLITE_NOTADB = 26
COMPANIONS = ("-wal", "-shm")  # WAL mode's files next to the database
WAL_MAGIC = (0x377F0682, 0x377F0683)  # little- and big-endian checksums (sqlite src/wal.c)
WAL_VERSION = 3007000
WAL_HEADER_BYTES = 32


class StateFileError(Exception):
    """A state file the daemon cannot use; the message names it."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path


class CorruptStateError(StateFileError):
    """The file is damaged (or holds rows the daemon cannot decode).

    ``kind`` names the file for the recovery command (``faults``, ``partitions``, ``hook``); ``lost`` says what
    moving it aside loses. The caller adds the command, which differs between the daemon and xpuctl.
    """

    def __init__(self, path: Path, *, what: str, kind: str, reason: str, lost: str) -> None:
        super().__init__(path, f"{what} {path} is corrupt ({reason}). {lost}")
        self.kind = kind
        self.reason = reason
        self.lost = lost


class UnreadableContent(Exception):  # noqa: N818 (a reason, turned into the store's CorruptStateError)
    """Raised by a store's ``after_open`` step: the file opens but holds something that does not decode.

    The message is the reason; open_state_db closes the file first, then raises the store's corrupt error with it.
    """


def is_corruption(exc: sqlite3.DatabaseError) -> bool:
    """True for a damaged or foreign file; False for the rest (locked, read-only, cannot open, disk full...)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)
    text = str(exc)
    return "malformed" in text or "not a database" in text


def check_integrity(db: sqlite3.Connection) -> None:
    """``PRAGMA quick_check``: every page and index reachable and well-formed (O(size), no full row compare).

    Raises sqlite3.DatabaseError with SQLite's first complaint when the answer is not ``ok``.
    """
    rows = db.execute("PRAGMA quick_check").fetchall()
    if rows != [("ok",)]:
        lines = [line for row in rows for line in str(row[0]).splitlines() if line and not line.startswith("***")]
        first = lines[0][:160] if lines else "no answer"
        more = f" and {len(lines) - 1} more problems" if len(lines) > 1 else ""
        error = sqlite3.DatabaseError(f"integrity check failed: {first}{more}")
        error.sqlite_errorcode = SQLITE_CORRUPT
        raise error


def wal_header_problem(header: bytes) -> str | None:
    """Why a WAL header is not intact, or None when it is (magic, version and checksum as in sqlite src/wal.c)."""
    if len(header) < WAL_HEADER_BYTES:
        return f"its write-ahead log is {len(header)} bytes, shorter than a WAL header"
    magic, version = struct.unpack(">II", header[:8])
    if magic not in WAL_MAGIC:
        return "its write-ahead log does not start with the WAL magic number"
    if version != WAL_VERSION:
        return f"its write-ahead log has format version {version}, not {WAL_VERSION}"
    order = ">" if magic & 1 else "<"
    words = struct.unpack(f"{order}6I", header[:24])
    s0 = s1 = 0
    for i in range(0, 6, 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    if (s0, s1) != struct.unpack(">II", header[24:32]):
        return "its write-ahead log header fails its checksum (SQLite would drop every commit in it)"
    return None


def damage_sqlite_ignores(path: Path) -> str | None:
    """A zero-byte state file or a WAL whose header is not intact: damage SQLite would open as "no data"."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None  # a new file; a WAL without its database is SQLite's to ignore (nothing refers to it)
    if size == 0:
        return "the file is empty (0 bytes): a state file holds at least its header once created"
    wal = path.with_name(path.name + "-wal")
    try:
        with wal.open("rb") as f:
            header = f.read(WAL_HEADER_BYTES)
    except FileNotFoundError:
        return None
    if not header:
        return None  # an empty WAL (reset after a checkpoint) holds no commits
    return wal_header_problem(header)


def open_failure(path: Path, what: str, exc: sqlite3.DatabaseError) -> StateFileError:
    """Not corruption: the file exists but SQLite cannot open or lock it (permissions, read-only, locked)."""
    return StateFileError(path, f"{what} {path}: cannot open it: {exc}")


def open_state_db(
    path: Path,
    what: str,
    schema: str,
    corrupt: Callable[[Path, str], CorruptStateError],
    after_open: Callable[[sqlite3.Connection], None] | None = None,
    *,
    timeout: float = 5.0,
) -> sqlite3.Connection:
    """Open (or create) a state file: WAL, synchronous=FULL, integrity checked, ``schema`` applied.

    ``after_open`` is the store's own step (a migration, reading rows that must decode); it raises
    UnreadableContent for content that does not decode. A SQLite error on the way is classified: corruption ->
    ``corrupt(path, reason)``, anything else -> open_failure. ``timeout``: seconds a locked file is waited for.
    The connection is in autocommit mode and may be used from any thread (the store serialises with its lock).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        damage = damage_sqlite_ignores(path)
    except OSError as exc:  # the WAL exists but cannot be read (permissions)
        raise StateFileError(path, f"{what} {path}: cannot read its write-ahead log: {exc}") from None
    if damage is not None:
        raise corrupt(path, damage)
    try:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout)
    except sqlite3.DatabaseError as exc:  # cannot open it at all (a directory, no permission)
        raise open_failure(path, what, exc) from None
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        check_integrity(db)
        db.executescript(schema)
        if after_open is not None:
            after_open(db)
    except sqlite3.DatabaseError as exc:
        db.close()
        if not is_corruption(exc):
            raise open_failure(path, what, exc) from None
        raise corrupt(path, str(exc)) from None
    except UnreadableContent as exc:
        db.close()
        raise corrupt(path, str(exc)) from None
    except BaseException:
        db.close()
        raise
    return db


def salvage_rows(path: Path, sql: str) -> list[tuple[object, ...]] | None:
    """Best effort: one read-only query on a damaged file (use NOT INDEXED: a table scan avoids a broken index)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return None
    try:
        return db.execute(sql).fetchall()
    except sqlite3.Error:
        return None
    finally:
        db.close()


def move_aside(path: Path, now: float | None = None) -> list[Path]:
    """Rename the file and its WAL companions to ``<name>.corrupt-<UTC time>``; returns the new paths."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}.{n}")
    moved = []
    for suffix in ("", *COMPANIONS):
        source = path.with_name(path.name + suffix)
        if source.exists():
            destination = target.with_name(target.name + suffix)
            source.rename(destination)
            moved.append(destination)
    return moved


def move_aside_if_corrupt(path: Path, open_store: Callable[[Path], Any]) -> tuple[Path, CorruptStateError] | None:
    """Open ``path`` with its store and close it; only when that says corrupt, move it aside.

    Returns (the file's new path, the corruption) or None when the file is readable: a readable file is never moved,
    that would drop good state. Any other StateFileError (locked, no permission) propagates.
    """
    try:
        open_store(path).close()
    except CorruptStateError as exc:
        return move_aside(path)[0], exc
    return None
