"""The telemetry API's shapes: query parameters (checked, 400 naming the field) and answers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from rest_framework import serializers

MAX_WINDOW_S = 86_400
MAX_SPAN_DAYS = 30


class SummaryQuery(serializers.Serializer[Any]):
    window_s = serializers.IntegerField(
        required=False, default=60, min_value=1, max_value=MAX_WINDOW_S,
        help_text="Seconds back from now (default 60).")
    pool = serializers.CharField(required=False, help_text="Only this pool (repeat for more).")


class DetailQuery(serializers.Serializer[Any]):
    route = serializers.CharField(required=False, help_text="Only this route's requests.")
    since = serializers.DateTimeField(
        required=False, help_text="ISO 8601; default 15 minutes before `until`.")
    until = serializers.DateTimeField(required=False, help_text="ISO 8601; default now.")
    resolution_s = serializers.ChoiceField(
        choices=[10, 60, 600, 3600], required=False,
        help_text="The series' step; default the finest giving at most 360 points.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        until = attrs.get("until") or timezone.now()
        since = attrs.get("since") or until - timedelta(minutes=15)
        if since >= until:
            raise serializers.ValidationError({"since": "since must be before until."})
        if until - since > timedelta(days=MAX_SPAN_DAYS):
            raise serializers.ValidationError(
                {"since": f"At most {MAX_SPAN_DAYS} days at once (windows are kept that long)."})
        attrs["since"], attrs["until"] = since, until
        return attrs


class FigureSerializer(serializers.Serializer[Any]):
    value = serializers.FloatField(allow_null=True,
                                   help_text="The estimate: ms, or a rate from 0 to 1; null "
                                             "without data.")
    low = serializers.FloatField(allow_null=True, help_text="Lower confidence bound.")
    high = serializers.FloatField(allow_null=True, help_text="Upper confidence bound.")
    n = serializers.IntegerField(help_text="Samples behind it.")
    # DRF takes declared fields off the class: these names do not shadow Field.source or
    # Serializer.errors at run time.
    source = serializers.CharField(help_text="Where it was measured.")  # type: ignore[assignment]


class ReportedSerializer(serializers.Serializer[Any]):
    source = serializers.CharField(help_text='The kind of source: "prometheus".')  # type: ignore[assignment]
    source_name = serializers.CharField(help_text="The metric source's name.")
    label = serializers.CharField(help_text='"from Prometheus <name>".')  # type: ignore[assignment]
    requests = serializers.IntegerField(
        help_text="Requests the pool's vllm:e2e_request_latency_seconds counted (every route).")
    ttft_p95 = FigureSerializer()
    tpot_p95 = FigureSerializer()
    duration_p95 = FigureSerializer()
    last_data_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField(
        allow_blank=True, help_text="Why the source gave nothing at its last read (down, an "
                                    "error, no series for this pool); empty when it answered.")
    last_read_at = serializers.DateTimeField(allow_null=True)


class PoolStatsSerializer(serializers.Serializer[Any]):
    pool = serializers.CharField()
    route = serializers.CharField(allow_null=True)
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    requests = serializers.IntegerField(
        help_text="The requests the pool is judged on: every request the gateways logged but "
                  "the client disconnects.")
    errors = serializers.IntegerField(  # type: ignore[assignment]
        help_text="5xx answers, requests with no answer, and answers the pool broke off.")
    client_disconnects = serializers.IntegerField(
        help_text="Requests the client abandoned (Envoy's DC flag, HAProxy's C/c termination "
                  "states, nginx's 499): shown apart, never counted against the pool.")
    retries = serializers.IntegerField()
    fallbacks = serializers.IntegerField(
        help_text="Requests this pool answered for another pool of a context tier whose "
                  "connect failed before any byte reached it (per-request fallback).")
    fell_over = serializers.IntegerField(
        help_text="Requests the split sent to this pool that another pool of the tier "
                  "answered (this pool's connect failed).")
    streamed = serializers.IntegerField()
    rps = serializers.FloatField(help_text="requests per second (client disconnects apart).")
    error_rate = FigureSerializer(help_text="errors / requests, Wilson interval.")
    disconnect_rate = FigureSerializer(
        help_text="client_disconnects / (requests + client_disconnects), Wilson interval.")
    ttft_p50 = FigureSerializer()
    ttft_p95 = FigureSerializer(help_text="First body byte of streamed answers, at the "
                                          "gateways.")
    ttft_p99 = FigureSerializer()
    tpot_p95 = FigureSerializer(help_text="From the pool's own /metrics: pool-wide.")
    duration_p95 = FigureSerializer()
    sources = serializers.ListField(child=serializers.CharField())
    last_data_at = serializers.DateTimeField(allow_null=True)
    reported = ReportedSerializer(
        many=True, help_text="Beside the gateways' figures: what each Prometheus marked as a "
                             "telemetry source reports of the pool (pool-wide, every route), "
                             "labelled by source. Never judged by a ramp's guard.")


class SeriesPointSerializer(serializers.Serializer[Any]):
    start = serializers.DateTimeField()
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()  # type: ignore[assignment]
    error_rate = serializers.FloatField(allow_null=True)
    client_disconnects = serializers.IntegerField()
    ttft_p50 = serializers.FloatField(allow_null=True)
    ttft_p95 = serializers.FloatField(allow_null=True)
    ttft_p99 = serializers.FloatField(allow_null=True)
    tpot_p95 = serializers.FloatField(allow_null=True)
    rps = serializers.FloatField()


class PoolDetailSerializer(serializers.Serializer[Any]):
    stats = PoolStatsSerializer()
    series = SeriesPointSerializer(many=True)


class IngestStatusSerializer(serializers.Serializer[Any]):
    source = serializers.CharField(help_text="The gateway or pool.")  # type: ignore[assignment]
    kind = serializers.CharField(
        help_text='"gateway access log", "pool /metrics" or "Prometheus" (a metric source\'s '
                  'view of one pool: path "prometheus:<pool>").')
    path = serializers.CharField(help_text="The file followed, or the /metrics URL.")
    lines = serializers.IntegerField(help_text="Lines read (log) or scrapes answered.")
    malformed = serializers.IntegerField()
    offset = serializers.IntegerField()
    rotations = serializers.IntegerField()
    truncations = serializers.IntegerField()
    last_read_at = serializers.DateTimeField(allow_null=True)
    lag_s = serializers.FloatField(allow_null=True,
                                   help_text="Seconds since the ingester last read it.")
    last_error = serializers.CharField(allow_blank=True)
    ingester = serializers.CharField(
        allow_null=True, help_text="The ingester holding its shard now (host:pid:random); "
        "null when none does (none running, or its lease expired).")


class CostQuery(serializers.Serializer[Any]):
    since = serializers.DateTimeField(
        required=False, help_text="ISO 8601; default 24 hours before `until` (7 days with "
                                  "period=day, 30 with period=month).")
    until = serializers.DateTimeField(required=False, help_text="ISO 8601; default now.")
    period = serializers.ChoiceField(
        choices=["day", "month"], required=False,
        help_text="Also give the cost per UTC day or calendar month (windows are kept 30 "
                  "days).")
    route = serializers.CharField(required=False,
                                  help_text="Only this route's share of the pool (its share "
                                            "of the gateways' requests to the pool).")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        until = attrs.get("until") or timezone.now()
        back = {"day": timedelta(days=7), "month": timedelta(days=MAX_SPAN_DAYS)}.get(
            attrs.get("period") or "", timedelta(hours=24))
        since = attrs.get("since") or until - back
        if since >= until:
            raise serializers.ValidationError({"since": "since must be before until."})
        if until - since > timedelta(days=MAX_SPAN_DAYS):
            raise serializers.ValidationError(
                {"since": f"At most {MAX_SPAN_DAYS} days at once (windows are kept that long)."})
        attrs["since"], attrs["until"] = since, until
        return attrs


class RouteShareSerializer(serializers.Serializer[Any]):
    route = serializers.CharField()
    share = serializers.FloatField(allow_null=True)
    output_tokens = serializers.IntegerField(allow_null=True)
    cost = serializers.CharField(allow_null=True)
    not_measured = serializers.CharField(allow_blank=True)
    requests = serializers.IntegerField(allow_null=True)
    failed_requests = serializers.IntegerField(allow_null=True)
    retries = serializers.IntegerField(allow_null=True)
    successful_requests = serializers.IntegerField(allow_null=True)
    cost_per_success = serializers.CharField(
        allow_null=True, help_text="The route's share of the cost ÷ its successful requests.")
    per_success_not_measured = serializers.CharField(allow_blank=True)


class LiveCostSerializer(serializers.Serializer[Any]):
    pool = serializers.CharField()
    route = serializers.CharField(allow_null=True)
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    currency = serializers.CharField(help_text="The pool's currency: cost and cost per 1M.")
    hourly_rate = serializers.CharField(help_text="The pool's node_hourly_rate now.")
    output_tokens = serializers.IntegerField(
        allow_null=True, help_text="Output tokens served (the pool's "
                                   "vllm:generation_tokens_total); null when not measured.")
    hours = serializers.FloatField(allow_null=True,
                                   help_text="Hours the token counter covered (scrape to "
                                             "scrape), the same interval as the tokens.")
    cost = serializers.CharField(allow_null=True, help_text="hourly rate × hours.")
    cost_per_1m = serializers.CharField(
        allow_null=True, help_text="Per 1M output tokens, the benchmark's formula "
                                   "(rate ÷ tokens/s × 1e6 ÷ 3600); null with `not_measured`.")
    output_tokens_per_s = serializers.FloatField(allow_null=True)
    utilisation = serializers.FloatField(
        allow_null=True, help_text="Mean running requests ÷ the pool's SLO capacity in "
                                   "streams (0..1, above 1 beyond it).")
    mean_running = serializers.FloatField(allow_null=True)
    capacity_streams = serializers.FloatField(allow_null=True)
    capacity_tokens_per_s = serializers.FloatField(allow_null=True)
    utilisation_source = serializers.CharField()
    tokens_source = serializers.CharField()
    not_measured = serializers.CharField(
        allow_blank=True, help_text='"not measured: <reason>" when cost_per_1m is null.')
    route_share = serializers.FloatField(allow_null=True)
    benchmark_cost_per_1m = serializers.CharField(allow_null=True)
    benchmark_source = serializers.CharField(allow_blank=True)
    gap = serializers.CharField(allow_blank=True,
                                help_text="Live against the benchmark, in words.")
    routes = RouteShareSerializer(many=True)
    requests = serializers.IntegerField(
        allow_null=True, help_text="Requests the gateways logged to the pool (client "
                                   "disconnects apart) plus those that fell over to another "
                                   "pool of the tier; null when none was logged.")
    failed_requests = serializers.IntegerField(
        allow_null=True, help_text="5xx, no answer, cut off by the pool, or fell over (as the "
                                   "ramp guard counts them).")
    retries = serializers.IntegerField(
        allow_null=True, help_text="Upstream attempts beyond the first (Envoy's retries): "
                                   "spend, never successes.")
    successful_requests = serializers.IntegerField(
        allow_null=True, help_text="requests − failed_requests.")
    error_rate = serializers.FloatField(allow_null=True,
                                        help_text="failed_requests ÷ requests.")
    cost_per_success = serializers.CharField(
        allow_null=True, help_text="Cost per successful request: cost ÷ successful_requests, "
                                   "in `currency`; null with `per_success_not_measured`.")
    per_success_not_measured = serializers.CharField(
        allow_blank=True, help_text='"not measured: <reason>" when cost_per_success is null.')
    requests_source = serializers.CharField()


class PoolCostSerializer(serializers.Serializer[Any]):
    total = LiveCostSerializer()
    periods = LiveCostSerializer(many=True)
