"""Eval tasks (thin: the work is in services and runner). `evals.run` runs on the `evals`
queue, `evals.reap` on `default` every 30 s (fleetctl/celery.py)."""

from __future__ import annotations

from fleetctl.celery import app
from fleetctl.evals import services


@app.task(name="evals.run", ignore_result=True, acks_late=False, soft_time_limit=12 * 3600,
          time_limit=12 * 3600 + 60)
def run(run_id: int) -> None:
    """Drive one eval run to its end (minutes to hours, on its own thread pool). Not
    acknowledged late: a worker that dies loses the message, and the reaper enqueues the run
    again once its heartbeat is stale; the next worker takes it over and resumes it from its
    rows (a redelivered message could not tell a dead driver from a slow one)."""
    services.run_execute(run_id=run_id)


@app.task(name="evals.reap", ignore_result=True)
def reap() -> int:
    """Beat: enqueue again the runs no worker drives (heartbeat stale, or never taken)."""
    return services.runs_reap()
