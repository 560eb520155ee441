from __future__ import annotations

from django.conf import settings
from django.db.models import Q, QuerySet

from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic.adapters.base import DesiredState, GatewaySpec, PoolTarget, RouteSpec
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, Route, SplitRevision


def route_list() -> QuerySet[Route]:
    return Route.objects.select_related("primary_pool").prefetch_related("gateways")


def revision_current(*, route: Route) -> SplitRevision | None:
    """The route's current split, from the database alone: its highest-numbered revision."""
    return SplitRevision.objects.filter(route=route, number=route.revision_number).first()


def revisions_current(*, routes: list[Route]) -> dict[int, SplitRevision]:
    if not routes:
        return {}
    match = Q()
    for route in routes:
        match |= Q(route_id=route.pk, number=route.revision_number)
    return {rev.route_id: rev for rev in SplitRevision.objects.filter(match)}


def pools_eligible(*, route: Route) -> set[str]:
    """Pools that may carry this route: they serve its model and, when it is pinned, sit in
    its jurisdiction. Health is not required here: a drain back to an unhealthy primary is
    still better than sending pinned traffic abroad."""
    entries = PoolModel.objects.filter(model_id=route.model_id)
    if route.residency:
        entries = entries.filter(pool__region__jurisdiction=route.residency)
    return set(entries.values_list("pool__name", flat=True))


def gateway_spec(gateway: Gateway) -> GatewaySpec:
    return GatewaySpec(name=gateway.name, kind=gateway.kind,
                       admin_address=gateway.admin_address, options=dict(gateway.options))


def gateway_desired_state(*, gateway: Gateway) -> DesiredState:
    routes = list(gateway.routes.all())
    current = revisions_current(routes=routes)
    specs = tuple(
        RouteSpec(key=route.name, model=route.model_id, latency_class=route.latency_class,
                  residency=route.residency, revision=route.revision_number,
                  weights=dict(current[route.pk].weights) if route.pk in current else {})
        for route in sorted(routes, key=lambda r: r.name)
    )
    names = {pool for spec in specs for pool in spec.weights}
    # Every pool that may ever carry these routes is declared, so a split change never needs
    # a structural change on the gateway (only weights move).
    for route in routes:
        names |= pools_eligible(route=route)
    pools = {
        pool.name: PoolTarget(name=pool.name, base_urls=tuple(pool.base_urls),
                              jurisdiction=pool.region.jurisdiction)
        for pool in Pool.objects.select_related("region").filter(name__in=names)
    }
    return DesiredState(
        routes=specs, pools=pools,
        residency_header=settings.TRAFFIC_RESIDENCY_HEADER,
        latency_class_header=settings.TRAFFIC_LATENCY_CLASS_HEADER,
    )


def gateway_list() -> QuerySet[Gateway]:
    return Gateway.objects.prefetch_related("routes")


def push_list() -> QuerySet[GatewayPush]:
    return GatewayPush.objects.select_related("gateway", "revision__route").prefetch_related(
        "attempt_rows")


def drain_list() -> QuerySet[Drain]:
    return Drain.objects.select_related("route", "pool").prefetch_related("revisions__route")


def drain_gateway_times(*, drain: Drain) -> list[GatewayPush]:
    """Per gateway and route: when it applied and verified the drain's revision."""
    return list(GatewayPush.objects.filter(revision__in=drain.revisions.all())
                .select_related("gateway", "revision__route").order_by("gateway__name"))


def pool_rates(*, gateway_ids: list[int] | None = None, minutes: int = 15
               ) -> dict[str, list[dict[str, float | str]]]:
    """Per pool (never only the aggregate): request rate, error rate and in-flight over time,
    from consecutive samples of each gateway, summed across gateways per sample time."""
    from collections import defaultdict
    from datetime import timedelta

    from django.utils import timezone

    from fleetctl.traffic.models import PoolTrafficSample

    since = timezone.now() - timedelta(minutes=minutes)
    samples = PoolTrafficSample.objects.filter(at__gte=since).order_by("gateway_id", "pool", "at")
    if gateway_ids is not None:
        samples = samples.filter(gateway_id__in=gateway_ids)
    previous: dict[tuple[int, str], PoolTrafficSample] = {}
    series: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for sample in samples:
        key = (sample.gateway_id, sample.pool)
        before = previous.get(key)
        previous[key] = sample
        if before is None or sample.requests_total < before.requests_total:
            continue  # first reading, or the gateway restarted and its counters reset
        seconds = (sample.at - before.at).total_seconds() or 1.0
        # Gateways are sampled one after another; a 10 s bucket lines their readings up.
        bucket = sample.at.replace(microsecond=0, second=sample.at.second // 10 * 10)
        stamp = bucket.isoformat()
        point = series[sample.pool].setdefault(stamp, {"rps": 0.0, "eps": 0.0, "active": 0.0})
        point["rps"] += (sample.requests_total - before.requests_total) / seconds
        point["eps"] += (sample.errors_total - before.errors_total) / seconds
        point["active"] += sample.active
    return {
        pool: [{"at": at, **values} for at, values in sorted(points.items())]
        for pool, points in sorted(series.items())
    }
