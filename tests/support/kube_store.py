"""The storage half of the API server stand-in (tests/support/kube_api.py): objects, resourceVersions, the watch
history, selectors and the Status bodies, as the Kubernetes API server has them.

Follows kubernetes/kubernetes v1.36/v1.37 API conventions: one cluster-wide resourceVersion that every write
advances (etcd's revision), uid/creationTimestamp/generation set by the server, ``generateName`` completed with 5
random characters, optimistic concurrency (an update or delete precondition naming an older resourceVersion is
409 Conflict), Status error bodies (k8s.io/apimachinery pkg/api/errors), field selectors limited to the fields
each resource declares (resource.k8s.io/v1 ResourceSlice: spec.nodeName, spec.driver, spec.pool.name) and label
selectors of k8s.io/apimachinery pkg/labels (=, ==, !=, in, notin, exists, !exists).
"""

from __future__ import annotations

import copy
import random
import re
import string
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.details = code, reason, details or {}

    def status(self) -> Obj:
        return status_body(self.code, self.reason, str(self), self.details)


def status_body(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message}
    body.update({"reason": reason, "code": code})
    if details:
        body["details"] = details
    return body


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group: str  # "" for core
    version: str
    namespaced: bool
    fields: tuple[str, ...] = ("metadata.name", "metadata.namespace")  # what fieldSelector may name
    has_status: bool = False  # a status subresource: the main resource ignores status, /status only changes it
    validate: bool = False  # checked with kubernetes-validate --strict on every write

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES = {
    r.plural: r
    for r in (
        Resource(
            "resourceslices",
            "ResourceSlice",
            "resource.k8s.io",
            "v1",
            False,
            ("metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"),
            validate=True,
        ),
        Resource("resourceclaims", "ResourceClaim", "resource.k8s.io", "v1", True, has_status=True, validate=True),
        Resource("deviceclasses", "DeviceClass", "resource.k8s.io", "v1", False, validate=True),
        Resource("nodes", "Node", "", "v1", False, has_status=True),
        Resource("pods", "Pod", "", "v1", True, ("metadata.name", "metadata.namespace", "spec.nodeName"), True),
    )
}


def _path(obj: Obj, dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def field_matcher(resource: Resource, selector: str) -> Callable[[Obj], bool]:
    terms = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        match = re.fullmatch(r"([^!=]+)(==|=|!=)(.*)", term)
        if match is None:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        name, op, value = match.groups()
        if name not in resource.fields:
            raise ApiError(400, "BadRequest", f'"{name}" is not a known field selector: only "{resource.fields}"')
        terms.append((name, op != "!=", value))
    return lambda obj: all((_path(obj, n) == v) == eq for n, eq, v in terms)


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    return [t for t in [*terms, current.strip()] if t]


def _set_check(key: str, op: str, values: set[str]) -> Callable[[dict[str, str]], bool]:
    if op == "in":
        return lambda labels: labels.get(key) in values
    return lambda labels: labels.get(key) not in values  # notin: also true without the label


def _equality_check(key: str, op: str, value: str) -> Callable[[dict[str, str]], bool]:
    return lambda labels: (labels.get(key) == value) == (op != "!=")


def _exists_check(key: str, negated: bool) -> Callable[[dict[str, str]], bool]:
    return lambda labels: (key in labels) != negated


def label_matcher(selector: str) -> Callable[[Obj], bool]:
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_terms(selector):
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term):
            checks.append(_set_check(m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}))
        elif m := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w.-]*)", term):
            checks.append(_equality_check(*m.groups()))
        elif m := re.fullmatch(r"(!?)([\w./-]+)", term):
            checks.append(_exists_check(m.group(2), bool(m.group(1))))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return lambda obj: all(check(obj.get("metadata", {}).get("labels") or {}) for check in checks)


@dataclass
class Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: str
    obj: Obj


@dataclass
class Store:
    """Every object and the recent history; all access under ``cond``."""

    history_limit: int = 1000
    validator: Callable[[Obj], None] | None = None
    defaulter: Callable[[Resource, Obj], None] | None = None  # server-side defaults, applied after validation
    rv: int = 1
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    history: list[Event] = field(default_factory=list)
    compacted: int = 0  # events at or below this resourceVersion are gone (410 Expired for a watch from there)
    cond: threading.Condition = field(default_factory=threading.Condition)
    closed: bool = False

    def _record(self, kind: str, resource: str, obj: Obj) -> None:
        self.history.append(Event(self.rv, kind, resource, copy.deepcopy(obj)))
        if len(self.history) > self.history_limit:
            self.compacted = self.history.pop(0).rv
        self.cond.notify_all()

    def compact(self) -> None:
        """What etcd compaction does to old resourceVersions: watches from before now get 410 Expired."""
        with self.cond:
            self.compacted = self.rv
            self.history.clear()

    def get(self, resource: Resource, namespace: str, name: str) -> Obj:
        with self.cond:
            obj = self.objects.get((resource.plural, namespace, name))
            if obj is None:
                raise ApiError(
                    404,
                    "NotFound",
                    f'{resource.qualified} "{name}" not found',
                    {"name": name, "group": resource.group, "kind": resource.plural},
                )
            return copy.deepcopy(obj)

    def list(self, resource: Resource, namespace: str | None, match: Callable[[Obj], bool]) -> tuple[list[Obj], int]:
        with self.cond:
            items = [
                copy.deepcopy(o)
                for (plural, ns, _), o in sorted(self.objects.items())
                if plural == resource.plural and (namespace is None or ns == namespace) and match(o)
            ]
            return items, self.rv

    def create(self, resource: Resource, namespace: str, obj: Obj, *, keep_status: bool = False) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        name = meta.get("name")
        if not name:
            raise ApiError(
                422,
                "Invalid",
                f"{resource.kind} is invalid: metadata.name: Required value: name or generateName is required",
            )
        self._check_body(resource, namespace, obj)
        with self.cond:
            key = (resource.plural, namespace, name)
            if key in self.objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{resource.qualified} "{name}" already exists',
                    {"name": name, "group": resource.group, "kind": resource.plural},
                )
            if resource.has_status and not keep_status:
                obj.pop("status", None)
            self.rv += 1
            meta.update(
                uid=str(uuid.uuid4()),
                resourceVersion=str(self.rv),
                creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
            if "spec" in obj:
                meta["generation"] = 1
            if namespace:
                meta["namespace"] = namespace
            self.objects[key] = obj
            self._record("ADDED", resource.plural, obj)
            return copy.deepcopy(obj)

    def update(self, resource: Resource, namespace: str, name: str, obj: Obj, *, status: bool = False) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if meta.get("name") != name:
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})",
            )
        self._check_body(resource, namespace, obj)
        with self.cond:
            old = self.objects.get((resource.plural, namespace, name))
            if old is None:
                raise ApiError(
                    404, "NotFound", f'{resource.qualified} "{name}" not found', {"name": name, "kind": resource.plural}
                )
            self._precondition(resource, name, old, meta.get("resourceVersion"), meta.get("uid"))
            if resource.has_status:
                kept = "spec" if status else "status"
                if kept in old:
                    obj[kept] = copy.deepcopy(old[kept])
                else:
                    obj.pop(kept, None)
            for key in ("uid", "creationTimestamp", "generation", "namespace"):
                if key in old["metadata"]:
                    meta[key] = old["metadata"][key]
            if obj.get("spec") != old.get("spec") and "generation" in meta:
                meta["generation"] += 1
            if {**obj, "metadata": {**meta, "resourceVersion": old["metadata"]["resourceVersion"]}} == old:
                return copy.deepcopy(old)  # a no-op update does not advance the resourceVersion
            self.rv += 1
            meta["resourceVersion"] = str(self.rv)
            self.objects[(resource.plural, namespace, name)] = obj
            self._record("MODIFIED", resource.plural, obj)
            return copy.deepcopy(obj)

    def delete(self, resource: Resource, namespace: str, name: str, preconditions: Obj | None = None) -> Obj:
        with self.cond:
            old = self.objects.get((resource.plural, namespace, name))
            if old is None:
                raise ApiError(
                    404, "NotFound", f'{resource.qualified} "{name}" not found', {"name": name, "kind": resource.plural}
                )
            pre = preconditions or {}
            self._precondition(resource, name, old, pre.get("resourceVersion"), pre.get("uid"))
            del self.objects[(resource.plural, namespace, name)]
            self.rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self.rv)
            self._record("DELETED", resource.plural, gone)
            return gone

    def _precondition(self, resource: Resource, name: str, old: Obj, rv: str | None, uid: str | None) -> None:
        if uid and uid != old["metadata"]["uid"]:
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {old['metadata']['uid']}",
            )
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource.qualified} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": name, "group": resource.group, "kind": resource.plural},
            )

    def _check_body(self, resource: Resource, namespace: str, obj: Obj) -> None:
        if obj.get("kind") not in (None, resource.kind) or obj.get("apiVersion") not in (None, resource.api_version):
            raise ApiError(
                400, "BadRequest", f"the body is a {obj.get('apiVersion')} {obj.get('kind')}, not a {resource.kind}"
            )
        if obj.get("metadata", {}).get("namespace") not in (None, "", namespace):
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        if resource.validate and self.validator is not None:
            self.validator({**obj, "apiVersion": resource.api_version, "kind": resource.kind})
        if self.defaulter is not None:
            self.defaulter(resource, obj)

    def events_after(self, rv: int, resource: str, timeout: float) -> Iterator[Event]:
        """Events of ``resource`` after ``rv`` as they happen, until ``timeout`` passes or the store closes."""
        deadline = threading.Event()
        timer = threading.Timer(timeout, lambda: (deadline.set(), self._wake()))
        timer.start()
        try:
            seen = rv
            while not deadline.is_set() and not self.closed:
                with self.cond:
                    if seen < self.compacted:
                        raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.compacted})")
                    pending = [e for e in self.history if e.rv > seen]
                    if not pending:
                        self.cond.wait()
                        continue
                seen = pending[-1].rv
                yield from (e for e in pending if e.resource == resource)
        finally:
            timer.cancel()

    def _wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
