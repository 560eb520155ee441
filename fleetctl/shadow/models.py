"""Shadow records: one row per run, one row per sampled request (the triple's three answers
and the two comparisons), and one row per judgement (the time series the dashboard draws).
Rows, not logs: the run page, the API, the CLI and the plan's stage-2 evidence read these.

A run copies live requests of one route (mirrored by the route's gateways to the shadow
collector) or replays a stored trace, and sends each sampled request to the primary, to the
primary again (the *secondary*: another endpoint of the primary pool when it has one) and to
the candidate. Primary vs secondary is the noise floor; primary vs candidate the signal.
"""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleetctl.core.jobs import STATUS_MAX_LENGTH, JobVerdict
from fleetctl.fleet.models import Pool, model_id_validator
from migrations_plan.jobs import PlanJob


class ShadowRun(PlanJob):
    """A shadow run: running from the moment it starts (nothing queues it), until a person
    stops it, its replay ends, or it fails. `finished_at` is when it ended, however it did;
    `cancelled_by` who stopped it; `stop_reason` why it ended, whichever way."""

    class Mode(models.TextChoices):
        MIRROR = "mirror", "mirror live traffic at the gateway"
        REPLAY = "replay", "replay a stored trace"

    class Status(models.TextChoices):
        """The job words a shadow run reaches (fleetctl/core/jobs.py; it is never queued and
        is stopped, not cancelled) and `stopped`: a person, or the residency fail-safe,
        pulled the kill switch. Not `complete` (a mirror run has no end of its own and a
        stopped replay did not replay its trace), not `cancelled` (what it judged until then
        stands as evidence: a cancelled job records none)."""

        RUNNING = "running", "running"
        STOPPED = "stopped", "stopped"
        COMPLETE = "complete", "complete (the trace was replayed)"
        FAILED = "failed", "failed"

    class Content(models.TextChoices):
        FULL = "full", "full: prompts and answers stored"
        REDACTED = "redacted", "redacted: stored with e-mails, numbers, keys masked"
        OFF = "off", "off: metrics and hashes only, no text anywhere"

    Verdict = JobVerdict

    # Required (the kernel's is optional): the run's candidate and primary are its plan's.
    plan = models.ForeignKey("migrations_plan.Plan", on_delete=models.CASCADE,
                             related_name="shadow_runs")
    # Mirror mode: the route whose live traffic is copied. Replay: the plan route whose
    # residency pin the replayed requests obey (the plan's only route when it has one).
    route = models.ForeignKey("traffic.Route", on_delete=models.SET_NULL, null=True,
                              blank=True, related_name="shadow_runs")
    candidate = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="+")
    primary = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="+")
    model_id = models.CharField(max_length=200, validators=[model_id_validator])
    mode = models.CharField(max_length=6, choices=Mode.choices, default=Mode.MIRROR)
    trace = models.ForeignKey("bench.Trace", on_delete=models.PROTECT, null=True, blank=True,
                              related_name="shadow_runs",
                              help_text="Replay: the trace (with prompt texts) replayed.")
    sample_percent = models.FloatField(
        default=10, validators=[MinValueValidator(0.01), MaxValueValidator(100)],
        help_text="Mirror: share of the route's requests the gateways copy, %. Replay: share "
                  "of the trace's requests sent.")
    max_rps = models.FloatField(
        default=2, validators=[MinValueValidator(0.01), MaxValueValidator(1000)],
        help_text="Spend cap: sampled requests per second sent on (each costs three calls).")
    max_tokens_per_day = models.PositiveBigIntegerField(
        default=2_000_000, validators=[MinValueValidator(1000)],
        help_text="Spend cap: prompt + completion tokens per UTC day, all three sides.")
    content = models.CharField(max_length=8, choices=Content.choices, default=Content.REDACTED)
    retention_hours = models.PositiveIntegerField(
        default=168, validators=[MinValueValidator(1), MaxValueValidator(24 * 90)],
        help_text="Stored prompt and answer text is purged this long after it was received.")
    min_pairs = models.PositiveIntegerField(
        default=200, validators=[MinValueValidator(10), MaxValueValidator(1_000_000)],
        help_text="Below this many compared pairs the verdict is insufficient data.")
    confidence = models.FloatField(
        default=0.95, validators=[MinValueValidator(0.5), MaxValueValidator(0.999)])
    # Quality margin in rate units (0.02 = 2 points), copied from the plan when started.
    margin = models.FloatField(validators=[MinValueValidator(0), MaxValueValidator(1)])
    status = models.CharField(max_length=STATUS_MAX_LENGTH, choices=Status.choices,
                              default=Status.RUNNING)
    stop_reason = models.TextField(blank=True)
    # Gateways of the route that cannot mirror (e.g. HAProxy), named when the run started.
    gateways_without_mirror = models.JSONField(default=list, blank=True)
    # Counters folded in from Redis by the judge: received, sampled, dropped_<reason>,
    # pairs, pair_errors, tokens.
    counters = models.JSONField(default=dict, blank=True)
    verdict = models.CharField(max_length=12, choices=Verdict.choices, blank=True)
    summary = models.CharField(max_length=600, blank=True)
    evidence_id = models.PositiveIntegerField(null=True, blank=True)
    judged_at = models.DateTimeField(null=True, blank=True)
    # What the judgement is about: the primary's and the candidate's evidence fingerprints
    # ({"primary": …, "candidate": …}, migrations_plan.evidence.pool_fingerprint) it applies
    # to. When either changes (an upgrade), the judgement restarts: only pairs received after
    # `judged_since` count, `judged_since_why` says which pool changed to what. Pairs from
    # before stay stored and exportable (history), not judged. None: every pair counts.
    judged_fingerprints = models.JSONField(default=dict, blank=True)
    judged_since = models.DateTimeField(null=True, blank=True)
    judged_since_why = models.CharField(max_length=300, blank=True)

    class Meta(PlanJob.Meta):
        indexes = [models.Index(fields=["plan", "-created_at"])]
        constraints = [
            models.UniqueConstraint(fields=["plan"], condition=Q(status="running"),
                                    name="one_running_shadow_run_per_plan"),
        ]

    def __str__(self) -> str:
        return f"shadow run {self.pk}"

    @property
    def running(self) -> bool:
        return self.status == self.Status.RUNNING


class ShadowPair(models.Model):
    """One sampled request: the primary's, the secondary's and the candidate's answers
    (metrics always; text only as the run's content policy allows) and the two comparisons
    (fleetctl.inference.compare): noise = primary vs secondary, signal = primary vs candidate."""

    class Source(models.TextChoices):
        MIRROR = "mirror", "mirrored"
        REPLAY = "replay", "replayed"

    run = models.ForeignKey(ShadowRun, on_delete=models.CASCADE, related_name="pairs")
    source = models.CharField(max_length=6, choices=Source.choices)
    received_at = models.DateTimeField()
    completed_at = models.DateTimeField(default=timezone.now)
    # sha256 of the request body as received (canonical JSON): equal requests hash equal.
    request_hash = models.CharField(max_length=64)
    greedy = models.BooleanField()
    # The request's parameters without content: model, temperature, max_tokens, stream,
    # response_format type, tool names, message count.
    params = models.JSONField(default=dict)
    # Per side ("primary", "secondary", "candidate"): endpoint, status, error, finish,
    # prompt/completion tokens, ttft_ms, tpot_ms, latency_ms, text_sha256.
    sides = models.JSONField(default=dict)
    # Content, per the run's policy ({} when off): "prompt" and one text per side (tool calls
    # as JSON), redacted when the policy says so. Emptied by the retention purge.
    content = models.JSONField(default=dict, blank=True)
    content_purged_at = models.DateTimeField(null=True, blank=True)
    # Comparison.metrics() of each comparison, plus first_divergence, edit_distance,
    # length_ratio, token_a/token_b (tokens only when content is stored).
    noise = models.JSONField(default=dict)
    signal = models.JSONField(default=dict)
    noise_diverged = models.BooleanField()
    signal_diverged = models.BooleanField()
    candidate_error = models.BooleanField(default=False)
    # How far the candidate's answer is from the primary's (normalised edit distance, 1.0 for
    # an error mismatch): the "most divergent pairs" order.
    divergence_score = models.FloatField(default=0)

    class Meta:
        ordering = ["-received_at", "-id"]
        indexes = [models.Index(fields=["run", "-received_at"]),
                   models.Index(fields=["run", "-divergence_score"])]

    def __str__(self) -> str:
        return f"pair {self.pk} of run {self.run_id}"


class ShadowJudgement(models.Model):
    """One look at a run's pairs by the judge: the time series of divergence vs noise floor
    with its confidence band, per metric."""

    run = models.ForeignKey(ShadowRun, on_delete=models.CASCADE, related_name="judgements")
    at = models.DateTimeField(default=timezone.now)
    pairs = models.PositiveIntegerField()
    verdict = models.CharField(max_length=12, choices=ShadowRun.Verdict.choices)
    # metric -> {"n", "noise_rate", "signal_rate", "estimate", "lower", "upper", "p_value",
    # "method", "verdict", "gated"}
    metrics = models.JSONField(default=dict)
    counters = models.JSONField(default=dict)
    # Per side ("primary", "secondary", "candidate") and figure ("ttft_ms", "tpot_ms",
    # "latency_ms"): {"n", "p50", "p95"} over the judged pairs' successful answers — the
    # three sides' speed on the same requests at the same moment (stats.latency_summary).
    latency = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["run", "at"]
        indexes = [models.Index(fields=["run", "at"])]

    def __str__(self) -> str:
        return f"judgement of run {self.run_id} at {self.at:%H:%M:%S}"
