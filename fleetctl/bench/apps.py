from django.apps import AppConfig


class BenchConfig(AppConfig):
    """Benchmarks: traces, sweeps, SLO-qualified throughput and cost per 1M output tokens."""

    name = "fleetctl.bench"
    label = "bench"
    verbose_name = "Benchmarks"

    def ready(self) -> None:
        from fleetctl.bench.evidence import register
        from fleetctl.bench.reverify import benchmark_again
        from migrations_plan.reverify import register_reverified_hook

        register()
        # A changed candidate whose conformance re-run passed: its last benchmark again,
        # where a route of the plan asks (reverify_benchmark).
        register_reverified_hook("benchmarks", benchmark_again)
