"""Soaks over REST (/api/v1/batch/soaks/): recurring batch jobs on a stage-3 plan's candidate.
Reading needs `read`; starting, editing and stopping need `jobs` (checked by the services).
Editing or stopping a running soak is a person's intervention: the soak fails on it."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.batch import selectors
from fleetctl.batch import soak as soaks
from fleetctl.batch.cost import plan_arbitrage
from fleetctl.batch.filters import SoakFilter
from fleetctl.batch.models import DEFAULT_CHUNK_SIZE, BatchJob, Soak, SoakEvent
from fleetctl.core import idempotency
from fleetctl.core.api.fields import StrictCharField
from fleetctl.core.api.schema import ObjectField
from fleetctl.core.errors import NotFoundError
from migrations_plan import selectors as plans


class SoakSerializer(serializers.ModelSerializer):
    plan = serializers.CharField(source="plan.name", read_only=True)
    pool = serializers.CharField(source="pool.name", read_only=True)
    input_file_name = serializers.CharField(source="input_file.name", read_only=True)
    state_label = serializers.CharField(source="get_state_display", read_only=True)

    class Meta:
        model = Soak
        fields = ["id", "plan", "pool", "input_file", "input_file_name", "every_s",
                  "duration_s", "concurrency", "rate_limit_rps", "completion_window_s",
                  "chunk_size", "drill", "state", "state_label", "state_reason", "started_at",
                  "ends_at", "finished_at", "next_job_at", "created_by", "evidence",
                  "cost_evidence"]
        read_only_fields = fields


class SoakEventSerializer(serializers.ModelSerializer):
    data = ObjectField(read_only=True)  # type: ignore[assignment]

    class Meta:
        model = SoakEvent
        fields = ["at", "kind", "actor", "manual", "message", "data"]
        read_only_fields = fields


class SoakDetailSerializer(SoakSerializer):
    summary = ObjectField(read_only=True, help_text=(
        "The verdict as the rows stand now: per job throughput (req/s, output tok/s), error "
        "rate, retries, resends; every manual intervention (who, when, what); the verdict "
        "(pass, fail, or running) and the reasons against it."))
    arbitrage = ObjectField(read_only=True, help_text=(
        "The plan's cost arbitrage measured on this soak: predicted vs measured cost per 1M "
        "output tokens, each in its currency, and the stated conversion when they differ."))
    events = SoakEventSerializer(many=True, read_only=True)

    class Meta(SoakSerializer.Meta):
        fields = [*SoakSerializer.Meta.fields, "summary", "arbitrage", "events"]
        read_only_fields = fields


OPTION_HELP = {
    "every_s": "A new job starts this often, in seconds, once the previous one has ended "
               "(at least 10; less than duration_s).",
    "duration_s": "How long the soak runs, in seconds (at least 60; days in production).",
    "concurrency": "Each job's requests in flight at once, at most (1-256; default 8).",
    "rate_limit_rps": "Each job's requests started per second, at most (null: no limit).",
    "completion_window_s": "Each job expires this long after it starts (default 3600).",
    "chunk_size": "Requests per chunk (1-10000; default 1000).",
}


class SoakCreateSerializer(serializers.Serializer):
    plan = serializers.SlugRelatedField(
        slug_field="name", queryset=plans.plan_list(),
        help_text="The plan's name; it must be at stage 3. The soak runs on its candidate.")
    input_file = serializers.PrimaryKeyRelatedField(
        queryset=selectors.file_list(),
        help_text="An uploaded input file's id (POST /api/v1/batch/files/).")
    every_s = serializers.IntegerField(help_text=OPTION_HELP["every_s"])
    duration_s = serializers.IntegerField(help_text=OPTION_HELP["duration_s"])
    concurrency = serializers.IntegerField(required=False, default=8,
                                           help_text=OPTION_HELP["concurrency"])
    rate_limit_rps = serializers.FloatField(required=False, allow_null=True, default=None,
                                            help_text=OPTION_HELP["rate_limit_rps"])
    completion_window_s = serializers.IntegerField(
        required=False, default=3600, help_text=OPTION_HELP["completion_window_s"])
    chunk_size = serializers.IntegerField(required=False, default=DEFAULT_CHUNK_SIZE,
                                          help_text=OPTION_HELP["chunk_size"])
    drill = serializers.ChoiceField(
        choices=BatchJob.Drill.values, required=False, allow_blank=True, default="",
        help_text="An interruption drill in the soak's first job: kill-worker or fault-pool.")


class SoakEditSerializer(serializers.Serializer):
    reason = StrictCharField(max_length=2000, help_text=(
        "Why (it goes in the soak's timeline). Editing a running soak is a manual "
        "intervention: the soak fails on it."))
    every_s = serializers.IntegerField(required=False, help_text=OPTION_HELP["every_s"])
    duration_s = serializers.IntegerField(required=False, help_text=OPTION_HELP["duration_s"])
    concurrency = serializers.IntegerField(required=False,
                                           help_text=OPTION_HELP["concurrency"])
    rate_limit_rps = serializers.FloatField(required=False, allow_null=True,
                                            help_text=OPTION_HELP["rate_limit_rps"])
    completion_window_s = serializers.IntegerField(
        required=False, help_text=OPTION_HELP["completion_window_s"])
    chunk_size = serializers.IntegerField(required=False, help_text=OPTION_HELP["chunk_size"])

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        sent = set(getattr(self, "initial_data", {}) or {})
        unknown = sorted(sent - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                {name: [f"Unknown field (editable: {', '.join(soaks.EDITABLE)})."]
                 for name in unknown})
        return attrs


class SoakStopSerializer(serializers.Serializer):
    reason = StrictCharField(max_length=2000, help_text=(
        "Why (it goes in the soak's timeline and the audit log). A stopped soak fails."))


class SoakViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Soaks: a batch job on a stage-3 plan's candidate every `every_s` for `duration_s`,
    passing only with no manual intervention and each job's error rate and throughput within
    the plan's margins; the verdict is the plan's `soak` evidence, the measured cost its
    `cost-arbitrage` evidence."""

    serializer_class = SoakSerializer
    filterset_class = SoakFilter

    def get_queryset(self) -> QuerySet[Soak]:
        return selectors.soak_list()

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        return SoakDetailSerializer if self.action == "retrieve" else SoakSerializer

    def _soak(self, pk: str) -> Soak:
        soak = selectors.soak_get(int(pk)) if str(pk).isdigit() else None
        if soak is None:
            raise NotFoundError(f"No soak {pk}. See /api/v1/batch/soaks/ for the soaks there "
                                f"are.")
        return soak

    def _detail(self, soak: Soak, code: int = status.HTTP_200_OK) -> Response:
        soak = self._soak(str(soak.pk))
        soak.summary = soaks.soak_summary(soak).as_json()  # type: ignore[attr-defined]
        soak.arbitrage = plan_arbitrage(soak.plan, soak).as_json()  # type: ignore[attr-defined]
        return Response(SoakDetailSerializer(soak).data, status=code)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A soak with its jobs' figures, interventions, verdict, cost arbitrage and
        timeline."""
        return self._detail(self._soak(str(kwargs["pk"])))

    @extend_schema(request=SoakCreateSerializer, parameters=[idempotency.PARAMETER],
                   responses={201: SoakDetailSerializer})
    @idempotency.idempotent
    def create(self, request: Request) -> Response:
        """Start a soak (scope `jobs`); its first job starts at once. 409 when the plan is
        not at stage 3 or already has a running soak."""
        body = idempotency.action_body(request, SoakCreateSerializer)
        soak = soaks.soak_create(actor=actor_from_request(request), **body)
        return self._detail(soak, status.HTTP_201_CREATED)

    @extend_schema(request=SoakEditSerializer, responses={200: SoakDetailSerializer})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Change a running soak's schedule or its jobs' options (scope `jobs`; from its next
        job). A manual intervention: the soak fails at the next tick."""
        soak = self._soak(str(kwargs["pk"]))
        changes = dict(idempotency.action_body(request, SoakEditSerializer))
        reason = changes.pop("reason")
        soak = soaks.soak_edit(actor=actor_from_request(request), soak=soak, reason=reason,
                               **changes)
        return self._detail(soak)

    @idempotency.object_action(request=SoakStopSerializer, response=SoakDetailSerializer)
    def stop(self, request: Request, pk: str) -> Response:
        """Stop a running soak (scope `jobs`; 409 unless running): its active job is
        cancelled and the soak records a failing verdict (a person stopped it)."""
        body = idempotency.action_body(request, SoakStopSerializer)
        soak = soaks.soak_stop(actor=actor_from_request(request), soak=self._soak(pk),
                               reason=body["reason"])
        return self._detail(soak)
