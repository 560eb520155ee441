"""Schedules over REST (/api/v1/schedules/): recurring evidence jobs per plan or pool.
Reading needs `read`; creating, editing and deleting need `jobs` (checked by the services).
A field the service refuses (cron, timezone, window_minutes, plan, pool, eval_suite) is a 400
naming it; nothing is stored."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.api.viewsets import ServiceModelViewSet
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core import idempotency
from fleetctl.schedules import selectors, services
from fleetctl.schedules.api import serializers as s


class ScheduleViewSet(ServiceModelViewSet):
    """Schedules: what to start (a re-benchmark, a drain rehearsal, a conformance probe, an
    eval run), for which plan or pool, on which cron in which time zone, within which window.
    Beat fires each occurrence once, as `system:schedule`; each run is in `runs/`."""

    queryset = selectors.schedule_list()
    serializer_class = s.ScheduleSerializer
    filterset_fields = ["kind", "enabled"]
    instance_kwarg = "schedule"
    create_service = services.schedule_create
    update_service = services.schedule_update
    delete_service = services.schedule_delete
    http_method_names = ["get", "post", "patch", "put", "delete", "head", "options"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.schedule_list()

    @extend_schema(request=s.ScheduleCreateSerializer, parameters=[idempotency.PARAMETER],
                   responses={201: s.ScheduleSerializer})
    @idempotency.idempotent
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Add a schedule (scope `jobs`); its first run is the cron's first occurrence after
        now. 400 names the field: a cron that is not five valid fields or never fires, an
        unknown time zone, a window outside 1-10080 minutes, a rehearsal or eval without a
        plan. An Idempotency-Key is honoured."""
        body = idempotency.action_body(request, s.ScheduleCreateSerializer)
        schedule = services.schedule_create(actor=actor_from_request(request), **body)
        return Response(s.ScheduleSerializer(selectors.schedule_get(schedule.pk)).data,
                        status=status.HTTP_201_CREATED)

    def _update(self, request: Request) -> Response:
        body = idempotency.action_body(request, s.ScheduleUpdateSerializer)
        schedule = services.schedule_update(actor=actor_from_request(request),
                                            schedule=self.get_object(), **body)
        return Response(s.ScheduleSerializer(selectors.schedule_get(schedule.pk)).data)

    @extend_schema(request=s.ScheduleUpdateSerializer, responses={200: s.ScheduleSerializer})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Change the cron, time zone, window, suite or note, or enable / disable (scope
        `jobs`). A new cron or time zone, or enabling, starts from the next occurrence."""
        return self._update(request)

    @extend_schema(request=s.ScheduleUpdateSerializer, responses={200: s.ScheduleSerializer})
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """As PATCH: the fields sent are changed (the kind and target are fixed)."""
        return self._update(request)

    @extend_schema(responses={200: s.ScheduleRunSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])
    def runs(self, request: Request, pk: str) -> Response:
        """This schedule's runs, newest occurrence first: started (with the job), skipped,
        missed (how many occurrences), failed (why), then complete / failed / cancelled once
        the job ended."""
        page = self.paginate_queryset(selectors.runs_of(self.get_object()))
        return self.get_paginated_response(s.ScheduleRunSerializer(page, many=True).data)
