"""Simulated nodes of any size, built from the h200x8 scenario: N cards, P processes per card.

Card ``i`` copies card ``i % 8`` of h200x8 (so every 8-card block has the same MIG layout: cards 6 and 7 MIG-enabled,
card 7 with two GPU instances) and gets its own UUID, PCI bus id (one PCI domain per 8-card block) and serial. The
template's own processes are replaced by ``processes_per_gpu`` on every card, each with a unique PID; on a card with
MIG instances they run in GPU instance 1, as the template's do.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
import uuid
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from exporter.backends.scenario import Scenario, parse_scenario

TEMPLATE = "h200x8"
FIRST_PID = 200_000
PROCESS_MEMORY_MIB = 512  # 100 processes fit a 141 GB card
PROCESS_NAMES = ("python3", "vllm", "tritonserver", "torchrun")


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


def to_toml(data: Mapping[str, Any]) -> str:
    """TOML for the shapes a scenario has: tables of scalars and arrays of such tables."""
    out: list[str] = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.append(f"[{key}]")
            out += [f"{k} = {_toml_value(v)}" for k, v in value.items()]
            out.append("")
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for table in value:
                out.append(f"[[{key}]]")
                out += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
                out.append("")
        elif isinstance(value, list) and not value:
            continue  # an empty array of tables is the same as none
        else:
            raise ValueError(f"{key}: top-level values must be tables or arrays of tables")
    return "\n".join(out)


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
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise ValueError(f"cannot write {type(value).__name__} as TOML")
