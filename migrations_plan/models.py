"""Staged migration plans: a candidate pool joining routes against a primary, moving through
abstraction → shadow → batch → live, one gate at a time.

Rows are the record: every check of every gate, every attestation, approval and stage move is
a row, and approvals keep the exact evidence snapshot they saw (and its hash), so "who
approved what, on which evidence" is answered from the database alone.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from fleetctl.core.links import validate_link_url
from fleetctl.fleet.models import Pool, slug_validator
from fleetctl.traffic.models import Route

STAGE_NAMES = {1: "abstraction", 2: "shadow", 3: "batch", 4: "live"}


class CostUnit(models.TextChoices):
    """The unit stage 3's measured cost arbitrage compares in (Plan.cost_unit)."""

    PER_1M_OUTPUT_TOKENS = "per_1m_output_tokens", "per 1M output tokens"
    PER_SUCCESSFUL_TASK = "per_successful_task", "per successful task"


class Plan(models.Model):
    class State(models.TextChoices):
        STAGE_1 = "stage-1", "1 · abstraction"
        STAGE_2 = "stage-2", "2 · shadow"
        STAGE_3 = "stage-3", "3 · batch"
        STAGE_4 = "stage-4", "4 · live"
        PAUSED = "paused", "paused"
        ABANDONED = "abandoned", "abandoned"
        COMPLETED = "completed", "completed"

    CLOSED_STATES = (State.ABANDONED, State.COMPLETED)

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    candidate_pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="plans")
    primary_pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="+")
    routes = models.ManyToManyField(Route, related_name="plans")
    # SLO the candidate must hold (per pool, never the aggregate) and the margins it is
    # judged with against the primary.
    slo_ttft_p95_ms = models.FloatField(
        validators=[MinValueValidator(1), MaxValueValidator(600_000)],
        help_text="Time to first token, p95, milliseconds.")
    slo_tpot_p95_ms = models.FloatField(
        validators=[MinValueValidator(0.1), MaxValueValidator(10_000)],
        help_text="Time per output token, p95, milliseconds.")
    slo_error_rate = models.FloatField(
        validators=[MinValueValidator(0), MaxValueValidator(0.5)],
        help_text="Errors and timeouts / requests, 0–0.5 (0.01 = 1 %).")
    slo_e2e_p95_ms = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Whole-answer latency p95 per pool (ms), streamed or not; the guard judges "
                  "it when set (routes whose callers do not stream have no TTFT).")
    latency_margin_pct = models.FloatField(
        default=10, validators=[MinValueValidator(0), MaxValueValidator(500)],
        help_text="How much slower than the primary the candidate may be, %.")
    cost_margin_pct = models.FloatField(
        default=0, validators=[MinValueValidator(-100), MaxValueValidator(500)],
        help_text="Cost per 1M output tokens may exceed the primary's by this much, %.")
    # The unit stage 3's cost arbitrage is judged in (fleetctl/batch/cost.py): per 1M output
    # tokens (the benchmark's unit), or per successful task (a soak's spend ÷ the custom_ids
    # that succeeded, so failures and retries count against the candidate).
    cost_unit = models.CharField(
        max_length=24, choices=CostUnit.choices, default=CostUnit.PER_1M_OUTPUT_TOKENS,
        help_text="Stage 3's cost arbitrage is judged per 1M output tokens or per successful "
                  "task (retries and failures counted).")
    quality_margin_pct = models.FloatField(
        default=2, validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="Divergence or eval score the candidate may lose beyond the noise floor, "
                  "percentage points.")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="owned_plans")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                   related_name="authored_plans", editable=False)
    target_date = models.DateField(null=True, blank=True)
    required_approvals = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(5)],
        help_text="Platform leads who must approve each gate (not the author or owner).")
    notes = models.TextField(blank=True)
    # Stage 3's cost arbitrage: what running the candidate is predicted to cost per 1M output
    # tokens (recorded when the plan enters stage 3: given, or the candidate's benchmark cost
    # then), against which the soak's measured cost is checked. Never compared across
    # currencies without a stated conversion (fleet CurrencyRate).
    predicted_cost_per_1m = models.DecimalField(
        max_digits=14, decimal_places=4, null=True, blank=True,
        validators=[MinValueValidator(0)],
        help_text="Predicted cost per 1M output tokens on the candidate (stage 3 checks it).")
    predicted_cost_currency = models.CharField(max_length=3, blank=True)
    predicted_cost_source = models.CharField(max_length=200, blank=True)
    predicted_cost_at = models.DateTimeField(null=True, blank=True)

    state = models.CharField(max_length=10, choices=State.choices, default=State.STAGE_1,
                             editable=False)
    # The stage the plan is at, kept while paused so a resume knows where to go back to.
    stage = models.PositiveSmallIntegerField(default=1, editable=False)
    stage_entered_at = models.DateTimeField(default=timezone.now, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    closed_at = models.DateTimeField(null=True, blank=True, editable=False)
    # At risk: a gate the plan already passed lost what it was approved on (a check that
    # passed then fails now, or its evidence expired). Set and cleared by the beat's refresh.
    at_risk_since = models.DateTimeField(null=True, blank=True, editable=False)
    risk = models.JSONField(default=list, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(stage__gte=1, stage__lte=4),
                                   name="plan_stage_1_to_4"),
            models.CheckConstraint(
                condition=~models.Q(candidate_pool=models.F("primary_pool")),
                name="plan_candidate_is_not_primary"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_open(self) -> bool:
        return self.state not in self.CLOSED_STATES

    @property
    def stage_name(self) -> str:
        return STAGE_NAMES[self.stage]

    @property
    def in_stage(self) -> bool:
        """At a stage (not paused or closed): its gate can be approved and advanced."""
        return self.state.startswith("stage-")


class GateCheck(models.Model):
    """One item of one stage's gate. Removed checks stay (with who and why) for the record."""

    class Kind(models.TextChoices):
        EVIDENCE = "evidence", "evidence-backed"
        ATTESTED = "attested", "attested"

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="checks")
    stage = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(4)])
    key = models.SlugField(max_length=63)
    title = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    rule = models.CharField(max_length=63, blank=True,
                            help_text="Registered rule name (evidence-backed checks).")
    params = models.JSONField(default=dict, blank=True)
    attest_role = models.CharField(max_length=20, blank=True,
                                   help_text="Role whose holder may attest (attested checks).")
    position = models.PositiveSmallIntegerField(default=0)
    added_by = models.CharField(max_length=150)
    added_at = models.DateTimeField(default=timezone.now)
    removed_at = models.DateTimeField(null=True, blank=True)
    removed_by = models.CharField(max_length=150, blank=True)
    removed_reason = models.TextField(blank=True)
    # The last evaluated status, so the refresh task can put changes on the timeline.
    last_status = models.CharField(max_length=20, blank=True)
    last_status_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["plan", "stage", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["plan", "stage", "key"],
                                    condition=models.Q(removed_at__isnull=True),
                                    name="one_live_check_per_key"),
        ]

    def __str__(self) -> str:
        return f"{self.plan.name} stage {self.stage}: {self.title}"


class CheckStatusChange(models.Model):
    """One change of one check's status (and its first status), as the refresh saw it: the
    check's history, green and red over the days. Written by `plan_refresh`; append-only."""

    check_item = models.ForeignKey(GateCheck, on_delete=models.CASCADE,
                                   related_name="history")
    status = models.CharField(max_length=20)
    at = models.DateTimeField(default=timezone.now)
    summary = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["check_item", "-at"])]

    def __str__(self) -> str:
        return f"check {self.check_item_id} {self.status} at {self.at:%Y-%m-%d %H:%M}"


class Attestation(models.Model):
    """A named person with the check's role confirms an attested check, with a note."""

    check_item = models.ForeignKey(GateCheck, on_delete=models.CASCADE,
                                   related_name="attestations")
    by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    role = models.CharField(max_length=20)
    note = models.TextField()
    at = models.DateTimeField(default=timezone.now)
    withdrawn_at = models.DateTimeField(null=True, blank=True)
    withdrawn_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"attestation of {self.check_item_id} by {self.by_id}"


class Approval(models.Model):
    """A platform lead's sign-off of one stage's gate, bound to the evidence it saw."""

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="approvals")
    stage = models.PositiveSmallIntegerField()
    by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    at = models.DateTimeField(default=timezone.now)
    gate_status = models.CharField(max_length=20)
    justification = models.TextField(blank=True)
    snapshot = models.JSONField()
    snapshot_hash = models.CharField(max_length=64)
    voided_at = models.DateTimeField(null=True, blank=True)
    void_reason = models.TextField(blank=True)
    # Set when the stage move this approval allowed happened.
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["plan", "stage"])]

    def __str__(self) -> str:
        return f"approval of {self.plan_id} stage {self.stage} by {self.by_id}"

    @property
    def is_active(self) -> bool:
        return self.voided_at is None and self.used_at is None

    @property
    def gate_status_label(self) -> str:
        from migrations_plan.evidence import status_label

        return status_label(self.gate_status)

    @property
    def evidence_seen(self) -> list[dict[str, Any]]:
        """The evidence this approval bound to, from its snapshot: per check (title, status
        then), each piece with its label, link and source — what an auditor asks for."""
        return [{"check": check.get("key", ""), "check_title": check.get("title", ""),
                 "check_status": check.get("status", ""), "kind": ref.get("kind", ""),
                 "ref": ref.get("ref", ""), "label": ref.get("label", ""),
                 "url": ref.get("url", ""), "source": ref.get("source_label")
                 or ref.get("source", ""), "observed_at": ref.get("observed_at")}
                for check in (self.snapshot or {}).get("checks", [])
                for ref in check.get("evidence", [])]


class StageMove(models.Model):
    class Kind(models.TextChoices):
        ADVANCE = "advance", "advance"
        REGRESS = "regress", "regress"
        PAUSE = "pause", "pause"
        RESUME = "resume", "resume"
        ABANDON = "abandon", "abandon"
        COMPLETE = "complete", "complete"

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="moves")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    from_state = models.CharField(max_length=10)
    to_state = models.CharField(max_length=10)
    by = models.CharField(max_length=150)
    at = models.DateTimeField(default=timezone.now)
    reason = models.TextField(blank=True)
    gate_snapshot = models.JSONField(default=dict)
    snapshot_hash = models.CharField(max_length=64, blank=True)
    approvals = models.ManyToManyField(Approval, related_name="+", blank=True)
    # Leaving stage 4 drains the candidate first; these are those drains.
    drains = models.ManyToManyField("traffic.Drain", related_name="plan_moves", blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.plan_id}: {self.from_state} → {self.to_state}"


class Evidence(models.Model):
    """A result an evidence job produced about a pool (benchmark, conformance, shadow, eval,
    soak...), or, of kind "external", what another system reported about it. Bound to what the
    pool was when measured: if its model revision, runtime version, driver label, quantisation
    or weight format changes, or the row passes `expires_at`, it no longer counts."""

    class Verdict(models.TextChoices):
        PASS = "pass", "pass"
        WARN = "warn", "warn"
        FAIL = "fail", "fail"
        INFO = "info", "info"

    kind = models.CharField(max_length=40, db_index=True)
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="evidence")
    route = models.ForeignKey(Route, on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="+")
    model_id = models.CharField(max_length=200, blank=True)
    observed_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    # {"model_revision": …, "runtime_version": …, "driver": …} at the time of measurement.
    pool_fingerprint = models.JSONField(default=dict)
    verdict = models.CharField(max_length=4, choices=Verdict.choices, default=Verdict.INFO)
    summary = models.CharField(max_length=300)
    data = models.JSONField(default=dict, blank=True)
    url = models.CharField(max_length=300, blank=True, validators=[validate_link_url],
                           help_text="Where the details are: an http(s) URL or a /path.")
    source = models.CharField(max_length=150, help_text="Who or which job produced it.")
    # Kind "external" only: what another system reported. `reported_by` names that system
    # ("grafana-slo-bot"), `about` the kind or check it speaks to ("shadow", "slo-burn");
    # `source` is who posted it.
    reported_by = models.CharField(max_length=100, blank=True)
    about = models.CharField(max_length=63, blank=True, db_index=True)

    class Meta:
        ordering = ["-observed_at", "-id"]
        indexes = [models.Index(fields=["pool", "kind", "-observed_at"])]

    def __str__(self) -> str:
        return f"{self.kind} on {self.pool_id} at {self.observed_at:%Y-%m-%d %H:%M}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise ValueError("Evidence rows are immutable; record a new one.")
        super().save(*args, **kwargs)
