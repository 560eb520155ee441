from __future__ import annotations

from fleetctl.celery import app
from fleetctl.conformance import services


@app.task(name="conformance.run", ignore_result=True, soft_time_limit=1800, time_limit=1860)
def run_execute(run_id: int) -> None:
    """Probe one pool (every endpoint) and its reference; record the verdict as evidence."""
    services.run_execute(run_id=run_id)


@app.task(name="conformance.reap", ignore_result=True)
def reap() -> int:
    """Beat: fail runs whose worker stopped beating or that no worker took (never left
    "running" or "queued")."""
    return services.runs_reap()
