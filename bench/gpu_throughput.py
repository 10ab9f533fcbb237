"""bf16 matrix-product throughput of one GPU for a fixed time (PyTorch), as one number: TFLOP/s.

    python3 bench/gpu_throughput.py [--seconds 10] [--size 8192] [--device 0]
    python3 bench/gpu_throughput.py --stream --seconds 60 [--dry-run]

Prints one JSON line: {"tflops": ..., "products": ..., "seconds": ..., "pid": ...}. Three warm-up products run
before the clock starts; the GPU is synchronised every few products so the count covers finished work only.
``--stream`` prints a line every quarter second instead, {"t": CLOCK_MONOTONIC at its end, "dt": ..., "tflops": ...},
so one process measures several phases (bench/check_throughput.py: the card alone, with the daemon, alone again)
against one baseline; ``--dry-run`` (no GPU) prints the same lines with no numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable


def matmul_tflops(seconds: float, size: int, device: int) -> dict[str, float]:
    import torch  # type: ignore[import-not-found]  # only on the GPU machine

    dev = torch.device("cuda", device)
    a = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        torch.matmul(a, b)
    torch.cuda.synchronize(dev)
    products = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            torch.matmul(a, b)
        torch.cuda.synchronize(dev)
        products += 10
    elapsed = time.perf_counter() - start
    return {
        "tflops": 2.0 * size**3 * products / elapsed / 1e12,
        "products": float(products),
        "seconds": elapsed,
        "pid": float(os.getpid()),
    }


STREAM_EVERY_S = 0.25


def stream(seconds: float, size: int, device: int, dry_run: bool) -> None:
    """Rate per quarter second until ``seconds`` pass (or the reader goes away)."""
    run_one: Callable[[], None] | None = None
    if not dry_run:
        import torch  # type: ignore[import-not-found]  # only on the GPU machine

        dev = torch.device("cuda", device)
        a = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
        b = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
        for _ in range(3):
            torch.matmul(a, b)
        torch.cuda.synchronize(dev)

        def product() -> None:
            torch.matmul(a, b)
            torch.cuda.synchronize(dev)

        run_one = product

    print(json.dumps({"ready": time.monotonic()}), flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start, products = time.monotonic(), 0
        while time.monotonic() - start < STREAM_EVERY_S:
            if run_one is not None:
                run_one()
                products += 1
            else:
                time.sleep(0.05)
        t = time.monotonic()
        rate = 2.0 * size**3 * products / (t - start) / 1e12 if run_one is not None else None
        print(json.dumps({"t": t, "dt": t - start, "tflops": rate}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--stream", action="store_true", help="a rate line every quarter second")
    ap.add_argument("--dry-run", action="store_true", help="--stream without a GPU: lines with no numbers")
    ns = ap.parse_args()
    if ns.stream:
        with contextlib.suppress(BrokenPipeError):  # the reader went away: the phases are over
            stream(ns.seconds, ns.size, ns.device, ns.dry_run)
        return 0
    try:
        result = matmul_tflops(ns.seconds, ns.size, ns.device)
    except ImportError as exc:
        print(f"gpu_throughput: PyTorch is not installed: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
