"""The steps of the device check (bench/device_check.py), in order of value, each with its time limit.

Every step is one process started by the orchestrator and killed at its limit. The limits of a run add up to at
most its budget: 360 s for the full check, 180 s for ``--quick``. ``--rehearse`` runs the same steps with the same
limits on the simulated node: a step that needs a GPU runs its stand-in (the simulated daemon, pynvml answering
from the H200 capture through bench/with_capture_nvml.py, the fake MPS control binary, a matmul that only sleeps).

``XPU_CHECK_LIMITS="daemon=20,tdm=30"`` overrides limits (seconds) for one run: to give a slow step more time on a
second try, or to force a step over its limit in the rehearsal test. ``XPU_CHECK_FAIL="xid"`` makes the named steps
fail at once instead of running (the rehearsal test's failing step: the summary must still be written).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FULL_BUDGET_S = 360.0
QUICK_BUDGET_S = 180.0
RESERVE_S = 5.0  # kept back from the steps for the card-settings check after the last step and the final pack
FAKE_MPS_CONTROL = REPO / "tests" / "fakes" / "nvidia-cuda-mps-control"
CONTRACT_TESTS = "tests/exporter/backends/test_backend_contract.py"


@dataclass(frozen=True, slots=True)
class Context:
    """What a step's command line depends on."""

    rehearse: bool
    quick: bool
    out: Path  # the step's own folder: its log, its JSON, its temporary files
    wheels: Path  # the carried wheels (bench/device_wheels.sh)
    site: Path  # where the carried wheels are installed (on PYTHONPATH for every later step)

    def pick(self, full: float, quick: float) -> str:
        return f"{quick if self.quick else full:g}"


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    title: str
    limit_s: float
    quick_limit_s: float
    command: Callable[[Context], list[str]]
    env: Callable[[Context], Mapping[str, str]] = lambda ctx: {}
    result: str = "result.json"  # the JSON file the step leaves in its folder

    def limit(self, quick: bool) -> float:
        return self.quick_limit_s if quick else self.limit_s


def py(*args: str) -> list[str]:
    return [sys.executable, *args]


def nvml_script(ctx: Context, script: str, *args: str) -> list[str]:
    """A script that talks to pynvml: on the card itself, or over the H200 capture when rehearsing."""
    if ctx.rehearse:
        return py("-m", "bench.with_capture_nvml", script, *args)
    return py(script, *args)


def _setup(ctx: Context) -> list[str]:
    return py("bench/check_setup.py", "--out", str(ctx.out), "--wheels", str(ctx.wheels), "--site", str(ctx.site))


def _contract(ctx: Context) -> list[str]:
    return py("-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=60", CONTRACT_TESTS)


def _contract_env(ctx: Context) -> Mapping[str, str]:
    return {} if ctx.rehearse else {"XPU_TEST_REAL_NVML": "1"}


def _daemon(ctx: Context) -> list[str]:
    return py("-m", "bench.check_daemon", "--out", str(ctx.out), "--seconds", ctx.pick(60, 20), *_sim(ctx))


def _gpm(ctx: Context) -> list[str]:
    return nvml_script(ctx, "bench/gpm_check.py", "--interval", ctx.pick(1.0, 0.5), "--out", str(ctx.out))


def _xid(ctx: Context) -> list[str]:
    return nvml_script(ctx, "bench/xid_registration.py", "--out", str(ctx.out))


def _mps(ctx: Context) -> list[str]:
    argv = py("-m", "bench.mps_timing", "--runs", ctx.pick(3, 2), "--out", str(ctx.out))
    return [*argv, "--binary", str(FAKE_MPS_CONTROL), "--gpu-uuid", "GPU-rehearsal"] if ctx.rehearse else argv


def _tdm(ctx: Context) -> list[str]:
    argv = py("bench/tdm_sharing.py", "--seconds", ctx.pick(2, 1), "--out", str(ctx.out))
    return argv + (["--quick"] if ctx.quick else []) + (["--simulate"] if ctx.rehearse else [])


def _overhead(ctx: Context) -> list[str]:
    return nvml_script(
        ctx, "bench/nvml_overhead.py", "--reps", ctx.pick(100, 30), "--json", str(ctx.out / "result.json")
    )


def _throughput(ctx: Context) -> list[str]:
    return py("-m", "bench.check_throughput", "--out", str(ctx.out), "--seconds", ctx.pick(3, 1.5), *_sim(ctx))


def _peers(ctx: Context) -> list[str]:
    return py("-m", "bench.check_peers", "--out", str(ctx.out), "--window", ctx.pick(6, 3), *_sim(ctx))


def _sim(ctx: Context) -> list[str]:
    return ["--rehearse"] if ctx.rehearse else []


# name, title, full limit, quick limit: the full limits add up to 355 s, the quick ones to 175 s (RESERVE_S apart)
STEPS: tuple[Step, ...] = (
    Step("setup", "carried wheels, machine, device nodes, the unit's DeviceAllow=", 15, 10, _setup),
    Step("contract", "the backend contract suite on real NVML", 35, 20, _contract, _contract_env),
    Step("daemon", "xpu-healthd on real NVML: metrics, health, faults, a partition", 90, 40, _daemon),
    Step("gpm", "GPM support and one interval per card (bench/gpm_check.py)", 15, 10, _gpm, result="gpm.json"),
    Step("xid", "XID event registration", 15, 10, _xid, result="xid_registration.json"),
    Step("mps", "MPS control daemon start, query, quit", 15, 8, _mps, result="mps_timing.json"),
    Step(
        "tdm",
        "TDM experiment: isolated and shared policies, a uid-1000 client",
        100,
        42,
        _tdm,
        result="tdm_sharing.json",
    ),
    Step("overhead", "NVML overhead: backend and sampler vs raw calls", 20, 10, _overhead),
    Step("throughput", "bf16 matmul with and without the daemon", 30, 15, _throughput),
    Step("peers", "xpu-healthd, nvitop-exporter and nvidia-smi on the same card", 20, 10, _peers),
)


def limit_overrides(text: str | None = None) -> dict[str, float]:
    """``XPU_CHECK_LIMITS`` as {step: seconds}; a clear ValueError for a bad entry."""
    text = os.environ.get("XPU_CHECK_LIMITS", "") if text is None else text
    names = {s.name for s in STEPS}
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise ValueError(f"XPU_CHECK_LIMITS: {item!r} is not STEP=SECONDS with STEP one of {', '.join(names)}")
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"XPU_CHECK_LIMITS: {item!r}: {value!r} is not a number of seconds") from None
        if not seconds > 0:
            raise ValueError(f"XPU_CHECK_LIMITS: {item!r}: the limit must be above 0")
        out[name] = seconds
    return out


def forced_failures(text: str | None = None) -> set[str]:
    """``XPU_CHECK_FAIL`` as a set of step names; a clear ValueError for an unknown one."""
    text = os.environ.get("XPU_CHECK_FAIL", "") if text is None else text
    names = {s.strip() for s in text.split(",") if s.strip()}
    unknown = names - {s.name for s in STEPS}
    if unknown:
        raise ValueError(f"XPU_CHECK_FAIL: no such step: {', '.join(sorted(unknown))}")
    return names


def failing_command(name: str) -> list[str]:
    return py("-c", f"raise SystemExit('{name}: this step fails on purpose (XPU_CHECK_FAIL)')")


def budget(quick: bool) -> float:
    return QUICK_BUDGET_S if quick else FULL_BUDGET_S


__all__ = ["STEPS", "Context", "Step", "budget", "failing_command", "forced_failures", "limit_overrides"]
