"""The daemon's process-wide memory settings (healthd/daemon/heap.py): the start-up heap frozen at READY, cyclic
garbage still collected afterwards, two malloc arenas and a fixed mmap threshold unless the operator says
otherwise, the libraries' start-up pages dropped. Each check runs in a fresh interpreter: the settings are
process-wide and must not leak into the test process."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge

from exporter.exposition import ExpositionCache
from healthd.daemon.heap import YOUNG_THRESHOLD, clean_file_mappings
from healthd.daemon.metrics import publisher
from tests.support.servicehelpers import running_daemon

REPO = Path(__file__).resolve().parents[3]
SNAPSHOT = None  # a registry source renders whatever it is handed


def run_python(code: str, argv: str = "", **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *([argv] if argv else [])],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]  # the last line: structlog may print before it


def test_settle_heap_freezes_what_lives_and_still_collects_cycles_made_later() -> None:
    out = run_python(
        """
        import gc, weakref
        from healthd.daemon.heap import settle_heap

        class Node:
            pass

        kept = [Node() for _ in range(100)]
        frozen = settle_heap(young_threshold=1000)
        assert frozen >= 100 and gc.get_freeze_count() == frozen
        assert gc.get_threshold()[0] == 1000
        assert not any(o is kept for o in gc.get_objects()), "a frozen list is still in a generation"

        collected = []
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: reference counts alone never free it
        weakref.finalize(a, collected.append, "cycle")
        del a, b
        held = [[] for _ in range(3000)]  # young container objects past the threshold: the collector runs
        print(collected, len(held))
        """
    )
    assert out == "['cycle'] 3000"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_ARENA_MAX) is glibc's")
def test_malloc_arenas_are_limited_unless_the_operator_set_them() -> None:
    code = "from healthd.daemon.heap import limit_malloc_arenas; print(limit_malloc_arenas())"
    assert run_python(code) == "True"
    assert run_python(code, MALLOC_ARENA_MAX="4") == "False"


@pytest.mark.e2e
def test_the_daemon_settles_its_heap_once_it_is_ready(tmp_path: Path) -> None:
    args = ["--simulate", "h200x1", "--metrics-listen", "127.0.0.1:0", "--log-level", "debug"]
    args += ["--grpc-listen", f"unix:{tmp_path}/healthd.sock", "--state-dir", str(tmp_path / "state")]
    with running_daemon(args, {}) as daemon:
        settled = daemon.wait_event("heap settled")
        names = [e.get("event") for e in daemon.events()]
        assert names.index("ready") < names.index("heap settled")
        assert settled["frozen"] > 10_000  # modules, classes and the daemon's components
        assert settled["threshold"][0] == YOUNG_THRESHOLD
        assert settled["released_kib"] > 1024  # the libraries' start-up pages (Linux: smaps and madvise)
        assert daemon.stop() == 0


def test_publish_trims_the_heap_only_after_a_render() -> None:
    registry = CollectorRegistry(auto_describe=False)
    Gauge("xpu_test_value", "A value.", registry=registry).set(1.0)
    exposition = ExpositionCache(registry, max_age=10.0, interval=5.0)
    trims: list[int] = []
    publish = publisher(exposition, lambda: trims.append(1))
    publish(SNAPSHOT)
    assert trims == [], "nothing was rendered (no one scrapes): nothing to trim"
    exposition.payload("text/plain", "gzip", client="10.0.0.1")  # a scraper: the next publish renders for it
    publish(SNAPSHOT)
    assert exposition.renders["publish"] == 1 and trims == [1]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_the_trimmer_gives_freed_heap_pages_back() -> None:
    out = run_python(
        """
        from healthd.daemon.heap import malloc_trimmer

        def rss():
            return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))

        trim = malloc_trimmer()
        chunks = [bytes(2000) for _ in range(20_000)]  # 40 MB of malloc heap (not Python's small-object arenas)
        pin = bytes(2000)  # above them: glibc cannot shrink the heap's top by itself
        del chunks
        before = rss()
        trimmed = trim()
        print(trimmed, (before - rss()) // 1024)
        """
    )
    trimmed, freed_mib = out.split()
    assert trimmed == "True" and int(freed_mib) >= 20, out


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_MMAP_THRESHOLD) is glibc's")
def test_a_freed_large_block_does_not_move_later_ones_into_the_heap() -> None:
    code = """
        import ctypes, sys
        from healthd.daemon.heap import fix_mmap_threshold

        applied = fix_mmap_threshold() if sys.argv[-1] == "fix" else None
        def in_heap(block):
            address = ctypes.addressof((ctypes.c_char * len(block)).from_buffer(block))
            for line in open("/proc/self/maps"):
                if line.rstrip().endswith("[heap]"):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    return lo <= address < hi
            return False

        first = bytearray(8 << 20)  # a render's joined text: a mapping of its own
        del first  # by default glibc now serves anything up to 8 MiB from the heap
        second = bytearray(1 << 20)
        print(applied, in_heap(second))
        """
    assert run_python(code, argv="default").split() == ["None", "True"], "glibc's threshold no longer rises"
    assert run_python(code, argv="fix").split() == ["True", "False"]
    code = "from healthd.daemon.heap import fix_mmap_threshold; print(fix_mmap_threshold())"
    assert run_python(code, MALLOC_MMAP_THRESHOLD_="65536") == "False"


SMAPS = """\
55d0c0000000-55d0c0100000 r-xp 00000000 fd:01 101 /usr/lib/libtext.so
Rss:                 600 kB
Anonymous:             0 kB
55d0c0100000-55d0c0200000 r--p 00100000 fd:01 101 /usr/lib/libtext.so
Rss:                 100 kB
Anonymous:            40 kB
55d0c0200000-55d0c0300000 r--p 00200000 fd:01 101 /usr/lib/libtext.so
Rss:                  80 kB
Anonymous:             0 kB
55d0c0300000-55d0c0400000 rw-p 00300000 fd:01 101 /usr/lib/libtext.so
Rss:                  30 kB
Anonymous:            30 kB
55d0c0400000-55d0c0500000 r--s 00000000 fd:01 102 /var/lib/state.db
Rss:                  50 kB
Anonymous:             0 kB
7f0000000000-7f0000100000 r--p 00000000 00:00 0
Rss:                  10 kB
Anonymous:            10 kB
7f0000100000-7f0000200000 r-xp 00000000 fd:01 103 /usr/lib/libcold.so
Rss:                   0 kB
Anonymous:             0 kB
7f0000200000-7f0000300000 r--p 00000000 fd:01 104 /usr/lib/locale/C.utf8/LC_CTYPE
Rss:                  12 kB
Anonymous:             0 kB
"""


def test_only_clean_private_read_only_file_mappings_with_resident_pages_are_dropped() -> None:
    assert list(clean_file_mappings(SMAPS)) == [
        (0x55D0C0000000, 0x55D0C0100000, 600),  # code
        (0x55D0C0200000, 0x55D0C0300000, 80),  # read-only data no relocation wrote
        (0x7F0000200000, 0x7F0000300000, 12),  # the last mapping is read too
    ]  # not: relocated data (copy-on-write pages), writable data, a shared mapping, anonymous or cold ones


@pytest.mark.skipif(platform.system() != "Linux", reason="/proc/self/smaps and madvise are Linux's")
def test_dropping_the_start_up_pages_frees_them_and_the_libraries_still_work() -> None:
    out = run_python(
        """
        import grpc, sqlite3, ssl
        from healthd.daemon.heap import clean_file_mappings, release_start_up_pages

        def resident():
            return sum(kib for *_, kib in clean_file_mappings(open("/proc/self/smaps").read()))

        before = resident()
        released = release_start_up_pages()
        after = resident()
        row = sqlite3.connect(":memory:").execute("select sum(value) from json_each('[1, 2, 3]')").fetchone()
        ssl.create_default_context()
        channel = grpc.insecure_channel("unix:/nonexistent.sock")
        channel.close()
        print(before >= released > 4096, after < before // 4, row)
        """
    )
    assert out == "True True (6,)", out
