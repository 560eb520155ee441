"""Tasks of the core app: housekeeping every app relies on."""

from __future__ import annotations

from fleetctl.celery import app
from fleetctl.core.idempotency import idempotency_prune as _prune


@app.task(name="core.idempotency_prune", ignore_result=True)
def idempotency_prune() -> int:
    """Beat, hourly: forget Idempotency-Keys older than IDEMPOTENCY_TTL_HOURS."""
    return _prune()
