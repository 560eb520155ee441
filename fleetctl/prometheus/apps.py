from django.apps import AppConfig


class PrometheusConfig(AppConfig):
    """Metric sources, query checks (gates and ramp guards), generated dashboards and alerts."""

    name = "fleetctl.prometheus"
    label = "prometheus"
    verbose_name = "Prometheus"

    def ready(self) -> None:
        from fleetctl.prometheus import evidence

        evidence.register()
