"""Tasks of the core app: housekeeping every app relies on. A shared task (core imports no
app, not even the Celery app): the app finds it among the installed apps' tasks."""

from __future__ import annotations

from celery import shared_task

from fleetctl.core.idempotency import idempotency_prune as _prune


@shared_task(name="core.idempotency_prune", ignore_result=True)
def idempotency_prune() -> int:
    """Beat, hourly: forget Idempotency-Keys older than IDEMPOTENCY_TTL_HOURS."""
    return _prune()
