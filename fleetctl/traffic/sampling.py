"""Traffic sampling: per-pool counters read from every gateway (beat), kept for a day. Rates
are differences between consecutive rows (selectors.pool_rates)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.utils import timezone

from fleetctl.traffic import selectors
from fleetctl.traffic.gateways.base import AdapterError, adapter_for
from fleetctl.traffic.models import Gateway, PoolTrafficSample

log = logging.getLogger("fleetctl.traffic")


def traffic_sample(*, gateway: Gateway) -> int:
    """Store one reading of the gateway's per-pool counters; returns rows written."""
    try:
        counters = adapter_for(selectors.gateway_spec(gateway)).pool_counters()
    except AdapterError as exc:
        log.info("no traffic sample from %s: %s", gateway.name, exc)
        return 0
    now = timezone.now()
    PoolTrafficSample.objects.bulk_create([
        PoolTrafficSample(gateway=gateway, pool=pool, at=now, requests_total=c.requests_total,
                          errors_total=c.errors_total, active=c.active)
        for pool, c in counters.items()
    ])
    return len(counters)


def traffic_samples_prune(*, older_than_hours: int = 24) -> int:
    cutoff = timezone.now() - timedelta(hours=older_than_hours)
    return PoolTrafficSample.objects.filter(at__lt=cutoff).delete()[0]
