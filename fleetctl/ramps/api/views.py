from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core import idempotency
from fleetctl.core.errors import NotFoundError
from fleetctl.ramps import selectors, services
from fleetctl.ramps.api import serializers as s
from fleetctl.ramps.filters import RampFilter
from fleetctl.ramps.models import Ramp, Watch


class RampViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Guarded ramps: a pool's weight on a route stepped up hold by hold, each hold judged on
    live telemetry; the guard rolls back (a drain) on a clear failure."""

    serializer_class = s.RampSerializer
    filterset_class = RampFilter

    def get_queryset(self) -> QuerySet[Ramp]:
        return selectors.ramp_list()

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        return s.RampDetailSerializer if self.action == "retrieve" else s.RampSerializer

    def _ramp(self, pk: str) -> Ramp:
        ramp = selectors.ramp_detail(int(pk)) if pk.isdigit() else None
        if ramp is None:
            raise NotFoundError(f"No ramp {pk}. See /api/v1/ramps/ for the ramps there are.")
        return ramp

    def _detail(self, ramp: Ramp, code: int = status.HTTP_200_OK) -> Response:
        ramp = self._ramp(str(ramp.pk))  # with its events, as they now stand
        ramp.spans = selectors.ramp_timeline(ramp)["spans"]  # type: ignore[attr-defined]
        ramp.numbers = selectors.ramp_numbers_now(ramp)  # type: ignore[attr-defined]
        return Response(s.RampDetailSerializer(ramp).data, status=code)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A ramp with its timeline (every decision and the numbers it used), the span of
        each step, and the guard's judgement of the current window right now."""
        return self._detail(self._ramp(str(kwargs["pk"])))

    @extend_schema(request=s.RampCreateSerializer, parameters=[idempotency.PARAMETER],
                   responses={201: s.RampDetailSerializer})
    @idempotency.idempotent
    def create(self, request: Request) -> Response:
        """Start a guarded ramp (scope `ramp`). Thresholds default to the plan's; with no
        plan, give slo_ttft_p95_ms, slo_tpot_p95_ms and slo_error_rate. 409 when the route
        already has an active ramp. The first step is set by the controller's first tick."""
        body = idempotency.action_body(request, s.RampCreateSerializer)
        ramp = services.ramp_create(actor=actor_from_request(request), **body)
        return self._detail(ramp, status.HTTP_201_CREATED)

    def _act(self, request: Request, pk: str,
             service: Callable[..., Ramp]) -> Response:
        body = idempotency.action_body(request, s.RampActionSerializer)
        ramp = service(actor=actor_from_request(request), ramp=self._ramp(pk),
                       reason=body["reason"])
        return self._detail(ramp)

    @idempotency.object_action(request=s.RampActionSerializer, response=s.RampDetailSerializer)
    def pause(self, request: Request, pk: str) -> Response:
        """Hold the current step until a person resumes (scope `ramp`; 409 unless running)."""
        return self._act(request, pk, services.ramp_pause)

    @idempotency.object_action(request=s.RampActionSerializer, response=s.RampDetailSerializer)
    def resume(self, request: Request, pk: str) -> Response:
        """Carry on from the current step (scope `ramp`; 409 unless paused): adopts the
        route's current revision, sets the step's split again and restarts its hold."""
        return self._act(request, pk, services.ramp_resume)

    @idempotency.object_action(request=s.RampActionSerializer, response=s.RampDetailSerializer)
    def skip(self, request: Request, pk: str) -> Response:
        """End the current hold now: the next tick steps up without judging it (scope
        `ramp`; 409 unless running with a step set)."""
        return self._act(request, pk, services.ramp_skip)

    @idempotency.object_action(request=s.RampActionSerializer, response=s.RampDetailSerializer)
    def abort(self, request: Request, pk: str) -> Response:
        """Stop the ramp and drain the pool off the route (scope `drain`; 409 unless
        active). The drain is linked as `drain`."""
        return self._act(request, pk, services.ramp_abort)


class WatchViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Standing live watches: after a ramp completes, the guard keeps judging every pool
    carrying weight on the route, window by window, and alerts or drains by policy."""

    serializer_class = s.WatchSerializer
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self) -> QuerySet[Watch]:
        watches = selectors.watch_list()
        params = self.request.query_params
        for name in ("route", "pool"):
            if params.get(name):
                watches = watches.filter(**{f"{name}__name": params[name]})
        if params.get("state"):
            watches = watches.filter(state=params["state"])
        return watches

    def _watch(self, pk: str) -> Watch:
        watch = selectors.watch_list().filter(pk=int(pk)).first() if pk.isdigit() else None
        if watch is None:
            raise NotFoundError(f"No watch {pk}. See /api/v1/watches/ for the watches there "
                                f"are.")
        return watch

    def _detail(self, watch: Watch, request: Request) -> Response:
        raw = request.query_params.get("verdicts", "500")
        if not raw.isdigit() or not 0 <= int(raw) <= 5000:
            raise ValidationError({"verdicts": ["A whole number from 0 to 5000."]})
        watch = self._watch(str(watch.pk))
        return Response(s.WatchDetailSerializer(watch, context={"verdicts": int(raw)}).data)

    @extend_schema(responses={200: s.WatchDetailSerializer})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A watch with its verdict history (newest first)."""
        return self._detail(self._watch(str(kwargs["pk"])), request)

    @extend_schema(request=s.WatchPolicySerializer, responses={200: s.WatchDetailSerializer})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Change the policy (`alert` | `drain`) of an active watch (scope `ramp`; 409 once
        ended)."""
        watch = self._watch(str(kwargs["pk"]))
        body = idempotency.action_body(request, s.WatchPolicySerializer)
        watch = services.watch_set_policy(actor=actor_from_request(request), watch=watch,
                                          policy=body["policy"], reason=body["reason"])
        return self._detail(watch, request)

    @idempotency.object_action(request=s.WatchEndSerializer, response=s.WatchDetailSerializer)
    def end(self, request: Request, pk: str) -> Response:
        """End an active watch (scope `ramp`; 409 once ended): judging stops, nothing is
        drained."""
        body = idempotency.action_body(request, s.WatchEndSerializer)
        watch = services.watch_end(actor=actor_from_request(request), watch=self._watch(pk),
                                   reason=body["reason"])
        return self._detail(watch, request)
