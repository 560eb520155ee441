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

InferencePools (the Gateway API Inference Extension's v1 API, group
inference.networking.k8s.io) are stored at their own path and checked against the CRD's
schema as the real API server would (422 Invalid naming the field): `spec.selector.matchLabels`
(required, non-empty), `spec.targetPorts` (1 to 8 unique port numbers), `spec.appProtocol`
(http or kubernetes.io/h2c), `spec.endpointPickerRef` (name; kind defaulting to Service, which
needs `port.number`; failureMode FailOpen or FailClose). HTTPRoutes are checked for what their
CRD enforces on backendRefs (a name; a port on a Service ref; weight 0..1,000,000). Whether a
backendRef *resolves* is the Gateway implementation's call, not the API server's: the fake
controller sets ResolvedRefs False with reason BackendNotFound for a ref to an InferencePool
that is not stored and InvalidKind for a kind it does not know (and for an InferencePool as
a RequestMirror backendRef, which Envoy AI Gateway, for one, refuses), and re-writes the
status of every route when an InferencePool is created or deleted, as a controller watching
them would. On a real cluster that behaviour comes from the Gateway implementation with the
Inference Extension's support (Envoy Gateway with Envoy AI Gateway, kgateway, Istio, GKE
Gateway, NGINX Gateway Fabric...), and a real one also writes InferencePool status, which
this fake does not. Services are not modelled: a Service ref always resolves.
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
POOL_PATH = re.compile(r"^/apis/inference\.networking\.k8s\.io/v1/namespaces/([^/]+)/"
                       r"inferencepools(?:/([^/]+))?$")
INFERENCE_GROUP = "inference.networking.k8s.io"
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                           r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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

    def write_status(self, obj: dict[str, Any],
                     pools: dict[tuple[str, str], dict[str, Any]] | None = None) -> bool:
        """Set this controller's entries in obj's status for its current generation, as a
        status update would; False (nothing written) when lagging. `pools`: the stored
        InferencePools its backendRefs are resolved against."""
        meta = obj["metadata"]
        mode = self.mode_for(meta["name"])
        if mode == "lag":
            return False
        generation = meta["generation"]
        parents = obj.setdefault("status", {}).setdefault("parents", [])
        unresolved = unresolved_ref(obj, pools or {})
        for ref in obj.get("spec", {}).get("parentRefs") or []:
            conditions = {kind: _condition(kind, "True", kind, f"{kind} (fake controller)",
                                           generation)
                          for kind in ("Accepted", "ResolvedRefs")}
            if unresolved:
                conditions["ResolvedRefs"] = _condition("ResolvedRefs", "False", *unresolved,
                                                        generation)
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


def unresolved_ref(route: dict[str, Any],
                   pools: dict[tuple[str, str], dict[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) of the first backendRef of `route` that does not resolve, as a
    Gateway implementation supporting InferencePools would say it; None when all do."""
    namespace = route["metadata"]["namespace"]
    for rule in route.get("spec", {}).get("rules") or []:
        refs = [(ref, False) for ref in rule.get("backendRefs") or []]
        refs += [(f["requestMirror"]["backendRef"], True) for f in rule.get("filters") or []
                 if f.get("type") == "RequestMirror" and f.get("requestMirror")]
        for ref, mirror in refs:
            group, kind = ref.get("group") or "", ref.get("kind") or "Service"
            where = f"{ref.get('namespace') or namespace}/{ref.get('name')}"
            if (group, kind) == ("", "Service"):
                continue  # Services are not modelled: they resolve
            if (group, kind) != (INFERENCE_GROUP, "InferencePool"):
                return "InvalidKind", f"unsupported backendRef {group}/{kind} {where}"
            if mirror:
                return "InvalidKind", (f"InferencePool {where} as a RequestMirror backendRef "
                                       "is not supported")
            if (ref.get("namespace") or namespace, ref.get("name")) not in pools:
                return "BackendNotFound", f'inferencepools "{where}" not found'
    return None


def _condition(kind: str, status: str, reason: str, message: str,
               generation: int) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": "2025-01-01T00:00:00Z"}


@dataclass
class FakeState:
    token: str | None = None
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # HTTPRoutes
    pools: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # InferencePools
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

    def put_inference_pool(self, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an InferencePool as `kubectl apply` would (what the model servers' deployment
        does, not fleetctl): checked against the CRD schema (ValueError with the API server's
        message when invalid); every route's status is then re-written."""
        problems = inference_pool_problems(obj)
        if problems:
            raise ValueError(invalid_message("InferencePool", obj, problems))
        with self.state.lock:
            _store_pool(self.state, namespace, obj)
        return obj

    def delete_inference_pool(self, namespace: str, name: str) -> None:
        with self.state.lock:
            self.state.pools.pop((namespace, name))
            self._reconcile_all()

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
        _reconcile_all(self.state)

    def _bump(self, obj: dict[str, Any]) -> None:
        _bump(self.state, obj)


def _bump(state: FakeState, obj: dict[str, Any]) -> None:
    state.version += 1
    obj["metadata"]["resourceVersion"] = str(state.version)


def _reconcile_all(state: FakeState) -> None:
    """The controller re-writes every route's status (a watched object changed)."""
    for obj in state.objects.values():
        if state.controller.write_status(obj, state.pools):
            _bump(state, obj)


def _store_pool(state: FakeState, namespace: str, obj: dict[str, Any]) -> None:
    """Store an InferencePool (the caller holds the lock and checked it)."""
    state.version += 1
    meta = obj["metadata"]
    previous = state.pools.get((namespace, meta["name"]))
    meta["namespace"] = namespace
    meta["resourceVersion"] = str(state.version)
    changed = previous is None or previous.get("spec") != obj.get("spec")
    generation = (previous or {}).get("metadata", {}).get("generation", 0)
    meta["generation"] = generation + 1 if changed else generation
    state.pools[(namespace, meta["name"])] = obj
    _reconcile_all(state)


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
        return PATH.match(parts.path) or POOL_PATH.match(parts.path), query, body

    def _collection(self, match: re.Match[str]) -> tuple[dict[tuple[str, str], Any], str, str]:
        """The store a path names, its resource (plural) and its apiVersion."""
        if match.re is POOL_PATH:
            return self.fake.pools, "inferencepools", f"{INFERENCE_GROUP}/v1"
        return self.fake.objects, "httproutes", "gateway.networking.k8s.io/v1"

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
        kind = "InferencePool" if match.re is POOL_PATH else "HTTPRoute"
        if obj.get("kind") != kind or obj["metadata"].get("name") != name:
            return self._status(400, "BadRequest", f"the body does not name this {kind}")
        problems = (inference_pool_problems(obj) if kind == "InferencePool"
                    else httproute_problems(obj))
        if problems:
            return self._status(422, "Invalid", invalid_message(kind, obj, problems))
        if kind == "InferencePool":
            with self.fake.lock:
                previous = (namespace, name) in self.fake.pools
                _store_pool(self.fake, namespace, obj)
                answer = copy.deepcopy(obj)
            return self._send(200 if previous else 201, answer)
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
            if self.fake.controller.write_status(obj, self.fake.pools):
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
        store, resource, api_version = self._collection(match)
        with self.fake.lock:
            if name:
                obj = store.get((namespace, name))
                if obj is None:
                    return self._status(404, "NotFound", f'{resource} "{name}" not found')
                return self._send(200, obj)
            wanted = _selector(query.get("labelSelector", [""])[0])
            items = [obj for (ns, _), obj in sorted(store.items())
                     if ns == namespace and _labels_match(obj, wanted)]
        kind = "InferencePoolList" if store is self.fake.pools else "HTTPRouteList"
        self._send(200, {"apiVersion": api_version, "kind": kind,
                         "metadata": {"resourceVersion": str(self.fake.version)},
                         "items": items})

    def do_DELETE(self) -> None:
        begun = self._begin()
        if begun is None:
            return
        match, _, _ = begun
        if not match or not match.group(2):
            return self._status(404, "NotFound", "the server could not find the resource")
        store, resource, _ = self._collection(match)
        with self.fake.lock:
            gone = store.pop((match.group(1), match.group(2)), None)
            if gone is not None and store is self.fake.pools:
                _reconcile_all(self.fake)  # the controller sees the pool go
        if gone is None:
            return self._status(404, "NotFound", f'{resource} "{match.group(2)}" not found')
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


# --- what the CRDs' schemas enforce (the API server refuses with 422 Invalid) ------------------

def invalid_message(kind: str, obj: dict[str, Any], problems: list[str]) -> str:
    """The API server's message for an object its schema refuses."""
    group = INFERENCE_GROUP if kind == "InferencePool" else "gateway.networking.k8s.io"
    name = (obj.get("metadata") or {}).get("name")
    return f'{kind}.{group} "{name}" is invalid: ' + ", ".join(problems)


def _port_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def inference_pool_problems(obj: dict[str, Any]) -> list[str]:
    """What the InferencePool v1 CRD's OpenAPI schema and validation rules refuse in obj."""
    problems = []
    if obj.get("apiVersion") != f"{INFERENCE_GROUP}/v1":
        problems.append(f"apiVersion: Unsupported value: {obj.get('apiVersion')!r}: supported "
                        f'values: "{INFERENCE_GROUP}/v1"')
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not DNS_SUBDOMAIN.match(name):
        problems.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 "
                        "subdomain must consist of lower case alphanumeric characters, '-' "
                        "or '.'")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*problems, "spec: Required value"]
    labels = (spec.get("selector") or {}).get("matchLabels") if isinstance(
        spec.get("selector"), dict) else None
    if not isinstance(labels, dict) or not labels or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        problems.append("spec.selector.matchLabels: Required value: a non-empty map of "
                        "label names to values")
    ports = spec.get("targetPorts")
    if not isinstance(ports, list) or not ports:
        problems.append("spec.targetPorts: Required value")
    elif len(ports) > 8:
        problems.append(f"spec.targetPorts: Too many: {len(ports)}: must have at most 8 items")
    else:
        numbers = [p.get("number") if isinstance(p, dict) else None for p in ports]
        for i, number in enumerate(numbers):
            if not _port_number(number):
                problems.append(f"spec.targetPorts[{i}].number: Invalid value: {number!r}: "
                                "must be between 1 and 65535")
        if len(set(map(str, numbers))) != len(numbers):
            problems.append("spec.targetPorts: Invalid value: port numbers must be unique")
    if spec.get("appProtocol", "http") not in ("http", "kubernetes.io/h2c"):
        problems.append(f"spec.appProtocol: Unsupported value: {spec['appProtocol']!r}: "
                        'supported values: "http", "kubernetes.io/h2c"')
    picker = spec.get("endpointPickerRef")
    if not isinstance(picker, dict):
        problems.append("spec.endpointPickerRef: Required value")
        return problems
    if not isinstance(picker.get("name"), str) or not picker.get("name"):
        problems.append("spec.endpointPickerRef.name: Required value")
    kind = picker.get("kind", "Service")
    if kind == "Service" and (picker.get("group") or "") == "" and not _port_number(
            (picker.get("port") or {}).get("number")):
        problems.append("spec.endpointPickerRef: Invalid value: port is required when kind "
                        "is 'Service' or unspecified (defaults to 'Service')")
    if picker.get("failureMode", "FailClose") not in ("FailOpen", "FailClose"):
        problems.append(f"spec.endpointPickerRef.failureMode: Unsupported value: "
                        f'{picker["failureMode"]!r}: supported values: "FailOpen", "FailClose"')
    return problems


def httproute_problems(obj: dict[str, Any]) -> list[str]:
    """What the HTTPRoute CRD refuses in the backendRefs (of rules and RequestMirror filters):
    a missing name, a Service ref without port, a weight outside 0..1,000,000."""
    problems = []
    for r, rule in enumerate((obj.get("spec") or {}).get("rules") or []):
        refs = [(f"spec.rules[{r}].backendRefs[{i}]", ref)
                for i, ref in enumerate(rule.get("backendRefs") or [])]
        refs += [(f"spec.rules[{r}].filters[{i}].requestMirror.backendRef",
                  f["requestMirror"].get("backendRef") or {})
                 for i, f in enumerate(rule.get("filters") or [])
                 if f.get("type") == "RequestMirror" and f.get("requestMirror")]
        for where, ref in refs:
            if not ref.get("name"):
                problems.append(f"{where}.name: Required value")
            if ((ref.get("group") or "", ref.get("kind") or "Service") == ("", "Service")
                    and "port" not in ref):
                problems.append(f"{where}: Invalid value: Must have port for Service "
                                "reference")
            weight = ref.get("weight", 1)
            if not isinstance(weight, int) or not 0 <= weight <= 1_000_000:
                problems.append(f"{where}.weight: Invalid value: {weight!r}: must be between "
                                "0 and 1000000")
    return problems
