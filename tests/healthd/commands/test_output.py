"""The one table formatter and the one JSON style of xpuctl (healthd/commands/output.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from healthd.api.v1 import health_pb2, partitions_pb2, simulation_pb2, topology_pb2
from healthd.commands.output import enum_label, message_json, table

CELL = st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=12)  # printable, no spaces


@given(st.integers(1, 6).flatmap(lambda n: st.tuples(st.lists(CELL, min_size=n, max_size=n), st.lists(
    st.lists(CELL, min_size=n, max_size=n), max_size=8))))  # fmt: skip
def test_columns_line_up_and_never_touch(data: tuple[list[str], list[list[str]]]) -> None:
    header, rows = data
    lines = table(header, rows)
    assert len(lines) == len(rows) + 1
    starts = []
    offset = 0
    for i in range(len(header)):
        starts.append(offset)
        offset += max(len(r[i]) for r in [header, *rows]) + 2
    for line, row in zip(lines, [header, *rows], strict=True):
        for start, cell in zip(starts, row, strict=True):
            assert line[start : start + len(cell)] == cell  # every cell begins where its column begins
            if start and cell:
                assert line[start - 2 : start] == "  "  # two spaces before it: "unknownok" cannot happen


def test_right_aligned_numbers() -> None:
    assert table(["GPU", "NAME"], [[7, "a"], [12, "b"]], right=(0,)) == ["GPU  NAME", "  7  a", " 12  b"]


def test_every_enum_of_the_api_has_distinct_readable_words() -> None:
    for module in (health_pb2, partitions_pb2, simulation_pb2, topology_pb2):
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            words = [enum_label(enum, v.number) for v in enum.values]
            assert len(set(words)) == len(words), enum.name
            assert all(w == w.lower() and not w.startswith(enum.name.lower()) for w in words), words
    assert enum_label(health_pb2.Action.DESCRIPTOR, health_pb2.ACTION_REPLACE_NODE) == "replace_node"
    assert enum_label(partitions_pb2.PartitionMode.DESCRIPTOR, partitions_pb2.PARTITION_MODE_MIG) == "mig"
    assert enum_label(health_pb2.Severity.DESCRIPTOR, 99) == "99"  # a newer daemon's value is kept, not dropped


def test_json_is_the_proto3_mapping_with_enum_words() -> None:
    fault = health_pb2.Fault(
        id="f1", opened_seq=2**40, severity=health_pb2.SEVERITY_FATAL, evidence={"pci_bus_id": "0000:3a:00"}
    )
    data = message_json(health_pb2.ListFaultsResponse(faults=[fault]))
    first = data["faults"][0]
    assert first["openedSeq"] == str(2**40)  # int64 as a string, lowerCamelCase
    assert first["severity"] == "fatal" and first["action"] == "unspecified"  # zero values are printed too
    assert first["evidence"] == {"pci_bus_id": "0000:3a:00"}  # a map's keys are data, left as they are
    assert data["lastSeq"] == "0"
