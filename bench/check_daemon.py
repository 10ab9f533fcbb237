"""The daemon step of the device check: xpu-healthd on the real backend for a minute, as an operator meets it.

1. The daemon starts with a config file (so it cannot fall back to a simulation), private sockets, state, CDI
   and MPS runtime directories, and the packaged unit's umask (0027). ``--rehearse``: the simulated h200x1 node.
2. Through the API, each call timed: node health (`xpuctl health`), the fault list (`xpuctl faults list`), and
   one TDM partition made and removed on card 0 (`partitions mode 0 tdm`, `create`, `get`, `delete`,
   `mode 0 none`). TDM is the daemon's own state: an MPS control daemon it starts and stops; no card setting.
3. The window: /metrics every 5 s for ``--seconds``; each body is checked for signs of trouble (backend not the
   one expected, a card down, sample failures, call timeouts, failing collectors, active fault series).
4. Figures: CPU share of one core, RSS, /metrics p50/p99 (a burst after the window), NVML call errors, and (real
   cards) each card's memory size against nvidia-smi's.

result.json in ``--out`` is rewritten after each phase, so a kill leaves what was measured so far.

    python3 -m bench.check_daemon --out DIR [--seconds 60] [--rehearse]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.check_setup import nvidia_smi
from bench.daemon_bench import DaemonRun

REPO = Path(__file__).resolve().parent.parent
UNIT_UMASK = 0o027  # packaging/systemd/xpu-healthd.service UMask=
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eEnaNIf]+)$", re.MULTILINE)
SCRAPE_EVERY_S = 5.0


def series(text: str) -> list[tuple[str, str, float]]:
    return [(m.group(1), m.group(2) or "", float(m.group(3))) for m in SERIES.finditer(text)]


def health_problems(text: str, backend: str = "nvml") -> list[str]:
    """What in one /metrics body says the daemon or a card is not well (the 'no false faults' check).

    ``backend``: the start of the backend label expected (``nvml`` on a card, ``simulated`` in the rehearsal)."""
    problems = []
    found = series(text)
    if not any(n == "xpu_backend_info" and f'backend="{backend}' in labels for n, labels, _ in found):
        problems.append(f"xpu_backend_info does not say backend={backend}")
    for name, labels, value in found:
        if name == "xpu_backend_up" and value != 1:
            problems.append("xpu_backend_up is 0")
        elif name == "xpu_gpu_up" and value != 1:
            problems.append(f"xpu_gpu_up{labels} is 0")
        elif name == "xpu_gpu_sample_failure" and value > 0:
            problems.append(f"xpu_gpu_sample_failure{labels}")
        elif name == "xpu_backend_call_timeouts_total" and value > 0:
            problems.append(f"xpu_backend_call_timeouts_total{labels} = {value:g}")
        elif name == "xpu_collector_success" and value != 1:
            problems.append(f"xpu_collector_success{labels} is 0")
        elif re.match(r"xpu_(health|fault)", name) and re.search(r"active|open|firing", name) and value > 0:
            problems.append(f"fault series {name}{labels} = {value:g}")
    return problems


def memory_mismatches(text: str, smi: list[list[str]]) -> list[str]:
    """Cards whose memory size in /metrics differs from nvidia-smi's (rows of index, uuid, memory.total MiB)."""
    rows = {r[1]: r for r in smi}
    out = []
    for name, labels, value in series(text):
        if name != "xpu_gpu_memory_total_bytes":
            continue
        uuid = re.search(r'uuid="([^"]+)"', labels)
        row = rows.get(uuid.group(1)) if uuid else None
        if row is None:
            out.append(f"{labels}: uuid not listed by nvidia-smi")
        elif abs(value / 2**20 - float(row[2])) > 1:
            out.append(f"{labels}: memory total {value / 2**20:.0f} MiB vs nvidia-smi {row[2]} MiB")
    return out


class Xpuctl:
    """xpuctl against one daemon; every call is timed and recorded, a failing one too."""

    def __init__(self, root: Path) -> None:
        self.prefix = [sys.executable, "-m", "healthd.cli", "--socket", f"unix:{root / 'healthd.sock'}",
                       "--timeout", "30"]  # fmt: skip
        self.admin = ["--admin-socket", f"unix:{root / 'admin.sock'}"]
        self.root = root
        self.calls: dict[str, dict[str, Any]] = {}

    def __call__(self, label: str, *args: str, admin: bool = False) -> str | None:
        argv = [*self.prefix, *args[:1], *(self.admin if admin else []), *args[1:]]
        t = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd=REPO)
        record: dict[str, Any] = {"ok": done.returncode == 0, "ms": (time.perf_counter() - t) * 1e3}
        if done.returncode != 0:
            record["error"] = (done.stderr.strip() or done.stdout.strip())[-400:]
        self.calls[label] = record
        print(f"xpuctl {' '.join(args)}: {'ok' if record['ok'] else record['error']}", flush=True)
        return done.stdout if done.returncode == 0 else None


def dir_modes(run: Path) -> dict[str, str]:
    """Mode and owner of each directory the daemon made under its runtime dir (what a client's uid must cross)."""
    out = {}
    for path in sorted([run, *(p for p in run.rglob("*") if p.is_dir())]):
        st = path.stat()
        out[str(path.relative_to(run.parent))] = f"{st.st_mode & 0o7777:04o} {st.st_uid}:{st.st_gid}"
    return out


def config_for(root: Path) -> str:
    run = root / "run"
    run.mkdir(mode=0o755, exist_ok=True)  # as the unit's RuntimeDirectoryMode=0755; the daemon makes the rest
    return (f'[daemon]\nadmin_socket = "{root / "admin.sock"}"\n[host]\ncdi_dir = "{root / "cdi"}"\n'
            f'[partitions]\nruntime_dir = "{run}"\n')  # fmt: skip


def api_round(ctl: Xpuctl, result: dict[str, Any]) -> None:
    health = ctl("health", "health")
    result["health"] = (health or "").strip().splitlines()[:12]
    faults = ctl("faults", "faults", "list", "--json")
    try:
        result["faults"] = json.loads(faults) if faults else None
    except ValueError:
        result["faults"] = faults
    if ctl("tdm_mode", "partitions", "mode", "0", "tdm", admin=True) is None:
        return
    try:
        reply = ctl("create", "partitions", "create", "--gpu", "0", "--compute", "50", "--memory", "1GiB",
                    "--owner-lease", "device-check", "--ttl", "300", "--json", admin=True)  # fmt: skip
        pid = json.loads(reply)["id"] if reply else None  # the created partition, one object
        if pid is not None:
            got = ctl("get", "partitions", "get", pid)
            result["partition"] = (got or "").strip().splitlines()[:20]
            result["mps_dir_modes"] = dir_modes(ctl.root / "run")
            ctl("delete", "partitions", "delete", pid, admin=True)
    finally:
        ctl("none_mode", "partitions", "mode", "0", "none", admin=True)


def window(run: DaemonRun, seconds: float, backend: str, result: dict[str, Any]) -> str:
    problems: list[str] = []
    errors: dict[str, float] = {}
    scrapes = 0
    run.begin()
    end = time.monotonic() + seconds
    text = ""
    while True:
        text = run.metrics_text()
        scrapes += 1
        problems += [p for p in health_problems(text, backend) if p not in problems]
        errors.update({labels: v for name, labels, v in series(text) if name == "xpu_backend_call_errors_total"})
        if time.monotonic() >= end:
            break
        time.sleep(min(SCRAPE_EVERY_S, max(0.0, end - time.monotonic())))
    run.end_window()
    by_metric = {r.metric.strip(): r.value for r in run.rows()}
    result.update({
        "scrapes": scrapes, "problems": problems, "call_errors": errors,
        "cpu_share_percent": by_metric["daemon CPU share of one core"],
        "cpu_per_cycle_ms": by_metric["CPU per sampling cycle, scrapes included"],
        "rss_mib": run.rss_mib, "peak_rss_mib": run.hwm_mib, "threads": run.threads,
        "scrape_p50_ms": by_metric["daemon /metrics p50 (real process)"],
        "scrape_p99_ms": by_metric["daemon /metrics p99 (real process)"],
    })  # fmt: skip
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rehearse", action="store_true", help="the simulated h200x1 node instead of the real card")
    args = ap.parse_args(argv)
    root = args.out / "d"  # short: the gRPC and admin socket paths live here
    root.mkdir(parents=True, exist_ok=True)
    backend = "simulated" if args.rehearse else "nvml"
    run = DaemonRun(0, 0, root, real=not args.rehearse, scenario="h200x1" if args.rehearse else None,
                    config=config_for(root), umask=UNIT_UMASK)  # fmt: skip
    result: dict[str, Any] = {"backend": backend, "seconds": args.seconds}
    path = args.out / "result.json"

    def save() -> None:
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")

    run.start()
    try:
        t = time.perf_counter()
        run.wait_ready(60)
        result["ready_s"] = time.perf_counter() - t
        result["gpus"] = run.discover_gpus()
        ctl = Xpuctl(root)
        try:
            api_round(ctl, result)
        finally:
            result["api"] = ctl.calls
            save()
        text = window(run, args.seconds, backend, result)
        if not args.rehearse:
            smi = nvidia_smi("index,uuid,memory.total")
            result["nvidia_smi_mismatches"] = memory_mismatches(text, smi) if isinstance(smi, list) else [smi]
        else:
            result["nvidia_smi_mismatches"] = []  # no nvidia-smi beside the simulated node
        log = run.log.read_text(errors="replace").splitlines()
        result["log_warnings"] = sum(1 for line in log if re.search(r'"level": "(warning|error)"', line))
        api_ok = all(c["ok"] for c in ctl.calls.values())
        result["ok"] = not result["problems"] and not result["nvidia_smi_mismatches"] and api_ok
    finally:
        run.stop()
        save()
        print(f"daemon log (packed with this step): {run.log}")
    print(json.dumps({k: result.get(k) for k in ("gpus", "problems", "api", "cpu_share_percent", "ok")}, default=str))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
