"""Per-request fallback and bounded queues of context tiers (docs/envoy.md, "Fallback and
queues of context tiers"): which cluster each pool of a tier's split is sent to, and the
clusters that exist for it beside the pools' own.

A tier entry's split names, for each pool P with weight:

- P's own cluster, for a `pinned` or `reject` tier, or when no other pool qualifies: a
  request that fails before its first byte is retried on another endpoint of P only;
- an **aggregate cluster** `P_fb_<hash>` of [P, then the tier's other pools with weight
  (name order)] for `failover`, and of those in P's latency class too for `failover-class`
  and `queue`, always only those in P's jurisdiction. The route's retry policy adds
  `previous_priorities`: each retry goes to the next pool of the list that was not tried,
  and only for RETRY_ON (nothing reached a server). A pool at 0 % (drained, not ramped yet)
  is in no list: a drain means no traffic at all;
- for a `queue` tier, P's **queue cluster** `P_q_<hash>` instead of P's own (the same
  endpoints) whose circuit breakers hold the tier's requests: at most `slots x endpoints`
  at once (HTTP/1.1: one request a connection, so `max_connections`), `queue_max` more
  waiting for one (`max_pending_requests`), and beyond that Envoy refuses the request
  (503, flag UO, never retried), which the Lua script answers as 429 with Retry-After. A
  tier's own clusters keep one tier's queue from filling with another tier's requests.
  The aggregate of a queue tier lists the queue clusters of its pools.

`_` is in no pool name, so a cluster's pool is the name before the first `_` (pool_of).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fleetctl.traffic.gateways.base import DesiredState, RouteSpec, TierSpec, tier_weights
from fleetctl.traffic.gateways.envoy.affinity import affinity_pools, consistent_hash_lb
from fleetctl.traffic.gateways.envoy.clusters import render_cluster
from fleetctl.traffic.gateways.envoy.names import (
    AGGREGATE_CLUSTER_TYPE,
    CIRCUIT_BREAKER_LIMIT,
    CLUSTER_TYPE,
    CONNECT_TIMEOUT,
    QUEUE_SLOTS_PER_ENDPOINT,
    digest,
)

FALLS_OVER = frozenset({"failover", "failover-class", "queue"})
SAME_CLASS = frozenset({"failover-class", "queue"})
_TIER_CLUSTER = re.compile(r"^([a-z0-9][a-z0-9-]*)_(fb|q)_[0-9a-f]{8}$")


@dataclass(frozen=True)
class Entry:
    """One weighted cluster of a tier's split: the pool the split chose, and the clusters a
    request tries in order (one: no fallback)."""

    pool: str
    weight: int
    tries: tuple[str, ...]

    @property
    def cluster(self) -> str:
        if len(self.tries) == 1:
            return self.tries[0]
        return f"{self.pool}_fb_{digest(list(self.tries))[:8]}"


def pool_of(cluster: str) -> str:
    """The pool a cluster sends to: its own name, or the name before a tier cluster's `_`."""
    match = _TIER_CLUSTER.match(cluster)
    return match.group(1) if match else cluster


def queue_cluster(route: RouteSpec, tier: TierSpec, index: int, pool: str) -> str:
    return f"{pool}_q_{digest([route.key, index, tier.queue_max])[:8]}"


def tier_entries(route: RouteSpec, tier: TierSpec, index: int,
                 desired: DesiredState) -> list[Entry]:
    """The tier's split as weighted clusters, by pool name (`tier_weights` decides weights)."""
    weights = tier_weights(route, tier)
    own = ({p: queue_cluster(route, tier, index, p) for p in weights}
           if tier.behaviour == "queue" else {p: p for p in weights})
    entries = []
    for pool, weight in sorted(weights.items()):
        tries = [own[pool]]
        if weight > 0 and tier.behaviour in FALLS_OVER:
            tries += [own[other] for other in sorted(weights)
                      if other != pool and weights[other] > 0
                      and _may_take(desired, pool, other, same_class=tier.behaviour in SAME_CLASS)]
        entries.append(Entry(pool=pool, weight=weight, tries=tuple(tries)))
    return entries


def _may_take(desired: DesiredState, pool: str, other: str, *, same_class: bool) -> bool:
    """May `other` answer a request the split gave `pool`? Never across a border; for a
    class-bound behaviour, never in another latency class (an unknown class matches none)."""
    mine, theirs = desired.pools.get(pool), desired.pools.get(other)
    if mine is None or theirs is None or mine.jurisdiction != theirs.jurisdiction:
        return False
    return not same_class or (bool(mine.latency_class)
                              and mine.latency_class == theirs.latency_class)


def render_tier_clusters(desired: DesiredState) -> dict[str, dict[str, Any]]:
    """The queue and aggregate clusters every tier entry names, by name."""
    clusters: dict[str, dict[str, Any]] = {}
    hashed = affinity_pools(desired)
    for route in desired.routes:
        for index, tier in enumerate(route.tiers if route.weights else ()):
            entries = tier_entries(route, tier, index, desired)
            if tier.behaviour == "queue":
                for entry in entries:
                    name = entry.tries[0]
                    clusters[name] = _queue_cluster(desired, entry.pool, name, tier)
                    if entry.pool in hashed:  # a queue's copy balances like its pool
                        clusters[name].update(consistent_hash_lb())
            for entry in entries:
                if len(entry.tries) > 1:
                    clusters[entry.cluster] = _aggregate_cluster(entry.cluster, entry.tries)
    return clusters


def _queue_cluster(desired: DesiredState, pool: str, name: str,
                   tier: TierSpec) -> dict[str, Any]:
    target = desired.pools[pool]
    cluster = render_cluster(target)
    cluster["name"] = name
    cluster["load_assignment"] = {**cluster["load_assignment"], "cluster_name": name}
    endpoints = len(target.base_urls)
    slots = (target.slots or QUEUE_SLOTS_PER_ENDPOINT) * endpoints
    cluster["circuit_breakers"] = {"thresholds": [{
        "max_connections": slots,
        "max_pending_requests": tier.queue_max or 1,
        "max_requests": CIRCUIT_BREAKER_LIMIT,
        "max_retries": CIRCUIT_BREAKER_LIMIT,
    }]}
    return cluster


def _aggregate_cluster(name: str, tries: tuple[str, ...]) -> dict[str, Any]:
    return {
        "@type": CLUSTER_TYPE,
        "name": name,
        "connect_timeout": CONNECT_TIMEOUT,
        "lb_policy": "CLUSTER_PROVIDED",
        "cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": {
            "@type": AGGREGATE_CLUSTER_TYPE, "clusters": list(tries)}},
        # Retries are checked against the route's cluster (this one): Envoy's default of 3
        # concurrent retries would leave a dead pool's requests unretried under load.
        "circuit_breakers": {"thresholds": [{
            "max_connections": CIRCUIT_BREAKER_LIMIT,
            "max_pending_requests": CIRCUIT_BREAKER_LIMIT,
            "max_requests": CIRCUIT_BREAKER_LIMIT,
            "max_retries": CIRCUIT_BREAKER_LIMIT,
        }]},
    }
