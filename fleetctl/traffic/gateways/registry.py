"""The gateway kinds fleetctl knows, found from their folders.

A kind is a package holding a `KIND = GatewayKind(...)` in its `__init__.py`: its name (the
value stored in Gateway.kind), the label people read, its adapter class, its options schema,
how its gateway is reached and, for a kind that writes an access log, the parser of its lines
(`<kind>/accesslog.py`, what the telemetry ingester reads). Every package directly under
fleetctl/traffic/gateways/ that declares one is a kind; a package elsewhere is added by
naming it in the Django setting `FLEETCTL_GATEWAY_KINDS` (a list of dotted package names).
Nothing else lists the kinds: the model, the API, the form and the push engine all ask here,
so adding a kind is adding its
folder (and, for a package outside this one, a line in the setting). No migration: the
database stores the kind as text and the registry checks it.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.traffic.gateways.base import AdapterError, GatewaySpec, LogRecord
from fleetctl.traffic.gateways.schema import AddressRule, OptionInfo, describe, parse_options

if TYPE_CHECKING:
    from fleetctl.traffic.gateways.base import Adapter


@dataclass(frozen=True)
class GatewayKind:
    """Everything fleetctl needs to know about one kind of gateway."""

    label: str  # "Envoy", "Kubernetes Gateway API": for pages, messages and docs
    adapter: type[Adapter[Any]]  # its `kind` is the name stored on Gateway rows
    options: type  # the frozen dataclass of its options (see schema.option)
    address: AddressRule  # what admin_address holds
    summary: str = ""  # one sentence: how fleetctl drives it
    # One access log line (bytes, without or with its newline) and the gateway's endpoints
    # ("host:port" -> pool) -> a LogRecord, None for a line that is no request, ValueError for
    # a malformed one. None: this kind writes no access log fleetctl can read (no live
    # telemetry from its gateways, only from the pools' own /metrics).
    parse_access_log: Callable[[bytes, Mapping[str, str]], LogRecord | None] | None = field(
        default=None, compare=False)
    # What its log's `ttft_ms` measures, in plain words for the figures' sources: only
    # Envoy sees the first byte of the answer's body; HAProxy and nginx see the response
    # headers, which a pool may send before its first token.
    ttft_measures: str = field(default="", compare=False)
    package: str = field(default="", compare=False)  # set by the registry

    @property
    def name(self) -> str:
        return self.adapter.kind

    @property
    def supports_mirror(self) -> bool:
        """Can its gateways copy a share of a route's requests to the shadow collector? The
        API and pages say so ("HAProxy cannot mirror; use replay")."""
        return self.adapter.supports_mirror

    @property
    def supports_context_tiers(self) -> bool:
        """Can its gateways route by prompt size (a route's context tiers)?"""
        return self.adapter.supports_context_tiers

    @property
    def supports_prefix_affinity(self) -> bool:
        """Can its gateways send requests sharing a prefix key to one endpoint of a pool?"""
        return self.adapter.supports_prefix_affinity

    def parse_options(self, raw: Any) -> Any:
        """The options schema's instance for `raw`, or OptionsError naming each problem."""
        return parse_options(self.options, raw, self.label)

    def address_problem(self, value: str) -> str | None:
        return self.address.problem(value, self.label)

    def option_infos(self) -> list[OptionInfo]:
        return describe(self.options)

    def required_options(self) -> tuple[str, ...]:
        return tuple(info.name for info in self.option_infos() if info.required)

    def help_text(self) -> str:
        """The kind's address and options in one paragraph (API schema, form help)."""
        options = "; ".join(info.describe() for info in self.option_infos())
        return f"{self.name}: admin_address is {self.address.help}. Options: {options}."


_lock = threading.Lock()
_found: dict[tuple[str, ...], dict[str, GatewayKind]] = {}


def _extra_packages() -> tuple[str, ...]:
    from django.conf import settings

    if not settings.configured:
        return ()
    return tuple(getattr(settings, "FLEETCTL_GATEWAY_KINDS", ()))


def _discover(extra: tuple[str, ...]) -> dict[str, GatewayKind]:
    import fleetctl.traffic.gateways as here

    packages = [f"{here.__name__}.{module.name}"
                for module in pkgutil.iter_modules(here.__path__) if module.ispkg]
    kinds: dict[str, GatewayKind] = {}
    for package in [*packages, *extra]:
        declared = getattr(importlib.import_module(package), "KIND", None)
        if declared is None:
            continue
        if not isinstance(declared, GatewayKind):
            raise TypeError(f"{package}.KIND is not a GatewayKind")
        if declared.name in kinds:
            raise ValueError(f"gateway kind {declared.name!r} is declared by both "
                             f"{kinds[declared.name].package} and {package}")
        object.__setattr__(declared, "package", package)
        kinds[declared.name] = declared
    return dict(sorted(kinds.items()))


def kinds() -> dict[str, GatewayKind]:
    """Name -> kind, sorted by name."""
    extra = _extra_packages()
    with _lock:
        found = _found.get(extra)
    if found is None:
        found = _discover(extra)
        with _lock:
            _found[extra] = found
    return found


def find(name: str) -> GatewayKind | None:
    return kinds().get(name)


def get(name: str) -> GatewayKind:
    """The kind called `name`; a permanent AdapterError for a name no package declares."""
    kind = find(name)
    if kind is None:
        raise AdapterError(f"no adapter for gateway kind {name!r} (known: "
                           f"{', '.join(kinds())})", permanent=True)
    return kind


def choices() -> list[tuple[str, str]]:
    """(name, label) of every kind: the choices of Gateway.kind on forms and in the API."""
    return [(name, kind.label) for name, kind in kinds().items()]


def unknown_kind_message(name: str) -> str:
    return f"{name!r} is not a gateway kind fleetctl knows; use one of {', '.join(kinds())}."


def adapter_class(name: str) -> type[Adapter[Any]]:
    return get(name).adapter


def adapter_for(gateway: GatewaySpec) -> Adapter[Any]:
    """The adapter for a Gateway row (its options parsed and checked by its kind's schema)."""
    return adapter_class(gateway.kind)(gateway)
