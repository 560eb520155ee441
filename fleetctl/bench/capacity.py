"""Each pool's SLO-qualified capacity from its benchmark evidence: the source that
fleetctl/traffic/capacity.py asks (registered in apps.py).

A pool's capacity for a model is the best level of its newest benchmark evidence for that
model that still counts (not expired, measured on what the pool still is: the same
fingerprint rule as every gate check) and that a concurrency sweep produced: the most
streams at which the run's SLO held, and the output tokens/s they gave. A trace-timing run
has no stream count (an open-loop level), so it is skipped with the reason. Both figures
are scaled by the pool's endpoints now over the endpoints measured (a run before the
benchmark recorded its endpoints counts as measured on today's)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from fleetctl.bench.evidence import KIND
from fleetctl.traffic.capacity import PoolCapacity
from migrations_plan.evidence import fingerprint_change, pool_fingerprint
from migrations_plan.models import Evidence

# Newest rows looked at per pool before giving up (older ones are superseded anyway).
ROWS_PER_POOL = 20


def benchmark_capacity(model_id: str, pools: list[Any]) -> dict[str, PoolCapacity]:
    now = timezone.now()
    found: dict[str, PoolCapacity] = {}
    for pool in pools:
        found[pool.name] = _capacity(pool, model_id, now)
    return found


def _capacity(pool: Any, model_id: str, now: Any) -> PoolCapacity:
    """`model_id` "": the newest benchmark of any model the pool was measured on."""
    rows = Evidence.objects.filter(kind=KIND, pool=pool)
    if model_id:
        rows = rows.filter(model_id=model_id)
    rows = rows.order_by("-observed_at", "-id")[:ROWS_PER_POOL]
    fingerprints: dict[str, dict[str, str]] = {}
    skipped = ""
    endpoints_now = len(pool.base_urls or [])
    for row in rows:
        if row.expires_at is not None and row.expires_at <= now:
            skipped = skipped or f"its newest benchmark expired at {row.expires_at:%Y-%m-%d}"
            continue
        measured_model = model_id or row.model_id
        if measured_model not in fingerprints:
            fingerprints[measured_model] = pool_fingerprint(pool, [measured_model])
        change = fingerprint_change(row.pool_fingerprint, fingerprints[measured_model])
        if change:
            skipped = skipped or f"its newest benchmark no longer counts: {change}"
            continue
        data = row.data if isinstance(row.data, dict) else {}
        streams, tokens = data.get("best_concurrency"), data.get("output_tokens_per_s")
        if data.get("timing") == "trace":
            skipped = skipped or (f"its newest benchmark (run {data.get('run')}) ran at trace "
                                  f"timing: capacity needs a concurrency sweep")
            continue
        if not streams or not tokens:
            skipped = skipped or (f"no level of its newest benchmark (run {data.get('run')}) "
                                  f"met the SLO")
            continue
        measured = data.get("endpoints") or endpoints_now or 1
        scale = (endpoints_now or measured) / measured
        return PoolCapacity(pool=pool.name, streams=float(streams) * scale,
                            tokens_per_s=float(tokens) * scale, run=data.get("run"),
                            evidence=row.pk, measured_on=str(data.get("measured_on") or
                                                             row.observed_at.date()),
                            endpoints_measured=measured, endpoints_now=endpoints_now)
    return PoolCapacity(pool=pool.name, why_none=skipped or (
        f"no benchmark of it for {model_id or 'any model'} yet: run one (Benchmarks → New "
        f"run)"))
