"""The client side of the TDM sharing experiment: what runs inside a partition (through `xpuctl partitions exec`).

    python3 bench/tdm_client.py matmul --seconds 10     # bf16 8192^3 products for a fixed time: TFLOP/s
    python3 bench/tdm_client.py matmul --then-alloc-gib 4   # ... then, in the same process, allocate 4 GiB
    python3 bench/tdm_client.py alloc --gib 4           # try to allocate that much device memory
    python3 bench/tdm_client.py ... --dry-run           # no GPU: report the partition environment only

Prints one JSON line with the result, the CUDA_MPS_* environment the client ran with and whether this uid can
reach the MPS pipe directory and its control pipe, so the experiment sees what the partition gave it. With
--dry-run the numbers are null: it only checks the path through the daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

MPS_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
)


def alloc(gib: float) -> dict[str, object]:
    import torch  # type: ignore[import-not-found]  # only on the GPU machine

    try:
        block = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda:0")
        block.fill_(1)
        torch.cuda.synchronize()
    except RuntimeError as exc:  # CUDA out of memory (an MPS pinned-memory limit shows as this)
        return {"allocated": False, "error": str(exc).splitlines()[0][:200]}
    return {"allocated": True, "error": ""}


def pipe_access() -> dict[str, object]:
    """Can this process's uid cross into the partition's pipe directory and see its control pipe?"""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
    if not pipe:
        return {"dir": "", "reachable": False, "control": False}
    control = os.path.join(pipe, "control")
    return {"dir": pipe, "reachable": os.access(pipe, os.R_OK | os.X_OK), "control": os.path.exists(control)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["matmul", "alloc"])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--then-alloc-gib", type=float, help="matmul: afterwards, allocate this much (the cap check)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: print the environment and null results")
    ns = ap.parse_args()
    out: dict[str, object] = {"what": ns.what, "env": {k: os.environ.get(k, "") for k in MPS_ENV}, "uid": os.getuid()}
    out["pipe"] = pipe_access()
    allocating = ns.what == "alloc" or ns.then_alloc_gib is not None
    if ns.dry_run:
        out.update({"tflops": None} if ns.what == "matmul" else {})
        out.update({"allocated": None, "error": ""} if allocating else {})
    else:
        if ns.what == "matmul":
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from gpu_throughput import matmul_tflops

            out.update(matmul_tflops(ns.seconds, 8192, 0))
        if allocating:
            out.update(alloc(ns.gib if ns.what == "alloc" else ns.then_alloc_gib))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
