from django.apps import AppConfig


class ConformanceConfig(AppConfig):
    """The OpenAI-contract conformance probe: runs, per-case rows, `conformance` evidence."""

    name = "fleetctl.conformance"
    label = "conformance"
    verbose_name = "Conformance"

    def ready(self) -> None:
        from fleetctl.conformance.evidence import register

        register()
