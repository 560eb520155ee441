from django.apps import AppConfig


class ShadowConfig(AppConfig):
    """Shadow runs: live traffic mirrored at the gateway (or replayed from a trace) to the
    primary, the primary again and the candidate; per-pair comparisons; `shadow` evidence."""

    name = "fleetctl.shadow"
    label = "shadow"
    verbose_name = "Shadow"

    def ready(self) -> None:
        from fleetctl.core.panels import Panel, register_panel
        from fleetctl.shadow.evidence import register
        from migrations_plan.panels import PLAN_PANELS, gate_action

        register()
        register_panel(gate_action("shadow/_gate_action.html", ("divergence", 2), order=20))
        register_panel(Panel(PLAN_PANELS, "shadow/_plan_panel.html", order=10))
