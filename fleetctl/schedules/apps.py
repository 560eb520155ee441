from typing import Any

from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    """Schedules: recurring evidence jobs per plan or pool (re-benchmark on another day,
    drain rehearsal inside a maintenance window, conformance and eval re-runs), fired by
    beat's `schedules.due` from rows people edit."""

    name = "fleetctl.schedules"
    label = "schedules"
    verbose_name = "Schedules"

    def ready(self) -> None:
        from fleetctl.core.panels import Panel, register_panel
        from migrations_plan.panels import PLAN_PANELS

        register_panel(Panel(PLAN_PANELS, "schedules/_plan_panel.html", order=40,
                             context=_plan_schedules))


def _plan_schedules(context: Any) -> dict[str, Any]:
    from fleetctl.schedules.selectors import schedules_of_plan

    return {"plan_schedules": schedules_of_plan(context["plan"])}
