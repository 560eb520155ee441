from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Live per-pool, per-route telemetry: the gateways' access logs and the pools' own
    /metrics, turned into windows of counts and mergeable latency histograms."""

    name = "fleetctl.telemetry"
    label = "telemetry"
    verbose_name = "Telemetry"
