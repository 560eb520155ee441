"""Ramps: a route's weight for one pool stepped up hold by hold, and every decision made on
the way (the timeline). The controller's state lives here, in rows: a tick claims a ramp with
a conditional UPDATE of its lease, so a worker or beat restart resumes it and two controllers
never drive one route; and at most one ramp per route is active (a conditional unique
constraint, so a second one is refused by the database too)."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleetctl.fleet.models import Pool
from fleetctl.traffic.models import Drain, Route
from migrations_plan.models import Plan

ACTIVE_STATES = ("running", "paused")


class Ramp(models.Model):
    class State(models.TextChoices):
        RUNNING = "running", "running"
        PAUSED = "paused", "paused: a person decides"
        COMPLETE = "complete", "complete"
        ROLLED_BACK = "rolled-back", "rolled back by the guard"
        ABORTED = "aborted", "aborted by a person"
        FAILED = "failed", "failed"

    route = models.ForeignKey(Route, on_delete=models.PROTECT, related_name="ramps")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="ramps")
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, null=True, blank=True,
                             related_name="ramps",
                             help_text="The plan whose candidate this is (stage 4): each "
                                       "step writes ramp-slo evidence for it.")
    # [{"percent": 5.0, "hold_s": 60}, ...]: strictly increasing percents, each held.
    steps = models.JSONField()
    min_samples = models.PositiveIntegerField(
        default=50, help_text="Requests the pool must answer in a hold before the guard "
                              "judges it (below: it waits).")
    window_s = models.PositiveIntegerField(
        default=30, help_text="The guard judges the last this-many seconds of the hold.")
    failure_threshold = models.PositiveSmallIntegerField(
        default=2, validators=[MinValueValidator(1)],
        help_text="Consecutive failing checks before the guard rolls back.")
    # The thresholds the guard uses (from the plan, or given for a pool with no plan).
    slo_ttft_p95_ms = models.FloatField(validators=[MinValueValidator(0)])
    slo_tpot_p95_ms = models.FloatField(validators=[MinValueValidator(0)])
    slo_error_rate = models.FloatField(validators=[MinValueValidator(0), MaxValueValidator(1)])
    latency_margin_pct = models.FloatField(validators=[MinValueValidator(0)])
    # Whole-answer latency p95 (streamed or not); null: not judged (only first-token latency).
    slo_e2e_p95_ms = models.FloatField(null=True, blank=True, validators=[MinValueValidator(1)])
    # Extra guard metrics: query checks against registered metric sources (fleetctl/
    # prometheus/query.py), [{"source", "query", "success"?, "failure"?, "field"?, "name"?}].
    # Judged with the guard's own figures: a fail counts toward the rollback, no data waits.
    metric_checks = models.JSONField(default=list, blank=True)
    # The split when the ramp started: the other pools share the rest in these proportions.
    base_weights = models.JSONField(default=dict)
    state = models.CharField(max_length=12, choices=State.choices, default=State.RUNNING)
    state_reason = models.TextField(blank=True)
    step_index = models.IntegerField(default=-1)  # -1: no step set yet
    step_started_at = models.DateTimeField(null=True, blank=True)
    # The route revision the ramp last set (or accepted): another number on the route means
    # somebody else changed the split, and the ramp pauses rather than fight it.
    revision_number = models.PositiveIntegerField(default=0)
    consecutive_failures = models.PositiveSmallIntegerField(default=0)
    drain = models.ForeignKey(Drain, on_delete=models.PROTECT, null=True, blank=True,
                              related_name="ramps", help_text="The rollback (guard or abort).")
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The controller's claim: a tick owns the ramp until lease_until.
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    next_check_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["route"], condition=Q(state__in=ACTIVE_STATES),
                                    name="one_active_ramp_per_route"),
        ]
        indexes = [models.Index(fields=["state", "next_check_at"])]

    def __str__(self) -> str:
        return f"ramp {self.pk} of {self.pool_id} on {self.route_id}"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def current_step(self) -> dict[str, float] | None:
        if 0 <= self.step_index < len(self.steps):
            step: dict[str, float] = self.steps[self.step_index]
            return step
        return None


class RampEvent(models.Model):
    """One decision or action on a ramp's timeline, with the numbers it used."""

    class Kind(models.TextChoices):
        START = "start", "started"
        STEP = "step", "stepped to a new weight"
        WAIT = "wait", "waiting for samples"
        CHECK = "check", "guard check"
        PASS = "pass", "hold passed"
        WARN = "warn", "warn: paused for a person"
        FAIL = "fail", "fail"
        ROLLBACK = "rollback", "rolled back (drain)"
        PAUSE = "pause", "paused"
        RESUME = "resume", "resumed"
        SKIP = "skip", "hold skipped"
        ABORT = "abort", "aborted (drain)"
        MANUAL_CHANGE = "manual-change", "paused: the split was changed by hand"
        COMPLETE = "complete", "complete"
        ERROR = "error", "error"

    ramp = models.ForeignKey(Ramp, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    step_index = models.IntegerField()
    percent = models.FloatField(null=True, blank=True)
    message = models.TextField()
    # What the decision used: per pool (candidate, primary) n, error rate and its bounds,
    # TTFT/TPOT p95 and their bounds with each figure's source, the thresholds, the window.
    numbers = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=150)
    revision_number = models.PositiveIntegerField(null=True, blank=True)
    drain = models.ForeignKey(Drain, on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="+")
    evidence_id = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["ramp", "at", "id"]

    def __str__(self) -> str:
        return f"ramp {self.ramp_id} {self.kind} at {self.at:%H:%M:%S}"


class Watch(models.Model):
    """The standing live watch of one pool on one route, after its ramp completed: the guard
    keeps judging it on the newest telemetry, against the SLO copied from the ramp (or plan)
    at hand-over and against the route's primary, and alerts or drains by `policy`. Its
    verdicts (`WatchVerdict`) are stage 4's evidence that the percentiles held (rule
    `watch.held`)."""

    class Policy(models.TextChoices):
        ALERT = "alert", "alert: a webhook and the timeline, the pool keeps its weight"
        DRAIN = "drain", "drain: the pool comes off the route"

    class State(models.TextChoices):
        ACTIVE = "active", "active"
        ENDED = "ended", "ended"

    class Role(models.TextChoices):
        CANDIDATE = "candidate", "the ramped pool (against its SLO and the primary)"
        PRIMARY = "primary", "the route's primary (against its SLO)"

    route = models.ForeignKey(Route, on_delete=models.PROTECT, related_name="watches")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="watches")
    ramp = models.ForeignKey(Ramp, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="watches", help_text="The ramp that handed over.")
    plan = models.ForeignKey(Plan, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="watches")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.CANDIDATE)
    policy = models.CharField(max_length=5, choices=Policy.choices, default=Policy.DRAIN)
    state = models.CharField(max_length=6, choices=State.choices, default=State.ACTIVE)
    ended_reason = models.TextField(blank=True)
    # What it judges, copied at hand-over (a later plan edit does not move a running watch).
    slo_ttft_p95_ms = models.FloatField(validators=[MinValueValidator(0)])
    slo_tpot_p95_ms = models.FloatField(validators=[MinValueValidator(0)])
    slo_error_rate = models.FloatField(validators=[MinValueValidator(0), MaxValueValidator(1)])
    latency_margin_pct = models.FloatField(validators=[MinValueValidator(0)])
    slo_e2e_p95_ms = models.FloatField(null=True, blank=True, validators=[MinValueValidator(1)])
    min_samples = models.PositiveIntegerField(default=50)
    window_s = models.PositiveIntegerField(
        default=30, help_text="Each verdict judges one window this long (whole telemetry "
                              "windows, back to back).")
    failure_threshold = models.PositiveSmallIntegerField(default=2,
                                                         validators=[MinValueValidator(1)])
    consecutive_failures = models.PositiveSmallIntegerField(default=0)
    drain = models.ForeignKey(Drain, on_delete=models.PROTECT, null=True, blank=True,
                              related_name="watches", help_text="The drain the watch made.")
    created_by = models.CharField(max_length=150)
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    # The end of the newest window judged: the next tick judges the window after it.
    judged_until = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["route", "pool"], condition=Q(state="active"),
                                    name="one_active_watch_per_route_pool"),
        ]
        indexes = [models.Index(fields=["state", "judged_until"])]

    def __str__(self) -> str:
        return f"watch {self.pk} of {self.pool_id} on {self.route_id}"

    @property
    def active(self) -> bool:
        return self.state == self.State.ACTIVE


class WatchVerdict(models.Model):
    """One judged window of a watch, with the figures it used (the pool's and the primary's)."""

    class Verdict(models.TextChoices):
        PASS = "pass", "pass"
        WARN = "warn", "warn"
        FAIL = "fail", "fail"
        INSUFFICIENT = "insufficient", "insufficient data"

    watch = models.ForeignKey(Watch, on_delete=models.CASCADE, related_name="verdicts")
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    verdict = models.CharField(max_length=12, choices=Verdict.choices)
    requests = models.PositiveIntegerField(default=0)
    ttft_p95_ms = models.FloatField(null=True, blank=True)
    tpot_p95_ms = models.FloatField(null=True, blank=True)
    e2e_p95_ms = models.FloatField(null=True, blank=True)
    error_rate = models.FloatField(null=True, blank=True)
    primary_requests = models.PositiveIntegerField(null=True, blank=True)
    primary_ttft_p95_ms = models.FloatField(null=True, blank=True)
    primary_tpot_p95_ms = models.FloatField(null=True, blank=True)
    primary_e2e_p95_ms = models.FloatField(null=True, blank=True)
    primary_error_rate = models.FloatField(null=True, blank=True)
    summary = models.TextField()
    # What happened on it: "" (recorded), "alerted", "drained", "counted" (a fail below the
    # threshold).
    action = models.CharField(max_length=10, blank=True)
    numbers = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["watch", "window_start", "id"]
        constraints = [models.UniqueConstraint(fields=["watch", "window_start"],
                                               name="one_verdict_per_watch_window")]

    def __str__(self) -> str:
        return f"watch {self.watch_id} {self.verdict} at {self.window_start:%H:%M:%S}"
