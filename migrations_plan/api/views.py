"""Migration plans over REST. Each write is one service call: the service checks who may do
it, says why not (audited), and records what happened; these views only translate."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404  # an id of the wrong type: 404, not 500
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.audit.api.serializers import AuditEventSerializer
from fleetctl.core.errors import DomainError
from fleetctl.core.idempotency import action_body
from fleetctl.traffic.api.serializers import DrainSerializer
from migrations_plan import evidence as ev
from migrations_plan import filters, selectors, services
from migrations_plan.api import serializers as s
from migrations_plan.models import STAGE_NAMES, GateCheck, Plan

STAGE_PARAM = OpenApiParameter("stage", int, OpenApiParameter.PATH,
                               description="1 abstraction, 2 shadow, 3 batch, 4 live.")
CHECK_PARAM = OpenApiParameter("check_id", int, OpenApiParameter.PATH,
                               description="The check's id (see GET …/checks/).")


class PlanViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Migration plans: a candidate pool joining routes, one gated stage at a time.
    Reading needs `read`; approving, advancing, attesting and editing gates need a person
    with the platform-lead role, signed in — never a token."""

    queryset = selectors.plan_list()
    serializer_class = s.PlanSerializer
    filterset_class = filters.PlanFilter
    ordering_fields = ["name", "created_at", "stage_entered_at", "target_date"]
    lookup_field = "name"

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        return s.PlanDetailSerializer if self.action == "retrieve" else s.PlanSerializer

    def _plan(self, name: str) -> Plan:
        return get_object_or_404(selectors.plan_list(), name=name)

    def _answer(self, plan: Plan, code: int = status.HTTP_200_OK) -> Response:
        """The plan as it is now (re-read: a service may have moved it)."""
        fresh = self._plan(plan.name)
        return Response(s.PlanDetailSerializer(fresh).data, status=code)

    @extend_schema(request=s.PlanCreateSerializer, responses={201: s.PlanDetailSerializer})
    def create(self, request: Request) -> Response:
        """Open a plan at stage 1 with the default gates (scope: a person with
        `fleet.manage`). One open plan per candidate and route (409 otherwise)."""
        body = action_body(request, s.PlanCreateSerializer)
        plan = services.plan_create(actor=actor_from_request(request), **body)
        return self._answer(plan, status.HTTP_201_CREATED)

    @extend_schema(request=s.PlanUpdateSerializer, responses={200: s.PlanDetailSerializer})
    def partial_update(self, request: Request, name: str) -> Response:
        """Change the plan's terms (SLO, margins, owner, target date, approvers). Approvals
        given under the old terms stop counting."""
        plan = self._plan(name)
        body = action_body(request, s.PlanUpdateSerializer, partial=True)
        plan = services.plan_update(actor=actor_from_request(request), plan=plan, **body)
        return self._answer(plan)

    @extend_schema(parameters=[STAGE_PARAM], responses={200: s.StageGateSerializer})
    @action(detail=True, methods=["get"], url_path=r"gates/(?P<stage>[^/.]+)")
    def gate(self, request: Request, name: str, stage: str) -> Response:
        """Any stage's gate evaluated now, with that stage's approvals."""
        plan = self._plan(name)
        number = int(stage) if stage.isdigit() else 0
        if number not in STAGE_NAMES:
            raise DomainError(f"Stages are 1–4 (abstraction, shadow, batch, live), not {stage}.",
                              fields={"stage": ["Use 1, 2, 3 or 4."]})
        return Response(s.StageGateSerializer(ev.evaluate_gate(plan, stage=number)).data)

    @extend_schema(methods=["GET"], responses={200: s.GateCheckSerializer(many=True)})
    @extend_schema(methods=["POST"], request=s.CheckCreateSerializer,
                   responses={201: s.GateCheckSerializer})
    @action(detail=True, methods=["get", "post"])
    def checks(self, request: Request, name: str) -> Response:
        """GET: every check of every stage, removed ones included (with who and why).
        POST: add a check to a stage's gate, evidence-backed (`rule`, `params`) or attested
        (`attest_role`). Approvals of that stage stop counting."""
        plan = self._plan(name)
        if request.method == "GET":
            page = self.paginate_queryset(selectors.plan_checks(plan=plan))
            return self.get_paginated_response(s.GateCheckSerializer(page, many=True).data)
        body = action_body(request, s.CheckCreateSerializer)
        check = services.check_add(actor=actor_from_request(request), plan=plan, **body)
        return Response(s.GateCheckSerializer(check).data, status=status.HTTP_201_CREATED)

    def _check(self, plan: Plan, check_id: str) -> GateCheck:
        return get_object_or_404(selectors.check_list(), plan=plan, pk=check_id)

    @extend_schema(parameters=[CHECK_PARAM], request=s.CheckUpdateSerializer,
                   responses={200: s.GateCheckSerializer})
    @action(detail=True, methods=["patch"], url_path=r"checks/(?P<check_id>[0-9]+)")
    def check_update(self, request: Request, name: str, check_id: str) -> Response:
        """Change a check's title or thresholds (stages not yet passed)."""
        check = self._check(self._plan(name), check_id)
        body = action_body(request, s.CheckUpdateSerializer)
        row = services.check_update(actor=actor_from_request(request), check=check, **body)
        return Response(s.GateCheckSerializer(row).data)

    @extend_schema(parameters=[CHECK_PARAM], request=s.ReasonSerializer,
                   responses={200: s.GateCheckSerializer})
    @action(detail=True, methods=["post"], url_path=r"checks/(?P<check_id>[0-9]+)/remove")
    def check_remove(self, request: Request, name: str, check_id: str) -> Response:
        """Take a check off its gate, with the reason (the row stays for the record)."""
        check = self._check(self._plan(name), check_id)
        body = action_body(request, s.ReasonSerializer)
        row = services.check_remove(actor=actor_from_request(request), check=check,
                                    reason=body["reason"])
        return Response(s.GateCheckSerializer(row).data)

    @extend_schema(parameters=[CHECK_PARAM], request=s.NoteSerializer,
                   responses={201: s.GateCheckSerializer})
    @action(detail=True, methods=["post"], url_path=r"checks/(?P<check_id>[0-9]+)/attest")
    def attest(self, request: Request, name: str, check_id: str) -> Response:
        """Confirm an attested check, in words. A person holding the check's role, signed in
        (not with a token)."""
        check = self._check(self._plan(name), check_id)
        body = action_body(request, s.NoteSerializer)
        services.attest(actor=actor_from_request(request), check=check, note=body["note"])
        return Response(s.GateCheckSerializer(selectors.check_as_listed(check=check)).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: DrainSerializer})
    @action(detail=True, methods=["post"], url_path="rehearse-drain")
    def rehearse_drain(self, request: Request, name: str) -> Response:
        """Start a drain rehearsal (an evidence job: scope `jobs`). Stage 4 only: the
        candidate is drained off the plan's routes for real, timed, and restored once its
        streams closed; the drain record is what the `drain.rehearsed` check reads."""
        drain = services.rehearsal_start(actor=actor_from_request(request),
                                         plan=self._plan(name))
        return Response(DrainSerializer(drain).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=s.ApproveSerializer, responses={200: s.PlanDetailSerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, name: str) -> Response:
        """Approve the current stage's gate, bound to the evidence it shows now. A platform
        lead other than the plan's author or owner, signed in; warn or insufficient data
        needs a justification, a failing gate cannot be approved."""
        plan = self._plan(name)
        body = action_body(request, s.ApproveSerializer)
        services.approve(actor=actor_from_request(request), plan=plan,
                         justification=body["justification"])
        return self._answer(plan)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.PlanDetailSerializer})
    @action(detail=True, methods=["post"])
    def advance(self, request: Request, name: str) -> Response:
        """Move to the next stage (from stage 4: completed). The gate is evaluated again; the
        required approvals must hold on exactly that evidence (409 otherwise)."""
        plan = self._plan(name)
        body = action_body(request, s.ReasonSerializer)
        plan = services.advance(actor=actor_from_request(request), plan=plan, reason=body["reason"])
        return self._answer(plan)

    @extend_schema(request=s.RegressSerializer, responses={200: s.PlanDetailSerializer})
    @action(detail=True, methods=["post"])
    def regress(self, request: Request, name: str) -> Response:
        """Go back to an earlier stage, with the reason. From stage 4 the candidate is
        drained first (see …/moves/ for the drain)."""
        plan = self._plan(name)
        body = action_body(request, s.RegressSerializer)
        plan = services.regress(actor=actor_from_request(request), plan=plan,
                                to_stage=body["stage"], reason=body["reason"])
        return self._answer(plan)

    def _leave(self, request: Request, name: str, service: Any) -> Response:
        plan = self._plan(name)
        body = action_body(request, s.ReasonSerializer)
        plan = service(actor=actor_from_request(request), plan=plan, reason=body["reason"])
        return self._answer(plan)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.PlanDetailSerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, name: str) -> Response:
        """Stop where it is (on-call may, in an incident). From stage 4 the candidate is
        drained first. Open approvals are voided."""
        return self._leave(request, name, services.pause)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.PlanDetailSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, name: str) -> Response:
        """Back to the stage it was paused at."""
        return self._leave(request, name, services.resume)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.PlanDetailSerializer})
    @action(detail=True, methods=["post"])
    def abandon(self, request: Request, name: str) -> Response:
        """Close the plan for good. From stage 4 the candidate is drained first."""
        return self._leave(request, name, services.abandon)

    @extend_schema(responses={200: s.ApprovalSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def approvals(self, request: Request, name: str) -> Response:
        """Every approval of every stage, newest first, with the evidence snapshot it saw."""
        plan = self._plan(name)
        page = self.paginate_queryset(selectors.plan_approvals(plan=plan))
        return self.get_paginated_response(s.ApprovalSerializer(page, many=True).data)

    @extend_schema(responses={200: s.StageMoveSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def moves(self, request: Request, name: str) -> Response:
        """Every stage move, newest first: who, why, the gate snapshot, the approvals it used
        and the drains that ran first."""
        plan = self._plan(name)
        page = self.paginate_queryset(selectors.plan_moves(plan=plan))
        return self.get_paginated_response(s.StageMoveSerializer(page, many=True).data)

    @extend_schema(responses={200: AuditEventSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def timeline(self, request: Request, name: str) -> Response:
        """Everything that happened to the plan, newest first (the latest 200), refusals
        included."""
        plan = self._plan(name)
        page = self.paginate_queryset(selectors.plan_timeline(plan=plan))  # type: ignore[arg-type]
        return self.get_paginated_response(AuditEventSerializer(page, many=True).data)


class EvidenceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                      viewsets.GenericViewSet):
    """What fleetctl's evidence jobs measured about pools, and what other systems reported
    (kind external). Rows are immutable: record a new one. Posting is for other systems'
    reports only and needs the `jobs` permission (service tokens with the `jobs` scope may)."""

    queryset = selectors.evidence_list()
    serializer_class = s.EvidenceSerializer
    filterset_class = filters.EvidenceFilter
    ordering_fields = ["observed_at", "id"]

    @extend_schema(request=s.EvidenceCreateSerializer, responses={201: s.EvidenceSerializer})
    def create(self, request: Request) -> Response:
        """Record what another system reports (kind external), bound to the pool as it is now
        (model revision, runtime, driver, quantisation, weight format): when those change, or
        `ttl_hours` pass, it stops counting. Shown as "reported by <reported_by>"; it never
        satisfies a check over a kind fleetctl measures (400 if you post such a kind)."""
        body = action_body(request, s.EvidenceCreateSerializer)
        row = services.evidence_report(actor=actor_from_request(request), **body)
        return Response(s.EvidenceSerializer(row).data, status=status.HTTP_201_CREATED)


class EvidenceKindViewSet(viewsets.ViewSet):
    """The registered evidence kinds and the rules that read them."""

    @extend_schema(responses={200: s.EvidenceKindSerializer(many=True)})
    def list(self, request: Request) -> Response:
        return Response([s.kind_json(kind) for _, kind in sorted(ev.KINDS.items())])


class EvidenceRuleViewSet(viewsets.ViewSet):
    """The registered rules an evidence-backed check can use, with their parameters."""

    @extend_schema(responses={200: s.EvidenceRuleSerializer(many=True)})
    def list(self, request: Request) -> Response:
        return Response([s.rule_json(rule) for _, rule in sorted(ev.RULES.items())])


__all__ = ["EvidenceKindViewSet", "EvidenceRuleViewSet", "EvidenceViewSet", "PlanViewSet"]
