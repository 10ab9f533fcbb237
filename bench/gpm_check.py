"""GPM on a real card: is it supported, what does one interval answer, and what does it cost (bench/device_check.sh).

For each card (and each MIG GPU instance): ``nvmlGpmQueryDeviceSupport``, then NvmlBackend.profiling twice,
``--interval`` seconds apart (the first call opens the interval, the second reports it), with the latency of every
GPM call the backend made; and the PCIe throughput fallback (two 20 ms windows) for comparison with GPM's PCIe
rates. Then every GPM metric id the backend knows, asked over one interval of its own: first all in one
``nvmlGpmMetricsGet``, then each alone, printed per id as supported, not supported (the metric's own return code) or
rejected (the driver refuses a request holding it), and whether the driver's branch defines it (nvml.h, see
exporter/backends/nvml/profiling.py). That settles how a driver answers an id it does not define. Reads only: GPM
sampling changes no card setting.

    python3 bench/gpm_check.py [--interval 1.0] [--out DIR]

Prints one block per card and writes gpm.json under --out. Exit status 0 when every card answered (with or without
GPM), 1 when a call failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynvml

from exporter.backends.errors import BackendError
from exporter.backends.nvml import NvmlBackend
from exporter.backends.nvml.profiling import METRIC_ID_NAMES, MIN_INTERVAL_SECONDS, defined_metric_ids
from exporter.backends.types import DeviceProfiling, ProfilingSample, Unsupported

TIMED = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet",
         "nvmlGpmSampleAlloc", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetEncoderUtilization",
         "nvmlDeviceGetDecoderUtilization")  # fmt: skip


@contextmanager
def timed_calls() -> Iterator[dict[str, list[float]]]:
    """Wrap the GPM and throughput calls of pynvml; yields call name -> seconds of each call."""
    times: dict[str, list[float]] = {}
    originals = {name: getattr(pynvml, name) for name in TIMED if hasattr(pynvml, name)}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times.setdefault(name, []).append(time.perf_counter() - start)

        return timed

    for name, fn in originals.items():
        setattr(pynvml, name, wrap(name, fn))
    try:
        yield times
    finally:
        for name, fn in originals.items():
            setattr(pynvml, name, fn)


def reading(sample: ProfilingSample | None) -> dict[str, Any] | None:
    if sample is None:
        return None
    return {
        "interval_seconds": round(sample.interval_seconds, 4),
        "metrics": {str(m): round(v, 6) for m, v in sorted(sample.metrics.items())},
        "engines": {f"{e}{n}": round(v, 6) for (e, n), v in sorted(sample.engines.items())},
    }


def describe(profiling: DeviceProfiling) -> dict[str, Any]:
    codec = {
        name: None if isinstance(value, Unsupported) else value
        for name, value in (
            ("encoder_utilization_ratio", profiling.encoder_utilization_ratio),
            ("decoder_utilization_ratio", profiling.decoder_utilization_ratio),
        )
    }
    return {
        "gpm_supported": profiling.gpm_supported,
        "card": reading(profiling.card),
        "mig": {str(gi): reading(s) for gi, s in sorted(profiling.mig.items())},
        **codec,
    }


def check_card(backend: NvmlBackend, index: int, interval: float) -> dict[str, Any]:
    instances = backend.mig_instances(index)
    with timed_calls() as times:
        backend.profiling(index, instances)
        time.sleep(interval)
        second = backend.profiling(index, instances)
        pcie = backend.pcie_throughput(index)
    result = describe(second)
    result["mig_instances"] = [m.gpu_instance_id for m in instances]
    result["pcie_sampling_window"] = {
        "tx_bytes_per_second": None if isinstance(pcie.tx_bytes_per_second, Unsupported) else pcie.tx_bytes_per_second,
        "rx_bytes_per_second": None if isinstance(pcie.rx_bytes_per_second, Unsupported) else pcie.rx_bytes_per_second,
    }
    result["call_ms"] = {name: [round(t * 1e3, 3) for t in ts] for name, ts in sorted(times.items())}
    result["refused_metric_ids"] = sorted(backend.refused_gpm_metric_ids(index))
    if second.gpm_supported:
        result["metric_ids"] = check_metric_ids(backend, index, interval)
    return result


def _metrics_call(older: Any, newer: Any, ids: list[int]) -> dict[int, tuple[int, float]]:
    """One nvmlGpmMetricsGet: id -> (its nvmlReturn, value); raises pynvml.NVMLError when the request is refused."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = older, newer
    for slot, mid in enumerate(ids):
        request.metrics[slot].metricId = mid
    pynvml.nvmlGpmMetricsGet(request)
    return {int(m.metricId): (int(m.nvmlReturn), float(m.value)) for m in request.metrics[: len(ids)]}


def probe_metric_ids(handle: Any, gpu_instance: int | None, interval: float, cuda: int | None) -> dict[str, Any]:
    """Every known metric id over one interval: the whole request, then each id alone."""
    ids = sorted(METRIC_ID_NAMES)
    defined = defined_metric_ids(cuda)
    samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
    try:
        for n, sample in enumerate(samples):
            if n:
                time.sleep(max(interval, MIN_INTERVAL_SECONDS))
            if gpu_instance is None:
                pynvml.nvmlGpmSampleGet(handle, sample)
            else:
                pynvml.nvmlGpmMigSampleGet(handle, gpu_instance, sample)
        requests: dict[str, str] = {}
        for label, asked in (("all known ids", ids), ("the ids this branch defines", sorted(defined & set(ids)))):
            try:
                _metrics_call(samples[0], samples[1], asked)
                requests[label] = f"answered ({len(asked)} ids)"
            except pynvml.NVMLError as err:
                requests[label] = f"REFUSED ({len(asked)} ids): NVML {err.value}"
        per_id: dict[str, dict[str, Any]] = {}
        for mid in ids:
            entry: dict[str, Any] = {"name": METRIC_ID_NAMES[mid], "defined_in_branch": mid in defined}
            try:
                code, value = _metrics_call(samples[0], samples[1], [mid])[mid]
                entry["status"] = "supported" if code == pynvml.NVML_SUCCESS else f"not supported (NVML {code})"
                if code == pynvml.NVML_SUCCESS:
                    entry["value"] = round(value, 6)
            except pynvml.NVMLError as err:
                entry["status"] = f"rejected (NVML {err.value})"
            per_id[str(mid)] = entry
    finally:
        for sample in samples:
            pynvml.nvmlGpmSampleFree(sample)
    where = "card" if gpu_instance is None else f"MIG GPU instance {gpu_instance}"
    return {"sampled": where, "cuda_driver_version": cuda, "requests": requests, "ids": per_id}


def check_metric_ids(backend: NvmlBackend, index: int, interval: float) -> dict[str, Any]:
    cuda = backend.system_info().cuda_driver_version
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    try:
        return probe_metric_ids(handle, None, interval, None if isinstance(cuda, Unsupported) else cuda)
    except pynvml.NVMLError as err:
        instances = backend.mig_instances(index)
        if err.value != pynvml.NVML_ERROR_NOT_SUPPORTED or not instances:
            return {"error": f"NVML {err.value}"}
    try:  # MIG on: the card level refuses samples, the instances take them
        gi = instances[0].gpu_instance_id
        return probe_metric_ids(handle, gi, interval, None if isinstance(cuda, Unsupported) else cuda)
    except pynvml.NVMLError as err:
        return {"error": f"NVML {err.value}"}


def id_lines(probe: dict[str, Any]) -> list[str]:
    if "error" in probe:
        return [f"  metric ids: not probed: {probe['error']}"]
    out = [f"  metric ids ({probe['sampled']}, CUDA driver {probe['cuda_driver_version']}):"]
    out += [f"    one request for {label}: {answer}" for label, answer in probe["requests"].items()]
    for mid, entry in probe["ids"].items():
        branch = "" if entry["defined_in_branch"] else "  [not in this branch's nvml.h]"
        out.append(f"    id {int(mid):>3} {entry['name']:<26} {entry['status']}{branch}")
    return out


def lines(index: int, result: dict[str, Any]) -> list[str]:
    out = [f"GPU {index}: GPM {'supported' if result.get('gpm_supported') else 'NOT supported'}"]
    card = result.get("card")
    if card:
        metrics = card["metrics"]
        out.append(f"  interval {card['interval_seconds']} s, {len(metrics)} metrics, {len(card['engines'])} engines")
        shown = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "pcie_tx_bytes_per_second")
        out += [f"  {name:<26} {metrics.get(name, 'absent')}" for name in shown]
    elif result.get("gpm_supported"):
        out.append("  no card-level reading (MIG on, or the card refused the card-level sample)")
    for gi, mig in result.get("mig", {}).items():
        out.append(f"  MIG GPU instance {gi}: {len(mig['metrics'])} metrics" if mig else f"  MIG {gi}: no reading")
    out.append(f"  PCIe 20 ms window: {result.get('pcie_sampling_window')}")
    for name, ms in result.get("call_ms", {}).items():
        out.append(f"  {name:<34} ms {ms}")
    if result.get("refused_metric_ids"):
        out.append(f"  ids the backend stopped asking for (refused): {result['refused_metric_ids']}")
    if "metric_ids" in result:
        out += id_lines(result["metric_ids"])
    if "error" in result:
        out.append(f"  ERROR {result['error']}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between the two GPM samples")
    parser.add_argument("--out", type=Path, help="directory for gpm.json")
    args = parser.parse_args(argv)
    backend = NvmlBackend()
    try:
        backend.open()
    except BackendError as exc:
        print(f"gpm_check: NVML unavailable: {exc}")
        return 1
    results: dict[str, Any] = {}
    failed = False
    try:
        for index in range(backend.device_count()):
            try:
                results[str(index)] = check_card(backend, index, args.interval)
            except BackendError as exc:
                results[str(index)] = {"error": f"{exc.code}: {exc}"}
                failed = True
            print("\n".join(lines(index, results[str(index)])))
    finally:
        backend.close()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpm.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
