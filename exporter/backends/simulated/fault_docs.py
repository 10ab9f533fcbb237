"""What each fault kind of the simulated node does and what its parameters mean: the text `xpuctl simulate kinds`
shows (through the Simulation service). The meanings, allowed values and defaults are those injector.py applies;
tests/exporter/backends/test_fault_docs.py holds the two together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.backends.simulated.injector import HANGABLE_CALLS
from exporter.backends.types import ComputeMode


@dataclass(frozen=True, slots=True)
class ParamDoc:
    meaning: str
    allowed: str
    default: str | None = None  # None: the parameter is required (or, where the kind says so, optional with no value)


@dataclass(frozen=True, slots=True)
class KindDoc:
    summary: str
    params: Mapping[str, ParamDoc]


_INSTANCE = ParamDoc("the MIG GPU instance the event names (that instance must exist)", "integer >= 0", "none")
_LINK = ParamDoc("the NVLink of the card", "integer from 0 to the card's link count - 1", "0")
_MEMORY = "MiB of device memory"

FAULT_DOCS: Mapping[str, KindDoc] = {
    "xid": KindDoc(
        "an XID driver event (79: fallen off the bus, 13: application error, ...)",
        {
            "code": ParamDoc("the XID number", "integer from 1 to 65535"),
            "gpu_instance_id": _INSTANCE,
            "compute_instance_id": ParamDoc(
                "with gpu_instance_id: the compute instance the event names", "0 (each simulated instance has one)", "0"
            ),
        },
    ),
    "ecc": KindDoc(
        "ECC errors: the volatile and aggregate counters grow and an ECC event is sent",
        {
            "corrected": ParamDoc("correctable (single-bit) errors to add", "integer >= 0 (one of the two > 0)", "0"),
            "uncorrected": ParamDoc("uncorrectable (double-bit) errors to add", "integer >= 0", "0"),
        },
    ),
    "remap_pending": KindDoc("a row remap waits for a GPU reset (the driver asks for a reset)", {}),
    "remap_failure": KindDoc("a row remap failed: the card has no spare rows left", {}),
    "nvlink_down": KindDoc("one NVLink goes down until cleared", {"link": _LINK}),
    "nvlink_errors": KindDoc(
        "NVLink error counters grow",
        {
            "link": _LINK,
            "crc": ParamDoc("CRC errors to add", "integer >= 0", "0"),
            "replay": ParamDoc("replay errors to add", "integer >= 0", "0"),
            "recovery": ParamDoc("recovery errors to add", "integer >= 0", "0"),
        },
    ),
    "gpu_lost": KindDoc("the card falls off the bus (GPU_IS_LOST and XID 79) until cleared", {}),
    "hang": KindDoc(
        "a driver call on the card blocks until cleared; the card's other calls then fail at once",
        {"call": ParamDoc("the call that hangs (* : every call)", ", ".join(HANGABLE_CALLS), "*")},
    ),
    "process_start": KindDoc(
        "a compute process starts on the card",
        {
            "pid": ParamDoc("its process id", "integer >= 1, not already on a simulated card"),
            "name": ParamDoc("its command name", "text", "python3"),
            "memory_mib": ParamDoc(f"{_MEMORY} it uses", "integer >= 0", "1024"),
            "load": ParamDoc("its share of the card's SMs", "number from 0 to 1", "0.5"),
            "gpu_instance_id": ParamDoc("the MIG GPU instance it runs in", "integer >= 0 (0: the whole card)", "0"),
            "pod": ParamDoc("the pod it runs in", "a lowercase DNS label", "none (not in a pod)"),
            "namespace": ParamDoc("with pod: the pod's namespace", "a lowercase DNS label", "default"),
            "container": ParamDoc("with pod: the container", "a lowercase DNS label", "main"),
        },
    ),
    "process_exit": KindDoc(
        "a process started with process_start exits", {"pid": ParamDoc("its process id", "a pid on this card")}
    ),
    "orphan_memory": KindDoc(
        "device memory in use that no process owns (a leak)",
        {"memory_mib": ParamDoc(f"{_MEMORY} to take", "integer >= 1")},
    ),
    "compute_mode": KindDoc(
        "the card's compute mode changes",
        {"mode": ParamDoc("the new mode", ", ".join(m.name.lower() for m in ComputeMode))},
    ),
    "persistence_off": KindDoc("persistence mode goes off", {}),
    "mig_pending": KindDoc("a MIG mode change waits for a GPU reset", {}),
    "ecc_pending": KindDoc("an ECC mode change (ECC off) waits for a GPU reset", {}),
    "pcie_replay": KindDoc("the PCIe replay counter grows", {"count": ParamDoc("replays to add", "integer >= 1", "1")}),
    "recovery_action": KindDoc(
        "the card reports a driver recovery action",
        {
            "code": ParamDoc(
                "the raw value, numbered as the scenario's driver branch numbers it", "integer from 1 to 65535"
            )
        },
    ),
    "process_list_denied": KindDoc(
        "the card refuses its process list (NO_PERMISSION) once MIG is on, as for an unprivileged caller", {}
    ),
}
