"""What the plan page's Shadow panel and its stage-2 divergence check need: the plan's
current or last run with its live counters, the start form, and the stop form. A template tag,
so the plans app renders the panel without importing shadow (plans sit below shadow)."""

from __future__ import annotations

from typing import Any

from django import template

from fleetctl.core.display import or_dash
from fleetctl.core.templatetags.panels import count, percent
from fleetctl.shadow.forms import StartForm, StopForm
from fleetctl.shadow.selectors import live_counters, run_for_plan

register = template.Library()


@register.simple_tag
def shadow_panel(plan: Any, *, forms: bool = True) -> dict[str, Any]:
    """`forms=False` for the gate's one-line action, which polls every 10 s and needs no
    form or counters."""
    run = run_for_plan(plan)
    panel: dict[str, Any] = {"run": run, "running": run is not None and run.running}
    if forms:
        panel["counters"] = live_counters(run) if run is not None else {}
        panel["start_form"] = StartForm(plan=plan)
        panel["stop_form"] = StopForm(initial={"next": f"/plans/{plan.name}/"})
    return panel


@register.filter
def get_side(mapping: Any, side: str) -> Any:
    """A pair's per-side dict (`sides`, or the marked texts) by side name."""
    return mapping.get(side, {}) if isinstance(mapping, dict) else {}


@register.filter
def shadow_pct(rate: Any) -> str:
    """A rate (0..1) as a percentage: 0.0123 -> "1.23 %"."""
    return percent(rate, 2)


@register.filter
@or_dash
def shadow_points(value: Any) -> str:
    """A difference of rates in points, signed: 0.005 -> "+0.50"."""
    return f"{float(value) * 100:+.2f}"


# A count with thousands separators (2000000 -> "2,000,000"); "—" when unknown.
register.filter("thousands", count)
