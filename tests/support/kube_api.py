"""A Kubernetes API server stand-in on loopback for the DRA driver's tests: the real REST paths and JSON of
resource.k8s.io/v1 (ResourceSlices, ResourceClaims with their status subresource, DeviceClasses) and core/v1 (Nodes
and Pods, read), so the official ``kubernetes`` Python client works against it unchanged.

Follows the API conventions of kubernetes/kubernetes v1.36/v1.37 (https://kubernetes.io/docs/reference/using-api/
api-concepts/): collection GET lists (``{"kind": "<Kind>List", "metadata": {"resourceVersion"}, "items"}``, items
without kind/apiVersion) or, with ``watch=true``, streams newline-delimited events (``{"type", "object"}``) after
``resourceVersion`` (unset or "0": the current objects as ADDED first), ending after ``timeoutSeconds``; a watch
from a compacted resourceVersion gets an ERROR event with a 410 Expired Status. POST creates, PUT replaces (409
Conflict on a stale resourceVersion), DELETE deletes (with DeleteOptions preconditions), DELETE on a collection is
deletecollection with the same selectors as a list. Errors are Status bodies (tests/support/kube_store.py).

Every ResourceSlice, ResourceClaim and DeviceClass written is validated like ``kubernetes-validate --strict``
(the package's own validate(), strict schemas) against each of ``versions`` (1.36 and 1.37 by default): a write
that fails either is refused with 422 Invalid, and kept in ``rejected`` for the test to show.

What it does not prove: the API server's own validation beyond the OpenAPI schemas (the cross-field rules of
pkg/apis/resource/validation, e.g. devices and sharedCounters in one slice, DNS-label counter names), admission,
RBAC, server-side apply and PATCH, and pagination (``limit`` is ignored: every list is complete).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate

from tests.support.kube_store import RESOURCES, ApiError, Obj, Resource, Store, field_matcher, label_matcher

VERSIONS = ("1.36", "1.37")


class KubeApiServer:
    def __init__(
        self,
        versions: tuple[str, ...] = VERSIONS,
        history_limit: int = 1000,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.versions = versions
        self.clock = clock  # what the server stamps taints' timeAdded with
        self.rejected: list[tuple[Obj, str]] = []  # (object, why) for every write refused by validation
        self.requests: list[tuple[str, str]] = []  # (method, path with query) in arrival order
        self.store = Store(history_limit=history_limit, validator=self._validate, defaulter=self._default)
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def start(self) -> KubeApiServer:
        self._thread = threading.Thread(target=self._http.serve_forever, name="kube-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.store.close()
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> KubeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _validate(self, obj: Obj) -> None:
        for version in self.versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                why = f"{version}: {e.message} at {'.'.join(str(p) for p in e.absolute_path)}"
                self.rejected.append((obj, why))
                raise ApiError(
                    422, "Invalid", f"{obj['kind']} {obj['metadata'].get('name')!r} is invalid: {why}"
                ) from e

    def _default(self, resource: Resource, obj: Obj) -> None:
        """resource.k8s.io/v1 DeviceTaint.timeAdded: "Added automatically during create or update if not set"; a
        metav1.Time is stored with second precision and read back as RFC 3339 in UTC ("...Z")."""
        if resource.plural == "resourceslices":
            for device in obj.get("spec", {}).get("devices") or ():
                for taint in device.get("taints") or ():
                    given = taint.get("timeAdded")
                    when = datetime.fromisoformat(given.replace("Z", "+00:00")) if given else self.clock()
                    taint["timeAdded"] = when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    # ----- what tests do directly (the objects other components would write) ----------------------------------

    def add(self, plural: str, obj: Obj, namespace: str = "") -> Obj:
        """Create as another client would (a Node as kubelet registers it, a claim as a user does): validated."""
        return self.store.create(RESOURCES[plural], namespace, obj, keep_status=True)

    def get(self, plural: str, name: str, namespace: str = "") -> Obj:
        return self.store.get(RESOURCES[plural], namespace, name)

    def items(self, plural: str, namespace: str | None = None) -> list[Obj]:
        return self.store.list(RESOURCES[plural], namespace, lambda _: True)[0]

    def update(self, plural: str, obj: Obj, namespace: str = "") -> Obj:
        return self.store.update(RESOURCES[plural], namespace, obj["metadata"]["name"], obj)

    def set_status(self, plural: str, name: str, status: Obj, namespace: str = "") -> Obj:
        """What the scheduler does to a claim (allocation, reservedFor) through the status subresource."""
        obj = self.get(plural, name, namespace)
        obj["status"] = status
        return self.store.update(RESOURCES[plural], namespace, name, obj, status=True)

    def delete(self, plural: str, name: str, namespace: str = "") -> Obj:
        return self.store.delete(RESOURCES[plural], namespace, name)


def _route(path: str) -> tuple[Resource, str | None, str | None, bool]:
    """(resource, namespace or None, name or None, status subresource) of an API path."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis" and parts[1:3] == ["resource.k8s.io", "v1"]:
        rest = parts[3:]
    else:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    namespace = None
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    if not rest or rest[0] not in RESOURCES:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    resource = RESOURCES[rest[0]]
    group = "" if parts[0] == "api" else "resource.k8s.io"
    if resource.group != group or (namespace is not None and not resource.namespaced):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    name = rest[1] if len(rest) > 1 else None
    status = len(rest) > 2 and rest[2] == "status"
    if len(rest) > 3 or (len(rest) == 3 and not (status and resource.has_status)):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return resource, namespace, name, status


def _handler(server: KubeApiServer) -> type[BaseHTTPRequestHandler]:
    store = server.store

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _reply(self, code: int, body: Obj) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Obj:
            length = int(self.headers.get("Content-Length") or 0)
            if not length:
                return {}
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError as e:
                raise ApiError(400, "BadRequest", f"the body is not JSON: {e}") from e
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the body must be a JSON object")
            return body

        def _serve(self, method: str) -> None:
            server.requests.append((method, self.path))
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                resource, namespace, name, status = _route(url.path)
                self._dispatch(method, resource, namespace, name, status, query)
            except ApiError as e:
                self._reply(e.code, e.status())

        def _dispatch(
            self, method: str, resource: Resource, ns: str | None, name: str | None, status: bool, query: dict[str, str]
        ) -> None:
            namespace = ns or ""
            if resource.namespaced and ns is None and (name is not None or method not in ("GET",)):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if name is None:
                if method == "GET":
                    self._list_or_watch(resource, ns, query)
                    return
                if method == "POST":
                    if resource.group == "":
                        raise ApiError(405, "MethodNotAllowed", "this stand-in serves core/v1 read-only")
                    self._reply(201, store.create(resource, namespace, self._body()))
                    return
                if method == "DELETE":
                    self._delete_collection(resource, ns, query)
                    return
            elif method == "GET":
                self._reply(200, store.get(resource, namespace, name))
                return
            elif method == "PUT" and resource.group:
                self._reply(200, store.update(resource, namespace, name, self._body(), status=status))
                return
            elif method == "DELETE" and resource.group and not status:
                options = self._body()
                self._reply(200, store.delete(resource, namespace, name, options.get("preconditions")))
                return
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

        def _matcher(self, resource: Resource, query: dict[str, str]) -> Any:
            fields = field_matcher(resource, query.get("fieldSelector", ""))
            labels = label_matcher(query.get("labelSelector", ""))
            return lambda obj: fields(obj) and labels(obj)

        def _list_or_watch(self, resource: Resource, ns: str | None, query: dict[str, str]) -> None:
            match = self._matcher(resource, query)
            if query.get("watch") in ("true", "1"):
                self._watch(resource, ns, query, match)
                return
            items, rv = store.list(resource, ns, match)
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
            body = {"kind": f"{resource.kind}List", "apiVersion": resource.api_version}
            self._reply(200, {**body, "metadata": {"resourceVersion": str(rv)}, "items": items})

        def _delete_collection(self, resource: Resource, ns: str | None, query: dict[str, str]) -> None:
            for item in store.list(resource, ns, self._matcher(resource, query))[0]:
                meta = item["metadata"]
                try:
                    store.delete(resource, meta.get("namespace", ""), meta["name"])
                except ApiError as e:
                    if e.code != 404:
                        raise
            self._reply(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})

        def _watch(self, resource: Resource, ns: str | None, query: dict[str, str], match: Any) -> None:
            timeout = float(query.get("timeoutSeconds") or 1800)
            start = query.get("resourceVersion", "")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for event in self._events(resource, ns, start, timeout, match):
                    self._chunk(json.dumps(event).encode() + b"\n")
                if query.get("allowWatchBookmarks") == "true":
                    bookmark = {"kind": resource.kind, "apiVersion": resource.api_version}
                    bookmark["metadata"] = {"resourceVersion": str(store.rv)}
                    self._chunk(json.dumps({"type": "BOOKMARK", "object": bookmark}).encode() + b"\n")
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _events(self, resource: Resource, ns: str | None, start: str, timeout: float, match: Any) -> Iterator[Obj]:
            typed = {"kind": resource.kind, "apiVersion": resource.api_version}
            if start in ("", "0"):
                items, rv = store.list(resource, ns, match)
                yield from ({"type": "ADDED", "object": {**typed, **item}} for item in items)
            else:
                try:
                    rv = int(start)
                except ValueError:
                    yield {
                        "type": "ERROR",
                        "object": ApiError(400, "BadRequest", f"invalid resourceVersion {start!r}").status(),
                    }
                    return
            try:
                for event in store.events_after(rv, resource.plural, timeout):
                    obj = event.obj
                    if (ns is None or obj["metadata"].get("namespace", "") == ns) and match(obj):
                        yield {"type": event.type, "object": {**typed, **obj}}
            except ApiError as e:
                yield {"type": "ERROR", "object": e.status()}

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def do_PATCH(self) -> None:
            server.requests.append(("PATCH", self.path))
            self._reply(415, ApiError(415, "UnsupportedMediaType", "this stand-in does not serve PATCH").status())

    return Handler
