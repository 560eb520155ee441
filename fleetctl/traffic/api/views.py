from __future__ import annotations

from typing import Any, cast

from django.core.exceptions import ValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404  # an id of the wrong type: 404, not 500
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.api.viewsets import ServiceModelViewSet
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core import idempotency
from fleetctl.traffic import push, selectors, services, tiers
from fleetctl.traffic.api import serializers as s
from fleetctl.traffic.api import waiting
from fleetctl.traffic.capacity_split import route_capacity_split
from fleetctl.traffic.filters import GatewayFilter
from fleetctl.traffic.models import Drain, Route, SplitRevision
from fleetctl.traffic.services.affinity import affinity_dict


class RouteViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                   viewsets.GenericViewSet):
    """Routes (a model, optionally a latency class and a residency pin) and their splits."""

    queryset = selectors.route_list()
    serializer_class = s.RouteSerializer
    filterset_fields = ["model_id", "residency", "latency_class"]
    lookup_field = "name"

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        return s.RouteCreateSerializer if self.action == "create" else s.RouteSerializer

    def get_serializer_context(self) -> dict[str, Any]:
        context = dict(super().get_serializer_context())
        context["current_revisions"] = getattr(self, "_current", {})
        return context

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset())) or []
        # Current revisions in one query for the whole page.
        self._current = selectors.revisions_current(routes=list(page))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        route = self.get_object()
        self._current = selectors.revisions_current(routes=[route])
        return Response(self.get_serializer(route).data)

    def perform_create(self, serializer: s.RouteCreateSerializer) -> None:  # type: ignore[override]
        serializer.instance = services.route_create(
            actor=actor_from_request(self.request), **serializer.validated_data
        )
        context = cast(dict[str, Any], serializer.context)  # DRF's is a plain dict
        context["current_revisions"] = selectors.revisions_current(routes=[serializer.instance])

    @extend_schema(methods=["GET"], responses={200: s.RevisionSerializer(many=True)})
    @extend_schema(methods=["POST"], request=s.RevisionCreateSerializer,
                   parameters=[idempotency.PARAMETER, *waiting.PARAMETERS],
                   responses={201: s.RevisionAnswerSerializer,
                              200: s.RevisionAnswerSerializer})
    # The history of the route named in the URL: the route list's filters do not apply.
    @action(detail=True, methods=["get", "post"], filter_backends=[])
    @idempotency.idempotent
    def revisions(self, request: Request, name: str) -> Response:
        """GET: the route's revision history, newest first. POST: a new split (scope `ramp`):
        201 with the new revision; 200 with `unchanged: true` and the current revision when
        the split is the one in force (nothing stored or pushed); 409 with the current
        revision, its weights and author when `base_revision` is stale. ?wait=verified
        answers once every gateway verified it (or the timeout passed)."""
        route = self.get_object()
        if request.method == "GET":
            page = self.paginate_queryset(selectors.revision_list(route=route))
            return self.get_paginated_response(s.RevisionSerializer(page, many=True).data)
        timeout_s = waiting.wait_timeout(request)
        body = s.RevisionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        revision = services.revision_create(
            actor=actor_from_request(request), route=route, **body.validated_data
        )
        return self._revision_answer(revision, timeout_s)

    @staticmethod
    def _revision_answer(revision: SplitRevision, timeout_s: float | None) -> Response:
        unchanged = getattr(revision, "unchanged", False)
        if timeout_s is not None:
            pushes = waiting.wait_for_pushes(
                selectors.revision_push_ids(revision=revision), timeout_s)
            revision.verified = waiting.verified(pushes)  # type: ignore[attr-defined]
            revision.wait_gateways = waiting.gateway_rows(pushes)  # type: ignore[attr-defined]
        return Response(s.RevisionAnswerSerializer(revision).data,
                        status=status.HTTP_200_OK if unchanged else status.HTTP_201_CREATED)

    @extend_schema(request=s.RouteHealthPolicySerializer, responses={200: s.RouteSerializer})
    @action(detail=True, methods=["post"], url_path="health-policy", filter_backends=[])
    def health_policy(self, request: Request, name: str) -> Response:
        """Set what the health policy does on this route (scope `fleet`): off, drain or
        drain-restore. Applies from the pool's next health flip."""
        route = self.get_object()
        body = s.RouteHealthPolicySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        route = services.route_health_policy_set(actor=actor_from_request(request), route=route,
                                                 **body.validated_data)
        self._current = selectors.revisions_current(routes=[route])
        return Response(s.RouteSerializer(route, context=self.get_serializer_context()).data)


    @extend_schema(request=s.RouteReverifyPolicySerializer, responses={200: s.RouteSerializer})
    @action(detail=True, methods=["post"], url_path="reverify-policy", filter_backends=[])
    def reverify_policy(self, request: Request, name: str) -> Response:
        """Set what happens on this route while a changed pool is re-verified (scope
        `fleet`): hold or drain. Applies from the next re-verification's end."""
        route = self.get_object()
        body = s.RouteReverifyPolicySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        route = services.route_reverify_policy_set(actor=actor_from_request(request),
                                                   route=route, **body.validated_data)
        self._current = selectors.revisions_current(routes=[route])
        return Response(s.RouteSerializer(route, context=self.get_serializer_context()).data)

    @extend_schema(methods=["GET"], responses={200: s.RouteAffinitySerializer})
    @extend_schema(methods=["PUT"], request=s.RouteAffinitySerializer,
                   responses={200: s.RouteAffinitySerializer})
    @action(detail=True, methods=["get", "put"], filter_backends=[])
    def affinity(self, request: Request, name: str) -> Response:
        """GET: the route's prefix affinity. PUT (scope `fleet`): set it; its gateways are
        pushed again. 400 naming the field on a bad value (prefix_bytes 64..65,536, only for
        a prompt key), or on `source` while a gateway that cannot keep it (HAProxy, nginx,
        Gateway API) carries the route."""
        route = self.get_object()
        if request.method == "PUT":
            route = services.route_affinity_set(actor=actor_from_request(request),
                                                route=route, data=request.data)
        return Response(affinity_dict(route))

    @extend_schema(responses={200: s.RouteCapacitySerializer})
    @action(detail=True, methods=["get"], filter_backends=[])
    def capacity(self, request: Request, name: str) -> Response:
        """Per pool that may carry the route: its SLO-qualified capacity (from its newest
        benchmark that still counts), the streams it carries now, its weight now and its
        share of the capacity split; the reason the split would be stored with, or why none
        is offered."""
        split = route_capacity_split(route=self.get_object())
        return Response(s.RouteCapacitySerializer(split).data)

    @extend_schema(request=s.CapacityApplySerializer,
                   parameters=[idempotency.PARAMETER, *waiting.PARAMETERS],
                   responses={201: s.RevisionAnswerSerializer,
                              200: s.RevisionAnswerSerializer})
    @action(detail=True, methods=["post"], url_path="capacity/apply", filter_backends=[])
    @idempotency.idempotent
    def capacity_apply(self, request: Request, name: str) -> Response:
        """Store the capacity split as a revision of kind `capacity` (scope `ramp`), its
        reason naming each pool's run: 201; 200 with `unchanged` when it is in force
        already; 409 when `base_revision` is stale; 400 when no split can be offered (the
        primary has no capacity figure). ?wait=verified as for a split change."""
        route = self.get_object()
        timeout_s = waiting.wait_timeout(request)
        body = s.CapacityApplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        revision = services.route_capacity_split_apply(
            actor=actor_from_request(request), route=route, **body.validated_data)
        return self._revision_answer(revision, timeout_s)

    @extend_schema(methods=["GET"], responses={200: s.RouteTiersSerializer})
    @extend_schema(methods=["PUT"], request=s.RouteTiersSetSerializer,
                   responses={200: s.RouteTiersSerializer})
    @action(detail=True, methods=["get", "put"], filter_backends=[])
    def tiers(self, request: Request, name: str) -> Response:
        """GET: the route's context tiers, each with the pools that may serve it now
        (computed from the registry and what the pools report) and why each other may not.
        PUT (scope `fleet`): replace them all; 400 naming the tier
        (`tiers[1].max_prompt_tokens`) when they overlap, repeat a bound, leave an entry
        empty, name an unknown behaviour, or no pool can serve one."""
        route = self.get_object()
        if request.method == "GET":
            views = tiers.route_tier_pools(route)
        else:
            data = request.data if isinstance(request.data, dict) else {}
            if "tiers" not in data:
                raise ValidationError({"tiers": ["Required: the list of tiers ([] removes "
                                                 "them)."]})
            views = services.route_tiers_set(actor=actor_from_request(request), route=route,
                                             tiers=data["tiers"])
        live = tiers.route_tier_live(route, views)
        return Response(s.RouteTiersSerializer({"route": route.name, "tiers": views,
                                                "live": live}).data)


class GatewayViewSet(ServiceModelViewSet):
    """Gateways (Envoy, HAProxy, nginx, Gateway API) and the routes each one carries."""

    queryset = selectors.gateway_list()
    serializer_class = s.GatewaySerializer
    filterset_class = GatewayFilter
    lookup_field = "name"
    instance_kwarg = "gateway"
    create_service = services.gateway_create
    update_service = services.gateway_update
    delete_service = services.gateway_delete

    @extend_schema(request=None, responses={200: s.GatewaySerializer})
    @action(detail=True, methods=["post"], url_path="rotate-mirror-secret", filter_backends=[])
    def rotate_mirror_secret(self, request: Request, name: str) -> Response:
        """Give the gateway a new mirror secret (scope `fleet`) and push it the new tokens
        its shadow copies carry; copies signed with the old one are accepted for 10 minutes
        more (MIRROR_SECRET_GRACE_S). The secret is never answered."""
        gateway = services.gateway_mirror_secret_rotate(actor=actor_from_request(request),
                                                        gateway=self.get_object())
        return Response(s.GatewaySerializer(self._as_read(gateway)).data)


class PushViewSet(viewsets.ReadOnlyModelViewSet):
    """Every push of a revision to a gateway, with each attempt."""

    queryset = selectors.push_list()
    serializer_class = s.PushSerializer
    filterset_fields = ["status", "gateway__name", "revision__route__name"]


class DrainViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Drains and restores, timed: requested, per-gateway verified, in-flight zero."""

    queryset = selectors.drain_list()
    serializer_class = s.DrainSerializer
    filterset_fields = ["action", "status", "route__name", "pool__name"]

    def get_serializer_context(self) -> dict[str, Any]:
        context = dict(super().get_serializer_context())
        context["gateway_times"] = getattr(self, "_gateway_times", {})
        return context

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset())) or []
        # Every drain's pushes in two queries for the whole page.
        self._gateway_times = selectors.drains_gateway_times(drains=list(page))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(request=s.DrainCreateSerializer,
                   parameters=[idempotency.PARAMETER, *waiting.PARAMETERS],
                   responses={202: s.DrainAnswerSerializer})
    @idempotency.idempotent
    def create(self, request: Request) -> Response:
        """Drain a route (to its primary) or a pool (off every route). Scope `drain`.
        Capacity-checked: a share the primary cannot carry spreads over the route's
        pools that carry weight (in its pin, if pinned), or moves in steps; `force: true` moves it
        all to the primary at once (`capacity` in the answer says which, with the figures).
        Answers once every gateway had its first push attempt (at most
        TRAFFIC_INLINE_PUSH_BUDGET_S), with the record as it then stands; poll it until
        in-flight streams have closed. ?wait=verified: once every gateway verified it (or
        the timeout passed), with `verified`."""
        timeout_s = waiting.wait_timeout(request)
        body = s.DrainCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        # A person's drain: capacity-checked, and stepped when nothing can carry it.
        drain = services.drain_request(actor=actor_from_request(request), stepping=True,
                                       **body.validated_data)
        # Committed: the first attempt at every gateway, here. The answer is the drain as
        # those attempts left it, from what this process holds (no second read).
        drain = push.drain_push_now(drain)
        return self._answer(drain, timeout_s)

    @extend_schema(request=s.RestoreSerializer,
                   parameters=[idempotency.PARAMETER, *waiting.PARAMETERS],
                   responses={202: s.DrainAnswerSerializer})
    @action(detail=True, methods=["post"])
    @idempotency.idempotent
    def restore(self, request: Request, pk: str) -> Response:
        """Return every route of this drain to the split it had before (409 if changed).
        ?wait=verified as for a drain."""
        timeout_s = waiting.wait_timeout(request)
        body = s.RestoreSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        drain = get_object_or_404(selectors.drain_list(), pk=pk)
        record = services.drain_restore(actor=actor_from_request(request), drain=drain,
                                        reason=body.validated_data.get("reason", ""))
        record = push.drain_push_now(record)
        return self._answer(record, timeout_s)

    def _answer(self, drain: Drain, timeout_s: float | None) -> Response:
        if timeout_s is not None:
            pushes = waiting.wait_for_pushes(list(drain.push_ids or []), timeout_s)
            drain.verified = waiting.verified(pushes)  # type: ignore[attr-defined]
            # The record and its gateways as they stand after the wait, from the rows.
            selectors.drain_progress_reread(drain=drain)
            drain.first_pushes = None
        return Response(s.DrainAnswerSerializer(drain).data, status=status.HTTP_202_ACCEPTED)


__all__ = ["DrainViewSet", "GatewayViewSet", "PushViewSet", "Route", "RouteViewSet"]
