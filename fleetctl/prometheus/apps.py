from django.apps import AppConfig


class PrometheusConfig(AppConfig):
    """Metric sources, query checks (gates and ramp guards), generated dashboards and alerts."""

    name = "fleetctl.prometheus"
    label = "prometheus"
    verbose_name = "Prometheus"

    def ready(self) -> None:
        from fleetctl.core.panels import register_provider
        from fleetctl.prometheus import evidence
        from fleetctl.prometheus.telemetry import read_all

        evidence.register()
        # The ingester's scrape thread reads the telemetry sources through this (telemetry
        # sits below prometheus).
        register_provider("telemetry.prometheus_read", read_all)
