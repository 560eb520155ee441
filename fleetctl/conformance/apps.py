from django.apps import AppConfig


class ConformanceConfig(AppConfig):
    """The OpenAI-contract conformance probe: runs, per-case rows, `conformance` evidence."""

    name = "fleetctl.conformance"
    label = "conformance"
    verbose_name = "Conformance"

    def ready(self) -> None:
        from fleetctl.conformance.calibration import pool_calibrations
        from fleetctl.conformance.evidence import register
        from fleetctl.conformance.reverify import reverify_candidate, reverify_registered
        from fleetctl.core.panels import register_panel
        from fleetctl.fleet.hooks import register_change_hook, register_report_hook
        from fleetctl.traffic.prompt_size import register_calibration_source
        from migrations_plan.panels import gate_action

        register()
        register_report_hook(reverify_candidate)  # a change the pool's servers report
        register_change_hook(reverify_registered)  # a registry edit of its fingerprint
        register_calibration_source(pool_calibrations)  # the gateway's prompt estimate
        register_panel(gate_action("conformance/_gate_action.html", ("conformance", 1), order=10))
        register_panel(gate_action("conformance/_routing_gate_action.html",
                                   ("routing-policy", 4), order=10))
