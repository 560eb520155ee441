from django.apps import AppConfig


class BenchConfig(AppConfig):
    """Benchmarks: traces, sweeps, SLO-qualified throughput and cost per 1M output tokens."""

    name = "fleetctl.bench"
    label = "bench"
    verbose_name = "Benchmarks"

    def ready(self) -> None:
        from fleetctl.bench.capacity import benchmark_capacity
        from fleetctl.bench.evidence import register
        from fleetctl.bench.reverify import benchmark_again
        from fleetctl.traffic.capacity import register_capacity_source
        from migrations_plan.reverify import register_reverified_hook

        register()
        # Each pool's SLO-qualified capacity, for capacity splits and capacity-checked drains.
        register_capacity_source(benchmark_capacity)
        # A changed candidate whose conformance re-run passed: its last benchmark again,
        # where a route of the plan asks (reverify_benchmark).
        register_reverified_hook("benchmarks", benchmark_again)
