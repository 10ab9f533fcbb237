"""What the CDI spec costs: building and writing it with numbered device nodes, reading the driver's device
tables, discovering driver libraries, and one run of the ldcache hook.

- spec write: ``CdiWriter.write`` for N partitions (half TDM, half MIG) on the simulated node's tables, with the
  tables cached (the usual case) and re-read (the first write after 10 s);
- tables: parsing ``/proc/devices`` and the 4322-line ``mig-minors`` once;
- discovery: ``ldconfig -p`` on this host plus the lookup (what the daemon does once at start);
- hook: ``xpu-cdi-hook update-ldcache`` on a minimal root file system, process start included (root only).

    python3 bench/cdi_bench.py [--partitions 56] [--rounds 50]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(REPO))

from bench.common import median, percentile, timed  # noqa: E402
from healthd.host.simulated_devices import simulated_host_devices, write_driver_tables  # noqa: E402
from healthd.partition.cdi import CdiWriter  # noqa: E402
from healthd.partition.driverlibs import builtin_hook_path, discover, read_ldcache  # noqa: E402
from healthd.partition.edits import ContainerEdits, Mount  # noqa: E402


def p50_p99_ms(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    samples = timed(fn, rounds)
    return median(samples) * 1000, percentile(samples, 0.99) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--partitions", type=int, default=56, help="partitions in the spec (default 56: 8 x 7 MIG)")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args(argv)
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="xpu-cdi-bench-") as tmp:
        root = Path(tmp)
        write_driver_tables(root / "sim")
        devices = simulated_host_devices(root / "sim")
        writer = CdiWriter(root / "cdi")

        def devices_of(n: int) -> list[tuple[str, ContainerEdits]]:
            out = []
            for i in range(n):
                gpu = i % 8
                if i % 2:
                    nodes = devices.mig_nodes(gpu, 1 + i // 16, 0)
                    out.append(
                        (f"p-{i:012x}", ContainerEdits(env={"CUDA_VISIBLE_DEVICES": f"MIG-{i}"}, device_nodes=nodes))
                    )
                else:
                    pipe = f"/run/xpu-runtime-kit/mps/p-{i:012x}/pipe"
                    edits = ContainerEdits(
                        env={"CUDA_MPS_PIPE_DIRECTORY": pipe},
                        mounts=(Mount(pipe, pipe),),
                        device_nodes=devices.card_nodes(gpu),
                    )
                    out.append((f"p-{i:012x}", edits))
            return out

        def cold() -> None:
            devices._tables = None
            writer.write(devices_of(args.partitions))

        rows.append(
            (
                f"spec write, {args.partitions} partitions, tables cached",
                *p50_p99_ms(lambda: writer.write(devices_of(args.partitions)), args.rounds),
            )
        )
        rows.append((f"spec write, {args.partitions} partitions, tables re-read", *p50_p99_ms(cold, args.rounds)))

        def tables() -> None:
            devices._tables = None
            devices.tables()

        rows.append(("device tables (/proc/devices + mig-minors)", *p50_p99_ms(tables, args.rounds)))
        rows.append(("driver discovery (ldconfig -p + lookup)", *p50_p99_ms(lambda: discover(read_ldcache()), 10)))
        hook = builtin_hook_path()
        if hook is not None and os.geteuid() == 0:
            rootfs = root / "rootfs"
            (rootfs / "etc").mkdir(parents=True)
            bundle = root / "bundle"
            bundle.mkdir()
            (bundle / "config.json").write_text(json.dumps({"root": {"path": str(rootfs)}}))
            state = json.dumps({"bundle": str(bundle)})

            def run_hook() -> None:
                subprocess.run([hook, "update-ldcache", "--folder", "/usr/lib"], input=state, text=True, check=True)

            rows.append(("xpu-cdi-hook update-ldcache (process included)", *p50_p99_ms(run_hook, 10)))
        spec_bytes = (root / "cdi" / "xpu-runtime-kit.io-gpu.json").stat().st_size
    print(f"{'what':<58} {'p50 ms':>8} {'p99 ms':>8}")
    for name, p50, p99 in rows:
        print(f"{name:<58} {p50:8.2f} {p99:8.2f}")
    print(f"spec size with {args.partitions} partitions: {spec_bytes} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
