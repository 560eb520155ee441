"""What each pool of a route can carry within its SLO, what it carries now, and the split
that gives each pool work in proportion to its capacity (docs/traffic.md, "Capacity").

Capacity is measured, never assumed: a pool's SLO-qualified capacity is the best level of
its latest still-valid benchmark (the most concurrent streams, and the output tokens/s they
gave, at which the run's SLO held), scaled by the endpoints it has now over the endpoints
the run measured. Traffic sits below the app that measures it: the benchmarks app registers
itself as the source when it loads (fleetctl/bench/capacity.py). A pool no source knows has
no capacity figure, and says why.

What a pool carries now is the gateways' in-flight count for it (PoolTrafficSample.active,
the newest sample of each gateway, summed): streams, the unit a benchmark's concurrency is
measured in, so the two compare without a model of request length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from fleetctl.traffic.gateways.base import TOTAL_WEIGHT
from fleetctl.traffic.models import PoolTrafficSample

# A gateway sample older than this says nothing about the load now.
LIVE_SAMPLE_MAX_AGE_S = 120


@dataclass(frozen=True)
class PoolCapacity:
    """One pool's SLO-qualified capacity for one model, or why it has none."""

    pool: str
    streams: float | None = None  # concurrent streams within the SLO, at today's endpoints
    tokens_per_s: float | None = None  # output tokens/s at that load, at today's endpoints
    run: int | None = None  # the benchmark run it comes from
    evidence: int | None = None  # the evidence row
    measured_on: str = ""  # ISO date of the run
    endpoints_measured: int | None = None
    endpoints_now: int | None = None
    why_none: str = ""  # set when streams/tokens_per_s are None

    @property
    def known(self) -> bool:
        return self.tokens_per_s is not None and self.tokens_per_s > 0

    @property
    def source(self) -> str:
        """Where the figure comes from, in a sentence fragment ("benchmark run 12 on
        2026-12-01, 2 endpoints then, 2 now")."""
        if not self.known:
            return self.why_none or "no benchmark"
        scaled = ""
        if self.endpoints_measured and self.endpoints_now != self.endpoints_measured:
            scaled = (f", scaled from {self.endpoints_measured} endpoint(s) then to "
                      f"{self.endpoints_now} now")
        return f"benchmark run {self.run} on {self.measured_on}{scaled}"


CapacitySource = Callable[[str, list[Any]], dict[str, PoolCapacity]]
SOURCES: list[CapacitySource] = []


def register_capacity_source(source: CapacitySource) -> CapacitySource:
    if source not in SOURCES:
        SOURCES.append(source)
    return source


def pool_capacities(model_id: str, pools: Iterable[Any]) -> dict[str, PoolCapacity]:
    """Pool name -> its capacity for `model_id` (Pool rows in), from the first source that
    knows it; a pool none knows gets a PoolCapacity saying so. `model_id` "": from the
    newest benchmark of any model (a pool page's one figure, read in constant queries)."""
    wanted = {pool.name: pool for pool in pools}
    found: dict[str, PoolCapacity] = {}
    for source in SOURCES:
        missing = [wanted[name] for name in sorted(set(wanted) - set(found))]
        if not missing:
            break
        for name, capacity in source(model_id, missing).items():
            if capacity.known or name not in found:
                found[name] = capacity
    for name in wanted:
        found.setdefault(name, PoolCapacity(
            pool=name, why_none="no benchmark of it for this model yet: run one "
                                "(Benchmarks → New run)"))
    return found


def live_streams(pools: Iterable[str], *, now: datetime | None = None) -> dict[str, int]:
    """Pool name -> the streams in flight at the gateways now: each gateway's newest sample
    of the pool (no older than LIVE_SAMPLE_MAX_AGE_S), summed. A pool no gateway sampled
    lately is left out (unknown, which is not zero)."""
    now = now or timezone.now()
    names = sorted(set(pools))
    latest: dict[tuple[int, str], PoolTrafficSample] = {}
    rows = (PoolTrafficSample.objects
            .filter(pool__in=names, at__gte=now - timedelta(seconds=LIVE_SAMPLE_MAX_AGE_S),
                    at__lte=now)
            .order_by("gateway_id", "pool", "-at"))
    for row in rows:
        latest.setdefault((row.gateway_id, row.pool), row)
    found: dict[str, int] = {}
    for (_, pool), row in latest.items():
        found[pool] = found.get(pool, 0) + max(0, row.active)
    return found


def proportional_weights(capacity: dict[str, float]) -> dict[str, int]:
    """Basis points summing to TOTAL_WEIGHT in proportion to each pool's capacity (pools of
    no capacity left out); the largest pool takes the rounding remainder. {} when none."""
    usable = {p: c for p, c in capacity.items() if c > 0}
    total = sum(usable.values())
    if not usable or total <= 0:
        return {}
    shares = {p: int(TOTAL_WEIGHT * c / total) for p, c in usable.items()}
    shares[max(shares, key=lambda p: (usable[p], p))] += TOTAL_WEIGHT - sum(shares.values())
    return shares
