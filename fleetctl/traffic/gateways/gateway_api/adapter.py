"""Kubernetes Gateway API adapter: one HTTPRoute (gateway.networking.k8s.io/v1) per route,
written by server-side apply, read back from the API server.

`GatewaySpec.admin_address` is the API server URL. Options: `namespace` (of the HTTPRoutes,
default "default"), `gateway_name` and `gateway_namespace` (the parent Gateway; default: the
fleetctl gateway's name and `namespace`), `section_name`, `hostnames`, `services` (pool ->
{"name", "port", "namespace"} or just a service name; default: the pool's name, port 8000),
`paths` (the OpenAI endpoints routed; default chat/completions, completions, embeddings),
`token` or `token_file` (bearer token; the file is read at every call, so a rotated service
account token is picked up), `ca_file` (CA bundle for the API server), `timeout_s` (2),
`require_status` (default true: see what "held" means below), `status_wait_s` (5: how long a
read-back waits for the controller to observe a new generation before calling it not held)
and `controller_name` (the GatewayClass's `spec.controllerName`; when set, only that
controller's status counts).

Matching. The Gateway API cannot read a body, so routes match the model *header*
(`DesiredState.model_header`), which something in front must set from the body — a body-based
routing extension (e.g. the Gateway API Inference Extension's) or the client. Each HTTPRoute
has one rule: an Exact match per path with header matches on model, residency (pinned routes)
and latency class (when the route has one), and `backendRefs` to the pools' Services with
`weight` in basis points (weights are relative integers 0..1,000,000; weight-0 refs are
allowed and receive nothing, but fleetctl leaves pools at 0 out).

Residency fails closed through the spec's match precedence (Exact path > method > number of
header matches > ...), which every conformant implementation must follow:
- a pinned route's matches also require `method: POST`;
- a guard HTTPRoute (`fleetctl-<gateway>-residency-guard`) matches every method on the same
  paths when the residency header is present at all (one RegularExpression `.*` header match)
  and has no backendRefs;
- unpinned routes match no method.
So a request carrying the residency header J reaches a route pinned to J (method + ≥ 2 headers
beat the guard's method + 1 header) or the guard, which answers 500 (the spec's answer for a
rule without backendRefs: "all traffic which matches this rule MUST receive a 500"); the
method tier puts the guard above every unpinned route whatever its header count. The guard is
applied before the routes, and read_back() requires it. The regex header match is
"implementation-specific" support in the spec (Envoy Gateway, Istio, Cilium, NGINX Gateway
Fabric... have it): check your implementation.
A route with empty weights gets a rule without backendRefs: 500 as well, never another pool.

What "applied" means here: the API server stored the objects. The Gateway implementation then
takes them asynchronously. What "held" means (read_back()): each of fleetctl's HTTPRoutes —
routes and guard — has, for the parentRef fleetctl rendered, a `status.parents[]` entry (of
`controller_name`'s controller when that option is set, else of every controller that wrote
one for that parentRef) whose `Accepted` condition is "True" with `observedGeneration` >=
`metadata.generation`, and no `Accepted` or `ResolvedRefs` condition "False" for that
generation. A controller takes a moment to observe a new generation, so read_back() re-reads
for up to `status_wait_s` while the only problem is lag (a refusal ends the wait at once) —
otherwise nearly every push's first attempt would fail and turn the gateway red for a retry.
After that it raises AdapterError naming the route and why: retryable
while the controller has not yet observed the generation (no entry, older or missing
`observedGeneration`, `Accepted` "Unknown"); permanent when it observed it and refused it (the
condition, reason and message are in the error). `require_status: false` skips the check, for
implementations that write no status. Status says the controller accepted the route, not that
every data-plane replica has it: read_back() reads the API objects, not the data plane.
In-flight requests are not observable through the API: in_flight() returns -1, and a drain on
this kind is verified by read-back only.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fleetctl.traffic.gateways.base import (
    Adapter,
    AdapterError,
    ApplyResult,
    DesiredState,
    GatewaySpec,
    RouteSpec,
    register,
)

GROUP = "gateway.networking.k8s.io"
API_VERSION = f"{GROUP}/v1"
MANAGED_BY = "app.kubernetes.io/managed-by"
GATEWAY_LABEL = "fleetctl.io/gateway"
ROLE_LABEL = "fleetctl.io/role"
ROUTE_ANNOTATION = "fleetctl.io/route"
FIELD_MANAGER = "fleetctl"
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
DEFAULT_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
DEFAULT_PORT = 8000
STATUS_POLL_S = 0.1  # re-read interval while waiting for the controller (status_wait_s)
MAX_MATCHES_PER_RULE = 64
MAX_MATCHES_PER_ROUTE = 128
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class ServiceRef:
    name: str
    port: int
    namespace: str | None


@dataclass(frozen=True)
class GatewayApiSettings:
    gateway: str
    api_url: str
    namespace: str
    parent_name: str
    parent_namespace: str
    section_name: str | None
    hostnames: tuple[str, ...]
    services: dict[str, ServiceRef]
    paths: tuple[str, ...]
    token: str | None
    token_file: str | None
    ca_file: str | None
    timeout_s: float
    require_status: bool = True
    controller_name: str | None = None
    status_wait_s: float = 5.0

    @classmethod
    def from_gateway(cls, gateway: GatewaySpec) -> GatewayApiSettings:
        opts = gateway.options
        namespace = str(opts.get("namespace", "default"))
        paths = tuple(opts.get("paths", DEFAULT_PATHS))
        if len(paths) * len(METHODS) > MAX_MATCHES_PER_ROUTE:
            raise AdapterError(f"at most {MAX_MATCHES_PER_ROUTE // len(METHODS)} paths fit the "
                               "residency guard", permanent=True)
        require_status = opts.get("require_status", True)
        if not isinstance(require_status, bool):
            raise AdapterError(f"option require_status must be true or false, not "
                               f"{require_status!r}", permanent=True)
        status_wait_s = opts.get("status_wait_s", 5.0)
        if (isinstance(status_wait_s, bool) or not isinstance(status_wait_s, int | float)
                or not 0 <= status_wait_s <= 300):
            raise AdapterError(f"option status_wait_s must be a number of seconds from 0 to "
                               f"300, not {status_wait_s!r}", permanent=True)
        controller_name = opts.get("controller_name")
        if controller_name is not None and (not isinstance(controller_name, str)
                                            or not controller_name):
            raise AdapterError(f"option controller_name must be a non-empty string (a "
                               f"GatewayClass controllerName), not {controller_name!r}",
                               permanent=True)
        return cls(
            gateway=gateway.name,
            api_url=gateway.admin_address.rstrip("/"),
            namespace=namespace,
            parent_name=str(opts.get("gateway_name", gateway.name)),
            parent_namespace=str(opts.get("gateway_namespace", namespace)),
            section_name=opts.get("section_name"),
            hostnames=tuple(opts.get("hostnames", ())),
            services={pool: _service_ref(pool, value)
                      for pool, value in dict(opts.get("services", {})).items()},
            paths=paths,
            token=opts.get("token"),
            token_file=opts.get("token_file"),
            ca_file=opts.get("ca_file"),
            timeout_s=float(opts.get("timeout_s", 2.0)),
            require_status=require_status,
            controller_name=controller_name,
            status_wait_s=float(status_wait_s),
        )

    def service(self, pool: str) -> ServiceRef:
        return self.services.get(pool) or ServiceRef(name=pool, port=DEFAULT_PORT, namespace=None)

    def pool_for_service(self, name: str) -> str:
        for pool, ref in self.services.items():
            if ref.name == name:
                return pool
        return name

    @property
    def collection(self) -> str:
        return f"/apis/{GROUP}/v1/namespaces/{self.namespace}/httproutes"


def _service_ref(pool: str, value: Any) -> ServiceRef:
    if isinstance(value, str):
        return ServiceRef(name=value, port=DEFAULT_PORT, namespace=None)
    return ServiceRef(name=str(value.get("name", pool)), port=int(value.get("port", DEFAULT_PORT)),
                      namespace=value.get("namespace"))


# --- rendering ------------------------------------------------------------------------------------

def route_name(settings: GatewayApiSettings, key: str) -> str:
    return f"fleetctl-{settings.gateway}-{key}"


def guard_name(settings: GatewayApiSettings) -> str:
    return f"fleetctl-{settings.gateway}-residency-guard"


def render_routes(desired: DesiredState, settings: GatewayApiSettings) -> list[dict[str, Any]]:
    """Every object to apply, the residency guard first."""
    if not DNS_LABEL.match(settings.gateway):
        raise AdapterError(f"gateway name {settings.gateway!r} is not a DNS label",
                           permanent=True)
    return [render_guard(desired, settings)] + [render_route(r, desired, settings)
                                                for r in desired.routes]


def parent_refs(settings: GatewayApiSettings) -> list[dict[str, Any]]:
    """The parentRefs of every HTTPRoute fleetctl renders (one: the parent Gateway)."""
    parent: dict[str, Any] = {"group": GROUP, "kind": "Gateway", "name": settings.parent_name,
                              "namespace": settings.parent_namespace}
    if settings.section_name:
        parent["sectionName"] = settings.section_name
    return [parent]


def _object(name: str, role: str, settings: GatewayApiSettings, rules: list[dict[str, Any]],
            annotations: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {"parentRefs": parent_refs(settings), "rules": rules}
    if settings.hostnames:
        spec["hostnames"] = list(settings.hostnames)
    return {
        "apiVersion": API_VERSION,
        "kind": "HTTPRoute",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {MANAGED_BY: "fleetctl", GATEWAY_LABEL: settings.gateway, ROLE_LABEL: role},
            "annotations": annotations,
        },
        "spec": spec,
    }


def render_guard(desired: DesiredState, settings: GatewayApiSettings) -> dict[str, Any]:
    present = {"type": "RegularExpression", "name": desired.residency_header, "value": ".*"}
    matches = [{"path": {"type": "Exact", "value": path}, "method": method, "headers": [present]}
               for path in settings.paths for method in METHODS]
    rules = [{"matches": matches[i:i + MAX_MATCHES_PER_RULE]}
             for i in range(0, len(matches), MAX_MATCHES_PER_RULE)]
    return _object(guard_name(settings), "residency-guard", settings, rules, {
        "fleetctl.io/purpose": "requests naming a jurisdiction that no pinned route serves get "
                               "500 here instead of reaching an unpinned route"})


def render_route(route: RouteSpec, desired: DesiredState,
                 settings: GatewayApiSettings) -> dict[str, Any]:
    if not DNS_LABEL.match(route.key):
        raise AdapterError(f"route key {route.key!r} is not a DNS label", permanent=True)
    headers = [{"type": "Exact", "name": desired.model_header, "value": route.model}]
    if route.residency:
        headers.append({"type": "Exact", "name": desired.residency_header,
                        "value": route.residency})
    if route.latency_class:
        headers.append({"type": "Exact", "name": desired.latency_class_header,
                        "value": route.latency_class})
    matches = []
    for path in settings.paths:
        match: dict[str, Any] = {"path": {"type": "Exact", "value": path}, "headers": headers}
        if route.residency:
            match["method"] = "POST"  # the tier that puts pinned routes above the guard
        matches.append(match)
    rule: dict[str, Any] = {"matches": matches}
    refs = _backend_refs(route, desired, settings)
    if refs:
        rule["backendRefs"] = refs
    return _object(route_name(settings, route.key), "route", settings, [rule], {
        ROUTE_ANNOTATION: route.key,
        "fleetctl.io/model": route.model,
        "fleetctl.io/revision": str(route.revision),
    })


def _backend_refs(route: RouteSpec, desired: DesiredState,
                  settings: GatewayApiSettings) -> list[dict[str, Any]]:
    refs = []
    for pool, weight in sorted(route.weights.items()):
        target = desired.pools.get(pool)
        if target is None:
            raise AdapterError(f"route {route.key}: pool {pool} is not declared", permanent=True)
        if route.residency and target.jurisdiction != route.residency and weight:
            raise AdapterError(f"route {route.key} is pinned to {route.residency}; pool {pool} "
                               f"is in {target.jurisdiction}", permanent=True)
        if weight <= 0:
            continue
        service = settings.service(pool)
        ref: dict[str, Any] = {"group": "", "kind": "Service", "name": service.name,
                               "port": service.port, "weight": weight}
        if service.namespace:
            ref["namespace"] = service.namespace  # needs a ReferenceGrant in that namespace
        refs.append(ref)
    return refs


def held_weights(item: dict[str, Any], settings: GatewayApiSettings) -> dict[str, int]:
    """One stored HTTPRoute -> {pool: basis points > 0}, from its first rule."""
    rules = item.get("spec", {}).get("rules") or [{}]
    held: dict[str, int] = {}
    for ref in rules[0].get("backendRefs") or []:
        weight = int(ref.get("weight", 1))
        if weight > 0:
            pool = settings.pool_for_service(str(ref.get("name")))
            held[pool] = held.get(pool, 0) + weight
    return held


# --- status: has the Gateway implementation taken it? ------------------------------------------

@dataclass(frozen=True)
class NotHeld:
    """Why one stored HTTPRoute does not count as held."""

    message: str
    rejected: bool  # the controller observed this generation and refused it


def _same_parent(ref: dict[str, Any], ours: dict[str, Any], route_namespace: str) -> bool:
    """Does a status entry's parentRef name our parentRef? Unset fields take the API's
    defaults (group gateway.networking.k8s.io, kind Gateway, the route's namespace)."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r.get("group", GROUP), r.get("kind", "Gateway"),
                r.get("namespace") or route_namespace, r.get("name"),
                r.get("sectionName") or None, r.get("port"))
    return key(ref) == key(ours)


def _observed(condition: dict[str, Any]) -> int:
    """A condition's observedGeneration; -1 when absent (it cannot vouch for any generation)."""
    try:
        return int(condition.get("observedGeneration", -1))
    except (TypeError, ValueError):
        return -1


def _parent_text(ref: dict[str, Any]) -> str:
    text = f"parent {ref.get('kind', 'Gateway')} {ref.get('namespace')}/{ref.get('name')}"
    return text + (f" section {ref['sectionName']}" if ref.get("sectionName") else "")


def status_not_held(item: dict[str, Any], settings: GatewayApiSettings) -> NotHeld | None:
    """None when, for every parentRef fleetctl rendered, the route's status has an entry
    (of `controller_name`'s controller if set, else every entry for that parentRef) with
    Accepted "True" at observedGeneration >= metadata.generation and neither Accepted nor
    ResolvedRefs "False" at that generation; else why not. Entries for other parents, and
    of other controllers when `controller_name` is set, are ignored."""
    meta = item.get("metadata") or {}
    namespace = str(meta.get("namespace") or settings.namespace)
    route = f"{namespace}/{meta.get('name')}"
    try:
        generation = int(meta.get("generation") or 0)
    except (TypeError, ValueError):
        generation = 0
    parents = (item.get("status") or {}).get("parents") or []
    lagging = f"controller has not yet observed generation {generation} of HTTPRoute {route}"
    for ours in parent_refs(settings):
        entries = [entry for entry in parents
                   if _same_parent(entry.get("parentRef") or {}, ours, namespace)
                   and (settings.controller_name is None
                        or entry.get("controllerName") == settings.controller_name)]
        if not entries:
            by = f" by {settings.controller_name}" if settings.controller_name else ""
            return NotHeld(f"{lagging} (no status{by} for {_parent_text(ours)} yet)", False)
        for entry in entries:
            controller = entry.get("controllerName") or "an unnamed controller"
            conditions = {c.get("type"): c for c in entry.get("conditions") or []
                          if isinstance(c, dict)}
            for kind in ("Accepted", "ResolvedRefs"):
                condition = conditions.get(kind)
                if (condition and condition.get("status") == "False"
                        and _observed(condition) >= generation):
                    return NotHeld(
                        f"HTTPRoute {route} generation {generation} refused by {controller} "
                        f"for {_parent_text(ours)}: {kind} is False, reason "
                        f"{condition.get('reason') or '(none)'}: "
                        f"{condition.get('message') or '(no message)'}", True)
            accepted = conditions.get("Accepted")
            if accepted is None or _observed(accepted) < generation:
                seen = ("no Accepted condition" if accepted is None
                        else "Accepted is for generation "
                             f"{accepted.get('observedGeneration', '(unset)')}")
                return NotHeld(f"{lagging} ({controller}, {_parent_text(ours)}: {seen})",
                               False)
            if accepted.get("status") != "True":
                return NotHeld(
                    f"HTTPRoute {route} generation {generation} not yet accepted by "
                    f"{controller} for {_parent_text(ours)}: Accepted is "
                    f"{accepted.get('status')}, reason {accepted.get('reason') or '(none)'}: "
                    f"{accepted.get('message') or '(no message)'}", False)
    return None


# --- the adapter ----------------------------------------------------------------------------------

@register
class GatewayApiAdapter(Adapter):
    kind = "gateway-api"
    label = "Gateway API"
    weight_resolution = "0.01 % (backendRefs weights in basis points)"

    def __init__(self, gateway: GatewaySpec) -> None:
        super().__init__(gateway)
        self.settings = GatewayApiSettings.from_gateway(gateway)
        self._guard_held = True
        self._http: httpx.Client | None = None

    def apply_checked(self, desired: DesiredState) -> ApplyResult:
        started = time.monotonic()
        objects = render_routes(desired, self.settings)
        wanted = {obj["metadata"]["name"] for obj in objects}
        for obj in objects:  # the guard first: fail-closed before any new route exists
            self._apply_one(obj)
        stale = [item["metadata"]["name"] for item in self._list()
                 if item["metadata"]["name"] not in wanted]
        for name in stale:
            self._call("DELETE", f"{self.settings.collection}/{name}", missing_ok=True)
        elapsed_ms = (time.monotonic() - started) * 1000
        return ApplyResult(applied=True, method="api", detail=(
            f"server-side applied {len(objects)} HTTPRoute(s) (1 residency guard), deleted "
            f"{len(stale)} stale, in {elapsed_ms:.0f} ms; the Gateway implementation programs "
            f"its data plane asynchronously"))

    def read_back(self) -> dict[str, dict[str, int]]:
        """The weights of fleetctl's stored HTTPRoutes — once the Gateway implementation has
        accepted their current generation (see the module notes; unless `require_status` is
        false). Until then AdapterError says which route and why: retryable while the
        controller has not observed it, permanent once it refused it."""
        deadline = time.monotonic() + self.settings.status_wait_s
        while True:
            items = self._list()
            if not self.settings.require_status:
                break
            problems = [problem for problem in (status_not_held(item, self.settings)
                                                for item in items) if problem]
            if not problems:
                break
            if any(p.rejected for p in problems) or time.monotonic() >= deadline:
                shown = "; ".join(p.message for p in problems[:3])
                more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
                raise AdapterError(f"{shown}{more}",
                                   permanent=any(p.rejected for p in problems))
            time.sleep(STATUS_POLL_S)
        roles = [item["metadata"].get("labels", {}).get(ROLE_LABEL) for item in items]
        self._guard_held = "residency-guard" in roles
        return {item["metadata"].get("annotations", {}).get(ROUTE_ANNOTATION, ""):
                held_weights(item, self.settings)
                for item, role in zip(items, roles, strict=True) if role == "route"}

    def matches(self, desired: DesiredState, held: dict[str, dict[str, int]]) -> bool:
        """Weights equal, and the residency guard is in place (without it a request naming a
        jurisdiction could reach an unpinned route)."""
        return self._guard_held and super().matches(desired, held)

    def in_flight(self, pool: str) -> int:
        return -1  # not observable through the Gateway API; drains are verified by read-back

    # --- HTTP ---

    def _client(self) -> httpx.Client:
        """One client per adapter instance (building the TLS context costs ~10 ms); the token
        is added per request, so a rotated token file takes effect at once."""
        if self._http is None:
            verify: ssl.SSLContext | bool = True
            if self.settings.ca_file:
                try:
                    verify = ssl.create_default_context(cafile=self.settings.ca_file)
                except (OSError, ssl.SSLError) as exc:
                    raise AdapterError(f"cannot load CA bundle {self.settings.ca_file}: {exc}",
                                       permanent=True) from exc
            self._http = httpx.Client(base_url=self.settings.api_url, verify=verify,
                                      timeout=httpx.Timeout(self.settings.timeout_s),
                                      follow_redirects=False,
                                      headers={"Accept": "application/json"})
        return self._http

    def _token(self) -> str | None:
        if self.settings.token:
            return self.settings.token
        if self.settings.token_file:
            try:
                return Path(self.settings.token_file).read_text().strip()
            except OSError as exc:
                raise AdapterError(f"cannot read token file {self.settings.token_file}: {exc}",
                                   permanent=True) from exc
        return None

    def _apply_one(self, obj: dict[str, Any]) -> None:
        # JSON is YAML: the API server takes it as an apply patch.
        self._call("PATCH", f"{self.settings.collection}/{obj['metadata']['name']}",
                   params={"fieldManager": FIELD_MANAGER, "force": "true"},
                   content=json.dumps(obj),
                   headers={"Content-Type": "application/apply-patch+yaml"})

    def _list(self) -> list[dict[str, Any]]:
        selector = f"{MANAGED_BY}=fleetctl,{GATEWAY_LABEL}={self.settings.gateway}"
        response = self._call("GET", self.settings.collection, params={"labelSelector": selector})
        try:
            return list(response.json().get("items") or [])
        except (ValueError, AttributeError) as exc:
            raise AdapterError(f"the API server's HTTPRoute list is not JSON: {exc}") from exc

    def _call(self, method: str, path: str, *, missing_ok: bool = False,
              headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
        what = f"{method} {self.settings.api_url}{path}"
        headers = dict(headers or {})
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            response = self._client().request(method, path, headers=headers, **kwargs)
        except httpx.TimeoutException as exc:
            raise AdapterError(f"{what} timed out after {self.settings.timeout_s:g} s") from exc
        except httpx.HTTPError as exc:
            # A certificate that does not verify is configuration: retrying cannot fix it.
            permanent = "CERTIFICATE_VERIFY_FAILED" in str(exc)
            raise AdapterError(f"{what} failed: {exc}", permanent=permanent) from exc
        status = response.status_code
        if status < 400 or (missing_ok and status == 404):
            return response
        message = _status_message(response)
        # 4xx: the request itself is wrong (auth, validation, RBAC): retrying cannot help,
        # except 408/429, which ask to come back later.
        permanent = status < 500 and status not in (408, 429)
        raise AdapterError(f"{what} answered {status}: {message}", permanent=permanent)


def _status_message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", ""))[:500] or response.reason_phrase
    except (ValueError, AttributeError):
        return response.text[:300] or response.reason_phrase
