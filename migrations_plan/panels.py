"""The plan page's slots (fleetctl/core/panels.py): what the apps above plans show on it.

`plan.panels` follow the gate; `plan.gate_action` sit in one check's row of the gate (below
its summary), on the checks they name. A gate action is registered with the checks it
serves, each a (check key, stage viewed) pair, and renders with the row's context: `plan`,
`check`, `result` (the check's outcome), `viewed_stage` and `can`:

    register_panel(gate_action("conformance/_gate_action.html", ("conformance", 1), order=10))
"""

from __future__ import annotations

from django.template import Context

from fleetctl.core.panels import Panel

PLAN_PANELS = "plan.panels"
GATE_ACTION = "plan.gate_action"


def gate_action(template: str, *checks: tuple[str, int], order: int) -> Panel:
    """A panel in the gate row of each check in `checks` ((key, stage viewed) pairs)."""
    serves = frozenset(checks)

    def when(context: Context) -> bool:
        check = context.get("check")
        return (getattr(check, "key", None), context.get("viewed_stage")) in serves

    return Panel(GATE_ACTION, template, order, when=when)
