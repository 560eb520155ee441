"""Validation of a DesiredState for Envoy: everything that would make Envoy reject the
files, or make them mean something other than the desired state, raised before writing."""

from __future__ import annotations

from urllib.parse import urlsplit

from fleetctl.traffic.gateways.base import (
    ROOT_PATHS,
    TOTAL_WEIGHT,
    DesiredState,
    PoolTarget,
    RouteSpec,
    pool_base_url_problem,
)
from fleetctl.traffic.gateways.envoy.names import (
    HEADER_NAME_RE,
    HEADER_VALUE_RE,
    MODEL_CHARS,
    MODEL_RE,
    NAME_RE,
    ConfigError,
    check,
)
from fleetctl.traffic.gateways.schema import collector_url_problem


def validate(desired: DesiredState) -> None:
    """Everything that would make Envoy reject the files, or make them mean something other
    than `desired`, raised before anything is written."""
    names = (desired.model_header, desired.residency_header, desired.latency_class_header,
             desired.prompt_tokens_header, desired.prompt_tokens_stated_header)
    for name in names:
        check(HEADER_NAME_RE.match(name), f"header name {name!r} is not a lowercase token")
    check(len(set(names)) == len(names),
          "model, residency, latency-class and prompt-size headers must differ")
    for pool in desired.pools.values():
        check(0.5 <= pool.prompt.chars_per_token <= 32 and 0 <= pool.prompt.per_message <= 64
              and 0 <= pool.prompt.base <= 256,
              f"pool {pool.name}: prompt calibration {pool.prompt} is out of range")
    for key, pool in desired.pools.items():
        _validate_pool(key, pool)
    if desired.mirror_url:
        problem = collector_url_problem(desired.mirror_url)
        check(problem is None, f"shadow collector {problem}")
    seen_keys: set[str] = set()
    seen_matches: dict[tuple[str, str, str], str] = {}
    for route in desired.routes:
        _validate_route(route, desired)
        check(route.key not in seen_keys, f"route key {route.key!r} appears twice")
        seen_keys.add(route.key)
        match = (route.model, route.latency_class, route.residency)
        other = seen_matches.setdefault(match, route.key)
        check(other == route.key, f"routes {other} and {route.key} match the same requests")


def _validate_pool(key: str, pool: PoolTarget) -> None:
    check(key == pool.name, f"pool {pool.name!r} is filed under {key!r}")
    problem = pool_problem(pool)
    check(problem is None, f"pool {pool.name}: Envoy {problem}")


def pool_problem(pool: PoolTarget) -> str | None:
    """Why Envoy cannot route to `pool`, worded to follow "the gateway" (Adapter.check_pool),
    or None. A path prefix other than /v1 cannot be expressed per weighted cluster (Envoy
    rewrites paths per route, and every pool of a route shares it), so it is refused rather
    than silently dropped; a cluster speaks one scheme."""
    if not NAME_RE.match(pool.name):
        return f"cannot name a cluster after pool {pool.name!r}: use [a-z0-9-], at most 63"
    problem = pool_base_url_problem(pool)
    if problem:
        return problem
    if len({urlsplit(url).scheme for url in pool.base_urls}) > 1:
        return "cannot mix http and https base URLs in one pool (one cluster, one scheme)"
    return None


def _validate_route(route: RouteSpec, desired: DesiredState) -> None:
    check(NAME_RE.match(route.key), f"route key {route.key!r} is not [a-z0-9-]")
    check(MODEL_RE.match(route.model), f"route {route.key}: model {route.model!r} has "
          f"characters outside {MODEL_CHARS}")
    for what, value in (("latency class", route.latency_class), ("residency", route.residency)):
        check(not value or HEADER_VALUE_RE.match(value),
              f"route {route.key}: {what} {value!r} is not a plain token")
    for pool, weight in route.weights.items():
        check(pool in desired.pools, f"route {route.key}: pool {pool!r} is not declared")
        check(isinstance(weight, int) and 0 <= weight <= TOTAL_WEIGHT,
              f"route {route.key}: weight {weight!r} of {pool} is not 0..{TOTAL_WEIGHT}")
        check(weight == 0 or desired.pools[pool].base_urls,
              f"route {route.key}: pool {pool} has weight but no base URL")
    above = 0
    for index, tier in enumerate(route.tiers):
        check(tier.bound is None or (isinstance(tier.bound, int) and tier.bound > above),
              f"route {route.key}: tiers[{index}]'s bound {tier.bound!r} is not above "
              f"{above}")
        check(tier.bound is not None or index == len(route.tiers) - 1,
              f"route {route.key}: only the last tier may be open-ended")
        check(tier.above == above, f"route {route.key}: tiers[{index}] starts above "
              f"{tier.above}, not above the tier below's bound {above}")
        above = tier.bound or above
    total = sum(route.weights.values())
    check(not route.weights or total == TOTAL_WEIGHT,
          f"route {route.key}: weights sum to {total}, not {TOTAL_WEIGHT}")


def parse_base_url(url: str, pool: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a pool base URL. A path prefix other than /v1 cannot be
    expressed per weighted cluster in Envoy, so it is refused rather than silently dropped."""
    parts = urlsplit(url)
    check(parts.scheme in ("http", "https") and parts.hostname,
          f"pool {pool}: base URL {url!r} is not http(s)://host[:port]")
    check(parts.path in ROOT_PATHS and not parts.query,
          f"pool {pool}: base URL {url!r} has a path prefix; Envoy forwards /v1/... as is")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigError(f"pool {pool}: base URL {url!r} has a bad port") from exc
    assert parts.hostname is not None
    return parts.scheme, parts.hostname, port
