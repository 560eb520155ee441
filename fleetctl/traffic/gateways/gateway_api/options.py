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


@dataclass(frozen=True)
class ServiceRef:
    name: str
    port: int
    namespace: str | None


def _services(raw: Any) -> dict[str, ServiceRef]:
    if not isinstance(raw, Mapping):
        raise ValueError("must be an object of pool name -> Service name or "
                         '{"name", "port", "namespace"}')
    refs = {}
    for pool, value in raw.items():
        if isinstance(value, str) and value:
            refs[str(pool)] = ServiceRef(name=value, port=DEFAULT_PORT, namespace=None)
            continue
        if not isinstance(value, Mapping) or set(value) - {"name", "port", "namespace"}:
            raise ValueError(f"[{pool!r}] must be a Service name or an object with name, port "
                             "and namespace")
        name, port, namespace = (value.get("name", pool), value.get("port", DEFAULT_PORT),
                                 value.get("namespace"))
        if not isinstance(name, str) or not name:
            raise ValueError(f"[{pool!r}].name must be a Service name")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"[{pool!r}].port must be a port number from 1 to 65535")
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            raise ValueError(f"[{pool!r}].namespace must be a namespace name")
        refs[str(pool)] = ServiceRef(name=name, port=port, namespace=namespace)
    return refs


def _paths(paths: tuple[str, ...]) -> str | None:
    if len(paths) > MAX_PATHS:
        return f"holds {len(paths)} paths; at most {MAX_PATHS} fit the residency guard"
    if not paths or not all(path.startswith("/") for path in paths):
        return "must be a non-empty list of paths starting with /"
    return None


def _not_empty(value: str) -> str | None:
    return None if value else "must not be empty"


def _collector_service(value: str) -> str | None:
    """`name:port` of the Service in front of the shadow collector (the routes' namespace)."""
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
    services: Mapping[str, ServiceRef] = option(
        default_factory=dict, parse=_services,
        help='pool -> Service name or {"name", "port", "namespace"}; default: the pool\'s '
             f"name, port {DEFAULT_PORT}")
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
