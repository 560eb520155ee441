"""What the plan's stage-1 gate needs to offer "Run the conformance probe": the plan's latest
run, one still going, and whether the person may start one."""

from __future__ import annotations

from typing import Any

from django import template

from fleetctl.conformance.models import ConformanceRun

register = template.Library()


@register.simple_tag
def conformance_gate(plan: Any) -> dict[str, Any]:
    latest = (ConformanceRun.objects.filter(pool_id=plan.candidate_pool_id)
              .order_by("-created_at", "-id").first())
    return {"latest": latest,
            "active": latest is not None and latest.status in ConformanceRun.ACTIVE}


@register.simple_tag
def routing_gate(plan: Any) -> dict[str, Any]:
    """The newest routing probe of each of the plan's routes, and whether one is running."""
    from fleetctl.conformance.models import RoutingProbe

    latest = [probe for route in plan.routes.order_by("name")
              if (probe := RoutingProbe.objects.filter(route=route)
                  .order_by("-created_at", "-id").first()) is not None]
    return {"latest": latest,
            "active": any(probe.status in RoutingProbe.ACTIVE for probe in latest)}
