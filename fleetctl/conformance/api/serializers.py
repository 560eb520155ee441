"""Conformance runs over REST. Inputs are shapes only; the services decide what is allowed
(the `jobs` permission, a pool with endpoints, a plan whose candidate is the pool, a model
both pools serve) and say why when it is not."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleetctl.conformance import cases as suite
from fleetctl.conformance.models import ConformanceCase, ConformanceRun, RoutingProbe
from fleetctl.core.api.fields import StrictBooleanField, StrictCharField, by_name
from fleetctl.core.api.schema import ObjectField
from fleetctl.fleet.api.serializers import pool_by_name
from fleetctl.traffic.models import Gateway, Route
from migrations_plan.api.serializers import plan_by_name


class ConformanceRunCreateSerializer(serializers.Serializer):
    pool = pool_by_name(help_text="The pool to probe (every one of its endpoints).")
    plan = plan_by_name(required=False, allow_null=True, default=None,
                        help_text="A plan whose candidate is the pool: its primary is the "
                                  "reference and its routes' model is probed.")
    primary = pool_by_name(required=False, allow_null=True, default=None,
                           help_text="The reference pool when no plan is named.")
    model = StrictCharField(max_length=200, required=False, allow_blank=True, default="",
                            help_text="Default: the plan's routes' model, or the pool's only "
                                      "model.")
    include_saturation = StrictBooleanField(
        required=False, default=False,
        help_text="Also run errors.rate_limit, which floods the pool until it answers 429.")
    # The metaclass moves declared fields off the class, so this does not hide Field.required.
    required = serializers.ListField(  # type: ignore[assignment]
        child=StrictCharField(max_length=60), required=False, default=list, max_length=50,
        help_text="Case keys to require beyond the default required set.")


class ConformanceRunSerializer(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.name", read_only=True)
    primary = serializers.CharField(source="primary.name", read_only=True, allow_null=True,
                                    default=None)
    plan = serializers.CharField(source="plan.name", read_only=True, allow_null=True,
                                 default=None)
    model = serializers.CharField(source="model_id", read_only=True)
    # Blank until the run finishes: documented, so a generated client accepts "".
    verdict = serializers.ChoiceField(choices=ConformanceRun.Verdict.choices, allow_blank=True,
                                      read_only=True)
    required_keys = serializers.ListField(child=serializers.CharField(), read_only=True)
    counts = ObjectField(read_only=True)
    url = serializers.SerializerMethodField()

    class Meta:
        model = ConformanceRun
        fields = ["id", "pool", "primary", "plan", "model", "include_saturation",
                  "required_keys", "status", "verdict", "summary", "counts", "error",
                  "evidence_id", "created_by", "created_at", "started_at", "finished_at",
                  "url"]
        read_only_fields = fields

    def get_url(self, run: ConformanceRun) -> str:
        return f"/conformance/runs/{run.pk}/"


class ConformanceCaseSerializer(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.name", read_only=True)
    latency_ms = serializers.FloatField(read_only=True, allow_null=True,
                                       help_text="Milliseconds, to 0.1 ms.")
    numbers = ObjectField(read_only=True)

    class Meta:
        model = ConformanceCase
        fields = ["key", "title", "required", "pool", "role", "endpoint", "status",
                  "expected", "got", "latency_ms", "request_excerpt", "response_excerpt",
                  "numbers", "at"]
        read_only_fields = fields


class ConformanceRunDetailSerializer(ConformanceRunSerializer):
    cases = ConformanceCaseSerializer(many=True, read_only=True)

    class Meta(ConformanceRunSerializer.Meta):
        fields = [*ConformanceRunSerializer.Meta.fields, "cases"]
        read_only_fields = fields


class ConformanceSuiteCaseSerializer(serializers.Serializer):
    key = serializers.CharField()
    title = serializers.CharField()
    required = serializers.BooleanField()  # type: ignore[assignment]
    opt_in = serializers.BooleanField()
    parity = serializers.BooleanField()
    sends = serializers.CharField()
    judges = serializers.CharField()


def suite_data() -> list[dict[str, Any]]:
    return [{"key": c.key, "title": c.title, "required": c.required, "opt_in": c.opt_in,
             "parity": c.parity, "sends": c.sends, "judges": c.judges} for c in suite.CASES]


# --- routing probes ---------------------------------------------------------------------------

class RoutingProbeCreateSerializer(serializers.Serializer):
    route = by_name(Route.objects.all(), "No route named {value}; see GET /api/v1/routes/.",
                    help_text="The route to probe, through the gateways that carry it.")
    plan = plan_by_name(required=False, allow_null=True, default=None,
                        help_text="A plan the route belongs to: the finished probe records "
                                  "routing-policy evidence about its candidate.")
    gateway = by_name(Gateway.objects.all(),
                      "No gateway named {value}; see GET /api/v1/gateways/.",
                      required=False, allow_null=True, default=None,
                      help_text="Probe through this gateway only (default: every gateway "
                                "carrying the route that has a listen_url).")


class RoutingProbeSerializer(serializers.ModelSerializer):
    route = serializers.CharField(source="route.name", read_only=True)
    plan = serializers.CharField(source="plan.name", read_only=True, allow_null=True,
                                 default=None)
    gateways = serializers.ListField(child=ObjectField(), read_only=True,
                                     help_text="[{name, listen_url}] probed.")
    verdict = serializers.ChoiceField(choices=RoutingProbe.Verdict.choices, allow_blank=True,
                                      read_only=True)
    results = serializers.ListField(child=ObjectField(), read_only=True, help_text=(
        "One per request: label, tier, gateway, stated (tokens), allowed (pools), refusal "
        "(413/503 due, or null), status, pool (the answer's x-fleetctl-pool), "
        "routed_tokens, result (ok, violation, unjudged) and detail."))
    url = serializers.SerializerMethodField()

    class Meta:
        model = RoutingProbe
        fields = ["id", "route", "plan", "gateways", "status", "verdict", "summary", "results",
                  "error", "evidence_id", "created_by", "created_at", "started_at",
                  "finished_at", "url"]
        read_only_fields = fields

    def get_url(self, probe: RoutingProbe) -> str:
        return f"/conformance/routing-probes/{probe.pk}/"
