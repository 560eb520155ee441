"""Prefix affinity on Envoy (docs/traffic.md, "Prefix affinity"): the Lua script writes each
request's key into the route's affinity header, the route entry hashes on that header, and
the clusters of the pools such a route may send to pick an endpoint by consistent hashing
with bounded load.

A cluster is one pool, shared by every route that may send to it: a pool that an affinity
route lists hashes for all of them. A request without a key (another route's, or a `header`
route's caller that sent none) gets a random endpoint, still under the load bound; that is
what a non-affinity route sharing the pool gets instead of least-request
(benchmarks/prefix_affinity.py measures both)."""

from __future__ import annotations

from typing import Any

from fleetctl.traffic.gateways.base import DesiredState, PrefixAffinity, RouteSpec

# No endpoint takes more than 1.5 times the pool's average of in-flight requests: a hot key
# spills to the next endpoint on the ring instead of queueing on one (Envoy applies it to
# RING_HASH and MAGLEV alike).
HASH_BALANCE_FACTOR = 150
# Ring hash over Maglev: removing an endpoint moves only its own keys (Maglev moves a few
# others too), so a dead endpoint costs the other endpoints none of their warm prefixes.
LB_POLICY = "RING_HASH"
# The caller's key is hashed as given, up to this many bytes.
CALLER_KEY_MAX_BYTES = 256


def affinity_pools(desired: DesiredState) -> set[str]:
    """The pools an affinity route may send to (weight 0 included, so a ramp onto one is a
    weights change only)."""
    return {pool for route in desired.routes if route.affinity for pool in route.weights}


def consistent_hash_lb() -> dict[str, Any]:
    """What replaces a pool cluster's LEAST_REQUEST when an affinity route lists it."""
    return {
        "lb_policy": LB_POLICY,
        "common_lb_config": {"consistent_hashing_lb_config": {
            "hash_balance_factor": HASH_BALANCE_FACTOR}},
    }


def hash_policy(route: RouteSpec) -> list[dict[str, Any]]:
    """The route entry's hash on its affinity header (none without affinity)."""
    if route.affinity is None:
        return []
    return [{"header": {"header_name": route.affinity.header}}]


def lua_affinity(desired: DesiredState) -> tuple[str, int, list[str]]:
    """For the Lua script: the per-model table of keys to write ({header, prompt bytes}),
    the most prompt bytes any of them reads, and every affinity header (a client's copies
    of them are removed)."""
    by_model: dict[str, set[PrefixAffinity]] = {}
    for route in desired.routes:
        if route.affinity is not None:
            by_model.setdefault(route.model, set()).add(route.affinity)
    rows = []
    for model, kinds in sorted(by_model.items()):
        keys = ", ".join(f'{{"{a.header}", {a.prefix_bytes}}}'
                         for a in sorted(kinds, key=lambda a: a.header))
        rows.append(f'\n  ["{model}"] = {{{keys}}},')
    scan = max((a.prefix_bytes for kinds in by_model.values() for a in kinds), default=0)
    headers = sorted({a.header for kinds in by_model.values() for a in kinds})
    return "".join(rows) + ("\n" if rows else ""), scan, headers
