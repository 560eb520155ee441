"""The files Envoy reads: CDS/RDS discovery files and the runtime file (an RTDS layer),
and the runtime values as Envoy reads and shows them."""

from __future__ import annotations

import json
import re
from typing import Any

from fleetctl.traffic.gateways.base import TOTAL_WEIGHT
from fleetctl.traffic.gateways.envoy.clusters import clusters_version
from fleetctl.traffic.gateways.envoy.names import (
    CLUSTERS_FILE,
    ROUTES_FILE,
    RUNTIME_LAYER,
    RUNTIME_TYPE,
    digest,
    fraction,
    is_mirror_key,
)
from fleetctl.traffic.gateways.envoy.routes import render_unconfigured_route_config


def discovery_file(resources: list[dict[str, Any]], version: str) -> str:
    """A CDS/RDS file: a DiscoveryResponse whose version_info Envoy reports back once loaded."""
    return json.dumps({"version_info": version, "resources": resources}, indent=1,
                      sort_keys=True) + "\n"


def clusters_file(clusters: dict[str, dict[str, Any]]) -> str:
    return discovery_file([clusters[n] for n in sorted(clusters)], clusters_version(clusters))


def routes_file(route_config: dict[str, Any], version: str) -> str:
    return discovery_file([route_config], version)


def runtime_file(weights: dict[str, int]) -> str:
    """The runtime file: an RTDS DiscoveryResponse whose layer holds every weight key (and
    every mirror fraction)."""
    # A mirror fraction is an object here: Envoy reads a FractionalPercent from an RTDS
    # layer's struct value, not from a string (which the admin endpoint does parse).
    layer: dict[str, Any] = {key: (fraction(weights[key]) if is_mirror_key(key)
                                   else str(weights[key])) for key in sorted(weights)}
    return json.dumps({"version_info": "w-" + digest(layer), "resources": [{
        "@type": RUNTIME_TYPE, "name": RUNTIME_LAYER, "layer": layer,
    }]}, separators=(",", ":")) + "\n"


def runtime_file_weights(text: str) -> dict[str, int]:
    """The weights (and mirror fractions) a runtime file holds ({} for one that is not
    fleetctl's)."""
    try:
        layer = json.loads(text)["resources"][0]["layer"]
        values = {str(key): (fraction_bp(value) if is_mirror_key(str(key))
                             else runtime_value_bp(str(key), str(value)))
                  for key, value in layer.items()}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return {}
    if any(value is None for value in values.values()):
        return {}
    return {key: value for key, value in values.items() if value is not None}


def runtime_strings(runtime: dict[str, int]) -> dict[str, str]:
    """Runtime values as Envoy reads them: a weight is an integer; a mirror fraction is a
    FractionalPercent in basis points (an integer there would mean whole percent)."""
    return {key: (json.dumps(fraction(value), separators=(",", ":"))
                  if is_mirror_key(key) else str(value))
            for key, value in runtime.items()}


def runtime_value_bp(key: str, text: str | None) -> int | None:
    """A runtime value as runtime_strings wrote it, back as an integer (basis points for a
    mirror key); None when it is not one of those (Envoy then uses the default)."""
    if text is None:
        return None
    if not is_mirror_key(key):
        try:
            return int(text)
        except ValueError:
            return None
    return fraction_bp(text)


_DENOMINATORS = {"HUNDRED": 100, "TEN_THOUSAND": 10_000, "MILLION": 1_000_000}
_DEBUG_FIELD = re.compile(r'key: "(numerator|denominator)"\s*value \{\s*'
                          r'(?:number_value: ([0-9.e+]+)|string_value: "([A-Z_]+)")')


def _debug_struct(text: str) -> dict[str, Any] | None:
    """A FractionalPercent as /runtime shows a struct value of the runtime file's layer
    (protobuf debug text, not JSON), or None."""
    found = {name: (float(number) if number else word)
             for name, number, word in _DEBUG_FIELD.findall(text)}
    return found or None


def fraction_bp(value: Any) -> int | None:
    """A FractionalPercent (a dict, or its JSON text) in basis points, capped at 10,000;
    None when it is not one. Envoy reads a bare integer as whole percent."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = _debug_struct(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return min(TOTAL_WEIGHT, value * 100)
    if not isinstance(value, dict):
        return None
    try:
        numerator = int(value.get("numerator", 0))
        denominator = _DENOMINATORS[str(value.get("denominator", "HUNDRED"))]
    except (ValueError, TypeError, KeyError):
        return None
    return min(TOTAL_WEIGHT, numerator * TOTAL_WEIGHT // denominator)


UNCONFIGURED_ROUTES_VERSION = "unconfigured"


def unconfigured_files() -> dict[str, str]:
    """File name -> content for a gateway fleetctl has not configured yet."""
    return {
        CLUSTERS_FILE: clusters_file({}),
        ROUTES_FILE: routes_file(render_unconfigured_route_config(),
                                 UNCONFIGURED_ROUTES_VERSION),
    }
