from typing import Any

from django.apps import AppConfig


class EconomicsConfig(AppConfig):
    """The economics of a plan: its business case (the ops burden of a second backend in
    engineer-weeks against the measured arbitrage at the plan's volume, and a capacity
    forecast), shown on its own page and as a panel on the plan page."""

    name = "fleetctl.economics"
    label = "economics"
    verbose_name = "Economics"

    def ready(self) -> None:
        from fleetctl.core.panels import Panel, register_panel
        from fleetctl.economics.services import evidence_recorded, rates_changed, tax_changed
        from fleetctl.fleet.hooks import register_rate_hook, register_tax_hook
        from migrations_plan.panels import PLAN_PANELS
        from migrations_plan.services import EVIDENCE_HOOKS

        register_panel(Panel(PLAN_PANELS, "economics/_plan_panel.html", order=50,
                             context=_plan_case))
        register_rate_hook(rates_changed)
        register_tax_hook(tax_changed)
        if evidence_recorded not in EVIDENCE_HOOKS:
            EVIDENCE_HOOKS.append(evidence_recorded)


def _plan_case(context: Any) -> dict[str, Any]:
    from fleetctl.economics.selectors import case_of

    inputs, case = case_of(context["plan"])
    return {"business_case": case, "business_inputs": inputs}
