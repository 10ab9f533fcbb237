"""bf16 matrix-product throughput of one GPU for a fixed time (PyTorch), as one number: TFLOP/s.

    python3 bench/gpu_throughput.py [--seconds 10] [--size 8192] [--device 0]

Prints one JSON line: {"tflops": ..., "products": ..., "seconds": ..., "pid": ...}. Three warm-up products run
before the clock starts; the GPU is synchronised every few products so the count covers finished work only.
Used by bench/device_check.py to compare the card's throughput with and without the daemon sampling it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--device", type=int, default=0)
    ns = ap.parse_args()
    try:
        result = matmul_tflops(ns.seconds, ns.size, ns.device)
    except ImportError as exc:
        print(f"gpu_throughput: PyTorch is not installed: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
