"""What a page shows of the apps above it: panels in named slots, and figures by name.

The apps are layers (tests/test_layers.py): the plan page (plans), the pool page (fleet) and
the route page (traffic) show panels that apps above them render, and a lower template must
not name a higher app's template or tags. So the page names a *slot* and renders whatever
is registered there (`{% load panels %}{% panels "pool.panels" %}`), and each app above
registers its panels in its `AppConfig.ready()`, as it registers its evidence kinds:

    register_panel(Panel("pool.panels", "ramps/_pool_live.html", order=10))

A panel is a template rendered with the page's context (as `{% include %}` would), in
`order` (lowest first), when `when(context)` holds (no `when`: always), with the variables
`context(context)` returns added (no `context`: none; a panel template may also load its
own app's tags). Slots today:

    plan.panels       the plan page, after the gate (shadow, evals, batch)
    plan.gate_action  a check's row in a plan's gate (conformance, shadow, evals); the
                      plans app builds these with `migrations_plan.panels.gate_action`
    pool.panels       the pool page, after the health history (ramps: live traffic)
    route.panels      the route page, after the split (ramps: live table, Ramps panel)

A *figure provider* is data a lower page shows in its own markup, where a panel would not
fit: the overview's live column is one cell in rows rendered up to a thousand times, so the
page asks for every row's figures at once (`{% provided "fleet.pool_live" pools as live %}`,
then `{{ live|item:pool.name }}`). Nothing registered: the tag gives `{}`.

This module lives in core, the lowest layer, because the lowest page with a slot (the pool
page) is fleet's, and fleet may import only core, accounts and audit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.template import Context


@dataclass(frozen=True)
class Panel:
    slot: str
    template: str
    order: int
    when: Callable[[Context], bool] | None = None
    context: Callable[[Context], dict[str, Any]] | None = None


PANELS: dict[str, list[Panel]] = {}
PROVIDERS: dict[str, Callable[..., Any]] = {}


def register_panel(panel: Panel) -> Panel:
    """Register (or replace: same slot and template) a panel; a slot keeps `order`."""
    entries = [p for p in PANELS.get(panel.slot, []) if p.template != panel.template]
    PANELS[panel.slot] = sorted([*entries, panel], key=lambda p: (p.order, p.template))
    return panel


def panels_of(slot: str) -> list[Panel]:
    return list(PANELS.get(slot, []))


def register_provider(name: str, provide: Callable[..., Any]) -> None:
    """Register (or replace) the function that gives the figures called `name`."""
    PROVIDERS[name] = provide


def provided(name: str, *args: Any) -> Any:
    provide = PROVIDERS.get(name)
    return provide(*args) if provide is not None else {}
