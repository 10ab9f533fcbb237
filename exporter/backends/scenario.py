"""Scenario files for the simulated backend: a TOML description of a node, validated on load."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from exporter.backends.types import MediaEngines, MigProfile
from exporter.textfile import NotATextFile, read_text_file

BUILTIN_SCENARIOS = ("h200x8", "h200x8-busy", "h200x1")


MAX_GPUS = 256  # a real node has up to 16 cards; the scale benches go to 64. Each card gets its own lane thread


class ScenarioError(ValueError):
    """A scenario file is missing, unreadable or invalid; the message names the key."""


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    gpu: int
    pid: int
    name: str
    memory_bytes: int
    load: float  # share of the card's SMs this process keeps busy, 0..1
    gpu_instance_id: int | None = None
    namespace: str = ""  # simulation of pod attribution: the pod the process runs in ("" = not in a pod)
    pod: str = ""
    container: str = ""


@dataclass(frozen=True, slots=True)
class MigInstanceSpec:
    gpu: int
    profile_id: int
    placement_start: int


@dataclass(frozen=True, slots=True)
class CardSpec:
    index: int
    uuid: str
    pci_bus_id: str
    serial: str
    mig_enabled: bool


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    dynamic: bool  # values move over time (dashboards look alive); False replays the capture as is
    driver_version: str
    nvml_version: str
    cuda_driver_version: int
    model: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    idle_power_watts: float
    power_limit_watts: float
    sm_clock_idle_mhz: int
    sm_clock_max_mhz: int
    memory_clock_mhz: int
    temperature_idle_celsius: float
    energy_joules_at_start: float
    pcie_generation: int
    pcie_width: int
    nvlink_count: int
    compute_capability: tuple[int, int]
    vbios_version: str
    cards: tuple[CardSpec, ...]
    mig_profiles: tuple[MigProfile, ...]
    processes: tuple[ProcessSpec, ...] = ()
    mig_instances: tuple[MigInstanceSpec, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # sections other components read (e.g. topology)


def load_scenario(name_or_path: str) -> Scenario:
    """Load a built-in scenario by name (``h200x8``) or a scenario TOML file by path."""
    if name_or_path in BUILTIN_SCENARIOS:
        text = resources.files("exporter.scenarios").joinpath(f"{name_or_path}.toml").read_text()
        source = f"built-in scenario {name_or_path!r}"
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ScenarioError(
                f"scenario {name_or_path!r}: no such built-in scenario ({', '.join(BUILTIN_SCENARIOS)}) or file"
            )
        try:
            text = read_text_file(path)
        except NotATextFile as exc:
            raise ScenarioError(f"{path}: {exc}") from None
        source = str(path)
    try:
        data = tomllib.loads(text)
        _check_finite(data, source)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from exc
    except RecursionError:
        raise ScenarioError(f"{source}: not valid TOML: nested too deeply") from None
    return parse_scenario(data, source=source)


MEDIA_KEYS = ("decoders", "encoders", "jpeg_decoders", "optical_flow", "copy_engines")


def _media(raw: dict[str, Any], where: str) -> MediaEngines | None:
    """A profile's media engines: all five keys, or none of them (then unknown)."""
    given = [k for k in MEDIA_KEYS if k in raw]
    if not given:
        return None
    if len(given) != len(MEDIA_KEYS):
        missing = ", ".join(k for k in MEDIA_KEYS if k not in raw)
        raise ScenarioError(f"{where}: media engine counts go together; missing {missing}")
    return MediaEngines(*(_get(raw, k, int, where) for k in MEDIA_KEYS))


def _check_finite(value: object, where: str) -> None:
    """TOML has nan and inf; no reading of a card is either, and the simulated node would fail on one later."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ScenarioError(f"{where}: {value} is not a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]")


def _get(table: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in table:
        raise ScenarioError(f"{where}: missing key {key!r}")
    value = table[key]
    if isinstance(value, bool) and kind is not bool and not (isinstance(kind, tuple) and bool in kind):
        raise ScenarioError(f"{where}.{key}: expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise ScenarioError(f"{where}.{key}: expected {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def parse_scenario(data: dict[str, Any], *, source: str = "scenario") -> Scenario:
    node = _get(data, "node", dict, source)
    card = _get(data, "card", dict, source)
    cards_raw = _get(data, "gpus", list, source)
    if not cards_raw:
        raise ScenarioError(f"{source}.gpus: at least one GPU is needed")
    if len(cards_raw) > MAX_GPUS:
        raise ScenarioError(f"{source}.gpus: {len(cards_raw)} GPUs; a scenario has at most {MAX_GPUS}")
    cards = []
    for i, raw in enumerate(cards_raw):
        where = f"{source}.gpus[{i}]"
        if not isinstance(raw, dict):
            raise ScenarioError(f"{where}: expected a table")
        uuid = _get(raw, "uuid", str, where)
        if not uuid.startswith("GPU-"):
            raise ScenarioError(f"{where}.uuid: must start with 'GPU-'")
        cards.append(
            CardSpec(
                index=i,
                uuid=uuid,
                pci_bus_id=_get(raw, "pci_bus_id", str, where).upper(),
                serial=str(raw.get("serial", "")),
                mig_enabled=bool(raw.get("mig_enabled", False)),
            )
        )
    if len({c.uuid for c in cards}) != len(cards):
        raise ScenarioError(f"{source}.gpus: UUIDs must be unique")

    profiles = []
    for i, raw in enumerate(data.get("mig_profiles", [])):
        where = f"{source}.mig_profiles[{i}]"
        placements = tuple((int(p[0]), int(p[1])) for p in _get(raw, "placements", list, where))
        profiles.append(
            MigProfile(
                profile_id=_get(raw, "id", int, where),
                name=_get(raw, "name", str, where),
                slice_count=_get(raw, "slices", int, where),
                memory_mib=_get(raw, "memory_mib", int, where),
                sm_count=_get(raw, "sms", int, where),
                instance_count=_get(raw, "instances", int, where),
                placements=placements,
                media=_media(raw, where),
            )
        )

    processes = []
    for i, raw in enumerate(data.get("processes", [])):
        where = f"{source}.processes[{i}]"
        gpu = _get(raw, "gpu", int, where)
        if not 0 <= gpu < len(cards):
            raise ScenarioError(f"{where}.gpu: no GPU {gpu} in this scenario")
        load = float(_get(raw, "load", (int, float), where))
        if not 0.0 <= load <= 1.0:
            raise ScenarioError(f"{where}.load: must be within 0..1")
        gi = raw.get("gpu_instance_id")
        processes.append(
            ProcessSpec(
                gpu=gpu,
                pid=_get(raw, "pid", int, where),
                name=_get(raw, "name", str, where),
                memory_bytes=int(_get(raw, "memory_mib", int, where)) * 2**20,
                load=load,
                gpu_instance_id=int(gi) if gi is not None else None,
                namespace=str(raw.get("namespace", "default" if raw.get("pod") else "")),
                pod=str(raw.get("pod", "")),
                container=str(raw.get("container", "")),
            )
        )

    instances = [
        MigInstanceSpec(
            gpu=_get(raw, "gpu", int, f"{source}.mig_instances[{i}]"),
            profile_id=_get(raw, "profile_id", int, f"{source}.mig_instances[{i}]"),
            placement_start=_get(raw, "placement_start", int, f"{source}.mig_instances[{i}]"),
        )
        for i, raw in enumerate(data.get("mig_instances", []))
    ]

    where = f"{source}.card"
    cc = _get(card, "compute_capability", list, where)
    known = {"node", "card", "gpus", "mig_profiles", "processes", "mig_instances"}
    return Scenario(
        name=_get(node, "name", str, f"{source}.node"),
        dynamic=bool(node.get("dynamic", True)),
        driver_version=_get(node, "driver_version", str, f"{source}.node"),
        nvml_version=_get(node, "nvml_version", str, f"{source}.node"),
        cuda_driver_version=_get(node, "cuda_driver_version", int, f"{source}.node"),
        model=_get(card, "model", str, where),
        memory_total_bytes=_get(card, "memory_total_bytes", int, where),
        memory_reserved_bytes=_get(card, "memory_reserved_bytes", int, where),
        idle_power_watts=float(_get(card, "idle_power_watts", (int, float), where)),
        power_limit_watts=float(_get(card, "power_limit_watts", (int, float), where)),
        sm_clock_idle_mhz=_get(card, "sm_clock_idle_mhz", int, where),
        sm_clock_max_mhz=_get(card, "sm_clock_max_mhz", int, where),
        memory_clock_mhz=_get(card, "memory_clock_mhz", int, where),
        temperature_idle_celsius=float(_get(card, "temperature_idle_celsius", (int, float), where)),
        energy_joules_at_start=float(_get(card, "energy_joules_at_start", (int, float), where)),
        pcie_generation=_get(card, "pcie_generation", int, where),
        pcie_width=_get(card, "pcie_width", int, where),
        nvlink_count=_get(card, "nvlink_count", int, where),
        compute_capability=(int(cc[0]), int(cc[1])),
        vbios_version=_get(card, "vbios_version", str, where),
        cards=tuple(cards),
        mig_profiles=tuple(profiles),
        processes=tuple(processes),
        mig_instances=tuple(instances),
        extra={k: v for k, v in data.items() if k not in known},
    )
