"""The kernel log: parse /dev/kmsg records and the NVIDIA driver's NVRM lines; a reader thread that follows it.

Record format (Documentation/ABI/testing/dev-kmsg): ``PRIORITY,SEQ,USEC,FLAGS[,...];MESSAGE`` followed by optional
continuation lines that start with a space (``SUBSYSTEM=pci``). PRIORITY is ``facility * 8 + level``. The kernel's
own printk records, the NVIDIA driver's among them, have facility 0 (kern); a process that writes to /dev/kmsg
gets facility 1 (user) or another non-zero one it names, never 0 (kernel/printk/printk.c, devkmsg_write). The same
number leads a line of /proc/kmsg or ``dmesg --raw`` as ``<PRIORITY>``.

A driver report counts only when the record is the kernel's and its message *begins* with ``NVRM: ``: text that
carries the prefix further in (a USB device's product string, a user-space write, a line of a file) is not the
driver's. The driver prints (open-gpu-kernel-modules: krcReportXid in src/nvidia/src/kernel/gpu/rc/kernel_rc.c,
osHandleGpuLost in src/nvidia/arch/nvalloc/unix/src/osinit.c):

- ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`` with ``pid='<unknown>',
  name=<unknown>`` when no process is known; on a MIG card the parenthesis also names the instances,
  ``(PCI:0000:3b:00 GPU-I:02 GPU-CI:00)``. Older drivers print ``pid=1234, `` without a name, no pid at all, or
  the address without ``PCI:`` (``NVRM: Xid (0000:03:00): 14, Channel 00000001``).
- ``NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>`` (names the card before its first report)
- ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`` and
  ``NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2335) installed in this system has fallen off the bus ...``,
  the latter also split over two records (``... installed in this`` / ``NVRM: system has fallen off the bus ...``).

Parsing is pure and never raises on any text; the reader survives overwritten records (EPIPE) and I/O errors.
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from exporter.supervision import Workers
from healthd.xid.kmsg_cursor import KmsgCursor

log = structlog.get_logger("kmsg")

DEFAULT_KMSG_PATH = Path("/dev/kmsg")
XID_FALLEN_OFF_BUS = 79

_PCI = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
# Every pattern is used with .match(): the message must begin with the driver's prefix.
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
    r"(?: GPU-I:(?P<gi>\d{1,4})(?: GPU-CI:(?P<ci>\d{1,4}))?)?\): (?P<xid>\d{1,6}),\s?(?P<rest>.*)",
    re.ASCII,
)
_PID_RE = re.compile(r"pid=(?P<pid>'<unknown>'|<unknown>|\d+),\s*(?:name=(?P<name>[^,]*),\s?)?(?P<text>.*)", re.ASCII)
_IDENTITY_RE = re.compile(rf"NVRM: GPU at PCI:(?P<pci>{_PCI}): (?P<uuid>GPU-[0-9a-fA-F-]+)")
# NV_DEV_PRINTF's "NVRM: GPU <bdf>: " prefix with osHandleGpuLost's text
_DEV_FALLEN_RE = re.compile(rf"NVRM: GPU (?:at PCI:)?(?P<pci>{_PCI}): GPU has fallen off the bus\b")
# the card-probe report; one printk of three "NVRM: " lines in current drivers, two lines in older ones
_OS_FALLEN_RE = re.compile(
    rf"NVRM: The NVIDIA GPU (?P<pci>{_PCI})(?: \(PCI ID: [0-9a-fA-F]{{4}}:[0-9a-fA-F]{{4}}\))? installed in this "
    r"system has fallen off the bus\b"
)
_OS_FALLEN_HEAD_RE = re.compile(rf"NVRM: The NVIDIA GPU (?P<pci>{_PCI})\b")
_MAX_PARTS = 3  # records one report can be split over when lines arrive one per record
_ESCAPED_BYTE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_SYSLOG_PREFIX_RE = re.compile(r"<(?P<priority>\d{1,4})>(?:\[\s*(?P<sec>\d+)\.(?P<frac>\d{1,9})\] ?)?", re.ASCII)
KERNEL_FACILITY = 0


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    priority: int  # syslog facility * 8 + level
    seq: int  # -1 when unknown
    usec: int  # microseconds since boot (monotonic), -1 when unknown
    flags: str
    message: str

    @property
    def from_kernel(self) -> bool:
        """Facility 0 (kern): written by the kernel itself; user space cannot give its /dev/kmsg writes facility 0."""
        return self.priority >= 0 and self.priority >> 3 == KERNEL_FACILITY


@dataclass(frozen=True, slots=True)
class NvrmEvent:
    """One driver report about one card. ``kind``: ``xid``, ``fallen_off_bus`` or ``identity``."""

    kind: str
    pci: str  # normalised ``dddd:bb:dd`` (domain:bus:device), see normalize_pci
    xid: int | None = None
    pid: int | None = None
    process: str | None = None
    text: str = ""
    uuid: str | None = None
    gpu_instance: int | None = None  # MIG: ``GPU-I:NN`` of the report, when the driver attributed it
    compute_instance: int | None = None  # MIG: ``GPU-CI:NN``


def normalize_pci(address: str) -> str:
    """``PCI:0000:3B:00``, ``00000000:3b:00.0``, ``3b:00`` -> ``0000:3b:00``; "" when it is not a PCI address."""
    a = address.strip()
    if a[:4].upper() == "PCI:":
        a = a[4:]
    a = a.split(".", 1)[0]
    parts = a.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return ""
    try:
        domain, bus, device = (int(p, 16) for p in parts)
    except ValueError:
        return ""
    if not (0 <= domain <= 0xFFFFFFFF and 0 <= bus <= 0xFF and 0 <= device <= 0x1F):
        return ""
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def parse_record(line: str) -> KmsgRecord | None:
    """One /dev/kmsg record (first line only; continuation lines are dropped). None when it is not one."""
    head, sep, rest = line.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 4:
        return None
    if not all(f.isascii() and f.isdigit() and len(f) <= 20 for f in fields[:3]):  # u64 at most
        return None
    priority, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    message = unescape(rest.split("\n", 1)[0].rstrip("\r"))
    return KmsgRecord(priority, seq, usec, ",".join(fields[3:]), message)


def unescape(text: str) -> str:
    """/dev/kmsg writes a byte < 0x20, >= 0x7f or a backslash as ``\\xNN``; a printk of several lines has
    ``\\x0a`` between them. Turn them back into the text (UTF-8, undecodable bytes replaced)."""
    if "\\x" not in text:
        return text
    raw = _ESCAPED_BYTE.sub(lambda m: bytes([int(m[1], 16)]), text.encode("utf-8", "surrogateescape"))
    return raw.decode("utf-8", "replace")


def escape(text: str) -> str:
    """What /dev/kmsg shows for a message: the kernel's escaping, undone by ``unescape``."""
    raw = text.encode("utf-8", "surrogateescape")
    return "".join(f"\\x{b:02x}" if b < 0x20 or b >= 0x7F or b == 0x5C else chr(b) for b in raw)


def parse_line(line: str) -> KmsgRecord | None:
    """A /dev/kmsg record, or a ``<PRIORITY>[ secs.frac] message`` line as /proc/kmsg and ``dmesg --raw`` print
    it. None for anything else: a line without its priority cannot show that the kernel wrote it."""
    record = parse_record(line)
    if record is not None:
        return record
    m = _SYSLOG_PREFIX_RE.match(line)
    if m is None:
        return None
    usec = int(m["sec"]) * 1_000_000 + int(m["frac"].ljust(6, "0")[:6]) if m["sec"] else -1
    message = line[m.end() :].split("\n", 1)[0].rstrip("\r")
    return KmsgRecord(int(m["priority"]), -1, usec, "", message)


def parse_nvrm(message: str) -> NvrmEvent | None:
    """The driver event in one message that begins with ``NVRM: ``, or None. Never raises.

    It trusts the message: call it only with a record's message from the kernel (see ``NvrmDecoder.feed``). An Xid
    or identity report is read from the first line only (a process name in it could hold a newline); a report the
    driver printed as several ``NVRM: `` lines is read as one.
    """
    if not message.startswith("NVRM: "):
        return None
    first = message.split("\n", 1)[0]
    m = _XID_RE.match(first)
    if m:
        pci = normalize_pci(m["pci"])
        if not pci:
            return None
        pid: int | None = None
        process: str | None = None
        text = m["rest"].strip()
        pm = _PID_RE.match(text)
        if pm:
            pid = int(pm["pid"]) if pm["pid"].isdigit() else None
            name = (pm["name"] or "").strip()
            process = None if name in ("", "<unknown>") else name
            text = pm["text"].strip()
        gi = int(m["gi"]) if m["gi"] else None
        ci = int(m["ci"]) if m["ci"] else None
        return NvrmEvent("xid", pci, int(m["xid"]), pid, process, text, gpu_instance=gi, compute_instance=ci)
    m = _IDENTITY_RE.match(first)
    if m:
        pci = normalize_pci(m["pci"])
        return NvrmEvent("identity", pci, uuid=m["uuid"]) if pci else None
    return _fallen_off_bus(_one_line(message))


def _one_line(message: str) -> str:
    """``NVRM: a\\nNVRM: b`` -> ``NVRM: a b``; a message whose later lines lack the prefix keeps its first line."""
    first, *more = message.split("\n")
    if not all(line.startswith("NVRM: ") for line in more):
        return first
    return " ".join([first.rstrip(), *(line[len("NVRM: ") :].strip() for line in more)])


def _fallen_off_bus(text: str) -> NvrmEvent | None:
    m = _DEV_FALLEN_RE.match(text) or _OS_FALLEN_RE.match(text)
    if m is None:
        return None
    pci = normalize_pci(m["pci"])
    return NvrmEvent("fallen_off_bus", pci, XID_FALLEN_OFF_BUS, text=text[len("NVRM: ") :].strip()) if pci else None


class NvrmDecoder:
    """Turns kernel-log records into driver events: only the kernel's own records, only messages that begin with
    the driver's prefix, and the fallen-off-the-bus report when its lines arrive as separate records (a file of
    ``<PRIORITY>`` lines, older kernels).

    ``rejected`` counts records that mention ``NVRM:`` but are not the driver's (written by user space, or the
    prefix further into the text): look-alikes, which an operator may want to know about.
    """

    def __init__(self) -> None:
        self._parts: list[str] = []  # a fallen-off-the-bus report begun in an earlier record
        self.rejected = 0
        self.last_rejected = ""

    def feed(self, record: KmsgRecord) -> NvrmEvent | None:
        message = record.message
        if not record.from_kernel or not message.startswith("NVRM: "):
            if "NVRM:" in message:
                self.rejected += 1
                self.last_rejected = message[:160]
            return None  # neither consumes nor breaks a pending split report: other records may come between
        event = parse_nvrm(message)
        if event is not None:
            self._parts = []
            return event
        line = _one_line(message)
        if _OS_FALLEN_HEAD_RE.match(line):
            self._parts = [line]  # the start of a report, complete or not
            return None
        if not self._parts:
            return None
        self._parts.append(line[len("NVRM: ") :].strip())
        event = _fallen_off_bus(" ".join(self._parts))
        if event is not None or len(self._parts) >= _MAX_PARTS:
            self._parts = []
        return event


def format_record(record: KmsgRecord) -> str:
    """The /dev/kmsg text of a record (tests, the simulator's kmsg file), escaped as the kernel escapes it."""
    return f"{record.priority},{record.seq},{record.usec},{record.flags};{escape(record.message)}"


def format_xid(pci: str, xid: int, text: str, *, pid: int | None = None, process: str | None = None) -> str:
    """An ``NVRM: Xid`` line as recent drivers print it."""
    pid_text = str(pid) if pid is not None else "'<unknown>'"
    return f"NVRM: Xid (PCI:{pci}): {xid}, pid={pid_text}, name={process or '<unknown>'}, {text}"


class KmsgReader:
    """Follows a kernel log on its own thread and hands every record to ``on_record``.

    On the real character device it reads one record per read(); EPIPE means records were overwritten before we
    read them, which is counted and skipped. A regular file (tests, simulation) is followed like ``tail -f``;
    ``from_start`` reads either whole. Where it starts: after the last record it handled, when it knows one of this
    boot (``cursor``, kmsg_cursor.py, or an earlier open in this process): the records logged meanwhile are
    replayed; else at the end (history before the daemon's first start is not replayed).
    """

    _read = staticmethod(os.read)  # one record per call on the device; a seam for tests

    def __init__(
        self,
        path: Path,
        on_record: Callable[[KmsgRecord], object],
        *,
        from_start: bool = False,
        poll_seconds: float = 0.2,
        workers: Workers | None = None,
        cursor: KmsgCursor | None = None,
    ) -> None:
        self.path = path
        self._workers = workers or Workers()
        self._cursor = cursor
        self._last_seq: int | None = None  # the last record handed on (this boot)
        self._saved_seq: int | None = None
        self._saved_at = float("-inf")
        self._skip_upto: int | None = None  # while replaying: records up to this one were handled before
        self._on_record = on_record
        self._from_start = from_start
        self._poll = poll_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.records = 0
        self.overwritten = 0  # EPIPE: the kernel overwrote records before we read them
        self.errors = 0
        self.last_error: str | None = None
        self.following = threading.Event()  # set once the log is open and positioned (tests, startup order)

    def start(self) -> None:
        if self._thread is None:
            self._thread = self._workers.start("kmsg-reader", self._run, self._stop)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._save_position(force=True)

    def _resume_after(self) -> int | None:
        """The last record handled in this boot: this process's own, else the saved one."""
        if self._last_seq is not None:
            return self._last_seq
        if self._cursor is None:
            return None
        self._last_seq = self._saved_seq = self._cursor.load()
        return self._last_seq

    def _position(self, fd: int) -> None:
        """Seek where reading starts: after the last record handled (from the oldest kept), or the end."""
        resume = self._resume_after()
        self._skip_upto = resume
        if resume is not None:
            os.lseek(fd, 0, os.SEEK_SET)  # /dev/kmsg: the oldest record the ring buffer still holds
        elif not self._from_start:
            os.lseek(fd, 0, os.SEEK_END)

    def _save_position(self, *, force: bool = False) -> None:
        """Save the position at most once a second (always when stopping); a failure is logged, never raised."""
        if self._cursor is None or self._last_seq is None or self._last_seq == self._saved_seq:
            return
        now = time.monotonic()
        if not force and now - self._saved_at < 1.0:
            return
        self._saved_at = now
        try:
            self._cursor.save(self._last_seq)
            self._saved_seq = self._last_seq
        except OSError as exc:
            log.warning("kernel-log position not saved", path=str(self._cursor.path), error=str(exc))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                self._failed(f"open {self.path}: {exc.strerror or exc}")
                self._stop.wait(5.0)
                continue
            try:
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    self._follow_device(fd)
                else:
                    self._follow_file(fd)
            except OSError as exc:
                self._failed(f"read {self.path}: {exc.strerror or exc}")
                self._stop.wait(1.0)
            finally:
                os.close(fd)

    def _failed(self, message: str) -> None:
        previous, self.last_error = self.last_error, message  # before the count: a reader of `errors` sees why
        if message != previous:
            log.warning("kernel log unreadable", error=message)
        self.errors += 1

    def _deliver(self, line: str) -> None:
        record = parse_line(line)
        if record is None:
            return
        if record.seq >= 0:
            skip = self._skip_upto
            if skip is not None:
                if record.seq <= skip:
                    return  # handled before the daemon (or this open) stopped
                if record.seq > skip + 1:  # the ring buffer dropped these while nobody read it
                    self.overwritten += record.seq - skip - 1
                self._skip_upto = None
            self._last_seq = record.seq
        self.records += 1
        try:
            self._on_record(record)
        except Exception:  # a consumer bug must not stop the reader
            log.exception("kmsg consumer failed")

    def _follow_device(self, fd: int) -> None:
        self._position(fd)
        self.following.set()
        size = 8192
        while not self._stop.is_set():
            try:
                chunk = self._read(fd, size)
            except BlockingIOError:
                self._save_position()
                select.select([fd], [], [], self._poll)
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overwritten += 1
                    continue
                if exc.errno == errno.EINVAL and size < 1 << 20:  # record longer than the buffer
                    size *= 4
                    continue
                raise
            if not chunk:
                self._stop.wait(self._poll)
                continue
            self._deliver(chunk.decode("utf-8", errors="replace"))

    def _follow_file(self, fd: int) -> None:
        self._position(fd)
        # replaying a file: lines without a sequence number (``<PRIORITY>`` syslog lines) before its end at open
        # cannot be told handled from new, so only those after it are
        replay_end = os.fstat(fd).st_size if self._skip_upto is not None else 0
        offset = 0
        self.following.set()
        pending = b""
        while not self._stop.is_set():
            chunk = os.read(fd, 65536)
            if not chunk:
                self._save_position()
                position = os.lseek(fd, 0, os.SEEK_CUR)
                if os.fstat(fd).st_size < position:  # truncated or rotated in place: start over
                    os.lseek(fd, 0, os.SEEK_SET)
                    pending, offset, replay_end, self._skip_upto = b"", 0, 0, None
                self._stop.wait(self._poll)
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                offset += len(raw) + 1
                if raw.startswith(b" "):  # continuation line (KEY=value) of the previous record
                    continue
                if offset <= replay_end and not raw[:1].isdigit():
                    continue
                self._deliver(raw.decode("utf-8", errors="replace"))
