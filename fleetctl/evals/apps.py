from django.apps import AppConfig


class EvalsConfig(AppConfig):
    """Eval runs: versioned suites pinned by SHA-256, scored on each pool directly (never
    through a route), paired against the primary; `eval` evidence (and the `live-quality`
    kind, which only stage-4 shadow runs record)."""

    name = "fleetctl.evals"
    label = "evals"
    verbose_name = "Evals"

    def ready(self) -> None:
        from fleetctl.core.panels import Panel, register_panel
        from fleetctl.evals.evidence import register
        from migrations_plan.panels import PLAN_PANELS, gate_action

        register()
        register_panel(gate_action("evals/_gate_action.html", ("eval", 2), order=30))
        # A changed candidate whose conformance re-run passed: the plan's last suite again.
        from fleetctl.evals.reverify import eval_again
        from migrations_plan.reverify import register_reverified_hook

        register_reverified_hook("evals", eval_again)
        register_panel(Panel(PLAN_PANELS, "evals/_plan_panel.html", order=20))
