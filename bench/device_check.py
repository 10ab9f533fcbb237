"""The device check: every piece of real-GPU evidence in one run that cannot fail to report (bench/device_check.sh).

The steps (bench/check_plan.py) run in order of value, each as its own process with its own time limit, inside one
budget: 360 s, or 180 s with ``--quick``. A step that fails or is killed at its limit is recorded with the last
lines of its log, and the next step runs. After every step summary.txt, summary.json and results.tar.gz in $OUT are
rewritten (bench/check_pack.py), so a kill at any moment leaves a summary; on SIGTERM, SIGINT or SIGHUP the running
step is stopped, the summary is written and printed, and the check exits 143. The last lines printed restate the
summary. This module uses the standard library only, so it starts even where the daemon's packages are missing.

Reads only: it never changes MIG mode, clocks, power limit, compute mode or persistence mode, and never resets a
card; it records those settings before the first step and after the last and says whether they are unchanged.
TDM and partitions are the daemon's own state (MPS control daemons it starts and stops).

    python3 bench/device_check.py [--quick] [--rehearse] [--out DIR] [--wheels DIR] [--only STEP ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import check_pack, check_plan
from bench.check_runner import Outcome, run_step
from bench.check_setup import card_settings
from bench.device_report import figure_line, summary_json, summary_text

REPO = check_plan.REPO
MPS_CONTROL = "nvidia-cuda-mps-control"


class Console:
    """What the check prints goes to stdout and to $OUT/console.log; a closed stdout never stops the check."""

    def __init__(self, path: Path) -> None:
        self._file: TextIO = path.open("a", buffering=1)

    def say(self, text: str = "") -> None:
        for stream in (sys.stdout, self._file):
            try:
                stream.write(text + "\n")
                stream.flush()
            except (OSError, ValueError):
                pass


class Stop:
    """The first SIGTERM, SIGINT or SIGHUP: the reason the check stops early (read by the step runner)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.reason is None:
            self.reason = f"{signal.Signals(signum).name} received"

    def requested(self) -> str | None:
        return self.reason


def load_figures(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stop_mps_daemons(root: Path, rehearse: bool) -> list[str]:
    """MPS control daemons that a killed step left under its folder (they detach from its process group): quit."""
    binary = str(check_plan.FAKE_MPS_CONTROL) if rehearse else shutil.which(MPS_CONTROL)
    stopped = []
    for control in root.rglob("control"):
        if binary is None or not control.is_socket():
            continue
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(control.parent)}
        try:
            subprocess.run([binary], input="quit\n", env=env, capture_output=True, text=True, timeout=10, check=False)
            stopped.append(str(control.parent))
        except (OSError, subprocess.SubprocessError):
            continue
    return stopped


class Check:
    def __init__(self, args: argparse.Namespace, console: Console, stop: Stop) -> None:
        self.args, self.console, self.stop = args, console, stop
        self.out: Path = args.out
        self.t0 = time.monotonic()
        self.budget = check_plan.budget(args.quick)
        overrides = check_plan.limit_overrides()
        self.failing = check_plan.forced_failures()
        wanted = {"setup", *args.only} if args.only else None  # setup installs what the other steps import
        self.steps = [s for s in check_plan.STEPS if wanted is None or s.name in wanted]
        self.outcomes = [Outcome(s.name, s.title, overrides.get(s.name, s.limit(args.quick))) for s in self.steps]
        self.work = Path(tempfile.mkdtemp(prefix="xdc-"))  # short: MPS and gRPC socket paths live below it
        os.chmod(self.work, 0o755)  # the TDM step's uid-1000 client walks down to the daemon's runtime dir
        self.site = self.work / "site"
        self.state: dict[str, Any] = {
            "check": "xpu-runtime-kit device check",
            "rehearse": args.rehearse,
            "quick": args.quick,
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "budget_s": self.budget,
            "limits_total_s": sum(o.limit_s for o in self.outcomes),
            "elapsed_s": 0.0,
            "finished": False,
            "interrupted": None,
            "work_dir": str(self.work),
            "settings": {},
            "files": list(check_pack.OUR_FILES),
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def env(self, step: check_plan.Step, ctx: check_plan.Context) -> dict[str, str]:
        tmp = ctx.out / "tmp"  # every temporary file of the step lands in its folder: packed, and cleaned after
        tmp.mkdir(exist_ok=True)
        os.chmod(tmp, 0o755)
        path = os.pathsep.join(p for p in (str(self.site), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp), **step.env(ctx)}

    def write(self) -> None:
        self.state["elapsed_s"] = round(self.elapsed(), 2)
        self.state["interrupted"] = self.stop.reason
        text = summary_text(self.state, self.outcomes)
        try:
            summary = summary_json(self.state, self.outcomes)
            check_pack.pack(self.out, self.work, text, summary, skip=frozenset({self.site.name}))
        except OSError as exc:
            self.console.say(f"device_check: could not write the results in {self.out}: {exc}")

    def settings(self, when: str) -> None:
        if self.args.rehearse:
            self.state["settings"] = {"unchanged": "not checked (rehearsal: no GPU)"}
            return
        left = self.budget - self.elapsed() - 1  # the read after the last step must not outlast the budget
        found = card_settings(max(1.0, min(10.0, left))) if when == "before" or left > 1 else "no time left to read"
        self.state["settings"][when] = found
        if when == "after":
            before = self.state["settings"].get("before")
            self.state["settings"]["unchanged"] = isinstance(found, list) and found == before

    def run_one(self, index: int, step: check_plan.Step, outcome: Outcome) -> None:
        left = self.budget - check_plan.RESERVE_S - self.elapsed()
        if self.stop.reason is not None:
            outcome.reason = f"not run: {self.stop.reason}"
            return
        if left < 1:
            outcome.reason = "not run: no time left in the budget"
            return
        ctx = check_plan.Context(
            self.args.rehearse, self.args.quick, self.work / step.name, self.args.wheels, self.site
        )
        ctx.out.mkdir(mode=0o755, exist_ok=True)
        os.chmod(ctx.out, 0o755)
        limit = min(outcome.limit_s, left)
        self.console.say(f"== [{index}/{len(self.steps)}] {step.name}: {step.title} (limit {limit:.0f} s)")
        outcome.status = "running"
        self.write()
        argv = check_plan.failing_command(step.name) if step.name in self.failing else step.command(ctx)
        run_step(outcome, argv, cwd=REPO, env=self.env(step, ctx), log=ctx.out / "log.txt",
                 limit_s=limit, stop_requested=self.stop.requested)  # fmt: skip
        if limit < outcome.limit_s and outcome.status == "killed" and self.stop.reason is None:
            outcome.reason = f"killed when the budget ran out ({limit:.0f} s of its {outcome.limit_s:g} s)"
        outcome.figures = load_figures(ctx.out / step.result)
        left_over = stop_mps_daemons(ctx.out, self.args.rehearse) if outcome.status != "ok" else []
        if left_over:
            outcome.tail.append(f"(device_check: stopped MPS control daemons left in {', '.join(left_over)})")
        self.console.say(f"   {outcome.status} in {outcome.elapsed_s:.1f} s  {outcome.reason}".rstrip())
        for line in outcome.tail[-5:] if outcome.status != "ok" else [figure_line(outcome)]:
            self.console.say(f"   | {line}")

    def run(self) -> int:
        mode = "rehearsal on the simulated node" if self.args.rehearse else "device"
        self.console.say(f"device_check: {mode}, {'quick' if self.args.quick else 'full'}, budget {self.budget:g} s "
                         f"(step limits {self.state['limits_total_s']:g} s), results in {self.out}")  # fmt: skip
        self.settings("before")
        for index, (step, outcome) in enumerate(zip(self.steps, self.outcomes, strict=True), 1):
            self.run_one(index, step, outcome)
            self.write()
        if self.stop.reason is None:
            self.settings("after")
        self.state["finished"] = self.stop.reason is None
        self.write()
        if not os.environ.get("XPU_CHECK_KEEP_WORK"):  # everything in it is in results.tar.gz now
            shutil.rmtree(self.work, ignore_errors=True)
        self.console.say()
        self.console.say(summary_text(self.state, self.outcomes))
        if self.stop.reason is not None:
            return 143
        settings_ok = self.args.rehearse or self.state["settings"].get("unchanged") is True
        return 0 if settings_ok and all(o.status in ("ok", "skipped") for o in self.outcomes) else 1


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or REPO / ".device" / "out"))
    ap.add_argument("--quick", action="store_true", help=f"the {check_plan.QUICK_BUDGET_S:g} s budget")
    ap.add_argument("--rehearse", action="store_true", help="the same steps on the simulated node (no GPU)")
    ap.add_argument("--wheels", type=Path, default=REPO / ".whl", help="carried wheels (bench/device_wheels.sh)")
    ap.add_argument(
        "--only", action="append", choices=[s.name for s in check_plan.STEPS], help="run only these (and setup)"
    )
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        check_plan.limit_overrides()
        check_plan.forced_failures()
    except ValueError as exc:
        print(f"device_check: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in check_pack.OUR_FILES:  # an earlier run's results in the same folder
        for path in (args.out / name, args.out / f"{name}.tmp"):
            path.unlink(missing_ok=True)
    stop = Stop()
    check = Check(args, Console(args.out / check_pack.CONSOLE), stop)
    others = check_pack.problems(args.out)
    if others:
        check.console.say(f"device_check: {args.out} already holds files the device tool may not return: {others}")
    return check.run()


if __name__ == "__main__":
    raise SystemExit(main())
