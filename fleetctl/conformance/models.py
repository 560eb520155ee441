"""Conformance probe records: one row per run, one row per case per endpoint probed. Rows,
not logs: the run page, the API, the CLI and the plan's stage-1 evidence all read these."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from fleetctl.fleet.models import Pool, model_id_validator
from fleetctl.traffic.models import Route
from migrations_plan.jobs import PlanJob
from migrations_plan.models import Plan


class ConformanceRun(PlanJob):
    """One probe of a pool (every endpoint of it) against the OpenAI contract, side by side
    with a reference pool (the plan's primary, or one named) on one of its endpoints. Its
    status is the job words (fleetctl/core/jobs.py): `complete` once every case is judged
    and the verdict recorded as evidence."""

    class Verdict(models.TextChoices):
        PASS = "pass", "pass"
        WARN = "warn", "warn (only optional cases fail)"
        FAIL = "fail", "fail (a required case fails)"

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="conformance_runs")
    primary = models.ForeignKey(Pool, on_delete=models.SET_NULL, null=True, blank=True,
                                related_name="+", help_text="The reference pool, if any.")
    model_id = models.CharField(max_length=200, validators=[model_id_validator])
    include_saturation = models.BooleanField(
        default=False, help_text="Run the opt-in case that floods the pool to see a 429.")
    required_keys = models.JSONField(
        default=list, blank=True,
        help_text="Case keys this run requires beyond the default required set.")
    verdict = models.CharField(max_length=4, choices=Verdict.choices, blank=True)
    summary = models.CharField(max_length=600, blank=True)
    counts = models.JSONField(default=dict, blank=True)
    evidence_id = models.PositiveIntegerField(null=True, blank=True)

    class Meta(PlanJob.Meta):
        indexes = [models.Index(fields=["pool", "-created_at"])]

    def __str__(self) -> str:
        return f"conformance run {self.pk}"


class ConformanceCase(models.Model):
    """One case on one endpoint of one pool: what was expected, what came back."""

    class Role(models.TextChoices):
        POOL = "pool", "pool under test"
        PRIMARY = "primary", "reference"

    class Status(models.TextChoices):
        PASS = "pass", "pass"
        FAIL = "fail", "fail"
        SKIP = "skip", "skipped"
        ERROR = "error", "error (no answer to judge)"

    run = models.ForeignKey(ConformanceRun, on_delete=models.CASCADE, related_name="cases")
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="+")
    role = models.CharField(max_length=8, choices=Role.choices)
    endpoint = models.CharField(max_length=300)
    key = models.CharField(max_length=60)
    title = models.CharField(max_length=200)
    required = models.BooleanField(default=False)
    position = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=5, choices=Status.choices)
    expected = models.CharField(max_length=500, blank=True)
    got = models.CharField(max_length=1000, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    request_excerpt = models.TextField(blank=True)
    response_excerpt = models.TextField(blank=True)
    numbers = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "position", "role", "endpoint"]
        constraints = [models.UniqueConstraint(fields=["run", "key", "pool", "endpoint"],
                                               name="one_case_row_per_endpoint")]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.key}@{self.endpoint}: {self.status}"


class RoutingProbe(PlanJob):
    """One probe of a route's routing policy through its gateways (routing.py): a few
    requests sized to each context tier's bounds, each judged by the pool that answered (the
    gateway's pool header) against the tier's eligible pools and the route's jurisdiction.
    With a plan, a finished probe records `routing-policy` evidence about its candidate."""

    class Verdict(models.TextChoices):
        PASS = "pass", "pass (no violation)"
        WARN = "warn", "warn (no violation; some requests could not be judged)"
        FAIL = "fail", "fail (a request broke the policy)"

    plan = models.ForeignKey(Plan, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="routing_probes")
    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="routing_probes")
    gateways = models.JSONField(default=list, blank=True,
                                help_text="The gateways probed: [{name, listen_url}].")
    verdict = models.CharField(max_length=4, choices=Verdict.choices, blank=True)
    summary = models.CharField(max_length=600, blank=True)
    results = models.JSONField(default=list, blank=True,
                               help_text="One entry per request sent: what was expected, "
                                         "what answered, and the violation if any.")
    evidence_id = models.PositiveIntegerField(null=True, blank=True)

    class Meta(PlanJob.Meta):
        indexes = [models.Index(fields=["route", "-created_at"])]

    def __str__(self) -> str:
        return f"routing probe {self.pk}"
