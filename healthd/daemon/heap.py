"""How the daemon's process holds its memory: glibc's malloc arenas and Python's cyclic garbage collector.

Process-wide settings, made by ``xpu-healthd``'s ``main`` and its /metrics publisher (never by a library import):

- ``limit_malloc_arenas`` before any thread starts. glibc gives each thread that allocates while another holds
  the main arena an arena of its own, up to 8 per core; the daemon's 30-90 threads (sampler lanes, gRPC, the
  HTTP server) then keep 5-7 MiB of freed memory spread over arenas no other thread reuses. Two arenas hold the
  same work (its threads mostly wait on the driver, not on malloc). An operator's ``MALLOC_ARENA_MAX`` wins.
- ``settle_heap`` once the daemon is READY. Everything alive then (modules, classes, the components: about
  40,000 objects on 8 cards, 65,000 on 64) lives as long as the process, so it is moved out of the collector's
  generations (``gc.freeze``) and no full collection walks it again. The first generation's threshold is raised
  from 700 to ``YOUNG_THRESHOLD`` net allocations of container objects: a sampling cycle's Snapshot, attribution
  records and render lines live one cycle and are freed by their reference counts, so at the default threshold
  a 64-card node ran about 85 young and 8 middle collections and most of a full one per cycle, all finding
  nothing (a quarter of a cycle's CPU in an in-process trial). At 10,000 a 64-card node still ran about 11
  young collections (2 ms each) and one middle one (7-9 ms) per cycle, a fifth of the daemon's CPU; at 100,000
  it collects about every two minutes, and that collection is a full one (about 70 ms at 64 busy cards, 6 ms on
  8: a scrape that meets it waits that long). The collector still runs once that many objects are held:
  cyclic garbage stays bounded by it (at most tens of MiB; the daemon makes almost none), not left for ever.
- ``fix_mmap_threshold`` with the arenas. glibc serves an allocation of 128 KiB or more with its own mapping,
  returned to the system when freed, but raises that threshold to the size of each such block freed (up to 32
  MiB): after the first renders a 64-card node's bodies and joined text (1-13 MiB) came from the heap, where the
  blocks allocated between them kept their pages. A set threshold stops the raising. ``MALLOC_MMAP_THRESHOLD_``
  wins.
- ``release_start_up_pages`` once READY, with ``settle_heap``. Loading and initialising the libraries (gRPC's
  core, OpenSSL, SQLite, libstdc++) touched about 18 MiB of their code and read-only data, most of it never run
  again; those pages stay resident until the kernel needs memory. They are clean copies of the files, so the
  daemon drops them from its mappings (``madvise(MADV_DONTNEED)``) and the ones it still uses come back on their
  next use, from the page cache. Only mappings that hold no page of their own (no copy-on-write data: nothing
  that relocation wrote) are dropped, so nothing but the file's own bytes can come back.
- ``malloc_trimmer`` after each render of /metrics. A render's bodies and joined text (about 13 MiB at 64 busy
  cards, 1.5 at 8) are freed when it is done, but glibc keeps the pages for the next allocation; ``malloc_trim(0)``
  gives the free ones back. It costs 0.35 ms at 8 cards and 1.5 at 64 (a few % of the render) and lowers the
  resident memory between renders by about 8 MiB at 64 busy cards (docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import structlog

log = structlog.get_logger("heap")

MALLOC_ARENAS = 2
MMAP_THRESHOLD = 128 * 1024  # glibc's starting value, kept
YOUNG_THRESHOLD = 100_000  # Python's default is 700
_M_ARENA_MAX = -8  # glibc malloc.h
_M_MMAP_THRESHOLD = -3
_MADV_DONTNEED = 4  # Linux asm-generic/mman-common.h
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """``mallopt(M_ARENA_MAX, arenas)`` on glibc, unless ``MALLOC_ARENA_MAX`` is set; whether it was applied."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """``mallopt(M_MMAP_THRESHOLD, threshold)`` on glibc, unless ``MALLOC_MMAP_THRESHOLD_`` is set; whether it was
    applied (see the module docstring)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))


def release_start_up_pages(smaps: Path = Path("/proc/self/smaps")) -> int:
    """Drop the resident pages of the read-only file mappings that hold no page of their own (see the module
    docstring); the KiB that were resident in them. 0 where there is no smaps or no madvise."""
    madvise = getattr(_libc(), "madvise", None)
    try:
        text = smaps.read_text()
    except OSError:
        return 0
    if madvise is None:
        return 0
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    released = 0
    for start, end, resident in clean_file_mappings(text):
        if madvise(start, end - start, _MADV_DONTNEED) == 0:
            released += resident
    return released


def clean_file_mappings(smaps: str) -> Iterator[tuple[int, int, int]]:
    """(start, end, resident KiB) of each mapping in a smaps text that is a file's, read-only (code or data) and
    private to the process, with resident pages and none that are anonymous (a copy-on-write page, which the file
    would not give back)."""
    mapping: tuple[int, int, str, str] | None = None
    resident = anonymous = 0
    for line in [*smaps.splitlines(), "00-00 ---p 0 00:00 0"]:  # a last header closes the last mapping
        header = _MAPPING.match(line)
        if header is None:
            key, _, value = line.partition(":")
            if key == "Rss":
                resident = int(value.split()[0])
            elif key == "Anonymous":
                anonymous = int(value.split()[0])
            continue
        if mapping is not None:
            start, end, perms, path = mapping
            if perms in ("r-xp", "r--p") and path.startswith("/") and resident and not anonymous:
                yield start, end, resident
        mapping = int(header.group(1), 16), int(header.group(2), 16), header.group(3), header.group(4)
        resident = anonymous = 0


def _libc() -> ctypes.CDLL | None:
    """The C library the interpreter runs on (the process's own symbols: no search for a file)."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def malloc_trimmer() -> Callable[[], bool] | None:
    """A call of glibc's ``malloc_trim(0)`` (free heap pages back to the OS; it says whether any were), or None
    where the C library has none."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: bool(trim(0))


def settle_heap(young_threshold: int = YOUNG_THRESHOLD) -> int:
    """Collect once, freeze what is alive (see the module docstring), raise the young threshold, drop the pages
    of the libraries' start-up; the number of objects frozen."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
    frozen = gc.get_freeze_count()
    released = release_start_up_pages()
    log.debug("heap settled", frozen=frozen, threshold=gc.get_threshold(), released_kib=released)
    return frozen
