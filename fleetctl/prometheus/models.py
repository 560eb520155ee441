"""A metric source: where query checks read (a Prometheus, or an HTTP endpoint answering JSON).
Registered by an administrator; its URL passes the outbound rules for purpose `metrics`
(fleetctl/core/destinations.py) when it is saved and again before every query."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone


class MetricSource(models.Model):
    class Kind(models.TextChoices):
        PROMETHEUS = "prometheus", "Prometheus (HTTP API: /api/v1/query, /api/v1/rules)"
        HTTP_JSON = "http-json", "HTTP JSON (GET a path, read one field)"

    name = models.SlugField(max_length=63, unique=True)
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.PROMETHEUS)
    base_url = models.CharField(max_length=500)
    # Sent as `Authorization: Bearer …`; never returned by the API nor written to the audit
    # log (only whether one is set).
    bearer_token = models.CharField(max_length=500, blank=True)
    timeout_s = models.FloatField(default=5.0, validators=[MinValueValidator(0.1),
                                                           MaxValueValidator(60)])
    # Set: this Prometheus is also a telemetry source. PromQL label matchers that select one
    # pool's vLLM series, `$pool` standing for the pool's name (e.g. `pool="$pool"`); the
    # ingester reads each pool's latency histograms through it into windows of source
    # "prometheus" (fleetctl/prometheus/telemetry.py). Empty: query checks only.
    telemetry_selector = models.CharField(max_length=300, blank=True)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)
    # The newest query asked of it (a gate check's, a ramp guard's or a person's test): its
    # outcome (pass/warn/fail/insufficient, or "answered" for an unjudged test) and reason.
    last_status = models.CharField(max_length=12, blank=True)
    last_reason = models.TextField(blank=True)
    last_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"metric source {self.name}"
