"""How long starting a partition's CUDA MPS control daemon takes, the way xpu-healthd starts one (device check).

Each run starts ``nvidia-cuda-mps-control -d`` through NvidiaMpsControl with the direct launcher (its parent exits
once the daemon listens; no output is read), sends the two quota defaults, asks ``get_server_list`` and sends
``quit``, on a private pipe and log directory under a temporary directory. Nothing here changes a card setting: the
defaults belong to that control daemon only, and no MPS server starts because no CUDA client connects.

    python3 -m bench.mps_timing [--runs 3] [--gpu-uuid GPU-...] [--binary PATH] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from healthd.partition.mps import MPS_CONTROL_BINARY, MpsError, NvidiaMpsControl
from healthd.partition.mps_launch import DetachedLauncher
from healthd.partition.mps_spec import MpsDaemonSpec

PHASES = ("start", "get_server_list", "quit")


def first_gpu_uuid() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def one_run(control: NvidiaMpsControl, root: Path, index: int, gpu_uuid: str) -> dict[str, float]:
    base = root / f"run-{index}"
    spec = MpsDaemonSpec(f"bench-{index}", gpu_uuid, base / "pipe", base / "log", 50, 1024)
    times: dict[str, float] = {}
    started = time.perf_counter()
    control.start(spec)  # -d, then set_default_active_thread_percentage and set_default_device_pinned_mem_limit
    times["start"] = time.perf_counter() - started
    try:
        started = time.perf_counter()
        if not control.alive(spec):
            raise MpsError("the control daemon does not answer get_server_list")
        times["get_server_list"] = time.perf_counter() - started
    finally:
        started = time.perf_counter()
        control.stop(spec)
        times["quit"] = time.perf_counter() - started
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gpu-uuid", help="card the control daemon may see (default: the first nvidia-smi lists)")
    ap.add_argument("--binary", default=MPS_CONTROL_BINARY)
    ap.add_argument("--out", type=Path, help="write mps_timing.json here")
    args = ap.parse_args(argv)
    if shutil.which(args.binary) is None:
        print(f"mps_timing: {args.binary} not installed; nothing measured")
        return 0
    gpu_uuid = args.gpu_uuid or first_gpu_uuid()
    if gpu_uuid is None:
        print("mps_timing: no GPU UUID (nvidia-smi failed and no --gpu-uuid); nothing measured")
        return 0
    control = NvidiaMpsControl(args.binary, launcher=DetachedLauncher())
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="xpu-mps-timing-") as tmp:
        for index in range(args.runs):
            try:
                runs.append(one_run(control, Path(tmp), index, gpu_uuid))
            except MpsError as exc:
                print(f"mps_timing: run {index}: {exc}")
                return 1
    print(f"{'phase':<16} {'median ms':>10} {'max ms':>10}   ({len(runs)} runs, {args.binary})")
    for phase in PHASES:
        values = [r[phase] * 1000 for r in runs]
        print(f"{phase:<16} {statistics.median(values):>10.1f} {max(values):>10.1f}")
    if args.out is not None:
        (args.out / "mps_timing.json").write_text(json.dumps({"binary": args.binary, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
