from __future__ import annotations

from celery import shared_task


@shared_task(name="prometheus.measure")
def measure() -> int:
    """Measure the due query and rules checks of every open plan's current gate."""
    from fleetctl.prometheus.services import gate_queries_measure

    return gate_queries_measure()
