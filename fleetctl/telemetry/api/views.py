"""Read-only telemetry API (scope `read`): live per-pool figures, one pool over time, and
where the ingester stands."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.core.errors import NotFoundError
from fleetctl.fleet import selectors as fleet_selectors
from fleetctl.telemetry import selectors
from fleetctl.telemetry.api import serializers as s


class TelemetryPoolViewSet(viewsets.ViewSet):
    """Live figures per pool, measured at the gateways (access logs) and by the pools
    themselves (/metrics)."""

    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"
    serializer_class = s.PoolStatsSerializer

    @extend_schema(
        parameters=[s.SummaryQuery,
                    OpenApiParameter("pool", str, many=True,
                                     description="Only these pools (repeat the parameter).")],
        responses=s.PoolStatsSerializer(many=True))
    def list(self, request: Request) -> Response:
        """Every pool (or those named) over the last `window_s` seconds, all routes together."""
        query = s.SummaryQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        pools = request.query_params.getlist("pool") or None
        summary = selectors.live_summary(pools=pools, window_s=query.validated_data["window_s"])
        return Response(s.PoolStatsSerializer([stats.as_dict() for stats in summary.values()],
                                              many=True).data)

    @extend_schema(parameters=[s.DetailQuery], responses=s.PoolDetailSerializer)
    def retrieve(self, request: Request, name: str) -> Response:
        """One pool in [since, until) (default the last 15 minutes), optionally one route:
        the figures with their bounds and sources, and a series per time step."""
        query = s.DetailQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        if not fleet_selectors.pool_exists(name=name):
            raise NotFoundError(f"No pool named {name!r}.")
        args: dict[str, Any] = {"pool": name, "route": query.validated_data.get("route"),
                                "since": query.validated_data["since"],
                                "until": query.validated_data["until"]}
        stats = selectors.pool_stats(**args, reported=True)
        series = selectors.pool_series(
            **args, resolution_s=query.validated_data.get("resolution_s"))
        return Response(s.PoolDetailSerializer({"stats": stats.as_dict(),
                                                "series": series}).data)


    @extend_schema(parameters=[s.CostQuery], responses=s.PoolCostSerializer)
    @action(detail=True, methods=["get"])
    def cost(self, request: Request, name: str) -> Response:
        """Live cost of one pool in [since, until) (default the last 24 hours), or of one
        route's share of it: output tokens served, hours, cost and cost per 1M output
        tokens, utilisation, beside the benchmark's cost with the gap explained; with
        `period`, per UTC day or calendar month too. Never a 0 for what was not measured:
        `not_measured` says why."""
        from fleetctl.telemetry.cost import live_cost, live_cost_rollup

        query = s.CostQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        if not fleet_selectors.pool_exists(name=name):
            raise NotFoundError(f"No pool named {name!r}.")
        data = query.validated_data
        args: dict[str, Any] = {"pool": name, "since": data["since"], "until": data["until"],
                                "route": data.get("route")}
        total = live_cost(**args)
        periods = (live_cost_rollup(**args, period=data["period"]) if data.get("period")
                   else [])
        return Response(s.PoolCostSerializer({
            "total": total.as_dict(), "periods": [p.as_dict() for p in periods]}).data)


class IngestStatusViewSet(viewsets.ViewSet):
    """Where the ingester stands in every log it follows and every /metrics it scrapes."""

    serializer_class = s.IngestStatusSerializer

    @extend_schema(responses=s.IngestStatusSerializer(many=True))
    def list(self, request: Request) -> Response:
        return Response(s.IngestStatusSerializer(selectors.ingest_status(), many=True).data)
