"""The device check's first step: install the carried wheels, then record the machine (bench/device_check.py).

1. Wheels: every wheel in ``--wheels`` (bench/device_wheels.sh fills .whl/) is installed into ``--site`` when the
   machine lacks that distribution or has an older version than the wheel; otherwise the machine's own is kept.
   Nothing can be fetched on the device, so this is pip with --no-index --no-deps over the named files.
2. The machine: Python, the versions the daemon will import, nvidia-smi's view of each card, the driver's entries
   in /proc/devices, the /dev/nvidia* nodes and /proc/driver/nvidia-caps.
3. packaging/deviceallow.py: would the packaged unit's DeviceAllow= let the daemon open every GPU node?

Standard library only (it runs before the wheels are there). Reads only. Writes result.json in ``--out``.

    python3 bench/check_setup.py --out DIR --wheels .whl --site DIR
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[0-9][^-]*)-.+\.whl$")
SETTINGS_QUERY = "index,uuid,mig.mode.current,compute_mode,persistence_mode,power.limit,clocks.applications.graphics"
GPU_QUERY = "index,name,driver_version,memory.total,mig.mode.current,persistence_mode"
SHOWN = ("grpcio", "protobuf", "prometheus-client", "nvidia-ml-py", "structlog", "grpcio-health-checking",
         "grpcio-reflection", "grpcio-status", "googleapis-common-protos", "pyyaml", "bcrypt", "pytest",
         "pytest-timeout", "hypothesis", "psutil", "nvitop", "nvitop-exporter", "torch")  # fmt: skip


def release(version: str) -> tuple[int, ...]:
    """The numeric release part of a version ("1.85.1" -> (1, 85, 1); "2.11.0+cu130" -> (2, 11, 0))."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts)


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def select_wheels(wheels: list[Path]) -> tuple[list[Path], list[str], list[str]]:
    """(wheels to install, why each is installed, what the machine keeps)."""
    install, why, kept = [], [], []
    for wheel in sorted(wheels):
        m = WHEEL.match(wheel.name)
        if m is None:
            continue
        name, version = m.group("name").replace("_", "-").lower(), m.group("version")
        have = installed(name)
        if have is not None and release(have) >= release(version):
            kept.append(f"{name} {have} (carried {version})")
        else:
            install.append(wheel)
            why.append(f"{name} {version} ({'missing' if have is None else f'machine has {have}'})")
    return install, why, kept


def install_wheels(wheels_dir: Path, site: Path) -> dict[str, Any]:
    wheels = sorted(wheels_dir.glob("*.whl")) if wheels_dir.is_dir() else []
    if not wheels:
        return {"installed": [], "kept": [], "error": None, "note": f"no wheels in {wheels_dir}"}
    chosen, why, kept = select_wheels(wheels)
    result: dict[str, Any] = {"installed": why, "kept": kept, "error": None}
    if chosen:
        site.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                "--no-cache-dir", "--disable-pip-version-check", "--upgrade", "--target", str(site)]  # fmt: skip
        done = subprocess.run([*argv, *map(str, chosen)], capture_output=True, text=True, timeout=120, check=False)
        print(done.stdout + done.stderr, end="")
        if done.returncode != 0:
            result["error"] = f"pip exited {done.returncode}: {done.stderr.strip()[-400:]}"
    return result


def nvidia_smi(query: str, timeout: float = 30.0) -> list[list[str]] | str:
    """nvidia-smi's rows for ``query``, or why there are none."""
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found (no GPU)"
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    if done.returncode != 0:
        return f"nvidia-smi exited {done.returncode}: {(done.stdout + done.stderr).strip()[-300:]}"
    return [[v.strip() for v in line.split(",")] for line in done.stdout.strip().splitlines()]


def card_settings(timeout: float = 10.0) -> list[list[str]] | str:
    """What the check must not change (MIG mode, compute mode, persistence, power limit, application clocks)."""
    return nvidia_smi(SETTINGS_QUERY, timeout)


def show(title: str, argv: list[str]) -> None:
    print(f"== {title}", flush=True)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        print((done.stdout + done.stderr).rstrip() or "(nothing)", flush=True)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"({exc})", flush=True)


def deviceallow() -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(REPO / "packaging" / "deviceallow.py")], capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    print("== the unit's DeviceAllow= resolved against this machine (packaging/deviceallow.py)")
    print(done.stdout + done.stderr, end="", flush=True)
    return {"rc": done.returncode, "denied": [line.strip() for line in done.stdout.splitlines() if "DENIED" in line]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--wheels", type=Path, default=REPO / ".whl")
    ap.add_argument("--site", type=Path, required=True)
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"wheels": install_wheels(args.wheels, args.site)}
    print(f"wheels: {json.dumps(result['wheels'], indent=1)}", flush=True)
    sys.path.insert(0, str(args.site))
    importlib.invalidate_caches()
    result["python"] = sys.version.split()[0]
    result["packages"] = {name: installed(name) for name in SHOWN}  # the carried ones first, as steps see them
    print(f"python {result['python']} {sys.executable}; packages: {json.dumps(result['packages'])}", flush=True)
    result["gpus"] = nvidia_smi(GPU_QUERY)
    show("/proc/devices (NVIDIA entries)", ["grep", "-i", "nvidia", "/proc/devices"])
    show("/dev/nvidia*", ["sh", "-c", "ls -l /dev/nvidia* /proc/driver/nvidia-caps/ 2>&1"])
    result["deviceallow"] = deviceallow()
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result["wheels"]["error"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
