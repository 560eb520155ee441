"""What an Envoy of a gateway is served: the clusters (CDS), the route configuration (RDS) and
the weights layer (RTDS), taken from the very documents the file mode writes (envoy/files.py:
each a DiscoveryResponse in JSON) and converted into protos. One rendering, two transports."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import any_pb2

from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.names import (
    CLUSTER_TYPE,
    CLUSTERS_FILE,
    ROUTE_CONFIG_TYPE,
    ROUTES_FILE,
    RUNTIME_TYPE,
)
from fleetctl.xds.protos import to_any


@dataclass(frozen=True)
class TypeResources:
    """The resources of one type at one version: (name, packed proto) pairs."""

    version: str
    resources: tuple[tuple[str, any_pb2.Any], ...]
    # The DiscoveryResponse document (JSON text) they were built from: what the shared
    # store keeps in PostgreSQL, and every replica builds the same protos from
    document: str = ""

    def named(self, names: tuple[str, ...]) -> list[any_pb2.Any]:
        """The resources an Envoy asked for (all of them for a wildcard request: no names)."""
        wanted = set(names)
        return [packed for name, packed in self.resources if not wanted or name in wanted]


Resources = Mapping[str, TypeResources]  # type URL -> its resources


def from_documents(documents: Mapping[str, str],
                   previous: Resources | None = None) -> dict[str, TypeResources]:
    """type URL -> resources, from the discovery documents envoy/files.py renders (JSON text
    keyed by type URL). A type whose version equals `previous`'s keeps its converted protos:
    a weights-only change converts the small runtime layer alone."""
    out: dict[str, TypeResources] = {}
    for type_url, text in documents.items():
        document = json.loads(text)
        version = str(document["version_info"])
        kept = (previous or {}).get(type_url)
        if kept is not None and kept.version == version:
            out[type_url] = kept
            continue
        out[type_url] = TypeResources(version=version, document=text, resources=tuple(
            (_name(resource), to_any(resource)) for resource in document["resources"]))
    return out


def rendered_resources(rendered: envoy_config.RenderedConfig, *,
                       clusters: dict[str, dict[str, Any]] | None = None,
                       previous: Resources | None = None) -> dict[str, TypeResources]:
    """A rendered desired state as served resources; `clusters` replaces its clusters (the
    adapter serves old and new clusters together while routes change over)."""
    return from_documents({
        CLUSTER_TYPE: envoy_config.clusters_file(
            rendered.clusters if clusters is None else clusters),
        ROUTE_CONFIG_TYPE: envoy_config.routes_file(rendered.route_config,
                                                    rendered.routes_version),
        RUNTIME_TYPE: rendered.runtime_text,
    }, previous)


def unconfigured_resources() -> dict[str, TypeResources]:
    """What an Envoy of a gateway fleetctl has not configured gets: the file mode's
    unconfigured files (no clusters; routes that answer "not configured") and no weights."""
    files = envoy_config.unconfigured_files()
    return from_documents({CLUSTER_TYPE: files[CLUSTERS_FILE],
                           ROUTE_CONFIG_TYPE: files[ROUTES_FILE],
                           RUNTIME_TYPE: envoy_config.runtime_file({})})


def _name(resource: dict[str, Any]) -> str:
    return str(resource.get("name", ""))
