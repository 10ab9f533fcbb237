"""Regenerate the committed gRPC/protobuf modules from proto/ (run from the repository root).

Each .proto lives at the path of the Python package its code belongs to (proto/healthd/api/v1/x.proto ->
healthd/api/v1/x_pb2.py), so generated imports resolve without rewriting. CI runs this and fails on a diff.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc


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
