"""Start-up of this tree against a baseline tree, interleaved: wall time from exec to READY=1 on a notify socket (as
systemd sees it), the CPU the daemon used to get there, and the import time of ``healthd.main``
(``python -X importtime``, the sum of every module's own time), run after run, the trees in turn.

    python3 bench/startup_bench.py [--baseline DIR | --baseline-ref REF] [--runs 7] [--node h200x8]

Nothing here asserts a time; medians and minimums are printed, with the ratio this/baseline. The minimum is the
figure least disturbed by other work on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, proc_cpu_seconds
from bench.exposition_bench import REPO, baseline_tree

BASELINE_REF = "1fe471c"  # the tree before the lazy imports and the literal version
IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|")


def to_ready(tree: Path, node: str, root: Path) -> tuple[float, float]:
    """(wall seconds from exec to READY=1, CPU seconds the daemon used until then)."""
    root.mkdir(parents=True)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(root / "n.sock"))
    notify.settimeout(60)
    env = {**os.environ, "PYTHONPATH": str(tree), "NOTIFY_SOCKET": str(root / "n.sock")}
    args = [sys.executable, "-m", "healthd", "--simulate", node, "--metrics-listen", f"127.0.0.1:{free_port()}"]
    args += ["--grpc-listen", f"unix:{root}/h.sock", "--state-dir", str(root / "state")]
    started = time.perf_counter()
    proc = subprocess.Popen(args, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while b"READY=1" not in notify.recv(4096):
            pass
        wall = time.perf_counter() - started
        cpu = proc_cpu_seconds(proc.pid)
    finally:
        notify.close()
        proc.terminate()
        proc.wait(30)
    return wall, cpu


def import_seconds(tree: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-X", "importtime", "-c", "import healthd.main"]
    err = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stderr
    return sum(int(m.group(1)) for line in err.splitlines() if (m := IMPORT_LINE.match(line))) / 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="a checkout to compare with (default: --baseline-ref)")
    ap.add_argument("--baseline-ref", default=BASELINE_REF)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--node", default="h200x8")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp"))
    args = ap.parse_args(argv)
    figures: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="xpu-bench-startup-", dir=args.work_dir) as tmp:
        root = Path(tmp)
        with baseline_tree(args.baseline, args.baseline_ref, root) as base:
            trees = {"baseline": base.resolve(), "this": REPO}
            for run in range(args.runs):
                order = list(trees.items()) if run % 2 == 0 else list(reversed(trees.items()))
                for name, tree in order:
                    wall, cpu = to_ready(tree, args.node, root / f"{name}-{run}")
                    f = figures.setdefault(name, {"to READY, wall": [], "to READY, CPU": [], "imports": []})
                    f["to READY, wall"].append(wall)
                    f["to READY, CPU"].append(cpu)
                    f["imports"].append(import_seconds(tree))
    print(f"== start-up, {args.node}, {args.runs} runs each, in turn")
    print(f"  {'':<28} {'baseline':>16} {'this':>16} {'ratio':>8}")
    for what in figures["this"]:
        b, t = figures["baseline"][what], figures["this"][what]
        for label, fn in (("median", statistics.median), ("min", min)):
            ratio = fn(t) / fn(b)
            print(f"  {what + ', ' + label + ' (ms)':<28} {fn(b) * 1e3:16.1f} {fn(t) * 1e3:16.1f} {ratio:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
