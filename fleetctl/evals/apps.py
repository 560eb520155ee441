from django.apps import AppConfig


class EvalsConfig(AppConfig):
    """Eval runs: versioned suites pinned by SHA-256, scored on each pool directly (never
    through a route), paired against the primary; `eval` and `live-quality` evidence."""

    name = "fleetctl.evals"
    label = "evals"
    verbose_name = "Evals"

    def ready(self) -> None:
        from fleetctl.evals.evidence import register

        register()
