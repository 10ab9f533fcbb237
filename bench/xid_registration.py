"""Evidence for XID event registration on a real card (run by bench/device_check.sh; reads only).

For every card: the event types NVML says it supports, which of them a registration accepts one at a time, whether
the daemon's mask (XID, double- and single-bit ECC) registers and a wait on it answers, whether a second
registration in a new set is accepted (what the daemon does after a reset or a lost card), the recovery-action
field decoded by the driver's branch, and whether the parent card's process list answers. Event sets are created
and freed; no card setting is touched.

    python3 bench/xid_registration.py [--out DIR] [--wait-ms 200]

Prints one block per card and writes ``xid_registration.json`` to ``--out``. Exit 0 when every check ran (what the
card refuses is evidence, not a failure); 1 when NVML cannot be initialised.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from exporter.backends.nvml.events import EVENT_MASK
from exporter.backends.recovery import decode_recovery_action, driver_branch

EXCLUDED = {"nvmlEventTypeAll", "nvmlEventTypeNone"}


def event_bits() -> dict[int, str]:
    """Every single-bit nvmlEventType* constant this pynvml defines, by bit."""
    bits: dict[int, str] = {}
    for name in dir(pynvml):
        value = getattr(pynvml, name)
        single_bit = isinstance(value, int) and value > 0 and value & (value - 1) == 0
        if name.startswith("nvmlEventType") and name not in EXCLUDED and single_bit:
            bits[value] = name.removeprefix("nvmlEventType")
    return dict(sorted(bits.items()))


def names(mask: int) -> list[str]:
    return [name for bit, name in event_bits().items() if mask & bit]


def _error(err: BaseException) -> str:
    return type(err).__name__.removeprefix("NVMLError_")


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn(*args)
    return result, (time.perf_counter() - start) * 1e6


def register(handle: Any, mask: int, wait_ms: int | None = None) -> dict[str, Any]:
    """Register ``mask`` in a fresh set (and wait on it when ``wait_ms``); the set is freed after."""
    event_set = pynvml.nvmlEventSetCreate()
    out: dict[str, Any] = {"mask": hex(mask)}
    try:
        try:
            _, out["register_us"] = _timed(pynvml.nvmlDeviceRegisterEvents, handle, mask, event_set)
            out["registered"] = True
        except pynvml.NVMLError as err:
            out["registered"], out["error"] = False, _error(err)
            return out
        if wait_ms is not None:
            try:
                data, out["wait_us"] = _timed(pynvml.nvmlEventSetWait_v2, event_set, wait_ms)
                out["wait"] = f"event type {int(data.eventType):#x} data {int(data.eventData)}"
            except pynvml.NVMLError as err:
                out["wait"] = _error(err)  # Timeout on a quiet card
        return out
    finally:
        pynvml.nvmlEventSetFree(event_set)


def check_card(index: int, driver: str, wait_ms: int) -> dict[str, Any]:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    card: dict[str, Any] = {"index": index, "name": str(pynvml.nvmlDeviceGetName(h))}
    try:
        mig = pynvml.nvmlDeviceGetMigMode(h)
        card["mig_mode"] = "on" if mig[0] else "off"
    except pynvml.NVMLError as err:
        card["mig_mode"] = _error(err)
    try:
        supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(h))
    except pynvml.NVMLError as err:
        card["supported"] = _error(err)
        supported = 0
    else:
        card["supported"] = {"mask": hex(supported), "types": names(supported)}
    card["one_by_one"] = {name: register(h, bit) for bit, name in event_bits().items() if supported & bit}
    daemon_mask = EVENT_MASK & supported if supported else EVENT_MASK  # as the daemon: all three if unknown
    if daemon_mask:
        card["daemon_mask"] = {"types": names(daemon_mask), **register(h, daemon_mask, wait_ms)}
        card["registered_again"] = register(h, daemon_mask)  # a new set, as the daemon builds after a reset
    else:
        refused = {"mask": "0x0", "registered": False, "error": "supports none of XID/ECC events"}
        card["daemon_mask"], card["registered_again"] = {"types": [], **refused}, refused
    card["recovery_action"] = _recovery_action(h, driver)
    card["parent_processes"] = _parent_processes(h)
    return card


def _recovery_action(h: Any, driver: str) -> dict[str, Any]:
    try:
        fv = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
    except (pynvml.NVMLError, AttributeError) as err:
        return {"error": _error(err)}
    if fv.nvmlReturn != pynvml.NVML_SUCCESS:
        return {"error": f"NVML return {int(fv.nvmlReturn)}"}
    wide = int(fv.valueType) in (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG)
    raw = int(fv.value.ullVal if wide else fv.value.uiVal)
    decoded = decode_recovery_action(raw, driver)
    return {"raw": raw, "decoded": decoded.label if decoded is not None else "unknown on this branch"}


def _parent_processes(h: Any) -> dict[str, Any]:
    try:
        return {"count": len(pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h))}
    except pynvml.NVMLError as err:
        return {"error": _error(err)}


def collect(wait_ms: int = 200) -> dict[str, Any]:
    driver = str(pynvml.nvmlSystemGetDriverVersion())
    try:
        bindings = importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        bindings = "unknown"
    return {
        "driver_version": driver,
        "driver_branch": driver_branch(driver),
        "nvml_version": str(pynvml.nvmlSystemGetNVMLVersion()),
        "nvidia_ml_py": bindings,
        "cards": [check_card(i, driver, wait_ms) for i in range(int(pynvml.nvmlDeviceGetCount()))],
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"driver {result['driver_version']} (branch {result['driver_branch']}), NVML {result['nvml_version']}, "
        f"nvidia-ml-py {result['nvidia_ml_py']}"
    ]
    for card in result["cards"]:
        supported = card["supported"]
        shown = supported if isinstance(supported, str) else f"{supported['mask']} {' '.join(supported['types'])}"
        lines.append(f"GPU {card['index']} {card['name']} (MIG {card['mig_mode']}): supported {shown}")
        one = card["one_by_one"]
        accepted = [n for n, r in one.items() if r["registered"]]
        refused = [f"{n} ({r['error']})" for n, r in one.items() if not r["registered"]]
        lines.append(f"  accepted one by one: {' '.join(accepted) or '-'}; refused: {' '.join(refused) or '-'}")
        d = card["daemon_mask"]
        state = "registered" if d["registered"] else f"refused ({d.get('error')})"
        lines.append(f"  daemon mask {d['mask']} ({'|'.join(d['types'])}): {state}, wait: {d.get('wait', '-')}")
        again = card["registered_again"]
        lines.append(f"  registered again in a new set: {'ok' if again['registered'] else again.get('error')}")
        lines.append(f"  recovery action field: {card['recovery_action']}")
        lines.append(f"  parent process list: {card['parent_processes']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for xid_registration.json")
    parser.add_argument("--wait-ms", type=int, default=200, help="one wait on the daemon's mask (default 200)")
    args = parser.parse_args(argv)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        print(f"xid_registration: NVML cannot be initialised: {_error(err)}")
        return 1
    try:
        result = collect(args.wait_ms)
    finally:
        pynvml.nvmlShutdown()
    print(render(result))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "xid_registration.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
