"""The layers run one way: exporter never imports healthd, the container layer (container/) imports neither but the
daemon's generated API, and there is no import loop, neither between two modules nor between two packages.

Every import in a module counts: lazy ones inside functions and TYPE_CHECKING ones too, since a loop hidden that way
is still one. Two packages are in a loop when some module of each imports some module of the other, even when no
two modules import each other (healthd/faults/ -> probes/runner.py and probes/ -> faults/model.py once made one):
at every package of exporter/, healthd/ and container/, at any depth, the modules and sub-packages directly in it
(its "rooms") must import each other one way only.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

from tests.support.paths import REPO

PACKAGES = ("exporter", "healthd", "container")
GENERATED = ("_pb2.py", "_pb2_grpc.py")


def modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((REPO / package).rglob("*.py")):
        if path.name.endswith(GENERATED):
            continue
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(path: Path, name: str) -> Iterator[str]:
    """Every module this one imports, resolved to full dotted names (relative imports included)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def graph() -> dict[str, set[str]]:
    known: dict[str, Path] = {}
    for package in PACKAGES:
        if (REPO / package).is_dir():
            known.update(modules(package))
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = {t for t in imports(path, name) if t in known and t != name}
        # importing a package's module also runs the package's __init__; cycles through __init__ count
        edges[name] = targets
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def room_edges(edges: dict[str, set[str]], package: str) -> dict[str, dict[str, str]]:
    """Between the rooms directly in ``package`` ("" for the top): room -> room it imports -> one import that does."""
    prefix = f"{package}." if package else ""

    def room(module: str) -> str | None:
        return module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None

    out: dict[str, dict[str, str]] = {}
    for source, targets in sorted(edges.items()):
        a = room(source)
        if a is None:
            continue
        out.setdefault(a, {})
        for target in sorted(targets):
            b = room(target)
            if b is not None and b != a:
                out[a].setdefault(b, f"{source} -> {target}")
    return out


def package_loops(edges: dict[str, set[str]]) -> list[str]:
    """One loop per package whose rooms import each other in a circle, with an import behind each arrow."""
    packages = {".".join(m.split(".")[:depth]) for m in edges for depth in range(m.count(".") + 1)}
    found = []
    for package in sorted(packages):
        rooms = room_edges(edges, package)
        cycle = find_cycle({a: set(bs) for a, bs in rooms.items()})
        if cycle is not None:
            arrows = "; ".join(rooms[a][b] for a, b in itertools.pairwise(cycle))
            found.append(f"{package or '(top)'}: {' -> '.join(cycle)} ({arrows})")
    return found


def test_exporter_never_imports_healthd_or_the_container_layer() -> None:
    bad = sorted(
        f"{name} imports {target}"
        for name, targets in graph().items()
        if name.startswith("exporter")
        for target in targets
        if target.startswith(("healthd", "container"))
    )
    assert bad == []


def test_the_container_layer_talks_to_the_daemon_only_through_its_api() -> None:
    bad = sorted(
        f"{name} imports {target}"
        for name, targets in graph().items()
        if name.startswith("container")
        for target in targets
        if target.startswith(("exporter", "healthd")) and not target.startswith("healthd.api")
    )
    assert bad == []


def test_no_import_cycles() -> None:
    assert find_cycle(graph()) is None, " -> ".join(find_cycle(graph()) or [])


def test_no_import_loops_between_packages() -> None:
    assert package_loops(graph()) == []


def test_a_loop_between_packages_is_found_where_no_two_modules_loop() -> None:
    edges = {
        "p": set(),
        "p.a": set(),
        "p.a.model": set(),
        "p.a.engine": {"p.b.runner"},
        "p.b": set(),
        "p.b.runner": {"p.a.model"},
    }
    assert find_cycle(edges) is None
    assert package_loops(edges) == ["p: a -> b -> a (p.a.engine -> p.b.runner; p.b.runner -> p.a.model)"]
    deep = {"p.x.a.one": {"p.x.b.two"}, "p.x.b.two": set(), "p.x.b.three": {"p.x.a.four"}, "p.x.a.four": set()}
    assert [loop.split(":")[0] for loop in package_loops(deep)] == ["p.x"]
    assert package_loops({"p.a.one": {"p.b.two"}, "p.b.two": set()}) == []


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
