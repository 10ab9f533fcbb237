#!/usr/bin/env python3
"""Resolve a unit's DeviceAllow= list the way systemd does, and say which GPU device nodes it lets through.

systemd.resource-control(5): with DevicePolicy=closed only the listed devices (and the pseudo devices /dev/null,
/dev/zero, ... it always adds) can be opened. ``char-NAME`` allows every minor of each character major whose name
in /proc/devices matches NAME (a shell glob, matched with fnmatch(3) without flags); a /dev path allows that one
device number, read when the unit starts. Both are resolved once, when systemd sets the unit's cgroup up.

    python3 packaging/deviceallow.py [--unit FILE] [--proc-devices FILE] [--dev DIR]

prints each rule with what it resolved to, then every NVIDIA node under DIR (default /dev) as allowed or DENIED,
and exits 1 when one is denied. Nodes the daemon never opens (IMEX channels, see NOT_NEEDED) are listed as such and
never count as denied. Standard library only: it also runs on a bare GPU node.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

UNIT = Path(__file__).resolve().parent / "systemd" / "xpu-healthd.service"
# /proc/devices names of drivers whose nodes the daemon has no use for, and why. "nvidia-caps-imex-channels" (driver
# 550 and later, nv-caps-imex.c) numbers /dev/nvidia-caps-imex-channels/channelN, the IMEX channels of multi-node
# NVLink jobs: containers get them from the runtime, the daemon never opens one, so the unit leaves them out.
NOT_NEEDED = {"nvidia-caps-imex-channels": "not needed (IMEX channel; the daemon never opens one)"}


@dataclass(frozen=True)
class Rule:
    spec: str  # "char-nvidia", "/dev/kmsg"
    access: str  # any of "rwm"


@dataclass(frozen=True)
class Node:
    path: str
    kind: str  # "c" or "b"
    major: int
    minor: int


def device_rules(unit_text: str) -> list[Rule]:
    """DeviceAllow= entries of a unit file, in order (comments and other keys ignored)."""
    rules = []
    for line in unit_text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or line.lstrip().startswith(("#", ";")) or key.strip() != "DeviceAllow":
            continue
        spec, _, access = value.strip().partition(" ")
        rules.append(Rule(spec, access.strip() or "rwm"))
    return rules


def proc_devices(text: str) -> dict[str, list[tuple[int, str]]]:
    """(major, name) pairs of /proc/devices per section, "c" and "b", parsed as systemd's own reader does."""
    sections: dict[str, list[tuple[int, str]]] = {"c": [], "b": []}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line == "Character devices:":
            current = "c"
            continue
        if line == "Block devices:":
            current = "b"
            continue
        if not line:
            current = None
            continue
        number, _, name = line.partition(" ")
        if current is None or not number.isdecimal() or int(number) <= 0 or not name.strip():
            continue
        sections[current].append((int(number), name.strip()))
    return sections


def resolve(rule: Rule, devices: Mapping[str, list[tuple[int, str]]], dev_numbers: Mapping[str, Node]) -> list[Node]:
    """What one rule allows: whole majors (minor -1) for char-/block-NAME, the node itself for a /dev path."""
    for prefix, kind in (("char-", "c"), ("block-", "b")):
        if rule.spec.startswith(prefix):
            pattern = rule.spec[len(prefix) :]
            majors = sorted({major for major, name in devices[kind] if fnmatch.fnmatchcase(name, pattern)})
            return [Node(rule.spec, kind, major, -1) for major in majors]
    node = dev_numbers.get(rule.spec)
    return [node] if node is not None else []


def allows(rules: Iterable[Rule], devices: Mapping[str, list[tuple[int, str]]], node: Node, access: str) -> bool:
    """Would a unit with these DeviceAllow= rules (and DevicePolicy=closed) let ``node`` be opened for ``access``?"""
    for rule in rules:
        if not set(access) <= set(rule.access):
            continue
        for allowed in resolve(rule, devices, {node.path: node}):
            if (allowed.kind, allowed.major) == (node.kind, node.major) and allowed.minor in (-1, node.minor):
                return True
    return False


def nvidia_nodes(dev: Path) -> list[Node]:
    """Character device nodes named nvidia* under ``dev`` (one directory level down, for nvidia-caps/)."""
    nodes = []
    for path in sorted([*dev.glob("nvidia*"), *dev.glob("nvidia*/*")]):
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            nodes.append(Node(str(path), "c", os.major(st.st_rdev), os.minor(st.st_rdev)))
    return nodes


def report(unit_text: str, devices_text: str, dev: Path) -> tuple[list[str], bool]:
    rules = device_rules(unit_text)
    devices = proc_devices(devices_text)
    lines = ["DeviceAllow= resolved against /proc/devices:"]
    for rule in rules:
        if rule.spec.startswith("/"):
            try:
                rdev = os.stat(rule.spec).st_rdev
                what = f"{os.major(rdev)}:{os.minor(rdev)}"
            except OSError as exc:
                what = f"not present ({exc.strerror})"
        else:
            majors = [str(n.major) for n in resolve(rule, devices, {})]
            what = f"major {', '.join(majors)}" if majors else "nothing (no such name in /proc/devices)"
        lines.append(f"  {rule.spec} {rule.access}: {what}")
    nodes = nvidia_nodes(dev)
    lines.append(f"NVIDIA device nodes under {dev}:")
    denied = False
    not_needed = {major: NOT_NEEDED[name] for major, name in devices["c"] if name in NOT_NEEDED}
    for node in nodes:
        if (why := not_needed.get(node.major)) is not None:
            lines.append(f"  {node.path} {node.major}:{node.minor}: {why}")
            continue
        ok = allows(rules, devices, node, "rw") or allows(rules, devices, node, "r")
        denied |= not ok
        mode = "rw" if allows(rules, devices, node, "rw") else "r" if ok else "DENIED"
        lines.append(f"  {node.path} {node.major}:{node.minor}: {mode}")
    if not nodes:
        lines.append("  none")
    return lines, denied


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--unit", type=Path, default=UNIT)
    ap.add_argument("--proc-devices", type=Path, default=Path("/proc/devices"))
    ap.add_argument("--dev", type=Path, default=Path("/dev"))
    args = ap.parse_args(argv)
    lines, denied = report(args.unit.read_text(), args.proc_devices.read_text(), args.dev)
    print("\n".join(lines))
    return 1 if denied else 0


if __name__ == "__main__":
    sys.exit(main())
