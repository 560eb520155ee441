from django.apps import AppConfig


class BenchConfig(AppConfig):
    """Benchmarks: traces, sweeps, SLO-qualified throughput and cost per 1M output tokens."""

    name = "fleetctl.bench"
    label = "bench"
    verbose_name = "Benchmarks"

    def ready(self) -> None:
        from fleetctl.bench.evidence import register

        register()
