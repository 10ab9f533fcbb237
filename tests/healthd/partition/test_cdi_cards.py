"""Whole-card CDI devices: the daemon publishes one device per card, named by its UUID, beside the partitions."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from exporter.backends.simulated import SimulatedBackend
from healthd.partition.manager import CreateRequest
from healthd.partition.model import CardMode, Owner, OwnerKind
from tests.support.partitions import partitions_on


def test_whole_cards_are_published_with_the_partitions(tmp_path: Path) -> None:
    backend = SimulatedBackend.from_name("h200x8")
    backend.open()
    parts = partitions_on(backend, tmp_path / "state", runtime_dir=tmp_path / "run")
    spec_file = tmp_path / "state" / "cdi" / "xpu-runtime-kit.io-gpu.json"

    async def go() -> None:
        await parts.start()
        try:
            spec = json.loads(spec_file.read_text())
            uuids = [backend.device_info(i).uuid for i in range(8)]
            assert spec["kind"] == "xpu-runtime-kit.io/gpu"
            assert sorted(d["name"] for d in spec["devices"]) == sorted(uuids)
            card3 = next(d for d in spec["devices"] if d["name"] == uuids[3])
            minor = backend.device_info(3).minor_number
            nodes = [n["path"] for n in card3["containerEdits"]["deviceNodes"]]
            assert f"/dev/nvidia{minor}" in nodes and "/dev/nvidiactl" in nodes
            assert not any(
                n.startswith("/dev/nvidia") and n[11:].isdigit() and n != f"/dev/nvidia{minor}" for n in nodes
            )
            assert card3["containerEdits"].get("env", []) == []  # the plugin sets the visible devices for all cards
            await parts.manager.set_mode("3", CardMode.TDM)
            record = await parts.manager.create(CreateRequest(Owner(OwnerKind.LEASE, holder="t"), "3", 10, 1024))
            names = {d["name"] for d in json.loads(spec_file.read_text())["devices"]}
            others = set(uuids) - {uuids[3]}
            assert names == {*others, record.id}  # a TDM card is had only through its partitions
            await parts.manager.delete(record.id)
            names = {d["name"] for d in json.loads(spec_file.read_text())["devices"]}
            assert names == others  # no partitions left: still in mode tdm, so still not whole
            await parts.manager.set_mode("3", CardMode.NONE)
            names = {d["name"] for d in json.loads(spec_file.read_text())["devices"]}
            assert names == set(uuids)  # back to mode none: whole again
        finally:
            await parts.stop()

    asyncio.run(go())
