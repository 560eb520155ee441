"""The contract every gateway adapter fulfils, and the registry that finds one by kind.

fleetctl always sends a gateway its whole desired state (every route it serves, at that
route's current revision), so a push and a reconcile are the same idempotent operation and a
gateway that restarted empty is repaired by the next one.

Weights are integers in basis points (1/100 of a percent) and each route's weights sum to
10,000 — or the route has no weights at all, which means "no pool may serve this route"
(residency fails closed): the gateway must answer such requests with an error, never send
them anywhere. A pool with weight 0 must receive no new requests.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

TOTAL_WEIGHT = 10_000


@dataclass(frozen=True)
class PoolTarget:
    """One upstream pool as a gateway sees it."""

    name: str  # unique, [a-z0-9-], also the cluster/backend name
    base_urls: tuple[str, ...]  # http(s)://host:port[/prefix]
    jurisdiction: str


@dataclass(frozen=True)
class RouteSpec:
    """One route at one revision."""

    key: str  # stable, [a-z0-9-]: the route's name
    model: str  # the `model` of the OpenAI request body
    latency_class: str  # "" = any latency class
    residency: str  # "" = not pinned; else a jurisdiction code the request must carry
    revision: int
    weights: dict[str, int]  # pool name -> basis points; empty = answer an error

    def __post_init__(self) -> None:
        if self.weights and sum(self.weights.values()) != TOTAL_WEIGHT:
            raise ValueError(f"route {self.key}: weights sum to {sum(self.weights.values())}")


@dataclass(frozen=True)
class DesiredState:
    """Everything one gateway should hold."""

    routes: tuple[RouteSpec, ...]
    pools: dict[str, PoolTarget]
    model_header: str = "x-fleetctl-model"  # set by the gateway from the body (Envoy) or sent
    residency_header: str = "x-fleetctl-residency"
    latency_class_header: str = "x-fleetctl-latency-class"

    def held_weights(self) -> dict[str, dict[str, int]]:
        """What read_back() should return once this state is applied (zero weights dropped)."""
        return {r.key: {p: w for p, w in r.weights.items() if w > 0} for r in self.routes}


@dataclass(frozen=True)
class GatewaySpec:
    """The Gateway row, as an adapter needs it."""

    name: str
    kind: str
    admin_address: str  # Envoy admin URL, HAProxy runtime socket, nginx config dir, k8s API URL
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolCounters:
    requests_total: int  # requests completed or started towards the pool, since start
    errors_total: int  # 5xx answers and connection failures
    active: int  # in flight now


@dataclass
class ApplyResult:
    applied: bool
    detail: str = ""  # e.g. "reload used (~100 ms)"; shown in the push attempt record
    method: str = ""  # e.g. "runtime", "file-swap", "reload", "api"


class AdapterError(Exception):
    """A push that failed. permanent=True means retrying cannot help (bad config, 4xx)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class Adapter(ABC):
    """Subclass per gateway kind; override only what differs. Every method is synchronous,
    must time out (use fleetctl.core.http or explicit timeouts) and must never leave the
    gateway half-configured: validate first, keep the previous state on failure."""

    kind: ClassVar[str]
    # Weights a gateway can represent exactly; others are rounded (e.g. HAProxy: 0..256).
    weight_resolution: ClassVar[str] = "0.01 %"

    def __init__(self, gateway: GatewaySpec) -> None:
        self.gateway = gateway

    @abstractmethod
    def apply(self, desired: DesiredState) -> ApplyResult:
        """Make the gateway hold `desired`; new requests follow it from the moment this
        returns (or raise AdapterError)."""

    @abstractmethod
    def read_back(self) -> dict[str, dict[str, int]]:
        """Route key -> {pool name: weight in basis points > 0} that the gateway holds now."""

    @abstractmethod
    def in_flight(self, pool: str) -> int:
        """Requests (including open streams) this gateway has in flight to `pool`."""

    def pool_counters(self) -> dict[str, PoolCounters]:
        """Cumulative per-pool counters from the gateway's own stats, for request and error
        rates per pool. Gateways that cannot tell return {} (the dashboard says so)."""
        return {}

    def matches(self, desired: DesiredState, held: dict[str, dict[str, int]]) -> bool:
        """Does what the gateway holds equal `desired`? Adapters that round weights override."""
        return held == desired.held_weights()


def url_port(url: str, default: int) -> int:
    """The port of a pool's base URL (`default` when it names none); a bad one is a
    permanent error, since retrying cannot fix a configuration."""
    from urllib.parse import urlsplit

    try:
        port = urlsplit(url).port
    except ValueError as exc:  # out of range or not a number
        raise AdapterError(f"{url!r}: {exc}", permanent=True) from exc
    if port == 0:
        raise AdapterError(f"{url!r}: port 0", permanent=True)
    return default if port is None else port


SAFE_NAME = re.compile(r"^[a-z0-9-]+$")
SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:/@+-]+$")


def check_plain_names(desired: DesiredState, *, where: str) -> None:
    """Header names, route keys and matched values that a rendered config can hold without
    quoting; anything else is refused before a byte is written (`where` names the syntax)."""
    for header in (desired.model_header, desired.residency_header,
                   desired.latency_class_header):
        if not SAFE_NAME.match(header):
            raise AdapterError(f"header name {header!r} is not [a-z0-9-]", permanent=True)
    for route in desired.routes:
        if not SAFE_NAME.match(route.key):
            raise AdapterError(f"route key {route.key!r} is not [a-z0-9-]", permanent=True)
        for value in (route.model, route.residency, route.latency_class):
            if value and not SAFE_VALUE.match(value):
                raise AdapterError(f"route {route.key}: {value!r} has characters {where} "
                                   "would need quoting for", permanent=True)


_REGISTRY: dict[str, type[Adapter]] = {}
# One module per gateway kind; each registers its adapter class on import.
ADAPTER_MODULES = ("envoy", "haproxy", "nginx", "gateway_api")


def _load_adapters() -> None:
    import importlib

    for name in ADAPTER_MODULES:
        importlib.import_module(f"fleetctl.traffic.adapters.{name}")


def register(cls: type[Adapter]) -> type[Adapter]:
    _REGISTRY[cls.kind] = cls
    return cls


def adapter_for(gateway: GatewaySpec) -> Adapter:
    _load_adapters()
    try:
        return _REGISTRY[gateway.kind](gateway)
    except KeyError as exc:
        raise AdapterError(f"no adapter for gateway kind {gateway.kind!r}", permanent=True) from exc
