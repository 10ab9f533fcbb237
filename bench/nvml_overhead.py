"""Real NVML: what the backend and the sampler add on top of the raw NVML calls they make (same process).

For each GPU, one ``NvmlBackend.sample`` + ``processes`` (+ ``mig_instances`` on a MIG card) runs under a recorder
that wraps every ``pynvml.nvml*`` function and keeps the top-level calls with their arguments. Then, alternating
in blocks, the backend path and a replay of exactly those raw calls (same handles, same arguments, NVML errors
caught as the backend catches them) are timed. The ratio is the backend's Python overhead. A full ``Sampler``
cycle (worker threads, deadlines, Snapshot) is compared with the sum of the raw calls of all GPUs the same way.

    python3 bench/nvml_overhead.py [--reps 200] [--json PATH]

Needs an NVIDIA driver; in the suite it reports itself skipped when there is none. Reads only: changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial, wraps
from pathlib import Path
from types import ModuleType
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BenchArgs, Row, SkipBench, median

NAME = "nvml_overhead"


@dataclass(frozen=True, slots=True)
class RawCall:
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class CallRecorder:
    """Wraps the module's ``nvml*`` functions; records top-level calls (not the ones they make internally)."""

    module: ModuleType
    prefix: str = "nvml"
    calls: list[RawCall] = field(default_factory=list)
    _depth: int = 0

    @contextmanager
    def recording(self) -> Iterator[list[RawCall]]:
        originals = {
            name: fn
            for name, fn in vars(self.module).items()
            if name.startswith(self.prefix) and callable(fn) and not isinstance(fn, type)
        }
        for name, fn in originals.items():
            setattr(self.module, name, self._wrap(name, fn))
        try:
            yield self.calls
        finally:
            for name, fn in originals.items():
                setattr(self.module, name, fn)

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        # wraps() keeps the signature visible: the backend inspects some pynvml signatures (nvml/calls.py list_call)
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                self.calls.append(RawCall(name, fn, args, kwargs))
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return wrapper


def replay(calls: list[RawCall], error: type[BaseException]) -> None:
    """Make the recorded calls again, catching the library's errors as the backend does."""
    for c in calls:
        try:  # noqa: SIM105 - a plain try costs less than suppress(), and this path is being timed
            c.fn(*c.args, **c.kwargs)
        except error:
            pass


def time_alternating(a: Callable[[], object], b: Callable[[], object], reps: int, block: int = 10) -> dict[str, float]:
    """Median wall and mean CPU seconds of a and b, run in alternating blocks so drift hits both alike."""
    wall: dict[str, list[float]] = {"a": [], "b": []}
    cpu = {"a": 0.0, "b": 0.0}
    done = 0
    while done < reps:
        n = min(block, reps - done)
        for key, fn in (("a", a), ("b", b)):
            c0 = time.process_time()
            for _ in range(n):
                t = time.perf_counter()
                fn()
                wall[key].append(time.perf_counter() - t)
            cpu[key] += time.process_time() - c0
        done += n
    return {
        "a_wall": median(wall["a"]),
        "b_wall": median(wall["b"]),
        "a_cpu": cpu["a"] / reps,
        "b_cpu": cpu["b"] / reps,
    }


def measure(reps: int) -> dict[str, Any]:
    try:
        import pynvml
    except ImportError as exc:
        raise SkipBench(f"pynvml (nvidia-ml-py) is not installed: {exc}") from None

    from exporter.backends.errors import DriverUnavailableError
    from exporter.backends.nvml import NvmlBackend
    from exporter.sampler import Sampler, SamplerSettings

    backend = NvmlBackend()
    try:
        backend.open()
    except DriverUnavailableError as exc:
        raise SkipBench(f"no NVIDIA driver here ({exc})") from None
    results: dict[str, Any] = {"gpus": [], "reps": reps}
    try:
        gpus = backend.device_count()
        traces: list[list[RawCall]] = []
        for i in range(gpus):
            backend.device_info(i)  # read once at start, as the sampler does; not part of the cycle
            mig = backend.sample(i).mig_mode_current is True

            def cycle(i: int = i, mig: bool = mig) -> None:
                backend.sample(i)
                backend.processes(i)
                if mig:
                    backend.mig_instances(i)

            cycle()  # warm caches (field request lists, process-utilization timestamp)
            recorder = CallRecorder(pynvml)
            with recorder.recording() as calls:
                cycle()
            trace = list(calls)
            traces.append(trace)
            t = time_alternating(cycle, partial(replay, trace, pynvml.NVMLError), reps)
            names: dict[str, int] = {}
            for c in trace:
                names[c.name] = names.get(c.name, 0) + 1
            results["gpus"].append(
                {
                    "gpu": i,
                    "mig": mig,
                    "nvml_calls": len(trace),
                    "calls": names,
                    "backend_wall_ms": t["a_wall"] * 1e3,
                    "raw_wall_ms": t["b_wall"] * 1e3,
                    "backend_cpu_ms": t["a_cpu"] * 1e3,
                    "raw_cpu_ms": t["b_cpu"] * 1e3,
                    "overhead_ratio": t["a_wall"] / t["b_wall"] if t["b_wall"] > 0 else float("nan"),
                }
            )
        sampler = Sampler(backend, SamplerSettings(interval_seconds=5.0, call_deadline_seconds=2.0))
        try:
            sampler.run_once()
            everything = [c for trace in traces for c in trace]
            t = time_alternating(sampler.run_once, lambda: replay(everything, pynvml.NVMLError), max(20, reps // 4))
        finally:
            sampler.stop()
        results["sampler"] = {
            "cycle_wall_ms": t["a_wall"] * 1e3,
            "raw_serial_wall_ms": t["b_wall"] * 1e3,
            "cycle_cpu_ms": t["a_cpu"] * 1e3,
            "raw_serial_cpu_ms": t["b_cpu"] * 1e3,
            "overhead_ratio_wall": t["a_wall"] / t["b_wall"] if t["b_wall"] > 0 else float("nan"),
        }
    finally:
        backend.close()
    return results


def rows(results: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    n = len(results["gpus"])
    for g in results["gpus"]:
        where = f"GPU {g['gpu']}" + (" (MIG)" if g["mig"] else "")
        out += [
            Row(f"NvmlBackend cycle, {where}", "ms", g["backend_wall_ms"], n, note=f"{g['nvml_calls']} NVML calls"),
            Row(f"  same raw NVML calls, {where}", "ms", g["raw_wall_ms"], n),
            Row(f"  backend / raw, {where}", "x", g["overhead_ratio"], n),
            Row(f"  backend CPU - raw CPU, {where}", "ms", g["backend_cpu_ms"] - g["raw_cpu_ms"], n),
        ]
    s = results["sampler"]
    out += [
        Row("Sampler cycle, all GPUs", "ms", s["cycle_wall_ms"], n),
        Row("  raw calls of all GPUs, one after another", "ms", s["raw_serial_wall_ms"], n),
        Row("  sampler / raw", "x", s["overhead_ratio_wall"], n, note="< 1: the sampler runs GPUs in parallel"),
    ]
    return out


def run(args: BenchArgs) -> list[Row]:
    return rows(measure(50 if args.quick else 200))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ns = ap.parse_args()
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        results = measure(ns.reps)
    except SkipBench as exc:
        print(f"nvml_overhead: skipped: {exc}", file=sys.stderr)
        return 2
    if ns.json:
        ns.json.write_text(json.dumps(results, indent=1))
    for r in rows(results):
        print(f"{r.metric:<52} {r.value:>10.3f} {r.unit:<3} {r.note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
