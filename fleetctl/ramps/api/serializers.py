from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleetctl.core.api.schema import NullableObjectField, ObjectField
from fleetctl.fleet.models import Pool
from fleetctl.ramps.models import Ramp, RampEvent, Watch, WatchVerdict
from fleetctl.traffic.models import Route
from migrations_plan.models import Plan


class StepSerializer(serializers.Serializer):
    percent = serializers.FloatField(help_text="The candidate's share of the route at this "
                                               "step (above 0, at most 100, 0.01 steps).")
    hold_s = serializers.FloatField(help_text="Seconds to hold it before the guard's verdict "
                                              "on the whole hold (at least the guard's "
                                              "window and one telemetry window).")


@extend_schema_field({"oneOf": [{"type": "number"},
                                  {"type": "string", "enum": ["capacity"]}]})
class StepPercentField(serializers.Field):
    """A step's percent as asked for: a number, or "capacity" on the last step (the pool's
    share of the route's capacity split, resolved when the ramp starts). The service judges
    both; here only the type."""

    def to_internal_value(self, data: Any) -> Any:
        if data == "capacity":
            return data
        if isinstance(data, bool) or not isinstance(data, int | float | str):
            raise serializers.ValidationError('A number, or "capacity" on the last step.')
        try:
            return float(data)
        except ValueError:
            raise serializers.ValidationError(
                f'{data!r} is not a number, nor "capacity".') from None

    def to_representation(self, value: Any) -> Any:
        return value


class StepCreateSerializer(serializers.Serializer):
    percent = StepPercentField(help_text=(
        'The candidate\'s share of the route at this step (above 0, at most 100, 0.01 '
        'steps), or "capacity" on the last step: its share of the route\'s capacity split '
        '(GET /api/v1/routes/{name}/capacity/), resolved when the ramp starts.'))
    hold_s = serializers.FloatField(help_text="Seconds to hold it before the guard's verdict "
                                              "on the whole hold.")


class RampEventSerializer(serializers.ModelSerializer):
    numbers = ObjectField(read_only=True, help_text=(
        "What the decision used: per pool the samples, error rate and TTFT/TPOT p95 with "
        "their bounds and sources, the thresholds, the window."))
    drain = serializers.IntegerField(source="drain_id", read_only=True, allow_null=True)

    class Meta:
        model = RampEvent
        fields = ["id", "at", "kind", "step_index", "percent", "message", "numbers", "actor",
                  "revision_number", "drain", "evidence_id"]
        read_only_fields = fields


class RampSerializer(serializers.ModelSerializer):
    route = serializers.CharField(source="route.name", read_only=True)
    pool = serializers.CharField(source="pool.name", read_only=True)
    plan = serializers.CharField(source="plan.name", read_only=True, allow_null=True)
    steps = StepSerializer(many=True, read_only=True)
    drain = serializers.IntegerField(source="drain_id", read_only=True, allow_null=True,
                                     help_text="The rollback or abort drain.")
    current_percent = serializers.SerializerMethodField(
        help_text="The candidate's share set by the current step (null before the first).")

    class Meta:
        model = Ramp
        fields = ["id", "route", "pool", "plan", "steps", "min_samples", "window_s",
                  "failure_threshold", "slo_ttft_p95_ms", "slo_tpot_p95_ms", "slo_error_rate",
                  "latency_margin_pct", "slo_e2e_p95_ms", "base_weights", "state",
                  "state_reason", "step_index",
                  "current_percent", "step_started_at", "revision_number",
                  "consecutive_failures", "drain", "created_by", "created_at", "finished_at",
                  "next_check_at", "metric_checks"]
        read_only_fields = fields

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["base_weights"] = ObjectField(read_only=True, help_text=(
            "The split when the ramp started (basis points by pool): the other pools share "
            "the rest in these proportions."))
        fields["metric_checks"] = serializers.ListField(
            child=ObjectField(), read_only=True, help_text=(
                "Extra guard metrics: query checks against metric sources (docs/prometheus.md)."))
        return fields

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_current_percent(self, ramp: Ramp) -> float | None:
        step = ramp.current_step
        return float(step["percent"]) if step else None


class SpanSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    percent = serializers.FloatField(allow_null=True)
    start = serializers.DateTimeField()
    end = serializers.DateTimeField(allow_null=True)
    outcome = serializers.CharField(help_text="holding, passed, skipped, stepped up, warned, "
                                              "rolled back, aborted, paused, complete")


class RampDetailSerializer(RampSerializer):
    events = RampEventSerializer(many=True, read_only=True,
                                 help_text="The timeline, oldest first.")
    spans = SpanSerializer(many=True, read_only=True, help_text="One per step set.")
    numbers = NullableObjectField(read_only=True, help_text=(
        "The guard's judgement of the current step's window right now (decision, reasons, "
        "both pools' figures with their sources); null when no step is holding."))

    class Meta(RampSerializer.Meta):
        fields = [*RampSerializer.Meta.fields, "events", "spans", "numbers"]
        read_only_fields = fields


class RampCreateSerializer(serializers.Serializer):
    route = serializers.SlugRelatedField(slug_field="name", queryset=Route.objects.all())
    pool = serializers.SlugRelatedField(slug_field="name", queryset=Pool.objects.all(),
                                        help_text="The candidate pool to ramp onto the route.")
    steps = StepCreateSerializer(many=True, help_text="Strictly increasing percents, each "
                                                      "held; at most 20.")
    plan = serializers.SlugRelatedField(
        slug_field="name", queryset=Plan.objects.all(), required=False, allow_null=True,
        help_text="The plan whose candidate the pool is (default: its stage-4 plan listing the "
                  "route, if any); each passed hold records ramp-slo evidence for it.")
    min_samples = serializers.IntegerField(required=False, default=50, min_value=1)
    window_s = serializers.IntegerField(required=False, default=30, min_value=1)
    failure_threshold = serializers.IntegerField(required=False, default=2, min_value=1,
                                                 max_value=100)
    slo_ttft_p95_ms = serializers.FloatField(required=False, allow_null=True, min_value=0)
    slo_tpot_p95_ms = serializers.FloatField(required=False, allow_null=True, min_value=0)
    slo_error_rate = serializers.FloatField(required=False, allow_null=True, min_value=0,
                                            max_value=1)
    latency_margin_pct = serializers.FloatField(required=False, allow_null=True, min_value=0)
    slo_e2e_p95_ms = serializers.FloatField(
        required=False, allow_null=True, min_value=1,
        help_text="Whole-answer latency p95 bound (ms), streamed or not; default: the plan's, "
                  "else not judged.")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000,
                                   default="")
    metric_checks = serializers.ListField(
        child=ObjectField(), required=False, max_length=10, default=list,
        help_text="Extra guard metrics (at most 10): {source, query, success and/or failure, "
                  "field?, name?}, e.g. {\"source\": \"prometheus\", \"query\": "
                  "\"sum(vllm:num_requests_waiting{pool=\\\"$pool\\\"})\", \"success\": "
                  "\"result < 10\"}. A failing one rolls back like the guard's own figures; "
                  "no data or a source that is down waits (docs/prometheus.md).")

    def validate_steps(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(step) for step in steps]


class RampActionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, help_text="Goes in the ramp's timeline "
                                                              "and the audit log.")


class WatchVerdictSerializer(serializers.ModelSerializer):
    class Meta:
        model = WatchVerdict
        fields = ["id", "window_start", "window_end", "verdict", "requests", "ttft_p95_ms",
                  "tpot_p95_ms", "e2e_p95_ms", "error_rate", "primary_requests",
                  "primary_ttft_p95_ms", "primary_tpot_p95_ms", "primary_e2e_p95_ms",
                  "primary_error_rate", "summary", "action", "at"]
        read_only_fields = fields


class WatchSerializer(serializers.ModelSerializer):
    route = serializers.CharField(source="route.name", read_only=True)
    pool = serializers.CharField(source="pool.name", read_only=True)
    plan = serializers.CharField(source="plan.name", read_only=True, allow_null=True)
    ramp = serializers.IntegerField(source="ramp_id", read_only=True, allow_null=True,
                                    help_text="The completed ramp that handed over.")
    drain = serializers.IntegerField(source="drain_id", read_only=True, allow_null=True,
                                     help_text="The drain the watch made (policy drain).")

    class Meta:
        model = Watch
        fields = ["id", "route", "pool", "plan", "ramp", "role", "policy", "state",
                  "ended_reason", "slo_ttft_p95_ms", "slo_tpot_p95_ms", "slo_error_rate",
                  "latency_margin_pct", "slo_e2e_p95_ms", "min_samples", "window_s",
                  "failure_threshold", "consecutive_failures", "drain", "created_by",
                  "started_at", "ended_at", "judged_until"]
        read_only_fields = fields


class WatchDetailSerializer(WatchSerializer):
    verdicts = serializers.SerializerMethodField(
        help_text="The judged windows, newest first (at most 500; `?verdicts=N` for fewer).")

    class Meta(WatchSerializer.Meta):
        fields = [*WatchSerializer.Meta.fields, "verdicts"]
        read_only_fields = fields

    @extend_schema_field(WatchVerdictSerializer(many=True))
    def get_verdicts(self, watch: Watch) -> list[dict[str, Any]]:
        limit = int(self.context.get("verdicts", 500))
        rows = watch.verdicts.order_by("-window_start", "-id")[:limit]
        return list(WatchVerdictSerializer(rows, many=True).data)


class WatchPolicySerializer(serializers.Serializer):
    policy = serializers.ChoiceField(choices=Watch.Policy.choices,
                                     help_text="What a failure does: alert or drain.")
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True,
                                   default="", help_text="Goes in the audit log.")


class WatchEndSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, help_text="Goes in the audit log.")
