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


# The rehearsal watcher's pace: one look, then the next queued with a countdown that grows
# to once a second (the drain itself is watched by traffic.drain_watch and converge).
REHEARSAL_FIRST_PAUSE_S = 0.05
REHEARSAL_MAX_PAUSE_S = 1.0


@app.task(name="plans.rehearsal_finish", ignore_result=True)
def rehearsal_finish(drain_id: int, pause_s: float = 0.0) -> None:
    """A watcher: one look at a rehearsal drain — restore the split once it completed, stop
    if it failed or is past DRAIN_WATCH_TIMEOUT_S — and otherwise the next look is queued
    with a countdown. Nothing waits inside a worker thread."""
    from django.conf import settings

    done, _restore = services.rehearsal_finish(
        drain_id=drain_id, timeout_s=float(settings.DRAIN_WATCH_TIMEOUT_S))
    if not done:
        pause = min(max(pause_s * 1.5, REHEARSAL_FIRST_PAUSE_S), REHEARSAL_MAX_PAUSE_S)
        rehearsal_finish.apply_async((drain_id, pause), countdown=pause)
