"""A plan's capacity forecast: the peak demand on its routes over the last days, from live
telemetry, against each of its two pools' SLO-qualified capacity (fleetctl/traffic/capacity.py).

Peak demand is in concurrent streams, the unit capacity is measured in, by Little's law per
telemetry window: streams = requests in the window × their mean duration ÷ the window's
length (the gateways' access logs, Window.duration histograms), summed over the plan's routes,
pools and gateways for each window start, and the largest taken. The telemetry keeps 10 s
windows for 6 hours, minutes for 2 days and 10-minute windows for 30 days, so an older peak
is a 10-minute average: short bursts are smoothed, which the forecast says."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from fleetctl.telemetry import histogram
from fleetctl.telemetry.models import Window
from fleetctl.traffic.capacity import PoolCapacity, pool_capacities
from migrations_plan.models import Plan


@dataclass(frozen=True)
class Peak:
    streams: float | None  # None: no telemetry of the routes in the period
    at: datetime | None = None
    resolution_s: int | None = None
    requests: int = 0  # in the peak window
    mean_duration_s: float | None = None
    why_none: str = ""

    @property
    def source(self) -> str:
        if self.streams is None:
            return self.why_none
        return (f"{self.requests} requests in the {self.resolution_s} s window from "
                f"{self.at:%Y-%m-%d %H:%M} UTC, mean duration {self.mean_duration_s:.2f} s "
                f"(Little's law: requests × mean duration ÷ window)")


@dataclass(frozen=True)
class PoolHeadroom:
    role: str  # "primary" / "candidate"
    capacity: PoolCapacity
    share: float | None  # peak ÷ capacity, None when either is unknown

    @property
    def short(self) -> bool:
        return self.share is not None and self.share > 1


@dataclass
class Forecast:
    days: int
    peak: Peak
    pools: list[PoolHeadroom] = field(default_factory=list)

    @property
    def primary_short(self) -> bool:
        return any(p.short for p in self.pools if p.role == "primary")

    def as_json(self) -> dict[str, Any]:
        return {"days": self.days,
                "peak_streams": None if self.peak.streams is None else round(
                    self.peak.streams, 2),
                "peak_at": self.peak.at.isoformat() if self.peak.at else None,
                "peak_source": self.peak.source, "primary_short": self.primary_short,
                "pools": [{"role": p.role, "pool": p.capacity.pool,
                           "capacity_streams": p.capacity.streams,
                           "capacity_tokens_per_s": p.capacity.tokens_per_s,
                           "capacity_source": p.capacity.source,
                           "peak_share": None if p.share is None else round(p.share, 3)}
                          for p in self.pools]}


def _mean_s(h: dict[str, int]) -> float | None:
    n = histogram.count(h)
    if not n:
        return None
    return sum(histogram.value_of(int(i)) * c for i, c in h.items()) / n / 1000.0


def peak_demand(routes: list[str], *, since: datetime, until: datetime) -> Peak:
    """The most concurrent streams the routes carried in one telemetry window."""
    rows = (Window.objects.filter(source=Window.Source.GATEWAY, route__in=routes,
                                  start__gte=since, start__lt=until)
            .order_by().values("resolution_s", "start", "requests", "duration"))
    steps: dict[tuple[int, datetime], tuple[int, dict[str, int]]] = {}
    for row in rows:
        key = (row["resolution_s"], row["start"])
        count, merged = steps.get(key, (0, {}))
        steps[key] = (count + row["requests"], histogram.merge(merged, row["duration"] or {}))
    best: Peak | None = None
    for (resolution, start), (requests, durations) in steps.items():
        mean = _mean_s(durations)
        if not requests or mean is None:
            continue
        streams = requests * mean / resolution
        if best is None or streams > (best.streams or 0):
            best = Peak(streams=streams, at=start, resolution_s=resolution, requests=requests,
                        mean_duration_s=mean)
    if best is None:
        return Peak(streams=None, why_none=(
            f"no request with a duration logged on route(s) {', '.join(routes)} since "
            f"{since:%Y-%m-%d %H:%M} UTC (the gateways' access logs feed it)"))
    return best


def plan_forecast(plan: Plan, *, days: int, now: datetime | None = None) -> Forecast:
    now = now or timezone.now()
    routes = list(plan.routes.order_by("name"))
    peak = peak_demand([r.name for r in routes], since=now - timedelta(days=days), until=now)
    model_id = routes[0].model_id if routes else ""
    pools = [("primary", plan.primary_pool), ("candidate", plan.candidate_pool)]
    found = pool_capacities(model_id, [pool for _, pool in pools])
    headroom = []
    for role, pool in pools:
        cap = found[pool.name]
        share = (peak.streams / cap.streams if peak.streams is not None and cap.known
                 and cap.streams else None)
        headroom.append(PoolHeadroom(role=role, capacity=cap, share=share))
    return Forecast(days=days, peak=peak, pools=headroom)
