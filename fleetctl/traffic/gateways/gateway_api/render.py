"""Gateway API objects for one gateway, rendered from a DesiredState by pure functions.

Matching. The Gateway API cannot read a body, so routes match the model *header*
(`DesiredState.model_header`), which something in front must set from the body — a body-based
routing extension (e.g. the Gateway API Inference Extension's) or the client. Each HTTPRoute
has one rule: an Exact match per path with header matches on model, residency (pinned routes)
and latency class (when the route has one), and `backendRefs` to the pools' backends with
`weight` in basis points (weights are relative integers 0..1,000,000; weight-0 refs are
allowed and receive nothing, but fleetctl leaves pools at 0 out).

A pool's backend (option `services`) is a Service (core group, a port) or an InferencePool
of the Gateway API Inference Extension's v1 API (group inference.networking.k8s.io, no port:
the InferencePool's targetPorts and its endpoint picker choose the model server). Weights,
drains and residency are the same over either: the weight is on the backendRef, and
residency is the pool's jurisdiction whatever its backend. The RequestMirror filter always
names the shadow collector's Service, never an InferencePool (options.MIRROR_TO_POOL says why).

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fleetctl.traffic.gateways.base import (
    MIRROR_AUTH_HEADER,
    MIRROR_HEADER,
    TOTAL_WEIGHT,
    AdapterError,
    DesiredState,
    GatewaySpec,
    RouteSpec,
)
from fleetctl.traffic.gateways.gateway_api.options import (
    DEFAULT_PORT,
    METHODS,
    BackendRef,
    GatewayApiOptions,
    backend_key,
)
from fleetctl.traffic.gateways.schema import parse_options
from fleetctl.traffic.gateways.targets import route_target

GROUP = "gateway.networking.k8s.io"
API_VERSION = f"{GROUP}/v1"
MANAGED_BY = "app.kubernetes.io/managed-by"
GATEWAY_LABEL = "fleetctl.io/gateway"
ROLE_LABEL = "fleetctl.io/role"
ROUTE_ANNOTATION = "fleetctl.io/route"
FIELD_MANAGER = "fleetctl"
MAX_MATCHES_PER_RULE = 64
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")




@dataclass(frozen=True)
class GatewayApiSettings:
    """What rendering and the adapter work from: the options with the parent Gateway's
    defaults filled in (the fleetctl gateway's name, the routes' namespace)."""

    gateway: str
    api_url: str
    namespace: str
    parent_name: str
    parent_namespace: str
    section_name: str | None
    hostnames: tuple[str, ...]
    services: dict[str, BackendRef]
    paths: tuple[str, ...]
    token: str | None
    token_file: str | None
    ca_file: str | None
    timeout_s: float
    require_status: bool = True
    controller_name: str | None = None
    status_wait_s: float = 5.0
    # The shadow collector's Service (option shadow_collector_service); None: no mirroring.
    collector: BackendRef | None = None

    @classmethod
    def from_gateway(cls, gateway: GatewaySpec) -> GatewayApiSettings:
        return cls.of(gateway.name, gateway.admin_address,
                      parse_options(GatewayApiOptions, gateway.options, "Gateway API"))

    @classmethod
    def of(cls, gateway: str, api_url: str, options: GatewayApiOptions) -> GatewayApiSettings:
        return cls(
            gateway=gateway,
            api_url=api_url.rstrip("/"),
            namespace=options.namespace,
            parent_name=options.gateway_name or gateway,
            parent_namespace=options.gateway_namespace or options.namespace,
            section_name=options.section_name,
            hostnames=options.hostnames,
            services=dict(options.services),
            paths=options.paths,
            token=options.token,
            token_file=options.token_file,
            ca_file=options.ca_file,
            timeout_s=options.timeout_s,
            require_status=options.require_status,
            controller_name=options.controller_name,
            status_wait_s=options.status_wait_s,
            collector=_collector(options.shadow_collector_service),
        )

    def backend(self, pool: str) -> BackendRef:
        """The pool's Service or InferencePool (option services; default: the Service named
        as the pool)."""
        return self.services.get(pool) or BackendRef(name=pool, port=DEFAULT_PORT, namespace=None)

    def pool_for_ref(self, ref: dict[str, Any]) -> str:
        """The pool a stored backendRef sends to: the one whose backend has its group, kind,
        namespace and name; else (a Service fleetctl defaulted) its name."""
        key = backend_key(ref)
        for pool, backend in self.services.items():
            if backend.key() == key:
                return pool
        return key[3]

    @property
    def collection(self) -> str:
        return f"/apis/{GROUP}/v1/namespaces/{self.namespace}/httproutes"


def _collector(value: str | None) -> BackendRef | None:
    if not value:
        return None
    name, _, port = value.rpartition(":")
    return BackendRef(name=name, port=int(port), namespace=None)


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
        if desired.mirror_url and route.mirror_bp > 0 and settings.collector is not None:
            rule["filters"] = mirror_filters(route, settings.collector)
    return _object(route_name(settings, route.key), "route", settings, [rule], {
        ROUTE_ANNOTATION: route.key,
        "fleetctl.io/model": route.model,
        "fleetctl.io/revision": str(route.revision),
    })


def _backend_refs(route: RouteSpec, desired: DesiredState,
                  settings: GatewayApiSettings) -> list[dict[str, Any]]:
    refs = []
    for pool, weight in sorted(route.weights.items()):
        route_target(route, pool, weight, desired)
        if weight <= 0:
            continue
        refs.append({**settings.backend(pool).backend_ref(), "weight": weight})
    return refs


def mirror_filters(route: RouteSpec, collector: BackendRef) -> list[dict[str, Any]]:
    """Copy `mirror_bp` of the route's requests to the collector's Service: a RequestMirror
    filter with `percent` when the share is whole percent, else `fraction` in basis points
    (both are experimental-channel fields of Gateway API v1.2+; an implementation on the
    standard channel mirrors every request or refuses the route: check yours). The route
    header and the mirror auth header are set on the rule, replacing any the client sent, so
    the live backends see them too: the API has no header change for the copy alone. The
    token is this gateway's for this route only, but a pool of the route can read it; where
    that matters, mirror through Envoy or nginx (docs/shadow.md)."""
    mirror: dict[str, Any] = {"backendRef": collector.backend_ref()}
    if route.mirror_bp % 100 == 0:
        mirror["percent"] = route.mirror_bp // 100
    else:
        mirror["fraction"] = {"numerator": route.mirror_bp, "denominator": TOTAL_WEIGHT}
    headers = [{"name": MIRROR_HEADER, "value": route.key}]
    modifier: dict[str, Any] = {"set": headers}
    if route.mirror_auth:
        headers.append({"name": MIRROR_AUTH_HEADER, "value": route.mirror_auth})
    else:
        modifier["remove"] = [MIRROR_AUTH_HEADER]
    return [
        {"type": "RequestHeaderModifier", "requestHeaderModifier": modifier},
        {"type": "RequestMirror", "requestMirror": mirror},
    ]


def held_mirror(item: dict[str, Any]) -> int:
    """One stored HTTPRoute -> its mirror share in basis points (0: none)."""
    rules = item.get("spec", {}).get("rules") or [{}]
    for rule_filter in rules[0].get("filters") or []:
        mirror = rule_filter.get("requestMirror") if isinstance(rule_filter, dict) else None
        if rule_filter.get("type") != "RequestMirror" or not isinstance(mirror, dict):
            continue
        try:
            if "fraction" in mirror:
                fraction = mirror["fraction"]
                return int(fraction["numerator"]) * TOTAL_WEIGHT // int(
                    fraction.get("denominator", 100))
            return int(mirror.get("percent", 100)) * 100
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return 0
    return 0


def held_weights(item: dict[str, Any], settings: GatewayApiSettings) -> dict[str, int]:
    """One stored HTTPRoute -> {pool: basis points > 0}, from its first rule."""
    rules = item.get("spec", {}).get("rules") or [{}]
    held: dict[str, int] = {}
    for ref in rules[0].get("backendRefs") or []:
        weight = int(ref.get("weight", 1))
        if weight > 0:
            pool = settings.pool_for_ref(ref)
            held[pool] = held.get(pool, 0) + weight
    return held
