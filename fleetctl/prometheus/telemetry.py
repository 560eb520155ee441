"""Prometheus as a telemetry source: each pool's vLLM latency histograms, read from a
Prometheus that scrapes the pools, into windows of source "prometheus" (route "": pool-wide,
like the pool's own /metrics), source_name = the metric source's name.

A metric source is a telemetry source when its `telemetry_selector` is set: label matchers
selecting one pool's series, `$pool` standing for the pool's name (`pool="$pool"`). Every
scrape round of the ingester's scrape thread (fleetctl/telemetry/scrape.py, while it holds
the lease; it calls this reader as the provider "telemetry.prometheus_read", registered in
apps.py, because telemetry sits below prometheus) asks each such source, for each pool, one
instant query per histogram:

    sum by (le, instance) (vllm:time_to_first_token_seconds_bucket{pool="h200-us"})

- vllm:time_to_first_token_seconds -> ttft
- vllm:time_per_output_token_seconds -> tpot
- vllm:e2e_request_latency_seconds -> duration (its count is the window's `requests`)

The cumulative buckets per instance are kept in a Cursor (source_name = the metric source,
path "prometheus:<pool>", `last_counters`); what each instance counted since the previous
round is spread into log buckets (histogram.from_cumulative, which also takes a counter that
went down as a restart of that instance) and added to the window holding the read time, in
the same transaction as the cursor. The first read only records where the counters stand.

Outbound calls go through the metric source's client (query.source_get: the outbound rules
for purpose `metrics`, its token, its timeout). A source that does not answer writes no
window (never zeros) and its error is the cursor's `last_error`, shown by the telemetry
API's ingest status and beside the pool's figures. A pool with no series in that Prometheus
says so the same way.

The pages and the API show these windows beside the gateways' (telemetry.selectors
PoolStats.reported), labelled "from Prometheus <name>". The ramp guard and the standing
watch judge the gateways' windows (and the pool's own TPOT) only: a Prometheus's figures
cover every route of the pool and the same requests the gateways logged, so adding them
would count requests twice.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from fleetctl.prometheus.query import _NoAnswer, fill, source_get
from fleetctl.telemetry.models import PROMETHEUS_CURSOR_PREFIX as PATH_PREFIX
from fleetctl.telemetry.models import prometheus_cursor_path as cursor_path
from fleetctl.telemetry.scrape import METRICS

log = logging.getLogger("fleetctl.prometheus.telemetry")

SERIES, READ_AT = "series", "at"
MAX_WORKERS = 8


def bucket_query(family: str, selector: str, pool: str) -> str:
    """The instant query for one histogram of one pool ($pool filled in, escaped)."""
    return f"sum by (le, instance) ({family}_bucket{{{fill(selector, pool=pool)}}})"


def _buckets(body: Any) -> dict[str, list[list[Any]]]:
    """instance -> [[le, cumulative], ...] from a /api/v1/query answer (ValueError when it is
    not the vector a bucket query answers)."""
    if not isinstance(body, dict) or body.get("status") != "success":
        why = body.get("error") if isinstance(body, dict) else "not a Prometheus answer"
        raise ValueError(f"Prometheus answered an error: {why}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"a {data.get('resultType') or 'missing'} result, not a vector")
    out: dict[str, dict[str, float]] = {}
    for item in data.get("result") or []:
        labels = item.get("metric") or {}
        le = labels.get("le")
        if le is None:
            continue
        bound = "+Inf" if le in ("+Inf", "Inf", "inf") else float(le)
        into = out.setdefault(str(labels.get("instance", "")), {})
        into[str(bound)] = into.get(str(bound), 0.0) + float(item["value"][1])
    return {instance: [[("+Inf" if le == "+Inf" else float(le)), cum]
                       for le, cum in buckets.items()]
            for instance, buckets in out.items()}


def read_all(now: datetime | None = None) -> int:
    """One round (the provider scrape.py calls)."""
    return PrometheusReader().read_all(now)


def forget(source_name: str) -> None:
    """A source no longer a telemetry source (deleted, or its selector cleared): its
    cursors go, so the pages stop showing its last state (its windows stay until they
    expire: they are what it measured)."""
    from fleetctl.telemetry.models import Cursor

    Cursor.objects.filter(source_name=source_name, path__startswith=PATH_PREFIX).delete()


class PrometheusReader:
    """Reads every telemetry source's per-pool histograms into windows (one round: read_all)."""

    def __init__(self, *, max_workers: int = MAX_WORKERS) -> None:
        from django.conf import settings

        self.window_s = int(settings.TELEMETRY_WINDOW_S)
        self.max_workers = max_workers

    def targets(self) -> list[tuple[Any, str]]:
        from fleetctl.fleet.models import Pool
        from fleetctl.prometheus.models import MetricSource

        sources = list(MetricSource.objects.filter(kind=MetricSource.Kind.PROMETHEUS)
                       .exclude(telemetry_selector="").order_by("name"))
        if not sources:
            return []
        pools = list(Pool.objects.order_by("name").values_list("name", flat=True))
        return [(source, pool) for source in sources for pool in pools]

    def _read_closing(self, source: Any, pool: str) -> tuple[dict[str, Any] | None, str]:
        """_read on a pool thread, then that thread's database connection closed: the
        outbound check reads the registry (which gateways are ours), and the threads are new
        each round, so an open connection per thread and round piled up until PostgreSQL
        refused clients (the suite's demo test hit "too many clients")."""
        from django.db import connections

        try:
            return self._read(source, pool)
        finally:
            connections.close_all()

    def _read(self, source: Any, pool: str) -> tuple[dict[str, Any] | None, str]:
        """instance -> {ttft|tpot|duration: buckets} now, or None and why."""
        series: dict[str, dict[str, Any]] = {}
        for name, family in METRICS.items():
            query = bucket_query(family, source.telemetry_selector, pool)
            try:
                body, _ = source_get(source, "/api/v1/query", {"query": query})
                found = _buckets(body)
            except (_NoAnswer, ValueError, KeyError, TypeError) as exc:
                return None, f"{query}: {exc} (Prometheus {source.name})"
            for instance, buckets in found.items():
                series.setdefault(instance, {})[name] = buckets
        if not series:
            return None, (f"no series: Prometheus {source.name} has no "
                          f"{', '.join(f'{f}_bucket' for f in METRICS.values())} matching "
                          f"{{{source.telemetry_selector.replace('$pool', pool)}}}")
        return series, ""

    def read_all(self, now: datetime | None = None) -> int:
        """One round over every telemetry source and pool; returns how many answered."""
        from django.db import transaction

        from fleetctl.telemetry import histogram
        from fleetctl.telemetry.models import Cursor, Window
        from fleetctl.telemetry.services import WindowDelta, window_start, windows_add

        targets = self.targets()
        if not targets:
            return 0
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(targets)),
                                thread_name_prefix="prom-telemetry") as pool_:
            results = list(pool_.map(lambda t: self._read_closing(*t), targets))
        now = now or datetime.now(tz=UTC)
        start = window_start(now.timestamp(), self.window_s)
        answered = 0
        with transaction.atomic():
            cursors = {(c.source_name, c.path): c for c in Cursor.objects.select_for_update()
                       .filter(source_name__in={s.name for s, _ in targets},
                               path__startswith=PATH_PREFIX)}
            deltas = []
            for (source, pool), (series, error) in zip(targets, results, strict=True):
                path = cursor_path(pool)
                cursor = cursors.get((source.name, path)) or Cursor(source_name=source.name,
                                                                    path=path)
                cursor.last_read_at = cursor.updated_at = now
                cursor.last_error = error
                if series is not None:
                    answered += 1
                    cursor.lines += 1
                    before = (cursor.last_counters or {}).get(SERIES)
                    if before is not None:
                        histograms: dict[str, dict[str, int]] = {}
                        for instance, counters in series.items():
                            previous = before.get(instance)
                            if previous is None:
                                continue  # a new instance: its first read is the baseline
                            for name, buckets in counters.items():
                                h = histogram.from_cumulative(
                                    [tuple(b) for b in buckets],  # type: ignore[misc]
                                    [tuple(b) for b in previous.get(name, [])])
                                histograms[name] = histogram.merge(histograms.get(name, {}), h)
                        if any(histograms.values()):
                            deltas.append(WindowDelta(
                                Window.Source.PROMETHEUS, source.name, "", pool, self.window_s,
                                start, counts={"requests": histogram.count(
                                    histograms.get("duration", {}))},
                                histograms=histograms))
                    cursor.last_counters = {SERIES: series, READ_AT: now.timestamp()}
                cursor.save()
            windows_add(deltas, now=now)
        return answered
