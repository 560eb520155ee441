from __future__ import annotations

from fleetctl.celery import app
from migrations_plan import selectors, services


@app.task(name="plans.refresh", ignore_result=True)
def refresh() -> int:
    """Beat: re-evaluate every open plan's current gate — void approvals whose evidence moved
    or expired, and put check status changes on each plan's timeline."""
    changed = 0
    for plan in selectors.open_plans().select_related("candidate_pool", "primary_pool"):
        changed += len(services.plan_refresh(plan=plan))
    return changed


@app.task(name="plans.rehearsal_finish", ignore_result=True, soft_time_limit=1000,
          time_limit=1030)
def rehearsal_finish(drain_id: int) -> None:
    """Restore the split once a rehearsal drain completed (left drained if it never does)."""
    from django.conf import settings

    services.rehearsal_finish(drain_id=drain_id, timeout_s=float(settings.DRAIN_WATCH_TIMEOUT_S))
