"""Reading a configuration or scenario file an operator names, whatever that name points at.

A FIFO would block the reader until someone writes to it (``--check-config`` as the unit's ``ExecStartPre=`` would
hang until its start timeout), ``/dev/zero`` would be read until memory runs out. So the file is opened without
waiting (``O_NONBLOCK``), must be a regular file, and is read up to a size no real configuration comes near.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_TEXT_BYTES = 4 * 2**20


class NotATextFile(ValueError):  # noqa: N818 - it names what the file is not
    """The path is no regular file of a sane size; the message is the reason, without the path."""


def read_text_file(path: Path, limit: int = MAX_TEXT_BYTES) -> str:
    """The file's text (UTF-8). Raises OSError as open() would (IsADirectoryError for a directory), NotATextFile
    for a FIFO, device or socket or a file over ``limit`` bytes, UnicodeDecodeError for text that is not UTF-8."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise NotATextFile("not a regular file (a FIFO, device or socket)")
        chunks = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise NotATextFile(f"larger than {limit // 2**20} MiB; no configuration is that large")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")
