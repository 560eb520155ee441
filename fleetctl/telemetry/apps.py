from typing import Any

from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Live per-pool, per-route telemetry: the gateways' access logs and the pools' own
    /metrics, turned into windows of counts and mergeable latency histograms."""

    name = "fleetctl.telemetry"
    label = "telemetry"
    verbose_name = "Telemetry"

    def ready(self) -> None:
        from fleetctl.core.panels import Panel, register_panel, register_provider
        from fleetctl.telemetry.selectors import route_tier_live

        # The route page's tier card and GET /api/v1/routes/{name}/tiers/ (traffic sits
        # below telemetry): each tier's live share per pool, the last 15 minutes.
        register_provider("traffic.tier_live", route_tier_live)
        # The fleet overview's live cost column (fleet sits below telemetry).
        from fleetctl.telemetry.cost import overview_costs

        register_provider("fleet.pool_cost", overview_costs)
        register_panel(Panel("pool.panels", "telemetry/_pool_cost.html", order=20,
                             context=_pool_cost))


def _pool_cost(context: Any) -> dict[str, Any]:
    """The pool page's live cost: the last hour, and the last 7 UTC days."""
    from datetime import timedelta

    from django.utils import timezone

    from fleetctl.telemetry.cost import live_cost, live_cost_rollup

    pool = context["pool"]
    now = timezone.now()
    tax = context.get("tax")  # the pool page's interruption tax, read once
    days = live_cost_rollup(pool=pool.name, since=now - timedelta(days=7), until=now,
                            period="day", tax=tax)
    return {"pool_cost": {
        "hour": live_cost(pool=pool.name, since=now - timedelta(hours=1), until=now,
                          breakdown=False, tax=tax),
        "days": list(reversed(days))}}
