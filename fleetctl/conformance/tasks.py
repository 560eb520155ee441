from __future__ import annotations

from fleetctl.celery import app
from fleetctl.conformance import routing_services, services


@app.task(name="conformance.run", ignore_result=True, soft_time_limit=1800, time_limit=1860)
def run_execute(run_id: int) -> None:
    """Probe one pool (every endpoint) and its reference; record the verdict as evidence."""
    services.run_execute(run_id=run_id)


@app.task(name="conformance.reap", ignore_result=True)
def reap() -> int:
    """Beat: fail runs whose worker stopped beating or that no worker took (never left
    "running" or "queued")."""
    return services.runs_reap()


@app.task(name="conformance.routing_probe", ignore_result=True, soft_time_limit=600,
          time_limit=660)
def routing_probe_execute(probe_id: int) -> None:
    """Probe one route's routing policy through its gateways; record the verdict."""
    routing_services.probe_execute(probe_id=probe_id)


@app.task(name="conformance.routing_reap", ignore_result=True)
def routing_reap() -> int:
    """Beat: fail routing probes whose worker stopped or that no worker took."""
    return routing_services.probes_reap()
