"""DeviceClass and claim selectors evaluated against published devices the way kube-scheduler does, with a real
CEL implementation: cel-expr-python (the CEL project's Python runtime over cel-cpp).

Follows kubernetes/dynamic-resource-allocation cel/compile.go (@3d03671, 2026-07-01; staging
src/k8s.io/dynamic-resource-allocation/cel) and the base environment of k8s.io/apiserver pkg/cel/environment
base.go (@24a394e):

- one variable ``device`` with ``driver``, ``allowMultipleAllocations``, ``attributes`` and ``capacity``;
  attributes and capacity are maps of domain -> map of id -> value, a name without a domain belongs to the
  driver's (parseQualifiedName); a domain the device has nothing in reads as an empty map
  (newStringInterfaceMapWithDefault);
- attribute values are int, bool, string or a Semver; capacities are Quantities;
- the result must be a bool (or dyn); an evaluation error makes the scheduler fail the allocation ("CEL runtime
  error", structured/internal/stable/allocator_stable.go), raised here as CelRuntimeError;
- extensions: cel.bind (ext.Bindings), the string extension, and Kubernetes' quantity and semver libraries
  (k8s.io/apiserver pkg/cel/library quantity.go and semverlib.go), which cel-expr-python lacks: they are
  extension functions here over two message types (a Quantity holds its exact value in nano units, so message
  equality is Quantity.Equal; a Semver holds major, minor, patch and prerelease, so equality ignores build
  metadata as Version.EQ does), with the semantics of tests/support/k8s_cel_values.py.

Not the same: ``device`` is declared as a map of dyn, not the DRADevice object type, so a type error Kubernetes
reports when the class is created shows here only when the expression runs; an empty domain map is supplied for
every domain named by a string literal in the expression (the way selectors name domains), not for computed
ones; the cost limits are not enforced; ext.Sets, ext.Lists, two-variable comprehensions, the regex, URL, IP,
CIDR and format libraries of the base environment are not loaded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.support import k8s_cel_values as values


class CelCompileError(ValueError):
    pass


class CelRuntimeError(RuntimeError):
    pass


def _pool() -> Any:
    pool = descriptor_pool.DescriptorPool()
    fd = descriptor_pb2.FileDescriptorProto(name="kubernetes_cel_values.proto", package="kubernetes", syntax="proto3")
    string, int64 = descriptor_pb2.FieldDescriptorProto.TYPE_STRING, descriptor_pb2.FieldDescriptorProto.TYPE_INT64
    optional, repeated = (
        descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    quantity = fd.message_type.add(name="Quantity")
    quantity.field.add(name="nanos", number=1, type=string, label=optional)
    semver = fd.message_type.add(name="Semver")
    for number, name in enumerate(("major", "minor", "patch"), start=1):
        semver.field.add(name=name, number=number, type=int64, label=optional)
    semver.field.add(name="pre", number=4, type=string, label=repeated)
    pool.Add(fd)
    return pool


POOL = _pool()
QuantityMsg = message_factory.GetMessageClass(POOL.FindMessageTypeByName("kubernetes.Quantity"))
SemverMsg = message_factory.GetMessageClass(POOL.FindMessageTypeByName("kubernetes.Semver"))
Q, V = cel.Type("kubernetes.Quantity"), cel.Type("kubernetes.Semver")
INT, BOOL, STRING, DOUBLE = cel.Type.INT, cel.Type.BOOL, cel.Type.STRING, cel.Type.DOUBLE


def quantity(text: str) -> Any:
    return _q(values.parse_quantity(text))


def _q(value: Fraction) -> Any:
    return QuantityMsg(nanos=str(int(value / values.NANO)))


def _value(q: Any) -> Fraction:
    return Fraction(int(q.nanos)) * values.NANO


def semver(text: str, normalize: bool = False) -> Any:
    v = values.parse_semver(text, normalize)
    return SemverMsg(major=v.major, minor=v.minor, patch=v.patch, pre=list(v.pre))


def _sv(m: Any) -> values.Semver:
    return values.Semver(m.major, m.minor, m.patch, tuple(m.pre))


def _as_integer(q: Any) -> int:
    if (n := values.as_int64(_value(q))) is None:
        raise ValueError("cannot convert value to integer")
    return n


def _is(parse: Callable[..., Any]) -> Callable[..., bool]:
    def check(*args: Any) -> bool:
        try:
            parse(*args)
        except ValueError:
            return False
        return True

    return check


def _fn(name: str, *overloads: tuple[str, list[Any], Any, Callable[..., Any] | None, bool]) -> Any:
    return cel.FunctionDecl(
        name,
        [
            cel.Overload(oid, return_type=ret, parameters=params, is_member=member, **({"impl": impl} if impl else {}))
            for oid, params, ret, impl, member in overloads
        ],
    )


def _compare(a: Any, b: Any) -> int:
    """cel-cpp registers implementations by argument kind, and both value types are messages: one implementation
    serves the Quantity and the Semver overload of isGreaterThan, isLessThan and compareTo."""
    if isinstance(a, QuantityMsg) and isinstance(b, QuantityMsg):
        return values.compare(_value(a), _value(b))
    if isinstance(a, SemverMsg) and isinstance(b, SemverMsg):
        return _sv(a).compare(_sv(b))
    raise TypeError(f"no such overload: {type(a).__name__}, {type(b).__name__}")


FUNCTIONS = [
    _fn("quantity", ("string_to_quantity", [STRING], Q, quantity, False)),
    _fn("isQuantity", ("is_quantity_string", [STRING], BOOL, _is(values.parse_quantity), False)),
    _fn("sign", ("quantity_sign", [Q], INT, lambda q: values.compare(_value(q), Fraction(0)), False)),
    _fn(
        "isGreaterThan",
        ("quantity_is_greater_than", [Q, Q], BOOL, lambda a, b: _compare(a, b) == 1, True),
        ("semver_is_greater_than", [V, V], BOOL, None, True),
    ),
    _fn(
        "isLessThan",
        ("quantity_is_less_than", [Q, Q], BOOL, lambda a, b: _compare(a, b) == -1, True),
        ("semver_is_less_than", [V, V], BOOL, None, True),
    ),
    _fn(
        "compareTo",
        ("quantity_compare_to", [Q, Q], INT, _compare, True),
        ("semver_compare_to", [V, V], INT, None, True),
    ),
    _fn("asApproximateFloat", ("quantity_get_float", [Q], DOUBLE, lambda q: float(_value(q)), True)),
    _fn("asInteger", ("quantity_get_int", [Q], INT, _as_integer, True)),
    _fn("isInteger", ("quantity_is_integer", [Q], BOOL, lambda q: values.as_int64(_value(q)) is not None, True)),
    _fn(
        "add",
        ("quantity_add", [Q, Q], Q, lambda a, b: _q(_value(a) + _value(b)), True),
        ("quantity_add_int", [Q, INT], Q, lambda a, n: _q(_value(a) + n), True),
    ),
    _fn(
        "sub",
        ("quantity_sub", [Q, Q], Q, lambda a, b: _q(_value(a) - _value(b)), True),
        ("quantity_sub_int", [Q, INT], Q, lambda a, n: _q(_value(a) - n), True),
    ),
    _fn(
        "semver",
        ("string_to_semver", [STRING], V, semver, False),
        ("string_bool_to_semver", [STRING, BOOL], V, semver, False),
    ),
    _fn(
        "isSemver",
        ("is_semver_string", [STRING], BOOL, _is(values.parse_semver), False),
        ("is_semver_string_bool", [STRING, BOOL], BOOL, _is(values.parse_semver), False),
    ),
    *(
        _fn(part, (f"semver_{part}", [V], INT, lambda v, p=part: getattr(v, p), True))
        for part in ("major", "minor", "patch")
    ),
]

ENV = cel.NewEnv(
    POOL,
    variables={"device": cel.Type.Map(STRING, cel.Type.DYN)},
    extensions=[ext_bindings.ExtBindings(), ext_strings.ExtStrings()],
    functions=FUNCTIONS,
)
_LITERAL = re.compile(r"\"((?:[^\"\\]|\\.)*)\"|'((?:[^'\\]|\\.)*)'")


class Selector:
    def __init__(self, expression: str) -> None:
        try:
            self.program = ENV.compile(expression)
        except Exception as e:
            raise CelCompileError(f"{expression!r}: {e}") from e
        if self.program.return_type() not in (BOOL, cel.Type.DYN):
            raise CelCompileError(f"must evaluate to bool or the unknown type, not {self.program.return_type().name()}")
        self.domains = {a or b for a, b in _LITERAL.findall(expression) if "." in (a or b)}

    def matches(self, driver: str, device: Mapping[str, Any]) -> bool:
        """``device`` as it is published (a ResourceSlice device, JSON)."""
        result = self.program.eval(data={"device": device_variable(driver, device, self.domains)})
        if result.type() == cel.Type.ERROR:
            raise CelRuntimeError(str(result.value()))
        if result.type() != BOOL:
            raise CelRuntimeError(f"CEL result of type {result.type().name()} could not be converted to bool")
        return bool(result.value())


def _qualified(name: str, driver: str) -> tuple[str, str]:
    domain, _, ident = name.rpartition("/")
    return (domain or driver), ident


def _attribute(value: Mapping[str, Any]) -> Any:
    if "version" in value:
        return semver(value["version"])
    for kind in ("int", "bool", "string"):
        if kind in value:
            return value[kind]
    for kind in ("ints", "bools", "strings"):
        if kind in value:
            return list(value[kind])
    if "versions" in value:
        return [semver(v) for v in value["versions"]]
    raise ValueError(f"an attribute without a value: {value}")


def device_variable(driver: str, device: Mapping[str, Any], domains: set[str] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    attributes: dict[str, dict[str, Any]] = {d: {} for d in domains}
    for name, value in (device.get("attributes") or {}).items():
        domain, ident = _qualified(name, driver)
        attributes.setdefault(domain, {})[ident] = _attribute(value)
    capacity: dict[str, dict[str, Any]] = {d: {} for d in domains}
    for name, cap in (device.get("capacity") or {}).items():
        domain, ident = _qualified(name, driver)
        capacity.setdefault(domain, {})[ident] = quantity(str(cap["value"]))
    return {
        "driver": driver,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
        "attributes": attributes,
        "capacity": capacity,
    }


def class_selects(device_class: Mapping[str, Any], driver: str, device: Mapping[str, Any]) -> bool:
    """Every selector of a DeviceClass must match (the scheduler ANDs them)."""
    selectors = (device_class.get("spec") or {}).get("selectors") or []
    return all(Selector(s["cel"]["expression"]).matches(driver, device) for s in selectors)


def selected(device_class: Mapping[str, Any], slices: list[Mapping[str, Any]]) -> list[str]:
    """Names of the devices of these slices the class selects."""
    return [
        d["name"]
        for s in slices
        for d in s["spec"].get("devices") or []
        if class_selects(device_class, s["spec"]["driver"], d)
    ]
