"""A fake Kubernetes API server for HTTPRoutes, on loopback, for the Gateway API adapter tests.

A mock, and allowed as one: no Kubernetes API server can run in this environment (no cluster,
no kind/k3s, no container runtime). It is a real HTTP(S) server the adapter talks to over a
socket, so the client side — URLs, query parameters, headers, bodies, TLS, timeouts, error
handling — is exercised for real. It implements only what the adapter uses: server-side apply
(PATCH with `application/apply-patch+yaml`), list with an equality label selector, get and
delete, bearer-token auth, and `Status` error bodies. It does not validate against the CRD's
OpenAPI schema, run admission, or merge field ownership: an apply replaces the object's spec
(fleetctl owns every field of the objects it applies).

Like a real API server, `metadata.generation` starts at 1 and goes up only when the spec
changes (not on label, annotation or status changes), `resourceVersion` changes on every
write, and `status` is a subresource: an apply neither sets nor clears it.

It also plays the Gateway implementation (`FakeController`, `server.controller`): by default,
right after each apply it writes the HTTPRoute's `status.parents[]` entry for each parentRef
(Accepted True, ResolvedRefs True, observedGeneration = generation), keeping other
controllers' entries. Tests can make it lag (`lag()`: no status written, so a new route has
none and a changed one keeps its old observedGeneration; `catch_up()` then writes it), refuse
(`reject(...)`: Accepted or ResolvedRefs False with a reason and message), or add raw entries
(`add_parent_status`) as another controller would.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

PATH = re.compile(r"^/apis/gateway\.networking\.k8s\.io/v1/namespaces/([^/]+)/httproutes"
                  r"(?:/([^/]+))?$")


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeController:
    """The Gateway implementation's status writer. mode: "accept", "lag" (writes nothing) or
    "reject" (the `reject_condition` is False with `reject_reason` / `reject_message`);
    `only`, when set, limits "lag"/"reject" to those HTTPRoute names (others are accepted)."""

    name: str = "example.net/fake-gateway-controller"
    mode: str = "accept"
    reject_condition: str = "Accepted"
    reject_reason: str = "NotAllowedByListeners"
    reject_message: str = "no listener of the parent Gateway allows this route"
    only: set[str] | None = None

    def mode_for(self, name: str) -> str:
        return self.mode if self.only is None or name in self.only else "accept"

    def write_status(self, obj: dict[str, Any]) -> bool:
        """Set this controller's entries in obj's status for its current generation, as a
        status update would; False (nothing written) when lagging."""
        meta = obj["metadata"]
        mode = self.mode_for(meta["name"])
        if mode == "lag":
            return False
        generation = meta["generation"]
        parents = obj.setdefault("status", {}).setdefault("parents", [])
        for ref in obj.get("spec", {}).get("parentRefs") or []:
            conditions = {kind: _condition(kind, "True", kind, f"{kind} (fake controller)",
                                           generation)
                          for kind in ("Accepted", "ResolvedRefs")}
            if mode == "reject":
                conditions[self.reject_condition] = _condition(
                    self.reject_condition, "False", self.reject_reason, self.reject_message,
                    generation)
            entry = {"parentRef": dict(ref), "controllerName": self.name,
                     "conditions": list(conditions.values())}
            parents[:] = [p for p in parents if not (p.get("controllerName") == self.name
                                                      and p.get("parentRef") == ref)]
            parents.append(entry)
        return True


def _condition(kind: str, status: str, reason: str, message: str,
               generation: int) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": "2025-01-01T00:00:00Z"}


@dataclass
class FakeState:
    token: str | None = None
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    fail_next: list[tuple[int, str]] = field(default_factory=list)  # (status, reason)
    delay_s: float = 0.0
    version: int = 0
    controller: FakeController = field(default_factory=FakeController)
    lock: threading.Lock = field(default_factory=threading.Lock)


class FakeApiServer:
    def __init__(self, *, token: str | None = None, tls: tuple[Path, Path] | None = None,
                 port: int = 0, state: FakeState | None = None):
        """`port` and `state` let a test start it again where a stopped one was, holding
        what that one held (as an API server restarted over the same etcd)."""
        self.state = state or FakeState(token=token)
        state = self.state

        class Handler(_Handler):
            fake = state

        self.httpd = _Server(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.scheme = "http"
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Down for every client: the open keep-alive connections are closed too."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.httpd.close_connections()

    @property
    def requests(self) -> list[Recorded]:
        return self.state.requests

    def stored(self, namespace: str = "default") -> dict[str, dict[str, Any]]:
        return {name: obj for (ns, name), obj in self.state.objects.items() if ns == namespace}

    # --- the controller ---

    @property
    def controller(self) -> FakeController:
        return self.state.controller

    def lag(self, only: set[str] | None = None) -> None:
        """From now on, write no status (for `only` these route names, if given)."""
        with self.state.lock:
            self.controller.mode, self.controller.only = "lag", only

    def reject(self, condition: str = "Accepted", reason: str = "NotAllowedByListeners",
               message: str = "no listener of the parent Gateway allows this route",
               only: set[str] | None = None) -> None:
        """From now on, refuse applied routes (`only` these names, if given) with `condition`
        False; the routes already stored are refused at once (their generation observed)."""
        with self.state.lock:
            controller = self.controller
            controller.mode, controller.only = "reject", only
            controller.reject_condition, controller.reject_reason = condition, reason
            controller.reject_message = message
            self._reconcile_all()

    def catch_up(self) -> None:
        """Accept everything from now on, and write status for every stored route now."""
        with self.state.lock:
            self.controller.mode, self.controller.only = "accept", None
            self._reconcile_all()

    def add_parent_status(self, namespace: str, name: str, entry: dict[str, Any]) -> None:
        """Append a raw status.parents entry, as another controller (or parent) would."""
        with self.state.lock:
            obj = self.state.objects[(namespace, name)]
            obj.setdefault("status", {}).setdefault("parents", []).append(entry)
            self._bump(obj)

    def _reconcile_all(self) -> None:
        for obj in self.state.objects.values():
            if self.controller.write_status(obj):
                self._bump(obj)

    def _bump(self, obj: dict[str, Any]) -> None:
        self.state.version += 1
        obj["metadata"]["resourceVersion"] = str(self.state.version)


class _Server(ThreadingHTTPServer):
    """Keeps its open connections, so stop() can close them as a stopped server would."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connections: set[socket.socket] = set()

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        for connection in list(self.connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeState
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; without this, Nagle + delayed ACK add 40 ms.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # --- plumbing ---

    def _begin(self) -> tuple[re.Match[str] | None, dict[str, list[str]], bytes] | None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        query = parse_qs(parts.query)
        with self.fake.lock:
            self.fake.requests.append(Recorded(self.command, parts.path, query,
                                               {k.lower(): v for k, v in self.headers.items()},
                                               body))
            failure = self.fake.fail_next.pop(0) if self.fake.fail_next else None
        if self.fake.delay_s:
            time.sleep(self.fake.delay_s)
        if failure:
            self._status(failure[0], failure[1], f"injected {failure[0]}")
            return None
        if self.fake.token and self.headers.get("Authorization") != f"Bearer {self.fake.token}":
            self._status(401, "Unauthorized", "Unauthorized")
            return None
        return PATH.match(parts.path), query, body

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Failure", "message": message, "reason": reason,
                          "code": code})

    # --- verbs ---

    def do_PATCH(self) -> None:
        begun = self._begin()
        if begun is None:
            return
        match, query, body = begun
        if not match or not match.group(2):
            return self._status(404, "NotFound", "the server could not find the resource")
        if self.headers.get("Content-Type") != "application/apply-patch+yaml":
            return self._status(415, "UnsupportedMediaType", "apply needs apply-patch+yaml")
        if query.get("fieldManager") != ["fleetctl"]:
            return self._status(422, "Invalid", "fieldManager is required for apply")
        obj = _parse(body)
        namespace, name = match.group(1), match.group(2)
        if obj.get("kind") != "HTTPRoute" or obj["metadata"].get("name") != name:
            return self._status(400, "BadRequest", "the body does not name this HTTPRoute")
        self._send(*self._store(namespace, name, obj))

    def _store(self, namespace: str, name: str, obj: dict[str, Any]) -> tuple[int, dict]:
        with self.fake.lock:
            previous = self.fake.objects.get((namespace, name))
            self.fake.version += 1
            meta = obj["metadata"]
            meta["namespace"] = namespace
            meta["resourceVersion"] = str(self.fake.version)
            meta["uid"] = (previous or {}).get("metadata", {}).get("uid", f"uid-{name}")
            meta["creationTimestamp"] = ((previous or {}).get("metadata", {})
                                         .get("creationTimestamp", time.time()))
            changed = previous is None or previous.get("spec") != obj.get("spec")
            generation = (previous or {}).get("metadata", {}).get("generation", 0)
            meta["generation"] = generation + 1 if changed else generation
            # status is a subresource: an apply of the object neither sets nor clears it
            obj.pop("status", None)
            if previous is not None and "status" in previous:
                obj["status"] = previous["status"]
            self.fake.objects[(namespace, name)] = obj
            answer = copy.deepcopy(obj)
            # the controller's status update, a separate write right after (done before the
            # answer so tests are deterministic; a real controller takes ms to seconds)
            if self.fake.controller.write_status(obj):
                self.fake.version += 1
                meta["resourceVersion"] = str(self.fake.version)
        return (201 if previous is None else 200), answer

    def do_GET(self) -> None:
        begun = self._begin()
        if begun is None:
            return
        match, query, _ = begun
        if not match:
            return self._status(404, "NotFound", "the server could not find the resource")
        namespace, name = match.group(1), match.group(2)
        with self.fake.lock:
            if name:
                obj = self.fake.objects.get((namespace, name))
                if obj is None:
                    return self._status(404, "NotFound", f'httproutes "{name}" not found')
                return self._send(200, obj)
            wanted = _selector(query.get("labelSelector", [""])[0])
            items = [obj for (ns, _), obj in sorted(self.fake.objects.items())
                     if ns == namespace and _labels_match(obj, wanted)]
        self._send(200, {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRouteList",
                         "metadata": {"resourceVersion": str(self.fake.version)},
                         "items": items})

    def do_DELETE(self) -> None:
        begun = self._begin()
        if begun is None:
            return
        match, _, _ = begun
        if not match or not match.group(2):
            return self._status(404, "NotFound", "the server could not find the resource")
        with self.fake.lock:
            gone = self.fake.objects.pop((match.group(1), match.group(2)), None)
        if gone is None:
            return self._status(404, "NotFound", f'httproutes "{match.group(2)}" not found')
        self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


def _parse(body: bytes) -> Any:
    """An apply patch is YAML; JSON is YAML, and json parses it much faster than PyYAML."""
    try:
        return json.loads(body)
    except ValueError:
        return yaml.safe_load(body)


def _selector(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def _labels_match(obj: dict[str, Any], wanted: dict[str, str]) -> bool:
    labels = obj.get("metadata", {}).get("labels", {})
    return all(labels.get(k) == v for k, v in wanted.items())
