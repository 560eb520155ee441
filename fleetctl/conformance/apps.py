from django.apps import AppConfig


class ConformanceConfig(AppConfig):
    """The OpenAI-contract conformance probe: runs, per-case rows, `conformance` evidence."""

    name = "fleetctl.conformance"
    label = "conformance"
    verbose_name = "Conformance"

    def ready(self) -> None:
        from fleetctl.conformance.evidence import register
        from fleetctl.conformance.reverify import reverify_candidate
        from fleetctl.core.panels import register_panel
        from fleetctl.fleet.services import register_report_hook
        from migrations_plan.panels import gate_action

        register()
        register_report_hook(reverify_candidate)
        register_panel(gate_action("conformance/_gate_action.html", ("conformance", 1), order=10))
