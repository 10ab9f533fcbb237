"""Regenerate the committed gRPC/protobuf modules from proto/ (run from the repository root).

Each .proto lives at the path of the Python package its code belongs to (proto/healthd/api/v1/x.proto ->
healthd/api/v1/x_pb2.py), so generated imports resolve without rewriting. CI runs this and fails on a diff.

Beside the code: `_pb2.pyi` for the messages (protoc's own) and `_pb2_grpc.pyi` for the stubs and servicers
(mypy-protobuf's grpc plugin, from the dev extra), so mypy checks a call through a stub and a servicer's signature.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc


def grpc_stub_plugin() -> str:
    """mypy-protobuf's protoc-gen-mypy_grpc, installed beside this Python (a venv) or on PATH."""
    name = "protoc-gen-mypy_grpc"
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install the dev extra (pip install -e .[dev]), it brings mypy-protobuf")
    return found


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    protos = sorted(str(p.relative_to(root / "proto")) for p in (root / "proto").rglob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{root / 'proto'}",
        f"-I{include}",
        f"--python_out={root}",
        f"--pyi_out={root}",
        f"--grpc_python_out={root}",
        f"--plugin=protoc-gen-mypy_grpc={grpc_stub_plugin()}",
        f"--mypy_grpc_out={root}",
        # servicers concrete, as at run time: a method a servicer leaves out answers UNIMPLEMENTED
        "--mypy_grpc_opt=quiet,generate_concrete_servicer_stubs",
        *protos,
    ]
    code = protoc.main(args)
    if code != 0:
        print("protoc failed", file=sys.stderr)
        return int(code)
    for proto in protos:
        package = (root / proto).parent
        for directory in [package, *package.parents]:
            if directory == root:
                break
            (directory / "__init__.py").touch(exist_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
