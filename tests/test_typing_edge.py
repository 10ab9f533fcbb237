"""The gRPC edge stays typed: few plain `Any` annotations and no `type: ignore` on a generated stub.

Over exporter/, healthd/ and container/ (generated code aside), counted from the syntax tree:
- parameters annotated exactly `Any` (not `dict[str, Any]`, not `Any | None`);
- functions whose return annotation is exactly `Any`;
- `type: ignore` comments on a line that names something imported from a generated package (`*_pb2`,
  `*_pb2_grpc`): the generated stubs carry `.pyi` files, so mypy needs no exemption there.

``python -m tests.test_typing_edge`` prints the counts and where they are.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import REPO

PACKAGES = ("exporter", "healthd", "container")
GENERATED_PACKAGES = ("healthd.api", "exporter.attribution.api", "container.deviceplugin.api", "container.dra.api")

MAX_ANY_PARAMETERS = 40
MAX_ANY_RETURNS = 10


@dataclass(frozen=True)
class Place:
    path: Path
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}: {self.what}"


def generated(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in GENERATED_PACKAGES)


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = ".".join(path.relative_to(REPO).with_suffix("").parts)
            if not generated(relative):
                yield path


def plain_any(annotation: ast.expr | None) -> bool:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return False
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    if isinstance(annotation, ast.Attribute):
        return annotation.attr == "Any" and isinstance(annotation.value, ast.Name) and annotation.value.id == "typing"
    return False


def any_annotations(path: Path) -> tuple[list[Place], list[Place]]:
    """(parameters annotated `Any`, functions returning `Any`) in one module."""
    parameters: list[Place] = []
    returns: list[Place] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        a = node.args
        parameters.extend(
            Place(path, arg.lineno, f"{node.name}({arg.arg}: Any)")
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
            if plain_any(arg.annotation)
        )
        if plain_any(node.returns):
            returns.append(Place(path, node.lineno, f"{node.name}() -> Any"))
    return parameters, returns


def stub_names(tree: ast.Module) -> set[str]:
    """The names a module binds to generated modules or to what it takes from them."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names if generated(alias.name))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and generated(node.module):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def ignores_on_stubs(path: Path) -> list[Place]:
    text = path.read_text()
    names = stub_names(ast.parse(text, str(path)))
    lines_names: dict[int, set[str]] = {}
    ignores: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME:
            lines_names.setdefault(token.start[0], set()).add(token.string)
        elif token.type == tokenize.COMMENT and "type: ignore" in token.string:
            ignores.append((token.start[0], token.string))
    return [Place(path, line, comment) for line, comment in ignores if names & lines_names.get(line, set())]


Census = tuple[list[Place], list[Place], list[Place]]


def census() -> Census:
    """(parameters annotated Any, functions returning Any, type: ignore on a generated stub) over the packages."""
    parameters: list[Place] = []
    returns: list[Place] = []
    ignores: list[Place] = []
    for path in sources():
        p, r = any_annotations(path)
        parameters += p
        returns += r
        ignores += ignores_on_stubs(path)
    return parameters, returns, ignores


@pytest.fixture(scope="module")
def counted() -> Census:
    return census()


def test_few_parameters_are_annotated_any(counted: Census) -> None:
    parameters, _, _ = counted
    assert len(parameters) <= MAX_ANY_PARAMETERS, "\n".join(map(str, parameters))


def test_few_functions_return_any(counted: Census) -> None:
    _, returns, _ = counted
    assert len(returns) <= MAX_ANY_RETURNS, "\n".join(map(str, returns))


def test_no_type_ignore_names_a_generated_stub(counted: Census) -> None:
    _, _, ignores = counted
    assert not ignores, "\n".join(map(str, ignores))


def test_the_census_sees_what_it_counts(tmp_path: Path) -> None:
    """The counters find each form they look for, and leave alone what is not plainly `Any`."""
    module = tmp_path / "sample.py"
    module.write_text(
        "import typing\n"
        "from typing import Any\n"
        "from healthd.api.v1 import health_pb2_grpc as stubs\n"
        "def f(a: Any, *b: typing.Any, c: 'Any', **d: Any) -> Any: ...\n"
        "async def g(e: Any | None, f: dict[str, Any]) -> list[Any]: ...\n"
        "x = stubs.HealthStub(None)  # type: ignore[no-untyped-call]\n"
        "y = len([])  # type: ignore[misc]\n"
    )
    parameters, returns = any_annotations(module)
    assert [p.what for p in parameters] == ["f(a: Any)", "f(c: Any)", "f(b: Any)", "f(d: Any)"]
    assert [r.line for r in returns] == [4]
    assert [i.line for i in ignores_on_stubs(module)] == [6]


if __name__ == "__main__":
    found = census()
    for title, places in zip(("parameters: Any", "-> Any", "type: ignore on a generated stub"), found, strict=True):
        print(f"{title}: {len(places)}")
        for place in places:
            print(f"  {place}")
