from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db.models import Exists, F, OuterRef, Q, QuerySet

from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic import tiers
from fleetctl.traffic.gateways.base import (
    TOTAL_WEIGHT,
    DesiredState,
    GatewaySpec,
    PoolTarget,
    PrefixAffinity,
    PromptCalibration,
    RouteSpec,
    TierSpec,
)
from fleetctl.traffic.holds import Hold
from fleetctl.traffic.mirror_auth import header_value
from fleetctl.traffic.models import (
    ContextTier,
    Drain,
    Gateway,
    GatewayPush,
    Route,
    SplitRevision,
)
from fleetctl.traffic.prompt_size import pool_calibrations

log = logging.getLogger("fleetctl.traffic")


def route_list() -> QuerySet[Route]:
    return Route.objects.select_related("primary_pool").prefetch_related("gateways")


def revision_current(*, route: Route) -> SplitRevision | None:
    """The route's current split, from the database alone: its highest-numbered revision."""
    return SplitRevision.objects.filter(route=route, number=route.revision_number).first()


def revisions_current(*, routes: list[Route]) -> dict[int, SplitRevision]:
    """Each route's current revision, in one query, holding the route object given and its
    parent (the routes API reads both per route: one query each before)."""
    if not routes:
        return {}
    match = Q()
    for route in routes:
        match |= Q(route_id=route.pk, number=route.revision_number)
    given = {route.pk: route for route in routes}
    current = {}
    for rev in SplitRevision.objects.filter(match).select_related("parent"):
        rev.route = given[rev.route_id]
        current[rev.route_id] = rev
    return current


def splits_current() -> list[dict[str, int]]:
    """Every route's current split (its weights), in one query: the revisions numbered as
    their route's revision_number, as `revisions_current` of every route reads them."""
    return list(SplitRevision.objects.filter(number=F("route__revision_number"))
                .order_by().values_list("weights", flat=True))


def pools_eligible(*, route: Route) -> set[str]:
    """Pools that may carry this route: they serve its model and, when it is pinned, sit in
    its jurisdiction. Health is not required here: a drain back to an unhealthy primary is
    still better than sending pinned traffic abroad."""
    entries = PoolModel.objects.filter(model_id=route.model_id)
    if route.residency:
        entries = entries.filter(pool__region__jurisdiction=route.residency)
    return set(entries.values_list("pool__name", flat=True))


def pools_eligible_many(*, routes: list[Route]) -> dict[int, set[str]]:
    """`pools_eligible` of several routes (route id -> pool names) in one query: a drain
    reads it once for all its routes, for its plan and its capacity check alike."""
    if not routes:
        return {}
    rows = (PoolModel.objects.filter(model_id__in={route.model_id for route in routes})
            .order_by().values_list("model_id", "pool__name", "pool__region__jurisdiction"))
    by_model: dict[str, list[tuple[str, str]]] = {}
    for model_id, name, jurisdiction in rows:
        by_model.setdefault(model_id, []).append((name, jurisdiction))
    return {route.pk: {name for name, jurisdiction in by_model.get(route.model_id, ())
                       if not route.residency or jurisdiction == route.residency}
            for route in routes}


def gateway_spec(gateway: Gateway) -> GatewaySpec:
    return GatewaySpec(name=gateway.name, kind=gateway.kind,
                       admin_address=gateway.admin_address, options=dict(gateway.options))


def gateway_desired_state(*, gateway: Gateway) -> DesiredState:
    """What the gateway should hold: each route at its current revision. Every pool that may
    carry a route is listed in it, at weight 0 when the split gives it none, so a ramp or a
    drain only moves weights (Envoy: one runtime update) instead of changing the route's
    shape (a config reload). An empty split stays empty: the route answers an error."""
    routes = list(gateway.routes.all())
    current = revisions_current(routes=routes)
    eligible = pools_eligible_many(routes=[route for route in routes if route.pk in current])
    # The pools the revisions name (by id), the routes' primaries and every eligible pool, in
    # one query: the drain path reads this.
    ids = {pk for revision in current.values() for pk in revision.pool_ids.values()}
    ids |= {route.primary_pool_id for route in routes}
    ids |= {pk for route in routes for pk in (route.mirror_pools or {}).values()}
    names = set().union(*eligible.values())
    registry = list(Pool.objects.select_related("region")
                    .filter(Q(pk__in=ids) | Q(name__in=names)))
    by_id = {pool.pk: pool for pool in registry}
    by_name = {pool.name: pool for pool in registry}
    tiers_by_route = _tier_specs(routes)
    specs = []
    for route in sorted(routes, key=lambda r: r.name):
        revision = current.get(route.pk)
        weights = _renderable_weights(route, revision, by_id) if revision else {}
        if weights:
            weights = {pool: 0 for pool in eligible[route.pk]} | weights
        mirror_bp = _renderable_mirror(route, by_id, eligible.get(route.pk, set())) \
            if weights else 0
        specs.append(RouteSpec(key=route.name, model=route.model_id,
                               latency_class=route.latency_class, residency=route.residency,
                               revision=route.revision_number, weights=weights,
                               mirror_bp=mirror_bp,
                               tiers=tiers_by_route.get(route.pk, ()) if weights else (),
                               affinity=route_affinity(route)))
    names = {pool for spec in specs for pool in spec.weights} & set(by_name)
    calibrations = pool_calibrations(names)  # the gateway's prompt-size estimate
    pools = {
        name: PoolTarget(name=name, base_urls=tuple(by_name[name].base_urls),
                         jurisdiction=by_name[name].region.jurisdiction,
                         latency_class=by_name[name].latency_class,
                         prompt=calibrations.get(name, PromptCalibration()))
        for name in sorted(names)
    }
    return desired_for_gateway(DesiredState(
        routes=tuple(specs), pools=pools,
        residency_header=settings.TRAFFIC_RESIDENCY_HEADER,
        latency_class_header=settings.TRAFFIC_LATENCY_CLASS_HEADER,
    ), gateway=gateway)


def route_affinity(route: Route) -> PrefixAffinity | None:
    """The route's prefix affinity as gateways enforce it; None when off."""
    if route.prefix_affinity == Route.PrefixAffinity.PROMPT:
        return PrefixAffinity("prompt", route.prefix_affinity_bytes)
    if route.prefix_affinity == Route.PrefixAffinity.HEADER:
        return PrefixAffinity("header", 0)
    return None


def _tier_specs(routes: list[Route]) -> dict[int, tuple[TierSpec, ...]]:
    """Route id -> its context tiers as gateways route them, with each tier's eligible pools
    (traffic/tiers.py): the tiers of every route in one query, the pools of their models in
    one more. A gateway narrows a tier's pools further to the route's own (`tier_weights`),
    so a tier never widens the route's residency-checked split."""
    by_route: dict[int, list[ContextTier]] = {}
    for tier in ContextTier.objects.filter(route__in=routes):  # ordered by bound, open last
        by_route.setdefault(tier.route_id, []).append(tier)
    if not by_route:
        return {}
    models = {route.model_id for route in routes if route.pk in by_route}
    entries: dict[str, list[PoolModel]] = {}
    for entry in (PoolModel.objects.filter(model_id__in=models)
                  .select_related("pool__region").order_by("pool__name")):
        entries.setdefault(entry.model_id, []).append(entry)
    specs = {}
    for route in routes:
        if route.pk not in by_route:
            continue
        found = tiers.candidates(route, entries=entries.get(route.model_id, []))
        specs[route.pk] = tuple(
            TierSpec(bound=view.tier.max_prompt_tokens, above=view.above,
                     behaviour=view.tier.behaviour, pools=tuple(view.eligible_names),
                     queue_max=view.tier.queue_max, retry_after_s=view.tier.retry_after_s)
            for view in tiers.tier_pools(route, by_route[route.pk], found=found))
    return specs


def desired_for_gateway(desired: DesiredState, *, gateway: Gateway) -> DesiredState:
    """`desired` (built for any gateway that carries the same routes: a push shares one) as
    this gateway holds it: its own shadow collector and, on every route when it mirrors, the
    header its copies carry to prove they are this gateway's (mirror_auth). On every route,
    not only those mirroring now: starting or stopping a shadow run stays a runtime change."""
    url = mirror_url(gateway=gateway)
    mirrors = bool(url) and gateway.supports_mirror
    routes = tuple(replace(route, mirror_auth=header_value(
        gateway.pk, gateway.mirror_secret, route.key) if mirrors else "")
        for route in desired.routes)
    if url == desired.mirror_url and routes == desired.routes:
        return desired  # the same object: render caches keyed on it still hit
    return replace(desired, mirror_url=url, routes=routes)


def mirror_url(*, gateway: Gateway) -> str:
    """The shadow collector this gateway mirrors to: its option `shadow_collector`, else the
    SHADOW_COLLECTOR_URL setting."""
    return str((gateway.options or {}).get("shadow_collector") or settings.SHADOW_COLLECTOR_URL)


def mirror_bp(percent: float) -> int:
    """A mirror percentage in basis points, as gateways hold it."""
    return max(0, min(TOTAL_WEIGHT, round(percent * 100)))


def _renderable_mirror(route: Route, by_id: dict[int, Pool], eligible: set[str]) -> int:
    """The route's mirror share for gateways, failing closed like _renderable_weights: 0
    unless every mirror pool is still the pool it was (same id under the same name), serves
    the route's model and sits inside its pin now. The registry refuses the edits that
    would break this (fleet services ask mirror_targets_refusals), so a 0 here is logged
    loudly: a second line, not the rule."""
    share = mirror_bp(route.mirror_percent or 0)
    if not share:
        return 0
    for name, pk in sorted((route.mirror_pools or {}).items()):
        pool = by_id.get(pk)
        if pool is None or pool.name != name or name not in eligible:
            log.error("route %s: mirroring withheld from gateways (%s): mirror pool %s is "
                      "gone, renamed, no longer serves %s or is outside the pin %s",
                      route.name, route.mirror_owner or "-", name, route.model_id,
                      route.residency or "-")
            return 0
    return share


def _renderable_weights(route: Route, revision: SplitRevision,
                        by_id: dict[int, Pool]) -> dict[str, int]:
    """The revision's weights that a gateway may be given now, failing closed: a weight
    whose pool is gone, or whose name another pool has taken since (ids differ), or whose
    pool sits outside the route's pin is withheld, and its share goes where a drain would
    send it (the primary, else the rest; with nobody left the route answers an error). The
    registry refuses the writes that would cause this (fleet services), so this is a second
    line, not the rule; it is logged loudly."""
    from fleetctl.traffic.split import drained

    def allowed(pool: Pool | None) -> bool:
        return pool is not None and (not route.residency
                                     or pool.region.jurisdiction == route.residency)

    withheld = set()
    for name, basis_points in revision.weights.items():
        pool = by_id.get(revision.pool_ids.get(name, -1))
        if pool is None or pool.name != name or not allowed(pool):
            withheld.add(name)
            if basis_points:
                log.error("route %s r%s: %s's weight withheld from gateways: its pool is gone, "
                          "renamed, taken over or outside the pin %s", route.name,
                          revision.number, name, route.residency or "-")
    if not withheld:
        return dict(revision.weights)
    primary = by_id.get(route.primary_pool_id)
    eligible = set(revision.weights) - withheld
    if primary is not None and allowed(primary):
        eligible.add(primary.name)
    return drained(revision.weights, remove=withheld,
                   primary=primary.name if primary is not None else "", eligible=eligible)


def gateway_list() -> QuerySet[Gateway]:
    return Gateway.objects.prefetch_related("routes")


def gateway_list_with_envoys() -> list[Gateway]:
    """The gateways, each `envoy-xds` one with `xds_envoys`: its Envoys as the xDS replicas
    recorded them (current, stale, refused or gone; fleetctl.xds.selectors)."""
    from fleetctl.xds.selectors import gateway_envoys

    gateways = list(gateway_list())
    envoys = gateway_envoys(gateways=[g.name for g in gateways if g.kind == "envoy-xds"])
    for gateway in gateways:
        gateway.xds_envoys = envoys.get(gateway.name)  # type: ignore[attr-defined]
    return gateways


def push_list() -> QuerySet[GatewayPush]:
    return GatewayPush.objects.select_related("gateway", "revision__route").prefetch_related(
        "attempt_rows")


def drain_list(*, with_restores: bool = False) -> QuerySet[Drain]:
    """Drains with their routes; `with_restores`: and the restores that undid each."""
    drains = Drain.objects.select_related("route", "pool").prefetch_related("revisions__route")
    return drains.prefetch_related("restored_by") if with_restores else drains


def drains_of_pool(*, pool: Pool, routes: list[Route]) -> list[Drain]:
    """Drains that took `pool`'s weight off any of `routes` (a drain of the pool, or of a
    whole route while it carried weight), oldest first (requested, then id). `drained_pools`
    is read in Python: SQLite has no JSON containment."""
    drains = (drain_list().filter(revisions__route__in=routes).distinct()
              .order_by("requested_at", "id"))
    return [d for d in drains if pool.name in (d.drained_pools or [])]


def drain_progress_reread(*, drain: Drain) -> None:
    """Read a drain's progress again from its row, in place (after waiting on its pushes)."""
    drain.refresh_from_db(fields=["status", "verified_at", "in_flight_zero_at",
                                  "completed_at", "last_error", "failure_reason"])


def drain_revisions(*, drain: Drain) -> list[SplitRevision]:
    """The revisions a drain made, one per route, each with its route's primary and its
    parent (what a restore goes back to). A stepped drain stores several per route: its
    last stands for the route, with `parent` set (in memory, never saved) to the split from
    before its first, which is what a restore of the drain goes back to."""
    rows = sorted(drain.revisions.select_related("route__primary_pool", "parent"),
                  key=lambda rev: (rev.route_id, rev.number))
    first: dict[int, SplitRevision] = {}
    last: dict[int, SplitRevision] = {}
    for rev in rows:
        first.setdefault(rev.route_id, rev)
        last[rev.route_id] = rev
    for route_id, rev in last.items():
        if first[route_id] is not rev:
            rev.parent = first[route_id].parent
    return list(last.values())


def drain_route_ids(*, drain: Drain) -> list[int]:
    """The routes a drain (or restore) changed, by id."""
    return list(drain.revisions.values_list("route_id", flat=True).distinct())


def drain_gateway_times(*, drain: Drain) -> list[GatewayPush]:
    """Per gateway and route: when it applied and verified the drain's revision."""
    from django.db.models.functions import Coalesce

    # A deleted gateway's pushes stay, under the name it had (services.gateway_delete).
    return list(GatewayPush.objects.filter(revision__in=drain.revisions.all())
                .select_related("gateway", "revision__route")
                .order_by(Coalesce("gateway__name", "gateway_name"), "revision__route__name"))


def drains_gateway_times(*, drains: list[Drain]) -> dict[int, list[GatewayPush]]:
    """`drain_gateway_times` of every drain of a page, in two queries (one per drain was
    the drains API's N+1: 50 on a page)."""
    from django.db.models.functions import Coalesce

    through = Drain.revisions.through
    drains_of: dict[int, list[int]] = {}
    for drain_id, revision_id in through.objects.filter(
            drain_id__in=[d.pk for d in drains]).values_list("drain_id", "splitrevision_id"):
        drains_of.setdefault(revision_id, []).append(drain_id)
    times: dict[int, list[GatewayPush]] = {d.pk: [] for d in drains}
    for push in (GatewayPush.objects.filter(revision__in=list(drains_of))
                 .select_related("gateway", "revision__route")
                 .order_by(Coalesce("gateway__name", "gateway_name"), "revision__route__name")):
        for drain_id in drains_of[push.revision_id]:
            times[drain_id].append(push)
    return times


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


# --- reads for the traffic dashboard ---------------------------------------------------------

def route_get(*, name: str) -> Route | None:
    # `has_context_tiers`: whether to read its tiers at all (traffic/tiers.py), in this query.
    return (route_list().select_related("primary_pool__region")
            .annotate(has_context_tiers=Exists(ContextTier.objects.filter(route=OuterRef("pk"))))
            .filter(name=name).first())


def revision_list(*, route: Route) -> QuerySet[SplitRevision]:
    """The route's revisions, newest first, each with its parent in the same query (a page
    diffs against it)."""
    return route.revisions.select_related("route", "parent").order_by("-number")


def revision_history(*, route: Route, limit: int = 50) -> list[SplitRevision]:
    return list(revision_list(route=route)[:limit])


def revision_push_ids(*, revision: SplitRevision) -> list[int]:
    """The pushes that carry a revision to its gateways, by id (to wait for them)."""
    return list(revision.pushes.values_list("pk", flat=True))


def route_gateway_pushes(*, route: Route) -> list[tuple[Gateway, GatewayPush | None]]:
    """Each gateway carrying the route, with its latest push of one of this route's revisions
    (None before the first). Two queries however many gateways and pushes there are."""
    from django.db.models import OuterRef, Subquery

    latest = (GatewayPush.objects.filter(gateway=OuterRef("pk"), revision__route=route)
              .order_by("-created_at", "-id").values("pk")[:1])
    gateways = list(Gateway.objects.filter(routes=route)
                    .annotate(latest_push_id=Subquery(latest)).order_by("name"))
    pushes = GatewayPush.objects.select_related("revision").in_bulk(
        [g.latest_push_id for g in gateways if g.latest_push_id]  # type: ignore[attr-defined]
    )
    return [(g, pushes.get(g.latest_push_id)) for g in gateways]  # type: ignore[attr-defined]


def ramp_pools(*, eligible: set[str], holding: set[str]) -> list[Pool]:
    """The pools a ramp may give weight to (`pools_eligible`), plus any that still hold weight
    on the route without being eligible now (e.g. moved region), so they can be set to 0."""
    names = eligible | holding
    return list(Pool.objects.select_related("region").filter(name__in=names).order_by("name"))


def pools_outside_pin(*, route: Route) -> list[Pool]:
    """Pools that serve the route's model but sit outside its residency pin: never offered."""
    if not route.residency:
        return []
    return list(Pool.objects.select_related("region")
                .filter(models__model_id=route.model_id)
                .exclude(region__jurisdiction=route.residency).order_by("name"))


def pool_get(*, name: str) -> Pool | None:
    return Pool.objects.select_related("region").filter(name=name).first()


class DrainPreview:
    """What a drain would do to one route; shown on the confirm page before anything moves."""

    def __init__(self, *, route: Route, before: dict[str, float], after: dict[str, float],
                 removed: list[str], capacity: dict[str, Any] | None = None) -> None:
        self.route = route
        self.before = before
        self.after = after
        self.removed = removed
        self.capacity = capacity or {}  # the capacity check's note (drain_capacity.check)


def drain_step(*, route: Route, weights: dict[str, int], pool: Pool | None,
               eligible: set[str] | None = None) -> tuple[dict[str, int], set[str]] | None:
    """What draining does to one route's split: a pool drain takes that pool out, a route
    drain takes out everything but the primary. None when the route has nothing to move.
    The drain service (under a row lock) and the dashboard's preview both use this.
    `eligible`: the route's `pools_eligible` when the caller read it already."""
    from fleetctl.traffic.split import drained

    if pool is not None:
        remove = {pool.name}
    else:
        remove = {p for p in weights if p != route.primary_pool.name}
    removed = remove & set(weights)
    if not removed:
        return None
    after = drained(weights, remove=remove, primary=route.primary_pool.name,
                    eligible=pools_eligible(route=route) if eligible is None else eligible)
    return after, removed


def drain_preview(*, route: Route | None = None, pool: Pool | None = None
                  ) -> list[DrainPreview]:
    """The drain as it would happen now (a person's: capacity-checked, may step), read
    only: the service recomputes it under a row lock and stays the authority."""
    from fleetctl.traffic import drain_capacity
    from fleetctl.traffic.split import as_percentages

    routes = [route] if route is not None else list(route_list())
    current = revisions_current(routes=routes)
    weights = {each.pk: current[each.pk].weights if each.pk in current else {}
               for each in routes}
    steps = {each.pk: drain_step(route=each, weights=weights[each.pk], pool=pool)
             for each in routes}
    moving = [each for each in routes if steps[each.pk] is not None]
    found = drain_capacity.readings(moving, {each.pk: weights[each.pk] for each in moving})
    previews = []
    for each in moving:
        _, removed = steps[each.pk]  # type: ignore[misc]
        after, note = drain_capacity.check(
            route=each, weights=weights[each.pk], remove=removed,
            eligible=pools_eligible(route=each), found=found, force=False, stepping=True)
        previews.append(DrainPreview(route=each, before=as_percentages(weights[each.pk]),
                                     after=as_percentages(after), removed=sorted(removed),
                                     capacity=note))
    return previews


def drain_get(*, drain_id: int) -> Drain | None:
    return drain_list(with_restores=True).filter(pk=drain_id).first()


def drain_restored_by(*, drain: Drain) -> Drain | None:
    """The restore that already undid this drain, if any (the first, should there be more)."""
    return Drain.objects.filter(restores=drain).order_by("requested_at", "pk").first()


def drains_recent(*, limit: int = 8) -> list[Drain]:
    return list(drain_list()[:limit])


def route_pool_rates(*, route: Route, pools: set[str], minutes: int = 15
                     ) -> dict[str, list[dict[str, float | str]]]:
    """pool_rates from the gateways carrying this route, for the pools that may carry it. A
    gateway counts per pool (cluster), not per route: a pool shared by two routes on one
    gateway shows both routes' traffic."""
    gateway_ids = [g.pk for g in route.gateways.all()]
    if not gateway_ids:
        return {}
    rates = pool_rates(gateway_ids=gateway_ids, minutes=minutes)
    return {pool: points for pool, points in rates.items() if pool in pools}


# --- what a registry write would do to traffic (fleet services ask before they write) --------

def _weight_of(revision: SplitRevision | None, pool: Pool) -> int:
    """The pool's share of a revision, counted only if the name still means this pool."""
    if revision is None or revision.pool_ids.get(pool.name) != pool.pk:
        return 0
    return int(revision.weights.get(pool.name, 0))


def routes_relying_on(*, pools: list[Pool], outside: str | None = None,
                      pinned: bool = False) -> list[str]:
    """Routes that give any of `pools` weight now, or have one as their primary, as
    sentences for an error. With `outside`, only routes pinned to a jurisdiction other than
    `outside` (the pools' jurisdiction after a move): those the move would take across a
    border; with `pinned`, only routes pinned to any jurisdiction. Reads the current
    revisions; callers hold the pools' (or their region's) row lock, which revision writers
    take too."""
    routes = list(Route.objects.select_related("primary_pool"))
    if outside is not None:
        routes = [r for r in routes if r.residency and r.residency != outside]
    if pinned:
        routes = [r for r in routes if r.residency]
    current = revisions_current(routes=routes)
    found = []
    for route in routes:
        pin = f" (pinned to {route.residency})" if route.residency else ""
        for pool in pools:
            share = _weight_of(current.get(route.pk), pool)
            if share:
                found.append(f"route {route.name}{pin} sends {share / 100:g} % to {pool.name}")
            if route.primary_pool_id == pool.pk:
                found.append(f"route {route.name}{pin} has {pool.name} as its primary")
    return found


def routes_mirroring_to(*, pools: list[Pool], outside: str | None = None,
                        model_id: str | None = None) -> list[str]:
    """Routes that mirror now (a shadow run) with one of `pools` among their mirror pools,
    as sentences for an error: "pool X is a mirror target of route Y (shadow run N); stop
    the shadow run first". With `outside`, only routes pinned to a jurisdiction other than
    `outside` (the pools' jurisdiction after a move); with `model_id`, only routes of that
    model (a pool that stops serving it). A pool counts only under the identity it was
    mirrored as (name and id). Callers hold the pools' row locks, which route_mirror_set
    takes too."""
    routes = Route.objects.filter(mirror_percent__gt=0).order_by("name")
    if model_id is not None:
        routes = routes.filter(model_id=model_id)
    found = []
    for route in routes:
        if outside is not None and not (route.residency and route.residency != outside):
            continue
        for pool in pools:
            if (route.mirror_pools or {}).get(pool.name) == pool.pk:
                owner = f" ({route.mirror_owner})" if route.mirror_owner else ""
                found.append(f"pool {pool.name} is a mirror target of route "
                             f"{route.name}{owner}; stop the shadow run first")
    return found


def routes_serving_model_from(*, pool: Pool, model_id: str) -> list[str]:
    """Routes of `model_id` that give `pool` weight now or have it as their primary, as
    sentences for an error: what would be stranded if the pool stopped serving the model
    (a pool-model deleted, or its model id changed). Pinned or not: gateways keep giving
    the pool its weight (they do not check what it serves), so the route's requests would
    reach a pool that no longer says it serves the model. Refused like deleting the pool;
    drain first. Callers hold the pool's row lock, which revision writers take too."""
    routes = list(Route.objects.select_related("primary_pool").filter(model_id=model_id)
                  .order_by("name"))
    current = revisions_current(routes=routes)
    found = []
    for route in routes:
        pin = f" (pinned to {route.residency})" if route.residency else ""
        share = _weight_of(current.get(route.pk), pool)
        if share:
            found.append(f"route {route.name}{pin} sends {share / 100:g} % of {model_id} to "
                         f"{pool.name}")
        if route.primary_pool_id == pool.pk:
            found.append(f"route {route.name}{pin} has {pool.name} as its primary for "
                         f"{model_id}")
    return found


def restore_target(*, revision: SplitRevision, route: Route, holds: list[Hold]
                   ) -> tuple[dict[str, int], list[Hold]]:
    """What restoring the drain that made `revision` puts back on its route, and the holds
    that keep a share back: the split from before the drain, except a pool whose share a
    ramp held (traffic/holds.py), which stays where the drain put it. The restore service
    (under the routes' locks) and the restore page both use this."""
    from fleetctl.traffic.split import drained

    before = revision.parent.weights if revision.parent else {}
    withheld = [hold for hold in holds if hold.route_id == revision.route_id
                and before.get(hold.pool, 0) > revision.weights.get(hold.pool, 0)]
    if not withheld:
        return dict(before), []
    return drained(before, remove={hold.pool for hold in withheld},
                   primary=route.primary_pool.name, eligible=pools_eligible(route=route)
                   ), withheld
