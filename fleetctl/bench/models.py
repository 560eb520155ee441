"""Benchmark records: traces, runs, levels and per-request samples. Rows, not logs: the
dashboard, the API, exports and gate evidence all read these."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from fleetctl.core.jobs import STATUS_MAX_LENGTH, Job, JobStatus
from fleetctl.fleet.models import Pool, model_id_validator, slug_validator

DEFAULT_WARMUP_S = 15.0
DEFAULT_WINDOW_S = 60.0


class Trace(models.Model):
    """A request trace, stored normalised as fleetctl JSONL on disk (never in a row)."""

    class Source(models.TextChoices):
        FLEETCTL = "fleetctl", "fleetctl JSONL"
        MOONCAKE = "mooncake", "Mooncake JSONL"
        AZURE = "azure-csv", "Azure CSV"
        SYNTHETIC = "synthetic", "synthetic"

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    description = models.TextField(blank=True)
    source = models.CharField(max_length=10, choices=Source.choices)
    path = models.CharField(max_length=300, editable=False)
    sha256 = models.CharField(max_length=64, editable=False)
    requests = models.PositiveIntegerField(editable=False)
    duration_s = models.FloatField(editable=False)
    summary = models.JSONField(default=dict, editable=False)
    generator = models.JSONField(default=dict, blank=True, editable=False)
    created_by = models.CharField(max_length=150, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-created_at", "name"]

    def __str__(self) -> str:
        return self.name


class Run(Job):
    """One benchmark job: a trace against one or more pools, levels interleaved across pools
    so machine drift hits all of them alike. No plan: its evidence is about pools, and any
    plan whose gate reads benchmark evidence of them takes it."""

    class Status(models.TextChoices):
        """The job words (fleetctl/core/jobs.py) and `partial`: the run ended, but some
        levels could not be run (their pools' results stand without them)."""

        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        COMPLETE = "complete", "complete"
        PARTIAL = "partial", "partial (some levels failed to run)"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"

    class Mode(models.TextChoices):
        LEVELS = "levels", "fixed list of concurrency levels"
        SEARCH = "search", "search for the highest concurrency that meets the SLO"

    class Timing(models.TextChoices):
        CONCURRENCY = "concurrency", "fixed concurrency (closed loop)"
        TRACE = "trace", "the trace's own timing, time-scaled (open loop)"

    name = models.CharField(max_length=100, blank=True)
    trace = models.ForeignKey(Trace, on_delete=models.PROTECT, related_name="runs")
    pools = models.ManyToManyField(Pool, related_name="bench_runs")
    model_id = models.CharField(max_length=200, validators=[model_id_validator])
    mode = models.CharField(max_length=6, choices=Mode.choices, default=Mode.SEARCH)
    levels = models.JSONField(default=list, blank=True)
    # timing="trace": each level replays the trace's arrival times divided by a speed factor
    # (1 = the trace's own timing, 2 = twice as fast); `speeds` lists them, `mode` and
    # `levels` are then unused (mode is stored as "levels", levels empty).
    timing = models.CharField(max_length=11, choices=Timing.choices, default=Timing.CONCURRENCY)
    speeds = models.JSONField(default=list, blank=True,
                              help_text="timing=trace: speed factors, e.g. [0.5, 1, 2, 4].")
    max_concurrency = models.PositiveIntegerField(
        default=256, validators=[MinValueValidator(1), MaxValueValidator(4096)])
    slo_ttft_p95_ms = models.FloatField(validators=[MinValueValidator(1),
                                                    MaxValueValidator(600_000)])
    slo_tpot_p95_ms = models.FloatField(validators=[MinValueValidator(0.1),
                                                    MaxValueValidator(10_000)])
    slo_error_rate = models.FloatField(validators=[MinValueValidator(0),
                                                   MaxValueValidator(0.5)])
    # Defaults (docs/benchmarks.md, "Load shape"): a warm-up long enough for the streams'
    # staggered starts and for the server's queue to settle, and a window that holds a p95's
    # worth of requests at moderate rates instead of a burst or two.
    warmup_s = models.FloatField(default=DEFAULT_WARMUP_S, validators=[MinValueValidator(0),
                                                                       MaxValueValidator(600)])
    window_s = models.FloatField(default=DEFAULT_WINDOW_S, validators=[MinValueValidator(0.5),
                                                                       MaxValueValidator(3600)])
    ramp_s = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(600)],
        help_text="Fixed concurrency: seconds over which a level's streams send their first "
                  "requests (staggered, seeded). Blank: half the warm-up. At most the warm-up.")
    min_samples = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)])
    shards = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(64)],
        help_text="Client processes (Celery tasks on the bench queue) a level is split over.")
    lag_limit_ms = models.FloatField(
        default=25.0, validators=[MinValueValidator(1), MaxValueValidator(10_000)],
        help_text="A level whose client lagged more than this (p99) is invalid, not counted.")
    status = models.CharField(max_length=STATUS_MAX_LENGTH, choices=Status.choices,
                              default=JobStatus.QUEUED)
    progress = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return self.name or f"run {self.pk}"


class Level(models.Model):
    """One pool at one load: the summary of its steady-state window and its verdict.

    Fixed-concurrency runs set `concurrency` (≥ 1) and leave `speed` null. Trace-timing runs
    set `speed` (the factor the trace's arrival times were divided by) and store
    `concurrency = 0`: an open-loop level has no fixed number of streams."""

    class Verdict(models.TextChoices):
        PASS = "pass", "pass"
        FAIL = "fail", "fail"
        INSUFFICIENT = "insufficient", "insufficient samples"
        INVALID = "invalid", "invalid (the client was the bottleneck)"
        ERROR = "error", "could not run"
        RUNNING = "running", "running"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="level_rows")
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="+")
    concurrency = models.PositiveIntegerField(help_text="0 for a trace-timing level.")
    speed = models.FloatField(null=True, blank=True,
                              help_text="Trace-timing level: the trace speed factor.")
    attempt = models.PositiveSmallIntegerField(default=1)
    verdict = models.CharField(max_length=12, choices=Verdict.choices, default=Verdict.RUNNING)
    binding = models.CharField(max_length=40, blank=True)
    summary = models.JSONField(default=dict, blank=True)
    output_tokens_per_s = models.FloatField(null=True, blank=True)
    ttft_p95_ms = models.FloatField(null=True, blank=True)
    tpot_p95_ms = models.FloatField(null=True, blank=True)
    error_rate = models.FloatField(null=True, blank=True)
    cost_per_1m = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    # The pool's hourly rate and currency when the level was judged: what `cost_per_1m` was
    # computed with (the pool's own may change later).
    hourly_rate = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True)
    note = models.TextField(blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "pool", "concurrency", "speed", "attempt"]

    def __str__(self) -> str:
        if self.speed is not None:
            return f"{self.run_id}/{self.pool_id}@{self.speed:g}x"
        return f"{self.run_id}/{self.pool_id}@{self.concurrency}"

    @property
    def load(self) -> str:
        """The level's load as shown: "4" (streams) or "2×" (trace speed)."""
        return f"{self.speed:g}×" if self.speed is not None else str(self.concurrency)


class ShardPart(models.Model):
    """What one client process contributes to a level besides its samples: its window, the
    tokens it saw in it, its CPU and loop lag — enough to merge rates exactly."""

    level = models.ForeignKey(Level, on_delete=models.CASCADE, related_name="parts")
    shard = models.PositiveSmallIntegerField()
    concurrency = models.PositiveIntegerField()
    window_s = models.FloatField(default=0)
    window_tokens = models.FloatField(default=0)
    measured_requests = models.PositiveIntegerField(default=0)
    client_cpu_s = models.FloatField(default=0)
    wall_s = models.FloatField(default=0)
    loop_lag_s = models.JSONField(default=list)
    # fixed concurrency: [stream, first send (s after the level's start), endpoint index]
    # for each of this process's streams; and the endpoint URLs it drove, by index
    stream_starts = models.JSONField(default=list, blank=True)
    endpoints = models.JSONField(default=list, blank=True)
    window_start_s = models.FloatField(default=0, help_text="When its steady-state window "
                                       "began: after the warm-up and its last stream's start.")
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=150, blank=True)
    finished_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["level", "shard"],
                                               name="one_part_per_shard")]

    def __str__(self) -> str:
        return f"{self.level_id} shard {self.shard}"


class Sample(models.Model):
    """One request as the client saw it (shard: which client process measured it)."""

    level = models.ForeignKey(Level, on_delete=models.CASCADE, related_name="samples")
    shard = models.PositiveSmallIntegerField(default=0)
    index = models.PositiveIntegerField()
    warmup = models.BooleanField(default=False)
    scheduled_s = models.FloatField()
    schedule_lag_s = models.FloatField()
    ttft_s = models.FloatField(null=True)
    tpot_s = models.FloatField(null=True)
    e2e_s = models.FloatField(null=True)
    itl_s = models.JSONField(default=list)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    window_tokens = models.FloatField(default=0)
    tokens_source = models.CharField(max_length=6, default="usage")
    status = models.CharField(max_length=8)
    http_status = models.PositiveSmallIntegerField(null=True)
    error = models.TextField(blank=True)
    stream = models.PositiveIntegerField(default=0, help_text="Fixed concurrency: the stream "
                                         "that sent it (0 … concurrency − 1).")
    endpoint = models.PositiveSmallIntegerField(default=0, help_text="Which of the pool's base "
                                                "URLs it went to (their order in the run).")

    class Meta:
        ordering = ["level", "shard", "index"]
        indexes = [models.Index(fields=["level", "shard"])]

    def __str__(self) -> str:
        return f"{self.level_id}#{self.shard}.{self.index}"
