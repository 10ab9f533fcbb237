"""What the device check leaves in $OUT: four files, rewritten whole after every step.

The device tool brings back at most 8 files from $OUT, at most 2 folders down, 16 MiB each, named in letters,
digits, '.', '_' and '-'. The check writes exactly these, flat in $OUT:

- ``summary.txt``, ``summary.json``: the outcome and figures of every step so far;
- ``results.tar.gz``: every step's folder (logs, JSON, daemon logs), each file cut to its last 2 MiB;
- ``console.log``: what the check printed.

Each rewrite goes to ``NAME.tmp`` and is renamed over NAME, so a kill at any moment leaves at most 7 files (the four
and three temporaries), each complete or absent. Standard library only.
"""

from __future__ import annotations

import io
import os
import re
import stat
import tarfile
from pathlib import Path

SUMMARY_TXT = "summary.txt"
SUMMARY_JSON = "summary.json"
TARBALL = "results.tar.gz"
CONSOLE = "console.log"
OUR_FILES = (SUMMARY_TXT, SUMMARY_JSON, TARBALL, CONSOLE)
MAX_FILES = 8
FILE_CAP_BYTES = 2 * 2**20  # per file inside the tarball (its tail is kept)
TARBALL_CAP_BYTES = 15 * 2**20  # under the tool's 16 MiB per file
ALLOWED_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _regular_files(root: Path, skip: frozenset[str]) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) == root and d in skip))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            try:
                if stat.S_ISREG(path.lstat().st_mode):
                    files.append(path)
            except OSError:
                continue
    return files


def tarball(root: Path, cap: int = FILE_CAP_BYTES, skip: frozenset[str] = frozenset()) -> bytes:
    """Every regular file under ``root`` (no sockets, pipes or links; not the top-level folders in ``skip``), each
    cut to its last ``cap`` bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for path in _regular_files(root, skip):
            try:
                with path.open("rb") as f:
                    size = f.seek(0, os.SEEK_END)
                    f.seek(max(0, size - cap))
                    data = f.read()
            except OSError:
                continue
            if size > cap:
                data = f"[first {size - cap} bytes cut]\n".encode() + data
            info = tarfile.TarInfo(str(path.relative_to(root.parent)))
            info.size, info.mode, info.mtime = len(data), 0o644, int(path.stat().st_mtime)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pack(out: Path, work: Path, summary_txt: str, summary_json: str, skip: frozenset[str] = frozenset()) -> None:
    """Rewrite the summary and the tarball in ``out``; the tarball shrinks its per-file cap until it fits."""
    write_atomic(out / SUMMARY_JSON, summary_json.encode())
    write_atomic(out / SUMMARY_TXT, summary_txt.encode() + b"\n")
    cap = FILE_CAP_BYTES
    data = tarball(work, cap, skip)
    while len(data) > TARBALL_CAP_BYTES and cap > 4096:
        cap //= 4
        data = tarball(work, cap, skip)
    write_atomic(out / TARBALL, data)


def problems(out: Path) -> list[str]:
    """What in ``out`` the device tool would not bring back (the rehearsal test asserts there is nothing)."""
    found: list[str] = []
    files = 0
    for dirpath, dirnames, filenames in os.walk(out):
        rel = Path(dirpath).relative_to(out)
        bad = [name for name in [*dirnames, *filenames] if not ALLOWED_NAME.match(name)]
        found += [f"{rel / name}: name outside letters, digits, '.', '_', '-'" for name in bad]
        for name in filenames:
            files += 1
            path = Path(dirpath) / name
            if len(rel.parts) > 2:
                found.append(f"{rel / name}: more than 2 folders down")
            if path.stat().st_size > 16 * 2**20:
                found.append(f"{rel / name}: over 16 MiB")
    if files > MAX_FILES:
        found.append(f"{files} files (at most {MAX_FILES} come back)")
    return found


__all__ = ["CONSOLE", "OUR_FILES", "SUMMARY_JSON", "SUMMARY_TXT", "TARBALL", "pack", "problems", "write_atomic"]
