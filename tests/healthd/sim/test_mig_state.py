"""The simulated driver's MIG state file: what is saved is made again with the same ids and UUIDs; a file that
cannot be read is set aside, never half-applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.backends.simulated import SimulatedBackend
from healthd.sim.mig_state import SimulatedMigState, parse


def backend() -> SimulatedBackend:
    b = SimulatedBackend.from_name("h200x8")
    b.open()
    return b


def test_instances_come_back_with_their_ids_and_uuids(tmp_path: Path) -> None:
    first = backend()
    state = SimulatedMigState(first, tmp_path / "mig.json")
    kept = [first.create_mig_instance(6, 19, start) for start in (1, 2, 3)]
    first.destroy_mig_instance(6, kept[0].gpu_instance_id)
    first.create_mig_instance(7, 19, 6)  # beside the scenario's own instances
    state.save()
    second = backend()
    assert SimulatedMigState(second, tmp_path / "mig.json").restore() == 2 + 3  # GPU 6, GPU 7
    assert second.mig_instances(6) == first.mig_instances(6)
    assert [i.uuid for i in second.mig_instances(6)] == [i.uuid for i in kept[1:]]
    assert second.mig_instances(7) == first.mig_instances(7)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"format": 2, "cards": {}}',
        '{"format": 1, "cards": {"x": []}}',
        '{"format": 1, "cards": {"6": [[1, 19]]}}',
    ],
)
def test_an_unreadable_file_is_set_aside(tmp_path: Path, text: str) -> None:
    path = tmp_path / "mig.json"
    path.write_text(text)
    with pytest.raises(ValueError):
        parse(text)
    b = backend()
    assert SimulatedMigState(b, path).restore() == 0
    assert (tmp_path / "mig.json.unreadable").read_text() == text
    assert [i.gpu_instance_id for i in b.mig_instances(7)] == [1, 2]  # the scenario's, untouched
