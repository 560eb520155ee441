from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleetctl.evals.models import EvalSuite
from fleetctl.fleet.models import Pool
from fleetctl.schedules import selectors
from fleetctl.schedules.models import Schedule, ScheduleRun
from migrations_plan.models import Plan

HELP = {
    "kind": "benchmark (repeat the pool's last benchmark run, on another day than it), "
            "rehearsal (drain rehearsal of the plan's candidate; stage 4), conformance "
            "(probe of the pool or plan candidate), eval (eval run of the plan).",
    "plan": "The plan's name (required for rehearsal and eval); the pool is its candidate.",
    "pool": "A pool's name, for benchmark and conformance schedules without a plan.",
    "eval_suite": "Eval schedules: the suite's id; null: the plan's last eval run's suite.",
    "cron": "Five fields (minute hour day-of-month month day-of-week), read in `timezone`, "
            "e.g. \"30 2 * * 6\". A cron that never fires (31 February) is refused.",
    "timezone": "IANA time zone name the cron is read in (default UTC).",
    "window_minutes": "A run must start within this many minutes of its cron time (the "
                      "maintenance window), else it is recorded as missed (1-10080).",
    "enabled": "Disabled: nothing fires; enabling starts from the next occurrence.",
}


class ScheduleSerializer(serializers.ModelSerializer):
    plan = serializers.SlugRelatedField(slug_field="name", queryset=Plan.objects.all(),
                                        required=False, allow_null=True, help_text=HELP["plan"])
    pool = serializers.SerializerMethodField(help_text="The pool it runs on (a plan's: its "
                                                       "candidate).")
    eval_suite = serializers.PrimaryKeyRelatedField(
        queryset=EvalSuite.objects.all(), required=False, allow_null=True,
        help_text=HELP["eval_suite"])
    cron = serializers.CharField(max_length=100, help_text=HELP["cron"])
    timezone = serializers.CharField(max_length=64, required=False, default="UTC",
                                     help_text=HELP["timezone"])
    window_minutes = serializers.IntegerField(required=False, default=60,
                                              help_text=HELP["window_minutes"])
    last_outcome = serializers.CharField(read_only=True, allow_null=True, help_text=(
        "The newest run's outcome (starting, started, skipped, missed, failed, complete, "
        "cancelled); null before the first."))
    last_due_at = serializers.DateTimeField(read_only=True, allow_null=True)

    class Meta:
        model = Schedule
        fields = ["id", "kind", "plan", "pool", "eval_suite", "cron", "timezone",
                  "window_minutes", "enabled", "note", "next_run_at", "last_run_at",
                  "last_outcome", "last_due_at", "created_by", "created_at"]
        read_only_fields = ["id", "pool", "next_run_at", "last_run_at", "last_outcome",
                            "last_due_at", "created_by", "created_at"]
        extra_kwargs = {"kind": {"help_text": HELP["kind"]},
                        "enabled": {"help_text": HELP["enabled"]}}

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_pool(self, schedule: Schedule) -> str | None:
        pool = schedule.target_pool
        return pool.name if pool is not None else None


class ScheduleCreateSerializer(ScheduleSerializer):
    """The create body: `pool` is writable (a pool's name)."""

    pool = serializers.SlugRelatedField(  # type: ignore[assignment]
        slug_field="name", queryset=Pool.objects.all(), required=False, allow_null=True,
        help_text=HELP["pool"])


class ScheduleUpdateSerializer(serializers.Serializer):
    cron = serializers.CharField(max_length=100, required=False, help_text=HELP["cron"])
    timezone = serializers.CharField(max_length=64, required=False, help_text=HELP["timezone"])
    window_minutes = serializers.IntegerField(required=False,
                                              help_text=HELP["window_minutes"])
    enabled = serializers.BooleanField(required=False, help_text=HELP["enabled"])
    note = serializers.CharField(required=False, allow_blank=True)
    eval_suite = serializers.PrimaryKeyRelatedField(
        queryset=EvalSuite.objects.all(), required=False, allow_null=True,
        help_text=HELP["eval_suite"])

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        sent = set(getattr(self, "initial_data", {}) or {})
        unknown = sorted(sent - set(self.fields) - {"id"})
        if unknown:
            raise serializers.ValidationError(
                {name: [f"Not editable (editable: {', '.join(self.fields)}; to change the "
                        f"kind or target, add another schedule)."] for name in unknown})
        return attrs


class ScheduleRunSerializer(serializers.ModelSerializer):
    job_url = serializers.SerializerMethodField(help_text="The dashboard page of the job.")

    class Meta:
        model = ScheduleRun
        fields = ["id", "due_at", "occurrences", "recorded_at", "started_at", "finished_at",
                  "outcome", "job_kind", "job_id", "job_url", "detail"]
        read_only_fields = fields

    def get_job_url(self, run: ScheduleRun) -> str:
        return selectors.job_url(run)
