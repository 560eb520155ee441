"""What a person sets on a Kubernetes Gateway API gateway (Gateway.options), typed and
checked by the registry."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetctl.traffic.gateways.schema import option

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
DEFAULT_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
DEFAULT_PORT = 8000
DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_MATCHES_PER_ROUTE = 128
MAX_PATHS = MAX_MATCHES_PER_ROUTE // len(METHODS)  # the residency guard matches each method


# The Gateway API Inference Extension's v1 API (the version its docs call current; v1alpha2
# lived in inference.networking.x-k8s.io and is not supported).
INFERENCE_GROUP = "inference.networking.k8s.io"
INFERENCE_POOL = "InferencePool"
SERVICE = "Service"
OLD_INFERENCE_GROUP = "inference.networking.x-k8s.io"
# A DNS-1123 subdomain: what Kubernetes requires of an InferencePool's name.
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                           r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
BACKEND_FIELDS = ("name", "port", "namespace", "group", "kind")


@dataclass(frozen=True)
class BackendRef:
    """Where an HTTPRoute sends a pool's share: a Service (core group, a port) or an
    InferencePool (group inference.networking.k8s.io, no port: the pool's spec.targetPorts
    name the model servers' ports and its endpoint picker chooses one)."""

    name: str
    port: int | None
    namespace: str | None
    group: str = ""
    kind: str = SERVICE

    @property
    def is_inference_pool(self) -> bool:
        return self.kind == INFERENCE_POOL

    def backend_ref(self) -> dict[str, Any]:
        """The backendRef object (without weight)."""
        ref: dict[str, Any] = {"group": self.group, "kind": self.kind, "name": self.name}
        if self.port is not None:
            ref["port"] = self.port
        if self.namespace:
            ref["namespace"] = self.namespace  # needs a ReferenceGrant in that namespace
        return ref

    def key(self) -> tuple[str, str, str | None, str]:
        return (self.group, self.kind, self.namespace, self.name)


def backend_key(ref: Mapping[str, Any]) -> tuple[str, str, str | None, str]:
    """A stored backendRef's (group, kind, namespace, name), with the API's defaults (core
    group, kind Service, the route's namespace as None) filled in."""
    return (str(ref.get("group") or ""), str(ref.get("kind") or SERVICE),
            ref.get("namespace") or None, str(ref.get("name")))


def _backend(pool: str, value: Mapping[str, Any]) -> BackendRef:
    where = f"[{pool!r}]"
    unknown = sorted(set(value) - set(BACKEND_FIELDS))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]} is not a field of a backend; its fields are "
                         + ", ".join(BACKEND_FIELDS))
    kind = value.get("kind", SERVICE)
    if kind not in (SERVICE, INFERENCE_POOL):
        raise ValueError(f'{where}.kind must be "{SERVICE}" or "{INFERENCE_POOL}", not '
                         f"{kind!r}")
    wanted_group = INFERENCE_GROUP if kind == INFERENCE_POOL else ""
    group = value.get("group", wanted_group)
    if group != wanted_group:
        hint = (f" (v1alpha2's group: fleetctl speaks the v1 API, {INFERENCE_GROUP})"
                if group == OLD_INFERENCE_GROUP else "")
        raise ValueError(f"{where}.group must be {wanted_group!r} for kind {kind}, not "
                         f"{group!r}{hint}")
    name, namespace = value.get("name", pool), value.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise ValueError(f"{where}.namespace must be a namespace name")
    if kind == INFERENCE_POOL:
        if not isinstance(name, str) or not DNS_SUBDOMAIN.match(name):
            raise ValueError(f"{where}.name must be an InferencePool name (a DNS subdomain: "
                             f"lower-case letters, digits, '-' and '.'), not {name!r}")
        if "port" in value:
            raise ValueError(f"{where}.port: an InferencePool backendRef takes no port (the "
                             "InferencePool's spec.targetPorts name the model servers' ports)")
        return BackendRef(name=name, port=None, namespace=namespace, group=group, kind=kind)
    port = value.get("port", DEFAULT_PORT)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name must be a Service name")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{where}.port must be a port number from 1 to 65535")
    return BackendRef(name=name, port=port, namespace=namespace)


def _services(raw: Any) -> dict[str, BackendRef]:
    if not isinstance(raw, Mapping):
        raise ValueError("must be an object of pool name -> Service name or "
                         '{"name", "port", "namespace"} or '
                         f'{{"kind": "{INFERENCE_POOL}", "name", "namespace"}}')
    refs = {}
    for pool, value in raw.items():
        if isinstance(value, str) and value:
            refs[str(pool)] = BackendRef(name=value, port=DEFAULT_PORT, namespace=None)
            continue
        if not isinstance(value, Mapping):
            raise ValueError(f"[{pool!r}] must be a Service name or an object with name, port "
                             f"and namespace, or kind {INFERENCE_POOL}, name and namespace")
        refs[str(pool)] = _backend(str(pool), value)
    named: dict[tuple[str, str, str | None, str], str] = {}
    for pool, ref in refs.items():
        first = named.setdefault(ref.key(), pool)
        if first != pool:
            raise ValueError(f"[{pool!r}] names the {ref.kind} {ref.name} that [{first!r}] "
                             "names too: a read-back could not tell their weights apart")
    return refs


def _paths(paths: tuple[str, ...]) -> str | None:
    if len(paths) > MAX_PATHS:
        return f"holds {len(paths)} paths; at most {MAX_PATHS} fit the residency guard"
    if not paths or not all(path.startswith("/") for path in paths):
        return "must be a non-empty list of paths starting with /"
    return None


def _not_empty(value: str) -> str | None:
    return None if value else "must not be empty"


# An InferencePool written as KIND/NAME or GROUP/KIND/NAME (a Service name has no '/').
POOL_REF = re.compile(r"(?i)^(inference\.networking\.(x-)?k8s\.io/)?inferencepools?/")
MIRROR_TO_POOL = (
    "a RequestMirror filter's backendRef to an InferencePool is not something fleetctl "
    "renders: Gateway API supports mirror backendRefs other than Services only as "
    "implementation-specific, the Inference Extension defines InferencePool as a rule "
    "backendRef only (its endpoint picker is not consulted for a mirror), and some "
    "implementations refuse it; name the shadow collector's Service (SERVICE:PORT)")


def _collector_service(value: str) -> str | None:
    """`name:port` of the Service in front of the shadow collector (the routes' namespace).
    An InferencePool is refused with the reason (MIRROR_TO_POOL), not mirrored to half-way."""
    if POOL_REF.match(value):
        return MIRROR_TO_POOL
    name, _, port = value.rpartition(":")
    if not DNS_NAME.match(name) or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"must be SERVICE:PORT (a Service name and a port number), not {value!r}"
    return None


@dataclass(frozen=True)
class GatewayApiOptions:
    namespace: str = option("default", check=_not_empty, help="the namespace of the HTTPRoutes")
    gateway_name: str | None = option(None, check=_not_empty,
                                      help="the parent Gateway; default: the fleetctl "
                                           "gateway's name")
    gateway_namespace: str | None = option(None, check=_not_empty,
                                           help="the parent Gateway's namespace; default: "
                                                "namespace")
    section_name: str | None = option(None, check=_not_empty,
                                      help="the parent Gateway's listener (sectionName)")
    hostnames: tuple[str, ...] = option((), help="the HTTPRoutes' hostnames")
    services: Mapping[str, BackendRef] = option(
        default_factory=dict, parse=_services,
        help='pool -> its backend: a Service name or {"name", "port", "namespace"}, or an '
             f'InferencePool {{"kind": "{INFERENCE_POOL}", "name", "namespace"}} (group '
             f"{INFERENCE_GROUP}, v1); default: the Service named as the pool, port "
             f"{DEFAULT_PORT}")
    paths: tuple[str, ...] = option(DEFAULT_PATHS, check=_paths,
                                    help="the OpenAI endpoints routed")
    token: str | None = option(None, help="bearer token for the API server")
    token_file: str | None = option(None, help="file holding the bearer token, read at every "
                                               "call (a rotated token is picked up)")
    ca_file: str | None = option(None, help="CA bundle for the API server's certificate")
    timeout_s: float = option(2.0, minimum=0.01, maximum=600,
                              help="seconds per call to the API server")
    require_status: bool = option(True, help="count a route as held only once the Gateway "
                                             "implementation accepted its generation")
    status_wait_s: float = option(5.0, minimum=0, maximum=300,
                                  help="seconds a read-back waits for the controller to "
                                       "observe a new generation")
    controller_name: str | None = option(None, check=_not_empty,
                                         help="only this GatewayClass controllerName's status "
                                              "counts")
    shadow_collector_service: str | None = option(
        None, check=_collector_service,
        help="SERVICE:PORT of the shadow collector's Service in the routes' namespace, the "
             "backendRef of the RequestMirror filter; without it routes are not mirrored "
             "(the push says so)")
