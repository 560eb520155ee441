from __future__ import annotations

from fleetctl.celery import app


@app.task(name="schedules.due", ignore_result=True)
def due() -> int:
    """Beat's tick: fire every schedule whose occurrence has come (services.schedules_due)."""
    from fleetctl.schedules.services import schedules_due

    return len(schedules_due())
