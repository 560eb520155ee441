"""Batch jobs: an OpenAI Batch-format input (one request per JSONL line) run on one pool.

The state lives in rows, so any worker process can take any job over:

- `BatchFile`: an uploaded input, validated whole before it is kept (streamed, line-numbered,
  all-or-nothing: fleetctl/core/jsonl.py). The file itself is kept on disk under
  BATCH_FILES_DIR; its rows here say what it holds.
- `BatchJob`: the input run on a pool with a concurrency limit, a rate limit and a completion
  window; its counters are the sums of its chunks'.
- `BatchChunk`: a contiguous range of the input's requests, the unit a worker claims with a
  conditional UPDATE of its lease (`lease_owner`, `lease_until`). `dispatched_through` is the
  highest request index the holder has started sending: at a takeover, every request at or
  below it without a result may have been sent (the in-flight ones), and is recorded as a
  `BatchResend` before it is sent again.
- `BatchResult`: one per request, written once (a unique constraint on (job, index); a second
  write is refused by the database, counted, never stored). A request counts as done only once
  its result row is committed, in the same transaction as its chunk's counters.
- `BatchJobEvent`: the timeline, with who did what; `manual` marks a person's action (a soak
  with any fails).
- `Soak`: recurring jobs on a plan's candidate over a duration; its jobs point back to it.
- `BatchComparison`: a sample of a job's requests sent to the plan's primary, compared with
  the job's answers (fleetctl/inference/compare.py).
"""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleetctl.fleet.models import Pool
from fleetctl.traffic.models import Route
from migrations_plan.models import Evidence, Plan

ACTIVE_STATES = ("queued", "running", "paused")
# Requests a worker claims at a time. Large, because a holder drains its chunk before it
# claims the next (the requests in flight fall toward zero at every boundary: 33 % below the
# benchmark client at concurrency 32 with chunks of 50, 3 % with chunks of 1,000, measured by
# benchmarks/batch_worker_overhead.py). A kill costs only the requests in flight whatever the
# chunk's size: the checkpoint is per request.
DEFAULT_CHUNK_SIZE = 1000


class BatchFile(models.Model):
    """An uploaded, validated input file (OpenAI Batch format)."""

    name = models.CharField(max_length=200, help_text="The uploaded file's name.")
    sha256 = models.CharField(max_length=64, db_index=True)
    # Relative to settings.BATCH_FILES_DIR.
    path = models.CharField(max_length=300)
    size_bytes = models.BigIntegerField()
    requests = models.PositiveIntegerField(help_text="Requests (non-blank lines).")
    # The endpoints and models the lines name, each with the first line naming it
    # ({"/v1/chat/completions": 1}, {"llama-3.1-8b-instruct": 1}): a job on a pool that does
    # not serve one is refused naming that line.
    url_lines = models.JSONField(default=dict)
    model_lines = models.JSONField(default=dict)
    uploaded_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Deleted (DELETE /openai/v1/files/{id}): its bytes are gone and no new job may use it;
    # the row stays, because the finished jobs that ran it still point at it.
    deleted_at = models.DateTimeField(null=True, blank=True)
    deleted_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.requests} requests)"


class Soak(models.Model):
    """Recurring batch jobs on a plan's candidate for a duration; passes only with no manual
    intervention and every job's error rate and throughput within the plan's margins."""

    class State(models.TextChoices):
        RUNNING = "running", "running"
        PASSED = "passed", "passed"
        FAILED = "failed", "failed"
        STOPPED = "stopped", "stopped by a person"

    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="soaks")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="soaks")
    input_file = models.ForeignKey(BatchFile, on_delete=models.PROTECT, related_name="soaks")
    every_s = models.PositiveIntegerField(
        validators=[MinValueValidator(10)],
        help_text="A new job starts this often (seconds), once the previous one has ended.")
    duration_s = models.PositiveIntegerField(
        validators=[MinValueValidator(60)],
        help_text="How long the soak runs (seconds; days in production).")
    # The jobs' options (as BatchJob's fields).
    concurrency = models.PositiveSmallIntegerField(default=8)
    rate_limit_rps = models.FloatField(null=True, blank=True)
    completion_window_s = models.PositiveIntegerField(default=3600)
    chunk_size = models.PositiveIntegerField(default=DEFAULT_CHUNK_SIZE)
    # A drill in the soak's first job (kill-worker, fault-pool or none).
    drill = models.CharField(max_length=12, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    state_reason = models.TextField(blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    next_job_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150)
    evidence = models.ForeignKey(Evidence, on_delete=models.SET_NULL, null=True, blank=True,
                                 related_name="+")
    cost_evidence = models.ForeignKey(Evidence, on_delete=models.SET_NULL, null=True,
                                      blank=True, related_name="+")
    # The tick's lease (the soak's schedule is driven by one controller at a time).
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["plan"], condition=Q(state="running"),
                                    name="one_running_soak_per_plan"),
        ]

    def __str__(self) -> str:
        return f"soak {self.pk} of {self.plan_id}"


class BatchJob(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        PAUSED = "paused", "paused"
        COMPLETED = "completed", "completed"
        EXPIRED = "expired", "expired: the completion window ended"
        CANCELLED = "cancelled", "cancelled"
        FAILED = "failed", "failed"

    class Drill(models.TextChoices):
        NONE = "", "no drill"
        KILL_WORKER = "kill-worker", "kill -9 the worker holding a chunk"
        FAULT_POOL = "fault-pool", "fault the pool (simulator fault hook)"

    input_file = models.ForeignKey(BatchFile, on_delete=models.PROTECT, related_name="jobs")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="batch_jobs")
    # The plan whose candidate (or primary) the pool is, when the job was created: its primary
    # is what the output sample is compared with.
    plan = models.ForeignKey(Plan, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="batch_jobs")
    soak = models.ForeignKey(Soak, on_delete=models.PROTECT, null=True, blank=True,
                             related_name="jobs")
    # A job submitted through the OpenAI Batch API (/openai/v1/batches): the batch-class
    # route it was placed through (its pool is one the route's split gives weight), the
    # endpoint the batch names and its metadata, as the client sent them. Empty for a job
    # created through fleetctl's own REST, form or CLI (those name a pool).
    route = models.ForeignKey(Route, on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="batch_jobs")
    endpoint = models.CharField(max_length=40, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    concurrency = models.PositiveSmallIntegerField(
        default=8, validators=[MinValueValidator(1), MaxValueValidator(256)],
        help_text="Requests in flight at once, at most.")
    rate_limit_rps = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.01)],
        help_text="Requests started per second, at most (empty: no limit).")
    completion_window_s = models.PositiveIntegerField(
        default=24 * 3600, validators=[MinValueValidator(10), MaxValueValidator(7 * 86400)],
        help_text="The job expires this long after it was created; its partial output stays.")
    chunk_size = models.PositiveIntegerField(
        default=DEFAULT_CHUNK_SIZE, validators=[MinValueValidator(1), MaxValueValidator(10_000)])
    max_attempts = models.PositiveSmallIntegerField(
        default=5, validators=[MinValueValidator(1), MaxValueValidator(20)],
        help_text="Tries per request on 429, 5xx and transport errors (with backoff).")
    request_timeout_s = models.FloatField(default=120)
    drill = models.CharField(max_length=12, choices=Drill.choices, blank=True, default="")
    drill_at = models.FloatField(
        default=0.4, validators=[MinValueValidator(0.05), MaxValueValidator(0.95)],
        help_text="The drill fires once this share of requests is done.")
    compare_sample = models.PositiveSmallIntegerField(
        default=20, validators=[MaxValueValidator(500)],
        help_text="Requests whose answers are compared with the primary's (0: none).")

    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    state_reason = models.TextField(blank=True)
    total = models.PositiveIntegerField()
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    # The drill: when it fired (committed before the kill), on which worker, when another
    # holder wrote the next result, and the verdict from the rows.
    drill_fired_at = models.DateTimeField(null=True, blank=True)
    drill_worker = models.CharField(max_length=100, blank=True)
    drill_resumed_at = models.DateTimeField(null=True, blank=True)
    drill_verdict = models.CharField(max_length=4, blank=True)
    drill_summary = models.TextField(blank=True)
    evidence = models.ForeignKey(Evidence, on_delete=models.SET_NULL, null=True, blank=True,
                                 related_name="+")
    # Writes the database refused because the request already had a result.
    duplicates_refused = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "created_at"])]

    def __str__(self) -> str:
        return f"batch job {self.pk}"

    @property
    def public_id(self) -> str:
        return f"batch_{self.pk}"

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES


class BatchChunk(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "pending"
        RUNNING = "running", "running"
        DONE = "done", "done"

    job = models.ForeignKey(BatchJob, on_delete=models.CASCADE, related_name="chunks")
    number = models.PositiveIntegerField()
    # Requests [first_index, last_index] (0-based request indices, not file lines), stored at
    # bytes [byte_start, byte_end) of the input file; first_line is the file line of the first.
    first_index = models.PositiveIntegerField()
    last_index = models.PositiveIntegerField()
    first_line = models.PositiveIntegerField()
    byte_start = models.BigIntegerField()
    byte_end = models.BigIntegerField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    claims = models.PositiveIntegerField(default=0)
    dispatched_through = models.IntegerField(default=-1)
    # Counters, updated in the transaction that writes each result.
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    retries = models.PositiveIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["job", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="batch_chunk_number"),
        ]
        indexes = [models.Index(fields=["state", "lease_until"])]

    def __str__(self) -> str:
        return f"chunk {self.number} of job {self.job_id}"


class BatchResult(models.Model):
    """One request's final answer: written once, never updated."""

    job = models.ForeignKey(BatchJob, on_delete=models.CASCADE, related_name="results")
    index = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=200)
    status_code = models.PositiveSmallIntegerField(help_text="0: no answer (transport error).")
    # The pool's answer body (JSON text) for the output file; empty when there was none.
    body = models.TextField(blank=True)
    error_code = models.CharField(max_length=60, blank=True)
    error_message = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField(default=1)
    prompt_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.FloatField(null=True, blank=True)
    worker = models.CharField(max_length=100)
    finished_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "index"]
        constraints = [
            models.UniqueConstraint(fields=["job", "index"], name="batch_result_once"),
        ]
        indexes = [models.Index(fields=["job", "finished_at"])]

    def __str__(self) -> str:
        return f"result {self.index} of job {self.job_id}"

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300


class BatchResend(models.Model):
    """A request that may have been sent twice: it was in flight (dispatched, no result) when
    its chunk's holder lost the lease (killed, or stalled past it), and is sent again."""

    job = models.ForeignKey(BatchJob, on_delete=models.CASCADE, related_name="resends")
    index = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=200)
    previous_owner = models.CharField(max_length=100)
    new_owner = models.CharField(max_length=100)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "index", "at"]

    def __str__(self) -> str:
        return f"resend of {self.index} in job {self.job_id}"


class TimelineEntry(models.Model):
    """A line of a job's or a soak's timeline: when, who, whether a person did it (a soak
    with any manual action fails), what happened and its figures (abstract)."""

    at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=150)
    manual = models.BooleanField(default=False)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        abstract = True


class BatchJobEvent(TimelineEntry):
    class Kind(models.TextChoices):
        CREATED = "created", "created"
        STARTED = "started", "started"
        PAUSED = "paused", "paused"
        RESUMED = "resumed", "resumed"
        EDITED = "edited", "edited"
        CANCELLED = "cancelled", "cancelled"
        EXPIRED = "expired", "expired"
        COMPLETED = "completed", "completed"
        FAILED = "failed", "failed"
        TAKEOVER = "takeover", "chunk taken over after a lapsed lease"
        DRILL_FIRED = "drill", "drill fired"
        DRILL_VERDICT = "drill-verdict", "drill verified"
        RETRY = "retry", "retried requests"

    job = models.ForeignKey(BatchJob, on_delete=models.CASCADE, related_name="events")
    # `manual`: a person's action (pause, resume, edit, cancel).
    kind = models.CharField(max_length=14, choices=Kind.choices)

    class Meta:
        ordering = ["job", "at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} on job {self.job_id}"


class SoakEvent(TimelineEntry):
    """The soak's own timeline: jobs started, a person's edits/stops/restarts (manual), and
    the verdict."""

    soak = models.ForeignKey(Soak, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=20)

    class Meta:
        ordering = ["soak", "at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} on soak {self.soak_id}"


class BatchComparison(models.Model):
    """One sampled request of a job answered by the primary too, and how the answers compare."""

    job = models.ForeignKey(BatchJob, on_delete=models.CASCADE, related_name="comparisons")
    index = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=200)
    primary_pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="+")
    primary_status = models.PositiveSmallIntegerField()
    # compare.Comparison's fields (identical, token_similarity, first_divergence, ...).
    outcome = models.JSONField(default=dict)
    identical = models.BooleanField(null=True)
    similarity = models.FloatField(null=True, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "index"]
        constraints = [
            models.UniqueConstraint(fields=["job", "index"], name="batch_comparison_once"),
        ]

    def __str__(self) -> str:
        return f"comparison {self.index} of job {self.job_id}"
