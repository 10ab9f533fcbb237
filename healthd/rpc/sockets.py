"""Unix socket paths a listener may take: nothing there, or a socket nobody serves any more.

A socket file left by a killed daemon is stale and is removed; one that a live process still serves is never
touched, whoever that process is (a second daemon must not take over the first one's sockets). Whether a socket is
live is asked the only reliable way: by connecting to it. A listener that accepts is live; ``ECONNREFUSED`` means
nobody listens. The kernel names the listening process (``SO_PEERCRED``), so the error can say which pid it is.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

PROBE_TIMEOUT_SECONDS = 2.0
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class SocketInUseError(OSError):
    """The path is served by a live process (or cannot be checked); the message names the path and the pid."""

    def __init__(self, path: Path, reason: str, pid: int | None = None) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.pid = pid


@dataclass(frozen=True, slots=True)
class BoundSocket:
    """A socket file this process created: unlinked at stop only while it is still the same file."""

    path: Path
    inode: tuple[int, int]  # (st_dev, st_ino)

    @classmethod
    def of(cls, path: Path) -> BoundSocket:
        st = path.stat()
        return cls(path, (st.st_dev, st.st_ino))

    def remove(self) -> None:
        """Unlink the file unless another process has replaced it since (then it is theirs)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) == self.inode:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def serving_pid(path: Path) -> int | None:
    """The pid of the process listening on ``path``; None when nothing listens there (absent or refused).

    Raises SocketInUseError when the path cannot be checked (not a socket, or not ours to connect to)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(mode):
        raise SocketInUseError(path, "exists and is not a socket; remove it or choose another path")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(PROBE_TIMEOUT_SECONDS)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # a stale socket: nobody listens
        except TimeoutError:  # a listener whose backlog is full is alive, just busy
            raise SocketInUseError(path, "is served by a running process (it did not answer in time)") from None
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise SocketInUseError(path, "exists and cannot be checked (permission denied)") from None
            raise SocketInUseError(path, f"exists and cannot be checked ({exc.strerror or exc})") from None
        pid, _, _ = _UCRED.unpack(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(pid)


def claim_socket_path(path: Path) -> None:
    """Make ``path`` free for a new listener: remove a stale socket, refuse a live one (SocketInUseError)."""
    pid = serving_pid(path)
    if pid is not None:
        raise SocketInUseError(path, f"is served by a running process, pid {pid}", pid)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
