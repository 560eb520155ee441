from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleetctl.prometheus.models import MetricSource


class MetricSourceSerializer(serializers.ModelSerializer):
    # Write-only: a source's token is never shown back, only whether one is set.
    bearer_token = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=500,
        help_text="Sent as Authorization: Bearer …. Never returned; an empty string removes "
                  "it.")
    has_bearer_token = serializers.SerializerMethodField()
    base_url = serializers.CharField(
        max_length=500, help_text="http(s) URL of the Prometheus (or the JSON endpoint's "
                                  "base). Checked for purpose `metrics`: loopback and "
                                  "link-local only where OUTBOUND_ALLOW_METRICS lists them; "
                                  "fleetctl's own services never.")

    telemetry_selector = serializers.CharField(
        max_length=300, required=False, allow_blank=True,
        help_text="Set: this Prometheus is also a telemetry source. PromQL label matchers "
                  "selecting one pool's vLLM series, $pool standing for the pool's name, "
                  "e.g. pool=\"$pool\". The ingester reads each pool's TTFT, TPOT and "
                  "end-to-end histograms through it into windows of source `prometheus`, "
                  "shown beside the gateways' figures and never judged by a ramp's guard. "
                  "Empty: query checks only.")

    class Meta:
        model = MetricSource
        fields = ["id", "name", "kind", "base_url", "bearer_token", "has_bearer_token",
                  "timeout_s", "telemetry_selector", "created_by", "created_at"]
        read_only_fields = ["id", "has_bearer_token", "created_by", "created_at"]
        extra_kwargs: dict[str, Any] = {"name": {"validators": []}}

    def get_has_bearer_token(self, source: MetricSource) -> bool:
        return bool(source.bearer_token)


class DashboardsMeasuredSerializer(serializers.Serializer):
    source = serializers.SlugRelatedField(  # type: ignore[assignment]
        slug_field="name",
                                          queryset=MetricSource.objects.all(),
                                          help_text="The Prometheus whose rules API is asked.")
