from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core import idempotency
from fleetctl.core.errors import NotFoundError
from fleetctl.ramps import selectors, services
from fleetctl.ramps.api import serializers as s
from fleetctl.ramps.filters import RampFilter
from fleetctl.ramps.models import Ramp


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
