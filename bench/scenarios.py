"""Simulated nodes of any size, built from the h200x8 scenario: N cards, P processes per card.

Card ``i`` copies card ``i % 8`` of h200x8 (so every 8-card block has the same MIG layout: cards 6 and 7 MIG-enabled,
card 7 with two GPU instances) and gets its own UUID, PCI bus id (one PCI domain per 8-card block) and serial. The
template's own processes are replaced by ``processes_per_gpu`` on every card, each with a unique PID; on a card with
MIG instances they run in GPU instance 1, as the template's do.

``busy_data`` makes a busy Kubernetes node instead: processes in pods, each pod's processes on one whole card or one
MIG instance, so cards are shared by several pods. At 8 GPUs it is the built-in ``h200x8-busy`` scenario
(``exporter/scenarios/h200x8-busy.toml``, written by ``python3 -m bench.scenarios``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from exporter.backends.scenario import Scenario, parse_scenario

TEMPLATE = "h200x8"
FIRST_PID = 200_000
PROCESS_MEMORY_MIB = 512  # 100 processes fit a 141 GB card
PROCESS_NAMES = ("python3", "vllm", "tritonserver", "torchrun")
BUSY_PROCESSES_PER_GPU = 50  # 8 GPUs: 400 processes
BUSY_PROCESSES_PER_POD = 4  # 8 GPUs: 100 pods
BUSY_FIRST_PID = 100_001
BUSY_NAMESPACES = ("ml-train", "inference", "research", "batch", "notebooks")
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
BUSY_SCENARIO_FILE = Path(__file__).resolve().parent.parent / "exporter" / "scenarios" / "h200x8-busy.toml"


def template_data(name: str = TEMPLATE) -> dict[str, Any]:
    text = resources.files("exporter.scenarios").joinpath(f"{name}.toml").read_text()
    return tomllib.loads(text)


def card_uuid(index: int) -> str:
    digest = hashlib.sha256(f"xpu-bench-gpu-{index}".encode()).digest()[:16]
    return f"GPU-{uuid.UUID(bytes=digest)}"


def scaled_data(gpus: int, processes_per_gpu: int = 0, *, dynamic: bool = True) -> dict[str, Any]:
    """The raw scenario table (as TOML would load it) of a node with ``gpus`` cards."""
    if gpus < 1:
        raise ValueError("gpus must be at least 1")
    if processes_per_gpu < 0:
        raise ValueError("processes_per_gpu must be >= 0")
    base = template_data()
    template_cards = base["gpus"]
    block = len(template_cards)
    cards = []
    instances = []
    for i in range(gpus):
        t = template_cards[i % block]
        bus = t["pci_bus_id"].split(":", 1)[1]  # keep the template's bus:device.function
        card: dict[str, Any] = {
            "uuid": card_uuid(i),
            "pci_bus_id": f"{i // block:08X}:{bus}",
            "serial": str(1654523100000 + i),
        }
        if t.get("mig_enabled"):
            card["mig_enabled"] = True
        cards.append(card)
        instances += [{**inst, "gpu": i} for inst in base.get("mig_instances", []) if inst["gpu"] == i % block]
    with_instances = {inst["gpu"] for inst in instances}
    processes = []
    pid = FIRST_PID
    for i in range(gpus):
        for k in range(processes_per_gpu):
            pid += 1
            proc: dict[str, Any] = {
                "gpu": i,
                "pid": pid,
                "name": PROCESS_NAMES[k % len(PROCESS_NAMES)],
                "memory_mib": PROCESS_MEMORY_MIB,
                "load": round(0.8 / max(1, processes_per_gpu), 4),
            }
            if i in with_instances:
                proc["gpu_instance_id"] = 1
            processes.append(proc)
    # the template's [topology] describes its own 8 cards; a scaled node has no layout (the daemon then reports none)
    data = {k: v for k, v in base.items() if k not in {"gpus", "processes", "mig_instances", "topology"}}
    data["node"] = {**base["node"], "name": f"bench-h200x{gpus}-p{processes_per_gpu}", "dynamic": dynamic}
    data["gpus"] = cards
    data["processes"] = processes
    data["mig_instances"] = instances
    return data


def scaled(gpus: int, processes_per_gpu: int = 0, *, dynamic: bool = True) -> Scenario:
    data = scaled_data(gpus, processes_per_gpu, dynamic=dynamic)
    return parse_scenario(data, source=data["node"]["name"])


def write_scenario(path: Path, gpus: int, processes_per_gpu: int = 0, *, dynamic: bool = True) -> Path:
    """Write the scenario as a TOML file for ``xpu-healthd --simulate PATH``."""
    path.write_text(to_toml(scaled_data(gpus, processes_per_gpu, dynamic=dynamic)))
    return path


def busy_data(gpus: int = 8, processes_per_gpu: int = BUSY_PROCESSES_PER_GPU) -> dict[str, Any]:
    """A busy Kubernetes node: ``gpus * processes_per_gpu`` processes in pods of 4 (one process per container).

    Pods go round-robin over the places a pod can run: every whole card and every MIG instance (a MIG-enabled card
    without instances runs nothing), all of a pod's processes on its place, so each card is shared by about 12 pods
    (time-slicing). At 8 GPUs the cards, MIG layout and topology are h200x8's own; above, ``scaled_data``'s.
    """
    if processes_per_gpu < 1:
        raise ValueError("processes_per_gpu must be >= 1")
    data = template_data() if gpus == 8 else scaled_data(gpus, 0)
    places: list[tuple[int, int | None]] = []
    instances_by_gpu: dict[int, list[int]] = {}
    for inst in data.get("mig_instances", []):  # GPU instance ids as the simulated driver hands them out: 1, 2, ...
        ids = instances_by_gpu.setdefault(inst["gpu"], [])
        ids.append(len(ids) + 1)
    for i, card in enumerate(data["gpus"]):
        if not card.get("mig_enabled"):
            places.append((i, None))
        places += [(i, gi) for gi in instances_by_gpu.get(i, [])]
    total = gpus * processes_per_gpu
    pods = -(-total // BUSY_PROCESSES_PER_POD)
    on_place = [0] * len(places)
    for pod in range(pods):
        on_place[pod % len(places)] += min(BUSY_PROCESSES_PER_POD, total - pod * BUSY_PROCESSES_PER_POD)
    processes = []
    for i in range(total):
        pod = i // BUSY_PROCESSES_PER_POD
        place = pod % len(places)
        gpu, gi = places[place]
        proc: dict[str, Any] = {
            "gpu": gpu,
            "pid": BUSY_FIRST_PID + i,
            "name": PROCESS_NAMES[pod % len(PROCESS_NAMES)],
            "memory_mib": 256 + 64 * (i % 8),  # 13 pods' worth fits a 2g.35gb instance
            "load": round(0.85 / on_place[place], 4),
            "namespace": BUSY_NAMESPACES[pod % len(BUSY_NAMESPACES)],
            "pod": f"job-{pod:03d}",
            "container": f"worker-{i % BUSY_PROCESSES_PER_POD}",
        }
        if gi is not None:
            proc["gpu_instance_id"] = gi
        processes.append(proc)
    name = "h200x8-busy" if gpus == 8 else f"bench-h200x{gpus}-busy"
    data["node"] = {**data["node"], "name": name, "dynamic": True}
    data["processes"] = processes
    return data


def write_busy_scenario(path: Path, gpus: int = 8, processes_per_gpu: int = BUSY_PROCESSES_PER_GPU) -> Path:
    path.write_text(busy_toml(gpus, processes_per_gpu))
    return path


BUSY_HEADER = """\
# A busy HGX H200 node: h200x8's cards, MIG layout and topology, with 400 GPU processes in 100 Kubernetes pods
# (4 containers of one process each). Pods go round-robin over the 6 whole cards and the 2 MIG instances of GPU 7,
# 12-13 pods on each (time-slicing). GPU 7 thus runs 96 processes, more than the 64 per-card process series kept
# by default (the rest are folded into process="other"); GPU 6 is MIG-enabled and empty. The simulated node serves
# their proc tree, kubelet log directory and pod-resources socket, as for h200x8.
# Generated by `python3 -m bench.scenarios --write-busy` (bench/scenarios.py): edit the generator, not this file.
"""


def busy_toml(gpus: int = 8, processes_per_gpu: int = BUSY_PROCESSES_PER_GPU) -> str:
    return (BUSY_HEADER if gpus == 8 else "") + to_toml(busy_data(gpus, processes_per_gpu), inline=("processes",))


def to_toml(data: Mapping[str, Any], *, inline: Sequence[str] = ()) -> str:
    """TOML for the shapes a scenario has: tables of scalars and arrays of such tables.

    Arrays of tables named in ``inline`` are written as one array of inline tables, one line per element (first,
    since a top-level key must come before any table header).
    """
    out: list[str] = []
    for key in inline:
        if data.get(key):
            out.append(f"{key} = [")
            out += [f"  {_toml_value(table)}," for table in data[key]]
            out += ["]", ""]
    for key, value in data.items():
        if key in inline:
            continue
        if isinstance(value, Mapping):
            out.append(f"[{key}]")
            out += [f"{k} = {_toml_value(v)}" for k, v in value.items() if not _table_array(v)]
            out.append("")
            for k, v in value.items():  # arrays of tables inside a table: [[key.k]] sections
                if _table_array(v):
                    for table in v:
                        out.append(f"[[{key}.{k}]]")
                        out += [f"{tk} = {_toml_value(tv)}" for tk, tv in table.items()]
                        out.append("")
        elif _table_array(value):
            for table in value:
                out.append(f"[[{key}]]")
                out += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
                out.append("")
        elif isinstance(value, list) and not value:
            continue  # an empty array of tables is the same as none
        else:
            raise ValueError(f"{key}: top-level values must be tables or arrays of tables")
    return "\n".join(out)


def _table_array(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _toml_key(key: str) -> str:
    return key if BARE_KEY.fullmatch(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string of printable text is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise ValueError(f"cannot write {type(value).__name__} as TOML")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.scenarios", description="write a generated scenario file")
    ap.add_argument("--write-busy", action="store_true", help=f"(re)write {BUSY_SCENARIO_FILE.name} in the package")
    ap.add_argument("--busy", type=int, metavar="GPUS", help="print a busy node of GPUS cards as TOML")
    ns = ap.parse_args(argv)
    if ns.write_busy:
        write_busy_scenario(BUSY_SCENARIO_FILE)
        print(f"wrote {BUSY_SCENARIO_FILE}", file=sys.stderr)
    elif ns.busy:
        sys.stdout.write(busy_toml(ns.busy))
    else:
        ap.print_usage(sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
