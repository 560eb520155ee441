"""Telemetry rows: windows of what the gateways saw per (route, pool), and of what each pool
reports about itself, plus where the ingester stands in every log it follows.

A window is additive: counts and histograms (fleetctl.telemetry.histogram: fixed log
buckets, `{bucket index: count}`) of two windows of the same key merge by adding, so the
ingester flushes partial windows every second (adding to the row), a restart resumes from
its cursor without counting a line twice (cursor and windows move in one transaction), and
the downsampler merges 10 s windows into 1 min and 10 min ones exactly.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

# A Prometheus telemetry source's cursor for one pool (fleetctl/prometheus/telemetry.py):
# Cursor(source_name=<metric source>, path="prometheus:<pool>").
PROMETHEUS_CURSOR_PREFIX = "prometheus:"


def prometheus_cursor_path(pool: str) -> str:
    return f"{PROMETHEUS_CURSOR_PREFIX}{pool}"


class Window(models.Model):
    """What one source saw of one pool (on one route) during [start, start + resolution_s)."""

    class Source(models.TextChoices):
        GATEWAY = "gateway", "gateway access log"
        POOL = "pool", "pool /metrics"
        # A metric source marked as a telemetry source (prometheus.MetricSource
        # .telemetry_selector): the pool's vLLM histograms as that Prometheus has them,
        # pool-wide like POOL (route ""). Shown beside the gateways' figures, labelled by
        # source; never judged by the ramp guard (fleetctl/prometheus/telemetry.py).
        PROMETHEUS = "prometheus", "Prometheus"

    # Which kind of source, and which one: a gateway's name, the pool's own /metrics (the
    # pool's name), or the metric source's name (PROMETHEUS).
    source = models.CharField(max_length=12, choices=Source.choices)
    source_name = models.CharField(max_length=63)
    # The route's name (the gateway's route key); "" for a pool's own figures, which cover
    # all of its traffic.
    route = models.CharField(max_length=63, blank=True)
    pool = models.CharField(max_length=63)
    resolution_s = models.PositiveIntegerField()  # 10, 60 or 600
    start = models.DateTimeField()
    # The requests the pool is judged on: every request logged but the client disconnects.
    requests = models.BigIntegerField(default=0)
    # Of those, answers of 5xx, requests that got no answer (reset, timeout: status 0) and
    # answers the pool broke off (LogRecord.ended_by "pool").
    errors = models.BigIntegerField(default=0)
    client_errors = models.BigIntegerField(default=0)  # 4xx
    # Requests the client abandoned (LogRecord.ended_by "client": Envoy's DC, HAProxy's C*
    # and c* termination states, nginx's 499), counted apart and in none of the other counts
    # or latency histograms (but the TTFT of one that got its first byte: ingest.py).
    client_disconnects = models.BigIntegerField(default=0)
    # Upstream attempts beyond the first (Envoy's retries before the first byte).
    retries = models.BigIntegerField(default=0)
    # A context tier's per-request fallback (docs/envoy.md): requests this pool answered
    # that the split had sent to another pool of the tier, which failed before any byte
    # reached it (`fallbacks`); and requests the split sent to this pool that another one
    # answered so (`fell_over`: a connect to this pool failed).
    fallbacks = models.BigIntegerField(default=0)
    fell_over = models.BigIntegerField(default=0)
    # Answers streamed (text/event-stream): the ones whose first body byte is a TTFT (client
    # disconnects apart, though one that had its first byte adds its TTFT: ingest.py).
    streamed = models.BigIntegerField(default=0)
    bytes_out = models.BigIntegerField(default=0)
    # Histograms, in milliseconds (histogram.py). ttft: time to the first body byte of a
    # streamed answer (gateway) or vllm:time_to_first_token_seconds (pool); duration: the
    # whole request (gateway) or vllm:e2e_request_latency_seconds (pool); tpot: the pool's
    # vllm:time_per_output_token_seconds (a gateway cannot see tokens).
    ttft = models.JSONField(default=dict)
    duration = models.JSONField(default=dict)
    tpot = models.JSONField(default=dict)
    # Live cost (pool windows only; scrape.py): output tokens the pool counted
    # (vllm:generation_tokens_total) in the `metered_ms` milliseconds its counter covered, and
    # its running requests (vllm:num_requests_running, every endpoint summed) sampled once a
    # scrape round: `running_sum` over `running_samples` rounds. A gateway cannot see tokens
    # (Envoy does not parse a streamed body), so these stay 0 on gateway windows.
    output_tokens = models.BigIntegerField(default=0)
    metered_ms = models.BigIntegerField(default=0)
    running_sum = models.BigIntegerField(default=0)
    running_samples = models.BigIntegerField(default=0)
    # Envoy response flags (UF, UO, URX, ...) and status classes -> count.
    flags = models.JSONField(default=dict)
    # Requests per context tier whose gateway entry routed them ("0", "1", ... or "unknown":
    # the prompt could not be sized) -> count; a route without tiers leaves it empty.
    tiers = models.JSONField(default=dict)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-start"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "source_name", "route", "pool", "resolution_s", "start"],
                name="one_window_per_key"),
        ]
        indexes = [
            models.Index(fields=["pool", "resolution_s", "start"]),
            models.Index(fields=["route", "resolution_s", "start"]),
            models.Index(fields=["resolution_s", "start"]),
        ]

    def __str__(self) -> str:
        return (f"{self.source}:{self.source_name} {self.route or '*'}/{self.pool} "
                f"{self.resolution_s}s@{self.start:%H:%M:%S}")


class Cursor(models.Model):
    """How far the ingester has read one log file (or scraped one pool): moved in the same
    transaction as the windows it fed, so a restart neither loses nor double-counts lines."""

    source_name = models.CharField(max_length=63)  # the gateway (or pool) it belongs to
    path = models.CharField(max_length=500)  # the file followed, or the /metrics URL
    inode = models.BigIntegerField(null=True, blank=True)
    offset = models.BigIntegerField(default=0)
    lines = models.BigIntegerField(default=0)
    malformed = models.BigIntegerField(default=0)
    rotations = models.PositiveIntegerField(default=0)
    truncations = models.PositiveIntegerField(default=0)
    # The pool's last cumulative histogram buckets (a scrape's delta is against these).
    last_counters = models.JSONField(default=dict, blank=True)
    last_error = models.TextField(blank=True)
    last_read_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["source_name", "path"]
        constraints = [
            models.UniqueConstraint(fields=["source_name", "path"], name="one_cursor_per_file"),
        ]

    def __str__(self) -> str:
        return f"{self.source_name}:{self.path}@{self.offset}"
