"""Writes for the routing probe (routing.py): start one, execute it, cancel it, fail the ones
whose worker stopped, and record what a finished one found as `routing-policy` evidence.

A probe is about one route and sends through every gateway that carries it and says where
callers reach it (the Envoy option `listen_url`), or the one named. The pools each tier may
use are computed when it runs (tiers.py), as the gateway's push computed them. With a plan
(the route must be one of its routes), the finished probe records evidence about the plan's
candidate on that route; without one it only keeps its verdict.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Any

import httpx
from django.core.exceptions import ValidationError
from django.db import transaction

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.conformance import routing
from fleetctl.conformance.evidence import ROUTING_KIND
from fleetctl.conformance.models import RoutingProbe
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import Pool
from fleetctl.traffic import selectors as traffic
from fleetctl.traffic.models import Gateway, Route
from fleetctl.traffic.tiers import route_tier_pools
from migrations_plan import jobs

if TYPE_CHECKING:
    from migrations_plan.models import Plan

log = logging.getLogger("fleetctl.conformance")
PRODUCER = "routing-probe"
HEARTBEAT_STALE_S = 300
QUEUED_STALE_S = 900


def probe_gateways(route: Route, gateway: Gateway | None = None) -> list[dict[str, str]]:
    """The gateways to send through: [{name, listen_url}], or the 400 that says why none."""
    carrying = list(route.gateways.order_by("name"))
    if gateway is not None and gateway not in carrying:
        raise ValidationError({"gateway": [
            f"Gateway {gateway.name} does not carry route {route.name} (it is carried by "
            f"{', '.join(g.name for g in carrying) or 'no gateway'})."]})
    chosen = [gateway] if gateway is not None else carrying
    found = [{"name": g.name, "listen_url": str((g.options or {}).get("listen_url") or "")}
             for g in chosen]
    usable = [g for g in found if g["listen_url"]]
    if not usable:
        names = ", ".join(g["name"] for g in found) or "no gateway"
        field = "gateway" if gateway is not None else "route"
        raise ValidationError({field: [
            f"Route {route.name} cannot be probed: {names} says no listen_url (the "
            f"http://host:port callers reach it at). Set the gateway's listen_url option "
            f"first." if found else
            f"Route {route.name} is carried by no gateway: put it on a gateway first."]})
    return usable


def probe_create(*, actor: Actor, route: Route, plan: Plan | None = None,
                 gateway: Gateway | None = None) -> RoutingProbe:
    """Queue a routing probe of `route` (jobs). 400 when the route is not the plan's or no
    gateway carrying it has a listen_url; 409 when the plan is closed or a probe of the
    route is still queued or running."""
    actor.require(roles.JOBS, action="routing.probe.create", target=route)
    if plan is not None:
        jobs.require_open(plan, "routing probes")
        if not plan.routes.filter(pk=route.pk).exists():
            raise ValidationError({"route": [
                f"Route {route.name} is not one of plan {plan.name}'s routes "
                f"({', '.join(r.name for r in plan.routes.order_by('name')) or 'none'})."]})
    gateways = probe_gateways(route, gateway)
    probe = RoutingProbe(route=route, plan=plan, gateways=gateways, created_by=actor.label,
                         plan_stage=plan.stage if plan is not None else None)
    with transaction.atomic():
        busy = (RoutingProbe.objects.select_for_update()
                .filter(route=route, status__in=RoutingProbe.ACTIVE).first())
        if busy is not None:
            raise ConflictError(f"Routing probe {busy.pk} of {route.name} is still "
                                f"{busy.status}; wait for it (or cancel it) first.")
        probe.save()
        audit_record(actor=actor, action="routing.probe.create", target=probe,
                     after={"route": route.name, "plan": plan.name if plan else None,
                            "gateways": [g["name"] for g in gateways]})
        transaction.on_commit(lambda: _enqueue(probe.pk))
    return probe


def plan_probes_create(*, actor: Actor, plan: Plan) -> list[RoutingProbe]:
    """The plan page's button: one probe per route of the plan (400 when it has none)."""
    routes = list(plan.routes.order_by("name"))
    if not routes:
        raise ValidationError({"route": [f"Plan {plan.name} names no route to probe."]})
    return [probe_create(actor=actor, route=route, plan=plan) for route in routes]


def _enqueue(probe_id: int) -> None:
    from fleetctl.conformance.tasks import routing_probe_execute

    routing_probe_execute.delay(probe_id)


def probe_cancel(*, actor: Actor, probe: RoutingProbe) -> RoutingProbe:
    return jobs.cancel(actor, probe, action="routing.probe.cancel", noun="Routing probe")


def probe_execute(*, probe_id: int) -> RoutingProbe | None:
    """The `conformance.routing_probe` task: every request through every gateway, judged,
    then the verdict (and, with a plan, the evidence)."""
    if not jobs.take(RoutingProbe, probe_id, worker=socket.gethostname(),
                     resume_after_s=HEARTBEAT_STALE_S / 2):
        return RoutingProbe.objects.filter(pk=probe_id).first()
    probe = RoutingProbe.objects.select_related("route", "plan").get(pk=probe_id)
    route = probe.route
    try:
        outcomes = _send_all(probe, route)
    except Exception as exc:
        log.exception("routing probe %s failed", probe_id)
        jobs.fail(probe, f"{type(exc).__name__}: {exc}")
        return RoutingProbe.objects.get(pk=probe_id)
    if outcomes is None:
        return RoutingProbe.objects.get(pk=probe.pk)  # cancelled meanwhile
    if not any(o.result != routing.UNJUDGED for o in outcomes):
        first = outcomes[0].detail if outcomes else "no request to send"
        jobs.fail(probe, f"no answer could be judged: {first}"[:2000],
                  results=[o.as_dict() for o in outcomes])
        return RoutingProbe.objects.get(pk=probe.pk)
    return _finish(probe, outcomes)


def _send_all(probe: RoutingProbe, route: Route) -> list[routing.Outcome] | None:
    views = route_tier_pools(route)
    eligible = traffic.pools_eligible(route=route)
    pools = {p.name: p for p in Pool.objects.select_related("region")
             .filter(name__in={c.pool.name for v in views for c in v.eligible} | eligible
                     | {c.pool.name for v in views for c, _ in v.others})}
    outcomes: list[routing.Outcome] = []
    with httpx.Client(timeout=routing.TIMEOUT_S) as client:
        for target in probe.gateways:
            gateway = Gateway.objects.filter(name=target["name"]).first()
            if gateway is None:
                continue  # deleted since: nothing to send through
            desired = traffic.gateway_desired_state(gateway=gateway)
            spec = next((r for r in desired.routes if r.key == route.name), None)
            for planned in routing.plan_probes(route, views, spec, eligible):
                outcomes.append(routing.send(client, target["listen_url"], gateway.name,
                                             route, desired, planned, pools))
            if not jobs.heartbeat(probe):
                return None
    return outcomes


def _finish(probe: RoutingProbe, outcomes: list[routing.Outcome]) -> RoutingProbe:
    verdict, summary = routing.summarise(outcomes)
    results = [o.as_dict() for o in outcomes]
    violations = [f"{o.label} via {o.gateway}: {o.detail}"[:300]
                  for o in outcomes if o.result == routing.VIOLATION]
    data: dict[str, Any] = {"probe": probe.pk, "route": probe.route.name,
            "gateways": [g["name"] for g in probe.gateways],
            "requests": len(outcomes),
            "violations": violations,
            "unjudged": sum(1 for o in outcomes if o.result == routing.UNJUDGED),
            "pools_seen": sorted({o.pool for o in outcomes if o.pool})}

    def evidence(locked: RoutingProbe) -> dict[str, Any]:
        if probe.plan is None:
            return {}
        from migrations_plan.services import evidence_record

        row = evidence_record(actor=Actor.for_system(PRODUCER), pool=probe.plan.candidate_pool,
                              kind=ROUTING_KIND, verdict=verdict, summary=summary[:600],
                              data=data, route=probe.route, model_id=probe.route.model_id,
                              source=f"routing probe {probe.pk}",
                              url=f"/conformance/routing-probes/{probe.pk}/")
        locked.evidence_id = row.pk
        locked.save(update_fields=["evidence_id"])
        return {"evidence": row.pk}

    return jobs.finish(probe, actor=Actor.for_system(PRODUCER), action="routing.probe.finish",
                       evidence=evidence,
                       fields={"verdict": verdict, "summary": summary[:600],
                               "results": results},
                       message=f"{verdict}: {summary}",
                       after={"verdict": verdict, "violations": len(violations)})


def probes_reap(*, stale_after_s: float = HEARTBEAT_STALE_S) -> int:
    """Beat: a probe whose worker stopped, or that no worker took, is failed (no evidence)."""
    return jobs.reap(RoutingProbe, policy=jobs.Reap.FAIL, stale_after_s=stale_after_s,
                     queued_after_s=QUEUED_STALE_S, queue="probe",
                     kept="no evidence was recorded")
