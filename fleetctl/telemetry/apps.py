from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Live per-pool, per-route telemetry: the gateways' access logs and the pools' own
    /metrics, turned into windows of counts and mergeable latency histograms."""

    name = "fleetctl.telemetry"
    label = "telemetry"
    verbose_name = "Telemetry"

    def ready(self) -> None:
        from fleetctl.core.panels import register_provider
        from fleetctl.telemetry.selectors import route_tier_live

        # The route page's tier card and GET /api/v1/routes/{name}/tiers/ (traffic sits
        # below telemetry): each tier's live share per pool, the last 15 minutes.
        register_provider("traffic.tier_live", route_tier_live)
