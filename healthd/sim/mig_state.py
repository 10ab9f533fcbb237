"""The simulated driver's MIG instances, kept in the state directory across daemon restarts.

A real driver keeps MIG instances for as long as the machine runs: a daemon that restarts finds them and adopts
its own (healthd/partition/manager.py). The simulated GPUs live in the daemon's process, so without this file a
restart would find none, and the adoption path would never run on a simulated node. The file is rewritten whenever
the instances change and read once, before anything else on the node reads the simulated GPUs.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import structlog

from exporter.atomic_file import write_text_atomic
from exporter.backends.simulated import SimulatedBackend

log = structlog.get_logger("simulation")

FORMAT = 1


class SimulatedMigState:
    def __init__(self, backend: SimulatedBackend, path: Path) -> None:
        self.backend = backend
        self.path = path
        self._lock = threading.Lock()
        self._saved: dict[int, tuple[tuple[int, int, int], ...]] | None = None

    def restore(self) -> int:
        """Make the stored instances again; how many there were. A file that cannot be read is reported and left
        aside (the simulated cards start without instances, as after a reboot)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return 0
        try:
            layout = parse(text)
        except ValueError as exc:
            aside = self.path.with_name(self.path.name + ".unreadable")
            self.path.replace(aside)
            log.error("simulated MIG state unreadable; starting without instances", path=str(aside), error=str(exc))
            return 0
        for reason in self.backend.restore_mig_layout(layout):
            log.warning("simulated MIG instance not made again", reason=reason)
        self.save()
        return sum(len(v) for v in layout.values())

    def save(self) -> None:
        """Write the instances if they changed since the last write (called on every simulated workload change)."""
        with self._lock:
            layout = self.backend.mig_layout()
            if layout == self._saved:
                return
            body = {"format": FORMAT, "cards": {str(k): [list(gi) for gi in v] for k, v in sorted(layout.items())}}
            write_text_atomic(self.path, json.dumps(body, indent=1) + "\n", mode=0o600)
            self._saved = layout


def parse(text: str) -> dict[int, tuple[tuple[int, int, int], ...]]:
    """card index -> (gpu instance id, profile id, placement start) per instance; ValueError for anything else."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or not isinstance(body.get("cards"), dict):
        raise ValueError(f"expected {{'format': {FORMAT}, 'cards': {{...}}}}")
    layout: dict[int, tuple[tuple[int, int, int], ...]] = {}
    for key, instances in body["cards"].items():
        if not key.isdigit() or not isinstance(instances, list):
            raise ValueError(f"card {key!r}: expected an index and a list of instances")
        rows = []
        for gi in instances:
            if not (isinstance(gi, list) and len(gi) == 3 and all(type(v) is int and v >= 0 for v in gi)):
                raise ValueError(f"card {key}: instance {gi!r} is not [gpu instance id, profile id, start]")
            rows.append((gi[0], gi[1], gi[2]))
        layout[int(key)] = tuple(rows)
    return layout
