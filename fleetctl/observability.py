"""Prometheus metrics for on-call alerting: `GET /api/v1/metrics`.

Every scrape builds a fresh `CollectorRegistry` holding one `FleetCollector`, which reads the
rows at that moment. Nothing is counted in process memory: there are many web processes and
the database is the record, so any of them answers the same. The collector runs a fixed
handful of queries (never one per gateway, route, pool or plan) and never talks to a gateway
or a pool, so a scrape stays fast when the fleet is not; on PostgreSQL its queries also run
under a statement timeout, so a scrape fails instead of hanging.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F, FilteredRelation, Q
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from rest_framework import renderers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleetctl.core.api.renderers import OnlyRepresentation, PassThroughRenderer
from fleetctl.fleet.models import Pool
from fleetctl.traffic.gateways.base import TOTAL_WEIGHT
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, Route
from migrations_plan import evidence as ev
from migrations_plan.models import GateCheck, Plan

# The Prometheus text exposition format, version 0.0.4 (what generate_latest writes).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A scrape's queries together take milliseconds; this only stops one that waits on a lock
# (e.g. behind a migration) from holding the scrape past Prometheus's own timeout.
STATEMENT_TIMEOUT_MS = 5000

OPEN_PUSH = (GatewayPush.Status.PENDING, GatewayPush.Status.RETRYING)
CLOSED_DRAIN = (Drain.Status.COMPLETE, Drain.Status.FAILED)


class FleetCollector:
    """Yields every fleetctl metric family from the database, at collect() time."""

    def __init__(self, *, now: datetime | None = None) -> None:
        self.now = now or timezone.now()

    def collect(self) -> Iterator[Metric]:
        if connection.vendor == "postgresql":
            # SET LOCAL lasts until the end of this transaction only. (Not on SQLite: its
            # transactions here are IMMEDIATE, i.e. they would take the write lock.)
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL statement_timeout = {int(STATEMENT_TIMEOUT_MS)}")
                families = self._families()
        else:
            families = self._families()
        yield from families

    def _families(self) -> list[Metric]:
        return [*self._gateways(), *self._routes(), *self._drains(), *self._pools(),
                *self._plans()]

    def _since(self, moment: datetime) -> float:
        # Web processes' clocks may disagree by a little; a negative age is never meaningful.
        return max(0.0, (self.now - moment).total_seconds())

    # --- gateways: 1 query ---------------------------------------------------------------

    def _gateways(self) -> list[Metric]:
        labels = ["gateway", "kind"]
        in_sync = GaugeMetricFamily(
            "fleetctl_gateway_in_sync",
            "1 when the gateway verified it holds every route at its current revision. 0 "
            "while it is failing or was never pushed; see fleetctl_gateway_failing and the "
            "gateways on /traffic/.", labels=labels)
        failing = GaugeMetricFamily(
            "fleetctl_gateway_failing",
            "1 when the last push to the gateway failed: it may still route by an old split, "
            "including to a drained pool. Its last_error is at /api/v1/gateways/<gateway>/; "
            "fix the gateway (is it up, is its admin address reachable?) and pushes retry by "
            "themselves.", labels=labels)
        state_seconds = GaugeMetricFamily(
            "fleetctl_gateway_state_seconds",
            "Seconds the gateway has been in its current state (in sync, failing or unknown; "
            "since it was registered when it never changed). With fleetctl_gateway_failing "
            "it says how long a gateway has been failing.", labels=labels)
        verified = GaugeMetricFamily(
            "fleetctl_gateway_last_verified_timestamp_seconds",
            "Unix time of the gateway's last verified push; no sample when never verified. "
            "time() minus this is how stale its confirmed state is.", labels=labels)
        pushes_open = GaugeMetricFamily(
            "fleetctl_gateway_pushes_open",
            "Pushes to the gateway still pending or retrying. Above 0 for minutes means a "
            "split change has not reached it; /api/v1/pushes/?gateway__name=<gateway> "
            "lists the attempts and their errors.", labels=labels)
        rows = (
            Gateway.objects.order_by("name")
            # The filter sits in the JOIN's ON clause, so only open pushes are joined (the
            # pushes table keeps every push ever made).
            .annotate(open_pushes=FilteredRelation(
                "pushes", condition=Q(pushes__status__in=OPEN_PUSH)))
            .annotate(pushes_open=Count("open_pushes"))
            .values_list("name", "kind", "state", "state_changed_at", "created_at",
                         "last_verified_at", "pushes_open")
        )
        for name, kind, state, changed_at, created_at, last_verified_at, n_open in rows:
            values = [name, kind]
            in_sync.add_metric(values, 1 if state == Gateway.State.IN_SYNC else 0)
            failing.add_metric(values, 1 if state == Gateway.State.FAILING else 0)
            state_seconds.add_metric(values, self._since(changed_at or created_at))
            if last_verified_at is not None:
                verified.add_metric(values, last_verified_at.timestamp())
            pushes_open.add_metric(values, n_open)
        return [in_sync, failing, state_seconds, verified, pushes_open]

    # --- routes: 1 query -----------------------------------------------------------------

    def _routes(self) -> list[Metric]:
        ratio = GaugeMetricFamily(
            "fleetctl_route_weight_ratio",
            "Share of the route's traffic each pool gets in its current revision (0-1); "
            "pools without weight have no sample. A route with a fleetctl_route_revision "
            "sample but none here has an empty split and answers 503 (drained with no pool "
            "left in its jurisdiction).", labels=["route", "pool"])
        revision = GaugeMetricFamily(
            "fleetctl_route_revision",
            "The route's current split revision number; it goes up on every ramp, drain and "
            "restore. The history (who, why) is at /api/v1/routes/<route>/revisions/.",
            labels=["route"])
        rows = (
            Route.objects.order_by("name")
            .annotate(current=FilteredRelation(
                "revisions", condition=Q(revisions__number=F("revision_number"))))
            .values_list("name", "revision_number", "current__weights")
        )
        for name, number, weights in rows:
            revision.add_metric([name], number)
            for pool, points in sorted((weights or {}).items()):
                if points:
                    ratio.add_metric([name, pool], points / TOTAL_WEIGHT)
        return [ratio, revision]

    # --- drains: 1 + one per action (2) queries ------------------------------------------

    def _drains(self) -> list[Metric]:
        drains = GaugeMetricFamily(
            "fleetctl_drains",
            "Drain and restore records by action and status (all time). A rising "
            "status=\"partial\" or \"failed\" count means a drain did not reach every gateway; "
            "the record (/traffic/drains/) names which.", labels=["action", "status"])
        open_drains = GaugeMetricFamily(
            "fleetctl_drains_open",
            "Drains and restores not yet complete or failed (pushing, verified and waiting "
            "for in-flight requests, or partial). One that stays open means a gateway still "
            "routes to the drained pool or its streams do not end; see /traffic/drains/.")
        duration = GaugeMetricFamily(
            "fleetctl_drain_last_duration_seconds",
            "Request to completion (every gateway verified and the drained pools' in-flight "
            "requests at zero) of the most recent completed drain or restore, by action. "
            "Compare with the drain target before relying on drains in an incident.",
            labels=["action"])
        counts = {(action, status): 0 for action in Drain.Action.values
                  for status in Drain.Status.values}
        for action, status, n in (Drain.objects.order_by().values("action", "status")
                                  .annotate(n=Count("id")).values_list("action", "status", "n")):
            counts[(action, status)] = n
        for (action, status), n in counts.items():
            drains.add_metric([action, status], n)
        open_drains.add_metric(
            [], sum(n for (_, status), n in counts.items() if status not in CLOSED_DRAIN))
        for action in Drain.Action.values:
            last = (Drain.objects.filter(action=action, status=Drain.Status.COMPLETE,
                                         completed_at__isnull=False)
                    .order_by("-completed_at", "-id")
                    .values_list("requested_at", "completed_at").first())
            if last is not None and last[1] is not None:
                duration.add_metric([action], (last[1] - last[0]).total_seconds())
        return [drains, open_drains, duration]

    # --- pools: 1 query ------------------------------------------------------------------

    def _pools(self) -> list[Metric]:
        healthy = GaugeMetricFamily(
            "fleetctl_pool_healthy",
            "1 when the pool's health probe says healthy; 0 when unhealthy (failed "
            "HEALTH_FAILURES_TO_UNHEALTHY probes in a row) or not probed yet. Its probe "
            "history and last error are at /api/v1/health-checks/?pool=<pool>.",
            labels=["pool", "runtime", "region"])
        for name, runtime, region, state in (
            Pool.objects.order_by("name")
            .values_list("name", "runtime", "region__code", "health_state")
        ):
            healthy.add_metric([name, runtime, region],
                               1 if state == Pool.Health.HEALTHY else 0)
        return [healthy]

    # --- plans: 2 queries ----------------------------------------------------------------

    def _plans(self) -> list[Metric]:
        stage = GaugeMetricFamily(
            "fleetctl_plan_stage",
            "Stage (1 abstraction, 2 shadow, 3 batch, 4 live) of each open migration plan; "
            "state says whether it is at that stage or paused there. Closed plans have no "
            "sample. The gate blocking the next stage is on /plans/<plan>/.",
            labels=["plan", "candidate", "state"])
        gate = GaugeMetricFamily(
            "fleetctl_plan_gate_status",
            "1 for the status the current stage's gate of each plan at a stage has, 0 for the "
            "others, in the words the API, the CLI and the dashboard use: fail (a check fails), "
            "awaiting-attestation (an attested check is not attested yet), insufficient, warn, "
            "pass. As the last gate refresh (plans.refresh) found it; no sample before a gate "
            "was first evaluated, or for a paused or closed plan.",
            labels=["plan", "stage", "status"])
        blocks = GaugeMetricFamily(
            "fleetctl_plan_gate_blocks_advance",
            "1 when the current stage's gate of the plan can be neither approved nor advanced "
            "(status fail or awaiting-attestation; the dashboard says blocked), 0 otherwise. "
            "Same refresh and samples as fleetctl_plan_gate_status.",
            labels=["plan", "stage"])
        at_stage: dict[int, tuple[str, int]] = {}
        for pk, name, candidate, state, number in (
            Plan.objects.exclude(state__in=Plan.CLOSED_STATES).order_by("name")
            .values_list("pk", "name", "candidate_pool__name", "state", "stage")
        ):
            stage.add_metric([name, candidate, state], number)
            if state.startswith("stage-"):
                at_stage[pk] = (name, number)
        statuses: dict[int, list[str]] = {pk: [] for pk in at_stage}
        for plan_id, last in (
            GateCheck.objects.filter(plan__in=list(at_stage), stage=F("plan__stage"),
                                     removed_at__isnull=True)
            .values_list("plan_id", "last_status")
        ):
            statuses[plan_id].append(last)
        for pk, (name, number) in at_stage.items():
            seen = statuses[pk]
            if "" in seen:
                continue  # not evaluated since a check was added
            now = ev.gate_status(seen)
            for status in ev.STATUSES:
                gate.add_metric([name, str(number), status], 1 if status == now else 0)
            blocks.add_metric([name, str(number)], 1 if ev.blocks_advance(now) else 0)
        return [stage, gate, blocks]


def render_metrics() -> bytes:
    """The exposition text of one scrape, from a registry made for it alone."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return generate_latest(registry)


# --- the endpoint ---------------------------------------------------------------------------

class PrometheusTextRenderer(PassThroughRenderer):
    """Passes the exposition text through; error bodies are switched to JSON by the view."""

    media_type = "text/plain"
    format = "prometheus"
    charset = "utf-8"


class MetricsView(APIView):
    """Prometheus metrics of gateways, routes, drains, pools and migration plans, read from
    the database at scrape time. Needs the `read` permission (token scope `read`)."""

    renderer_classes = [PrometheusTextRenderer]
    content_negotiation_class = OnlyRepresentation

    @extend_schema(
        operation_id="metrics",
        responses={(200, "text/plain"): OpenApiResponse(
            response=OpenApiTypes.STR,
            description="Prometheus text exposition format 0.0.4 "
                        f"(`Content-Type: {CONTENT_TYPE}`)."
        )},
    )
    def get(self, request: Request) -> Response:
        return Response(render_metrics(), content_type=CONTENT_TYPE)

    def finalize_response(self, request: Request, response: Any, *args: Any,
                          **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(response, Response) and not isinstance(response.data, bytes):
            # Errors (401, 403…) and OPTIONS keep the API's one JSON shape.
            response.accepted_renderer = renderers.JSONRenderer()
            response.accepted_media_type = renderers.JSONRenderer.media_type
        return response
