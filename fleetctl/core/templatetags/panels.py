"""`{% panels "slot" %}`, `{% provided "name" args as var %}` and `{{ mapping|item:key }}`:
a page renders what the apps above it registered (fleetctl/core/panels.py) without naming
them. Also the figure filters the apps' libraries register under their own names
(`percent`, `count`, and `item`), written once here."""

from __future__ import annotations

from typing import Any

from django import template
from django.template import Context
from django.utils.safestring import SafeString, mark_safe

from fleetctl.core import panels as registry
from fleetctl.core.display import or_dash

register = template.Library()


@register.simple_tag(takes_context=True)
def panels(context: Context, slot: str) -> SafeString:
    """Each panel registered in `slot` whose condition holds, in order, rendered with the
    page's context as `{% include %}` renders a template."""
    engine = context.template.engine  # type: ignore[union-attr]
    out = []
    for panel in registry.panels_of(slot):
        if panel.when is not None and not panel.when(context):
            continue
        extra = panel.context(context) if panel.context is not None else {}
        with context.push(**extra):
            out.append(engine.get_template(panel.template).render(context))
    # Rendered templates: each escaped what it printed.
    return mark_safe("\n".join(out))


@register.simple_tag
def provided(name: str, *args: Any) -> Any:
    return registry.provided(name, *args)


@register.filter
def item(mapping: Any, key: Any) -> Any:
    """`mapping[key]`, or None when there is none (a key no `.` lookup can spell)."""
    try:
        return mapping[key]
    except (KeyError, TypeError, IndexError):
        return None


@or_dash
def percent(value: Any, places: int = 1) -> str:
    """A share (0..1) as a percentage: 0.873 -> "87.3 %"; "—" when unknown."""
    return f"{float(value) * 100:.{places}f} %"


@or_dash
def count(value: Any) -> str:
    """A count with thousands separators (2000000 -> "2,000,000"); "—" when unknown."""
    return f"{int(value):,}"
