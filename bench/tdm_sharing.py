"""The TDM sharing experiment: does each policy hold partitions to their quotas, side by side, on a real card?

Everything goes through the daemon's own API: a private xpu-healthd on the real backend (state, sockets, MPS pipe
directories and CDI in a temporary directory), `xpuctl partitions mode/create/exec/delete`. For each sharing policy
(isolated: an MPS control daemon per partition; shared: one per card) on one card:

- a 30 % / 2 GiB partition A and a 70 % / 8 GiB partition B;
- bf16 matmul in A alone, in B alone (A idle beside it), and in both at once: TFLOP/s of each, their sum against the
  card alone (no MPS), and each partition's share of the pair against its quota, in points;
- a client in A that sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100: held to its quota, or not;
- a 4 GiB allocation in A's 2 GiB cap, right after A's matmul in the same client: it must fail;
- (isolated pass) a client running as uid 1000 through the daemon's own MPS directories, and what nvidia-smi shows
  meanwhile (an MPS client is "M+C").

The daemon runs as the packaged unit runs it: umask 0027, its runtime directory made 0755 as systemd's
RuntimeDirectoryMode=0755 makes it, and every MPS directory below made by the daemon itself, so the uid-1000 client
meets the modes a container's user would. The directory modes are recorded. ``--quick`` keeps the runs that decide
the question (both partitions together, the cap, the uid-1000 client) and drops the card-alone, one-alone and
tamper runs.

It changes no card setting (no compute mode, MIG mode, clocks or power): it records them before and after and says
if they differ. About 80 s with --seconds 2 (bench/device_check.py's setting). One table at the end, JSON in --out.

    python3 bench/tdm_sharing.py [--gpu 0] [--seconds 8] [--quick] [--out DIR]
    python3 bench/tdm_sharing.py --simulate      # dry run on the simulated node: the same path, no numbers
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402

CLIENT_FILES = ("tdm_client.py", "gpu_throughput.py")  # copied where a uid-1000 client can read them
QUOTAS = {"A": (30, "2GiB"), "B": (70, "8GiB")}
POLICIES = ("isolated", "shared")
UNIT_UMASK = 0o027  # packaging/systemd/xpu-healthd.service UMask=
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class PolicyResult:
    policy: str
    alone: dict[str, float | None] = field(default_factory=dict)  # partition -> TFLOP/s
    together: dict[str, float | None] = field(default_factory=dict)
    tamper_tflops: float | None = None  # A with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100
    cap_allocation: bool | None = None  # did 4 GiB fit in A's 2 GiB cap (it must not)
    env_ok: bool = True  # every client saw its partition's pipe directory and quota
    notes: list[str] = field(default_factory=list)
    uid1000: dict[str, Any] = field(default_factory=dict)


@dataclass
class Experiment:
    gpu: int
    simulated: bool
    seconds: float
    quick: bool = False
    client: str = ""  # the client script, where every uid can read it
    runtime_dir: str = ""
    card_alone: float | None = None
    settings_before: dict[str, str] = field(default_factory=dict)
    settings_after: dict[str, str] = field(default_factory=dict)
    policies: list[PolicyResult] = field(default_factory=list)


def card_settings(gpu: int) -> dict[str, str]:
    """What this experiment must not change, read through NVML (read-only)."""
    import pynvml  # type: ignore[import-not-found]

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        out: dict[str, str] = {}
        reads = {
            "compute_mode": lambda: pynvml.nvmlDeviceGetComputeMode(h),
            "mig_mode": lambda: pynvml.nvmlDeviceGetMigMode(h),
            "persistence_mode": lambda: pynvml.nvmlDeviceGetPersistenceMode(h),
            "power_limit_mw": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h),
            "applications_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetApplicationsClock(h, pynvml.NVML_CLOCK_SM),
            "applications_mem_clock_mhz": lambda: pynvml.nvmlDeviceGetApplicationsClock(h, pynvml.NVML_CLOCK_MEM),
        }
        for key, read in reads.items():
            try:
                out[key] = str(read())
            except pynvml.NVMLError as exc:
                out[key] = f"error: {exc}"
        return out
    finally:
        pynvml.nvmlShutdown()


@contextlib.contextmanager
def private_daemon(tmp: Path, simulated: bool) -> Iterator[list[str]]:
    """xpu-healthd with everything under ``tmp`` (which stands for /run: every user can cross it) and the unit's
    umask; its runtime dir ``tmp/run`` is 0755 as the unit's; yields the xpuctl command prefix."""
    sock, admin = tmp / "healthd.sock", tmp / "admin.sock"
    config = tmp / "healthd.toml"
    (tmp / "run").mkdir(mode=0o755, exist_ok=True)
    os.chmod(tmp / "run", 0o755)
    config.write_text(
        f'[daemon]\nadmin_socket = "{admin}"\n[host]\ncdi_dir = "{tmp / "cdi"}"\n'
        "[partitions]\n"
        f'runtime_dir = "{tmp / "run"}"\n'
        'cdi_driver_libraries = "off"\nreconcile_interval_seconds = 5.0\n'
        "[topology]\nenabled = false\n"
    )
    args = [sys.executable, "-m", "healthd", "--config", str(config), "--grpc-listen", f"unix:{sock}",
            "--metrics-listen", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp / "state")]  # fmt: skip
    if simulated:
        args += ["--simulate", "h200x1"]
    log = (tmp / "daemon.log").open("ab")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # carried wheels too
    env = {**os.environ, "XPU_MPS_LAUNCH": "direct", "PYTHONPATH": path}
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, umask=UNIT_UMASK)
    try:
        deadline = time.monotonic() + 60
        while not admin.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not start:\n{(tmp / 'daemon.log').read_text()[-3000:]}")
            time.sleep(0.2)
        yield [sys.executable, "-m", "healthd.cli", "--socket", f"unix:{sock}", "--timeout", "60",
               "partitions", "--admin-socket", f"unix:{admin}"]  # fmt: skip
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def xpuctl(prefix: Sequence[str], *args: str) -> str:
    done = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"xpuctl {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def client(
    prefix: Sequence[str],
    exp: Experiment,
    pid: str,
    what: list[str],
    *,
    wrap: Sequence[str] = (),
    python: str = sys.executable,
) -> dict[str, Any]:
    """One tdm_client.py run inside partition ``pid`` (its last stdout line is JSON)."""
    out = xpuctl(prefix, "exec", pid, "--", *wrap, python, exp.client, *what)
    return dict(json.loads(out.strip().splitlines()[-1]))


def run_policy(prefix: Sequence[str], exp: Experiment, policy: str) -> PolicyResult:
    result = PolicyResult(policy)
    gpu, dry = str(exp.gpu), ["--dry-run"] if exp.simulated else []
    matmul = ["matmul", "--seconds", str(exp.seconds), *dry]
    then_cap = [*matmul, "--then-alloc-gib", "4"]  # A's 2 GiB cap, tried once A's matmul is done
    xpuctl(prefix, "mode", gpu, "tdm", "--sharing", policy)
    ids: dict[str, str] = {}
    try:
        for name, (compute, memory) in QUOTAS.items():
            reply = xpuctl(prefix, "create", "--gpu", gpu, "--compute", str(compute), "--memory", memory,
                           "--owner-lease", f"tdm-sharing-{name}", "--ttl", "600", "--json")  # fmt: skip
            ids[name] = json.loads(reply)["id"]  # the created partition, one object
        if not exp.quick:
            for name, pid in ids.items():
                got = client(prefix, exp, pid, then_cap if name == "A" else matmul)
                result.alone[name] = got.get("tflops")
                check_env(result, name, got)
                if name == "A":
                    record_cap(result, got)
        with ThreadPoolExecutor(max_workers=2) as pool:
            what = {"A": then_cap if exp.quick else matmul, "B": matmul}
            runs = {name: pool.submit(client, prefix, exp, pid, what[name]) for name, pid in ids.items()}
            for name, run in runs.items():
                got = run.result()
                result.together[name] = got.get("tflops")
                if exp.quick:
                    check_env(result, name, got)
                    if name == "A":
                        record_cap(result, got)
        if not exp.quick:
            tamper = client(prefix, exp, ids["A"], matmul, wrap=["env", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"])
            result.tamper_tflops = tamper.get("tflops")
        if policy == "isolated":
            result.uid1000 = uid1000_client(prefix, ids["A"], exp)
    finally:
        for pid in ids.values():
            with contextlib.suppress(RuntimeError):
                xpuctl(prefix, "delete", pid)
        with contextlib.suppress(RuntimeError):
            xpuctl(prefix, "mode", gpu, "none")
    return result


def record_cap(result: PolicyResult, got: dict[str, Any]) -> None:
    result.cap_allocation = got.get("allocated")
    if got.get("error"):
        result.notes.append(f"4 GiB in A: {got['error']}")


def check_env(result: PolicyResult, name: str, got: dict[str, Any]) -> None:
    env = got.get("env", {})
    compute, _ = QUOTAS[name]
    if not env.get("CUDA_MPS_PIPE_DIRECTORY") or env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != str(compute):
        result.env_ok = False
        result.notes.append(f"{name} ran with {env}")


def uid1000_client(prefix: Sequence[str], pid: str, exp: Experiment) -> dict[str, Any]:
    """A client that is not root, through the partition: does it reach the MPS server, and what does nvidia-smi
    show while it runs (an MPS client is listed as type M+C)?"""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return {"skipped": "setpriv (util-linux) not found"}
    wrap = [setpriv, "--reuid=1000", "--regid=1000", "--clear-groups"]
    seconds = ["--seconds", str(max(exp.seconds, 3.0))] if not exp.simulated else ["--dry-run"]
    # the dry run needs only the standard library: the system's Python, which any uid can run (a Python under
    # root's home may not be), stands in for the GPU machine's
    python = SYSTEM_PYTHON if exp.simulated and os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable
    modes = dir_modes(Path(exp.runtime_dir))
    with ThreadPoolExecutor(max_workers=1) as pool:
        run = pool.submit(client, prefix, exp, pid, ["matmul", *seconds], wrap=wrap, python=python)
        smi = ""
        if not exp.simulated and shutil.which("nvidia-smi"):
            time.sleep(2)
            smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30, check=False).stdout
        try:
            got = run.result()
        except RuntimeError as exc:
            return {"error": str(exc)[:500], "nvidia_smi": smi[-2000:], "dir_modes": modes}
    return {"uid": got.get("uid"), "tflops": got.get("tflops"), "pipe": got.get("pipe"), "nvidia_smi": smi[-2000:],
            "dir_modes": modes}  # fmt: skip


def dir_modes(run: Path) -> dict[str, str]:
    """Mode and owner of each directory the daemon made under its runtime dir (what the client's uid crosses)."""
    out = {}
    for path in sorted([run, *(p for p in run.rglob("*") if p.is_dir())]):
        st = path.stat()
        out[str(path.relative_to(run.parent))] = f"{st.st_mode & 0o7777:04o} {st.st_uid}:{st.st_gid}"
    return out


def share_error(result: PolicyResult) -> dict[str, float] | None:
    a, b = result.together.get("A"), result.together.get("B")
    if a is None or b is None or a + b <= 0:
        return None
    return {name: 100 * value / (a + b) - QUOTAS[name][0] for name, value in (("A", a), ("B", b))}


def table(exp: Experiment) -> str:
    def f(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1f}"

    card = exp.card_alone
    head = (
        f"{'policy':9} {'A alone':>8} {'B alone':>8} {'A | B together':>15} {'sum % card':>10} "
        f"{'share err A/B (pts)':>19} {'A asks 100%':>11} {'4GiB in 2GiB':>12}"
    )
    lines = [
        f"TDM sharing on GPU {exp.gpu}: card alone {f(card)} TFLOP/s (bf16 matmul, {exp.seconds:g}s per run)",
        head,
    ]
    for r in exp.policies:
        a, b = r.together.get("A"), r.together.get("B")
        total = None if a is None or b is None or not card else 100 * (a + b) / card
        err = share_error(r)
        err_text = "n/a" if err is None else f"{err['A']:+.1f} / {err['B']:+.1f}"
        cap = "n/a" if r.cap_allocation is None else ("FITS (bad)" if r.cap_allocation else "refused")
        lines.append(
            f"{r.policy:9} {f(r.alone.get('A')):>8} {f(r.alone.get('B')):>8} {f(a) + ' | ' + f(b):>15} "
            f"{f(total):>10} {err_text:>19} {f(r.tamper_tflops):>11} {cap:>12}"
        )
    lines.append("TFLOP/s per partition; A = 30 % / 2 GiB, B = 70 % / 8 GiB; 'B alone' is B with A idle beside it.")
    if exp.simulated:
        lines.append("dry run on the simulated node: the path through the daemon is real, the numbers are not")
    changed = {k for k in exp.settings_before if exp.settings_before.get(k) != exp.settings_after.get(k)}
    lines.append(f"card settings changed: {sorted(changed) if changed else 'none'}")
    for r in exp.policies:
        if r.uid1000:
            u = r.uid1000
            smi = u.get("nvidia_smi", "")
            mps_client = "M+C" in smi if smi else None
            pipe = u.get("pipe") or {}
            lines.append(
                f"{r.policy}: client as uid 1000: "
                + (u.get("skipped") or u.get("error") or f"ran as uid {u.get('uid')}, {f(u.get('tflops'))} TFLOP/s")
                + (f"; pipe dir reachable: {pipe.get('reachable')}" if pipe else "")
                + ("" if mps_client is None else f"; nvidia-smi lists an MPS client (M+C): {mps_client}")
            )
            if u.get("dir_modes"):
                lines.append(f"{r.policy}: MPS dirs the daemon made: {u['dir_modes']}")
        lines += [f"{r.policy}: {note}" for note in r.notes]
        if not r.env_ok:
            lines.append(f"{r.policy}: a client did not get its partition's environment")
    return "\n".join(lines)


def client_copy(root: Path) -> str:
    """The client scripts in a 0755 folder of their own, so a uid-1000 client reads them wherever the repo lives."""
    folder = root / "client"
    folder.mkdir(mode=0o755, exist_ok=True)
    os.chmod(folder, 0o755)
    for name in CLIENT_FILES:
        shutil.copy(ROOT / "bench" / name, folder / name)
        os.chmod(folder / name, 0o644)
    return str(folder / "tdm_client.py")


def run(gpu: int, seconds: float, simulated: bool, out: Path | None, quick: bool = False) -> Experiment:
    exp = Experiment(gpu=gpu, simulated=simulated, seconds=seconds, quick=quick)
    # under $TMPDIR (the device check points it into the step's folder): every user can cross the folders above
    root = Path(tempfile.mkdtemp(prefix="tdm-"))
    try:
        os.chmod(root, 0o755)  # stands for /run: the daemon's runtime dir below it is where the unit's would be
        exp.client, exp.runtime_dir = client_copy(root), str(root / "run")
        if not simulated:
            exp.settings_before = card_settings(gpu)
        if not simulated and not quick:
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
            done = subprocess.run([sys.executable, exp.client, "matmul", "--seconds", str(seconds)],
                                  capture_output=True, text=True, timeout=300, check=False, env=env)  # fmt: skip
            if done.returncode == 0:
                exp.card_alone = json.loads(done.stdout.strip().splitlines()[-1]).get("tflops")
        with private_daemon(root, simulated) as prefix:
            for policy in POLICIES:
                exp.policies.append(run_policy(prefix, exp, policy))
                if out is not None:  # what is known so far survives a kill
                    out.mkdir(parents=True, exist_ok=True)
                    (out / "tdm_sharing.json").write_text(json.dumps(asdict(exp), indent=2) + "\n")
    finally:
        if out is not None and (root / "daemon.log").exists():
            shutil.copy(root / "daemon.log", out / "tdm-daemon.log")
        shutil.rmtree(root, ignore_errors=True)
    if not simulated:
        exp.settings_after = card_settings(gpu)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "tdm_sharing.json").write_text(json.dumps(asdict(exp), indent=2) + "\n")
    return exp


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=8.0, help="matmul time per run (default 8)")
    ap.add_argument("--simulate", action="store_true", help="dry run on the simulated node (no GPU, no numbers)")
    ap.add_argument("--quick", action="store_true", help="only the runs together, the cap and the uid-1000 client")
    ap.add_argument("--out", type=Path, help="directory for tdm_sharing.json")
    ns = ap.parse_args(argv)
    exp = run(ns.gpu, ns.seconds, ns.simulate, ns.out, ns.quick)
    print(table(exp))
    bad = [r for r in exp.policies if not r.env_ok or r.cap_allocation is True]
    changed = any(exp.settings_before.get(k) != exp.settings_after.get(k) for k in exp.settings_before)
    return 1 if bad or changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
