"""What xpuctl prints: aligned tables for people, and JSON in one style for scripts.

JSON is the proto3 JSON mapping of the daemon's reply (``google.protobuf.json_format``: lowerCamelCase keys, 64-bit
integers as strings, every field present, zero values included), with one change made in ``enum_label``: an enum
value is written as the readable word the tables show (``warning``, ``replace_node``, ``mig``), not as the proto
constant (``SEVERITY_WARNING``). Every ``--json`` goes through ``print_json``; a stream (``faults watch``) prints one
such object per line.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

GAP = "  "  # between table columns

JsonValue = dict[str, Any] | list[Any] | str | int | float | bool | None


def enum_prefix(enum: EnumDescriptor) -> str:
    """The prefix the style guide puts on an enum's values: its type name in UPPER_SNAKE (PartitionMode ->
    PARTITION_MODE_)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"


def enum_label(enum: EnumDescriptor, number: int) -> str:
    """SEVERITY_WARNING -> "warning", ACTION_REPLACE_NODE -> "replace_node", PARTITION_MODE_MIG -> "mig"; a number
    this build does not know (a newer daemon) stays a number's text, so nothing is lost."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    return value.name.removeprefix(enum_prefix(enum)).lower()


def _map_value(field: FieldDescriptor) -> FieldDescriptor | None:
    """The value field of a map field's entry type; None for any other field."""
    entry = field.message_type
    return entry.fields_by_name["value"] if entry is not None and entry.GetOptions().map_entry else None


def _relabel(value: Any, field: FieldDescriptor) -> Any:
    if field.enum_type is not None:
        return enum_label(field.enum_type, int(value))
    if field.message_type is not None and isinstance(value, dict):
        return _relabel_message(value, field.message_type)
    return value


def _relabel_message(data: dict[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    for field in descriptor.fields:
        if field.json_name not in data:
            continue
        value = data[field.json_name]
        inner = _map_value(field)
        if inner is not None:
            data[field.json_name] = {k: _relabel(v, inner) for k, v in value.items()}
        elif isinstance(value, list):
            data[field.json_name] = [_relabel(v, field) for v in value]
        else:
            data[field.json_name] = _relabel(value, field)
    return data


def message_json(message: Message) -> dict[str, Any]:
    """The proto3 JSON mapping of ``message`` with readable enum words (see the module docstring)."""
    data = json_format.MessageToDict(message, always_print_fields_with_no_presence=True, use_integers_for_enums=True)
    return _relabel_message(data, cast("Descriptor", message.DESCRIPTOR))  # the C and Python descriptors alike


def to_json(value: Message | Mapping[str, Any] | Sequence[Any]) -> JsonValue:
    """A message, or a dict or list that holds messages, as JSON values."""
    if isinstance(value, Message):
        return message_json(value)
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value  # type: ignore[return-value]  # a plain JSON scalar


def print_json(value: Message | Mapping[str, Any] | Sequence[Any], *, one_line: bool = False) -> None:
    """Indented JSON, or one line per object for a stream (like ``kubectl get -w -o json`` fed to ``jq``)."""
    text = json.dumps(to_json(value), indent=None if one_line else 2, ensure_ascii=False)
    print(text, flush=one_line)


def table(header: Sequence[str], rows: Iterable[Sequence[object]], *, right: Iterable[int] = ()) -> list[str]:
    """Columns as wide as their widest cell and two spaces apart, so no two cells ever run together; ``right``:
    the columns (by position) aligned to the right, for numbers. The last column is not padded."""
    cells = [[str(c) for c in header], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    right_cols = set(right)
    lines = []
    for row in cells:
        parts = [
            c.rjust(w) if i in right_cols else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append(GAP.join(parts).rstrip())
    return lines


def print_table(header: Sequence[str], rows: Iterable[Sequence[object]], *, right: Iterable[int] = ()) -> None:
    print("\n".join(table(header, rows, right=right)))


# ----- the --json / -o option every command that prints a result takes -------------------------------------------

FORMATS = ("table", "json")


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--json``, and ``-o json|table`` as kubectl writes it; both set ``args.output``."""
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default="table",
        help="table (default) or json: the proto3 JSON mapping with readable enum words",
    )
    parser.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")


def wants_json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "table") == "json"


def leaf_parsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """Every subcommand that runs something (``faults list``, ``health``, ...), with its full name."""
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                inner = leaf_parsers(sub)
                found += [(f"{name} {n}".strip(), p) for n, p in inner] if inner else [(name, sub)]
    return found


def prints_result(parser: argparse.ArgumentParser) -> bool:
    """False for the commands that serve or replace themselves (``hook serve``, ``partitions exec``): they print no
    result to format. A command says so with ``set_defaults(prints_result=False)``."""
    return bool(parser.get_default("prints_result") is not False)


def add_output_options_everywhere(parser: argparse.ArgumentParser) -> None:
    """Gives every subcommand that prints a result the same ``--json``/``-o``, so no command forgets them."""
    for _name, sub in leaf_parsers(parser):
        if prints_result(sub) and not any("--json" in a.option_strings for a in sub._actions):
            add_output_options(sub)
