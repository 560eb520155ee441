"""Prometheus as a telemetry source: each pool's vLLM latency histograms, read from a
Prometheus that scrapes the pools, into windows of source "prometheus" (route "": pool-wide,
like the pool's own /metrics), source_name = the metric source's name.

A metric source is a telemetry source when its `telemetry_selector` is set: label matchers
selecting one pool's series, `$pool` standing for the pool's name (`pool="$pool"`). Every
scrape round of the ingester's scrape thread (fleetctl/telemetry/scrape.py, while it holds
the lease; it calls this reader as the provider "telemetry.prometheus_read", registered in
apps.py, because telemetry sits below prometheus) asks each such source one instant query
per histogram for every pool at once when the selector names the pool with one exact
matcher (`pool="$pool"`, any label name):

    sum by (le, instance, pool) (vllm:time_to_first_token_seconds_bucket{pool!=""})

and splits the answer by that label (series of pools not in the registry are ignored); so a
round is three queries a source, not three a pool (3,000 at 1,000 pools). Any other selector
(`job="vllm-$pool"`, a regex) is asked per pool, three queries each:

    sum by (le, instance) (vllm:time_to_first_token_seconds_bucket{job="vllm-h200-us"})

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
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from fleetctl.prometheus.query import _NoAnswer, fill, source_get
from fleetctl.telemetry.models import PROMETHEUS_CURSOR_PREFIX as PATH_PREFIX
from fleetctl.telemetry.models import prometheus_cursor_path as cursor_path
from fleetctl.telemetry.scrape import METRICS

log = logging.getLogger("fleetctl.prometheus.telemetry")

T = TypeVar("T")
SERIES, READ_AT = "series", "at"
MAX_WORKERS = 8


def bucket_query(family: str, selector: str, pool: str) -> str:
    """The instant query for one histogram of one pool ($pool filled in, escaped)."""
    return f"sum by (le, instance) ({family}_bucket{{{fill(selector, pool=pool)}}})"


POOL_MATCHER = re.compile(r'(?<![\w])([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"\$pool"')


def pool_label(selector: str) -> str | None:
    """The label that carries the pool's name when the selector's only `$pool` is one exact
    matcher (`pool="$pool"`): then every pool's series can be read with one query."""
    found = POOL_MATCHER.findall(selector)
    return found[0] if len(found) == 1 and selector.count("$pool") == 1 else None


def fleet_query(family: str, selector: str, label: str) -> str:
    """The instant query for one histogram of every pool (the `label="$pool"` matcher made
    `label!=""`), summed per pool and instance."""
    every = POOL_MATCHER.sub(lambda m: f'{m.group(1)}!=""', selector)
    return f"sum by (le, instance, {label}) ({family}_bucket{{{every}}})"


def _buckets(body: Any) -> dict[str, list[list[Any]]]:
    """instance -> [[le, cumulative], ...] from a /api/v1/query answer (ValueError when it is
    not the vector a bucket query answers)."""
    return _buckets_by(body, "").get("", {})


def _buckets_by(body: Any, label: str) -> dict[str, dict[str, list[list[Any]]]]:
    """The same, per value of `label` (all under "" when label is "")."""
    if not isinstance(body, dict) or body.get("status") != "success":
        why = body.get("error") if isinstance(body, dict) else "not a Prometheus answer"
        raise ValueError(f"Prometheus answered an error: {why}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"a {data.get('resultType') or 'missing'} result, not a vector")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for item in data.get("result") or []:
        labels = item.get("metric") or {}
        le = labels.get("le")
        if le is None:
            continue
        bound = "+Inf" if le in ("+Inf", "Inf", "inf") else float(le)
        group = str(labels.get(label, "")) if label else ""
        into = out.setdefault(group, {}).setdefault(str(labels.get("instance", "")), {})
        into[str(bound)] = into.get(str(bound), 0.0) + float(item["value"][1])
    return {group: {instance: [[("+Inf" if le == "+Inf" else float(le)), cum]
                               for le, cum in buckets.items()]
                    for instance, buckets in instances.items()}
            for group, instances in out.items()}


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

    def _closing(self, read: Callable[[], T]) -> T:
        """`read` on a pool thread, then that thread's database connection closed: the
        outbound check reads the registry (which gateways are ours), and the threads are new
        each round, so an open connection per thread and round piled up until PostgreSQL
        refused clients (the suite's demo test hit "too many clients")."""
        from django.db import connections

        try:
            return read()
        finally:
            connections.close_all()

    def _read_round(self, targets: list[tuple[Any, str]]
                    ) -> list[tuple[dict[str, Any] | None, str]]:
        """Every target's read, in the targets' order: one fleet read per source whose
        selector names the pool with one exact matcher, a read per pool otherwise."""
        pools_of: dict[str, list[str]] = {}
        sources: dict[str, Any] = {}
        for source, pool in targets:
            sources[source.name] = source
            pools_of.setdefault(source.name, []).append(pool)
        reads: list[Callable[[], dict[tuple[str, str], tuple[dict[str, Any] | None, str]]]] = []
        for name, source in sources.items():
            label = pool_label(source.telemetry_selector)
            if label is not None:
                reads.append(partial(self._keyed_fleet, source, pools_of[name], label))
            else:
                reads += [partial(self._keyed, source, pool) for pool in pools_of[name]]
        found: dict[tuple[str, str], tuple[dict[str, Any] | None, str]] = {}
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(reads)),
                                thread_name_prefix="prom-telemetry") as threads:
            for part in threads.map(lambda read: self._closing(read), reads):
                found.update(part)
        return [found[(source.name, pool)] for source, pool in targets]

    def _keyed(self, source: Any, pool: str
               ) -> dict[tuple[str, str], tuple[dict[str, Any] | None, str]]:
        return {(source.name, pool): self._read(source, pool)}

    def _keyed_fleet(self, source: Any, pools: list[str], label: str
                     ) -> dict[tuple[str, str], tuple[dict[str, Any] | None, str]]:
        return {(source.name, pool): got
                for pool, got in self._read_fleet(source, pools, label).items()}

    def _read_fleet(self, source: Any, pools: list[str], label: str
                    ) -> dict[str, tuple[dict[str, Any] | None, str]]:
        """Every pool's histograms with one query per histogram: pool -> (instance ->
        {ttft|tpot|duration: buckets}, or None and why)."""
        series: dict[str, dict[str, dict[str, Any]]] = {}
        for name, family in METRICS.items():
            query = fleet_query(family, source.telemetry_selector, label)
            try:
                body, _ = source_get(source, "/api/v1/query", {"query": query})
                found = _buckets_by(body, label)
            except (_NoAnswer, ValueError, KeyError, TypeError) as exc:
                why = f"{query}: {exc} (Prometheus {source.name})"
                return {pool: (None, why) for pool in pools}
            for pool, instances in found.items():
                for instance, buckets in instances.items():
                    series.setdefault(pool, {}).setdefault(instance, {})[name] = buckets
        return {pool: (series[pool], "") if pool in series else (None, self._none(source, pool))
                for pool in pools}

    @staticmethod
    def _none(source: Any, pool: str) -> str:
        return (f"no series: Prometheus {source.name} has no "
                f"{', '.join(f'{f}_bucket' for f in METRICS.values())} matching "
                f"{{{fill(source.telemetry_selector, pool=pool)}}}")

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
            return None, self._none(source, pool)
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
        results = self._read_round(targets)
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
