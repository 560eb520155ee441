from __future__ import annotations

from django.conf import settings

from fleetctl.celery import app
from fleetctl.fleet import selectors, services
from fleetctl.fleet.probe import probe_pool


@app.task(name="fleet.pools_probe_due", ignore_result=True)
def pools_probe_due() -> int:
    """Beat entry point: one probe task per pool, each expiring before the next round."""
    interval = float(settings.HEALTH_PROBE_INTERVAL_S)
    pool_ids = list(selectors.pool_ids_to_probe())
    for pool_id in pool_ids:
        pool_probe.apply_async(args=(pool_id,), expires=interval)
    return len(pool_ids)


@app.task(name="fleet.pool_probe", ignore_result=True, acks_late=False)
def pool_probe(pool_id: int) -> bool | None:
    pool = selectors.pool_for_probe(pool_id=pool_id)
    if pool is None:
        return None
    result = probe_pool(pool.base_urls, timeout_s=settings.HEALTH_PROBE_TIMEOUT_S,
                        configured=selectors.pool_configured_models(pool_id=pool_id))
    services.pool_health_record(
        pool_id=pool_id, ok=result.ok, status_code=result.status_code,
        latency_ms=result.latency_ms, error=result.error, models_seen=result.models_seen,
        reported=result.reported,
    )
    return result.ok


@app.task(name="fleet.health_history_prune", ignore_result=True)
def health_history_prune() -> int:
    return services.health_history_prune()
