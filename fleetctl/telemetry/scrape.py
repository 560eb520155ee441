"""Scraping the pools' own /metrics into windows (source=pool, route="").

Every TELEMETRY_SCRAPE_INTERVAL_S the ingester's scrape thread GETs /metrics from every base
URL of every pool (a bounded thread pool: a server that does not answer costs one worker its
timeout, the others go on) and reads vLLM's histograms:

- vllm:time_to_first_token_seconds -> ttft
- vllm:time_per_output_token_seconds -> tpot (a gateway cannot see tokens: this is the only
  TPOT there is, and it is pool-wide: every route and model the pool serves)
- vllm:e2e_request_latency_seconds -> duration (its count is the window's `requests`)

and two more for live cost (fleetctl/telemetry/cost.py):

- vllm:generation_tokens_total (a counter) -> output_tokens, and the milliseconds since the
  previous scrape it covers -> metered_ms (per pool, once a round: the pool is paid for the
  whole interval, served tokens or not, so an idle pool still gets a window);
- vllm:num_requests_running (a gauge, read once a round) -> running_sum, running_samples
  (the pool's running requests summed over its endpoints, one sample per metered round in
  which every endpoint answered).

The same thread reads each pool's histograms from the Prometheus servers marked as telemetry
sources (fleetctl/prometheus/telemetry.py: windows of source "prometheus"), after each round.

Each is summed over its labels (models), and what was counted since the previous scrape
(the cumulative buckets are kept in the Cursor for that URL, `last_counters`) is spread into
log buckets (histogram.from_cumulative) and added to the window holding the scrape time. The
first scrape of a URL only records where the counters stand; a count lower than before
means the server restarted and its new counts are the delta. Windows and cursors move in one
transaction, as for the logs.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger("fleetctl.telemetry.scrape")

METRICS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:time_per_output_token_seconds",
    "duration": "vllm:e2e_request_latency_seconds",
}
TOKENS = "vllm:generation_tokens"  # the family; its sample is vllm:generation_tokens_total
RUNNING = "vllm:num_requests_running"
# Keys of parse_histograms' answer (and of Cursor.last_counters) beside the histograms.
OUTPUT_TOKENS = "output_tokens"
RUNNING_NOW = "running"
SCRAPED_AT = "at"
MAX_BODY = 8 * 1024 * 1024
MAX_WORKERS = 32


def metrics_url(base_url: str) -> str:
    """The server's /metrics for a pool base URL (`/v1` and any path dropped: vLLM serves
    /metrics at its root)."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


def parse_histograms(text: str) -> dict[str, Any]:
    """name (ttft, tpot, duration) -> [[le, cumulative], ...] summed over labels; le as a
    float, or "+Inf" (JSON has no infinity). Besides, when the server exports them:
    "output_tokens" (vllm:generation_tokens_total, cumulative) and "running"
    (vllm:num_requests_running now), each summed over labels."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {family: name for name, family in METRICS.items()}
    sums: dict[str, dict[float, float]] = {}
    scalars: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (TOKENS, RUNNING):
            key = OUTPUT_TOKENS if family.name == TOKENS else RUNNING_NOW
            scalars[key] = sum(float(sample.value) for sample in family.samples
                               if sample.name in (f"{TOKENS}_total", RUNNING))
            continue
        name = wanted.get(family.name)
        if name is None:
            continue
        into = sums.setdefault(name, {})
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                continue
            le = float(sample.labels["le"])
            into[le] = into.get(le, 0.0) + float(sample.value)
    histograms: dict[str, Any] = {
        name: [["+Inf" if le == math.inf else le, cum] for le, cum in sorted(buckets.items())]
        for name, buckets in sums.items()}
    return {**histograms, **scalars}


class Scraper:
    def __init__(self, *, interval_s: float | None = None, timeout_s: float = 3.0,
                 max_workers: int = MAX_WORKERS) -> None:
        from django.conf import settings

        self.interval_s = float(interval_s if interval_s is not None
                                else settings.TELEMETRY_SCRAPE_INTERVAL_S)
        self.window_s = int(settings.TELEMETRY_WINDOW_S)
        self.timeout_s = timeout_s
        self.max_workers = max_workers

    def targets(self) -> list[tuple[str, str]]:
        from fleetctl.fleet.models import Pool

        out = []
        for name, base_urls in Pool.objects.values_list("name", "base_urls"):
            for url in base_urls or ():
                out.append((name, metrics_url(url)))
        return sorted(set(out))

    def _fetch(self, url: str) -> tuple[dict[str, Any] | None, str]:
        from fleetctl.core.http import OutboundError, http_get

        try:
            response = http_get(url, timeout_s=self.timeout_s, max_body=MAX_BODY)
        except OutboundError as exc:
            return None, str(exc)
        if response.status_code != 200:
            return None, f"GET {url}: HTTP {response.status_code}"
        try:
            return parse_histograms(response.text), ""
        except ValueError as exc:
            return None, f"GET {url}: not Prometheus text: {exc}"

    def scrape_all(self, now: datetime | None = None) -> int:
        """One round over every pool; returns how many endpoints answered."""
        from django.db import transaction

        from fleetctl.telemetry import histogram
        from fleetctl.telemetry.models import Cursor, Window
        from fleetctl.telemetry.services import WindowDelta, window_start, windows_add

        targets = self.targets()
        if not targets:
            return 0
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(targets)),
                                thread_name_prefix="scrape") as pool:
            results = list(pool.map(lambda target: self._fetch(target[1]), targets))
        now = now or datetime.now(tz=UTC)
        start = window_start(now.timestamp(), self.window_s)
        answered = 0
        endpoints: dict[str, int] = {}
        for pool_name, _ in targets:
            endpoints[pool_name] = endpoints.get(pool_name, 0) + 1
        with transaction.atomic():
            cursors = {(c.source_name, c.path): c for c in Cursor.objects.select_for_update()
                       .filter(path__in={url for _, url in targets})}
            deltas = []
            meters: dict[str, _Meter] = {}
            for (pool_name, url), (counters, error) in zip(targets, results, strict=True):
                cursor = cursors.get((pool_name, url)) or Cursor(source_name=pool_name,
                                                                 path=url)
                cursor.last_read_at = now
                cursor.updated_at = now
                cursor.last_error = error
                meter = meters.setdefault(pool_name, _Meter())
                if counters is not None:
                    answered += 1
                    cursor.lines += 1
                    meter.add(counters, cursor.last_counters or {}, now)
                    if cursor.last_counters:
                        histograms = {name: histogram.from_cumulative(
                            [tuple(b) for b in buckets],  # type: ignore[misc]
                            [tuple(b) for b in cursor.last_counters.get(name, [])])
                            for name, buckets in counters.items() if name in METRICS}
                        requests = histogram.count(histograms.get("duration", {}))
                        if any(histograms.values()):
                            deltas.append(WindowDelta(
                                Window.Source.POOL, pool_name, "", pool_name, self.window_s,
                                start, counts={"requests": requests},
                                histograms=histograms))
                    cursor.last_counters = {**counters, SCRAPED_AT: now.timestamp()}
                cursor.save()
            for pool_name, meter in meters.items():
                counts = meter.counts(endpoints[pool_name])
                if counts:
                    deltas.append(WindowDelta(Window.Source.POOL, pool_name, "", pool_name,
                                              self.window_s, start, counts=counts))
            windows_add(deltas, now=now)
        return answered

    def read_prometheus(self, now: datetime | None = None) -> int:
        """The same round for the metric sources marked as telemetry sources: each pool's
        histograms as those Prometheus servers have them (fleetctl/prometheus/telemetry.py,
        the provider "telemetry.prometheus_read"; 0 when the app is not installed)."""
        from fleetctl.core.panels import provided

        return int(provided("telemetry.prometheus_read", now) or 0)

    def run(self, stop: threading.Event, *, only_while: threading.Event | None = None) -> None:
        """Scrape every interval until `stop` is set; with `only_while`, only while that is
        set too (the ingester's lease)."""
        from django.db import close_old_connections

        while not stop.is_set():
            if only_while is not None and not only_while.is_set():
                stop.wait(0.5)
                continue
            began = time.monotonic()
            try:
                self.scrape_all()
            except Exception:
                log.exception("scrape round failed; trying again next round")
            try:
                self.read_prometheus()
            except Exception:
                log.exception("reading the Prometheus telemetry sources failed; trying "
                              "again next round")
            finally:
                close_old_connections()
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))


class _Meter:
    """One pool's share of a scrape round for live cost: the output tokens its endpoints
    counted since their previous scrape (a counter lower than before: the server restarted,
    its new count is the delta, as for the histograms), the time that covers, and the
    running requests now."""

    def __init__(self) -> None:
        self.tokens = 0.0
        self.covered_s: float | None = None
        self.running = 0.0
        self.running_seen = 0

    def add(self, counters: dict[str, Any], last: dict[str, Any], now: datetime) -> None:
        if RUNNING_NOW in counters:
            self.running += float(counters[RUNNING_NOW])
            self.running_seen += 1
        tokens, before, at = counters.get(OUTPUT_TOKENS), last.get(OUTPUT_TOKENS), \
            last.get(SCRAPED_AT)
        if tokens is None or before is None or at is None:
            return  # no counter, or the first look at it (or at this cursor) since it came
        tokens = float(tokens)
        self.tokens += tokens - float(before) if tokens >= float(before) else tokens
        # Endpoints are scraped together: the pool's interval is the shortest since one of
        # them was last read (one that missed a round brings its tokens late, but the time
        # they were served in was metered then, through the others).
        since = now.timestamp() - float(at)
        self.covered_s = since if self.covered_s is None else min(self.covered_s, since)

    def counts(self, endpoints: int) -> dict[str, int]:
        # The first look only records where the counters stand (no window, as for the
        # histograms); the gauge is sampled in the rounds that are metered.
        counts: dict[str, int] = {}
        if self.covered_s is None:
            return counts
        counts.update({"output_tokens": round(self.tokens),
                       "metered_ms": max(1, round(self.covered_s * 1000))})
        if self.running_seen == endpoints:
            counts.update({"running_sum": round(self.running), "running_samples": 1})
        return counts
