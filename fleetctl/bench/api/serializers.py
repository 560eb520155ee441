"""Benchmarks over REST: traces, runs, their levels and per-request samples. Inputs are shapes
only; the services decide what is allowed (the `jobs` permission, SLO ranges, pools that
serve the model) and say why when it is not."""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from fleetctl.bench import selectors
from fleetctl.bench.models import DEFAULT_WARMUP_S, DEFAULT_WINDOW_S, Level, Run, Sample, Trace
from fleetctl.core.api.fields import StrictCharField
from fleetctl.core.api.schema import OBJECT_SCHEMA, ObjectField
from fleetctl.fleet.api.serializers import pool_by_name
from fleetctl.fleet.models import Pool

SOURCES = ("auto", "fleetctl", "mooncake", "azure-csv")
LENGTH_HELP = ('A token count (constant) or {"kind": "constant|uniform|lognormal|empirical", …}, '
               'e.g. {"kind": "uniform", "lo": 64, "hi": 512} (see TRACES.md).')
ARRIVAL_HELP = ('{"kind": "constant|poisson|bursty|on_off", …}, e.g. {"kind": "poisson", '
                '"rate": 5}. Default: Poisson at 10 requests/s.')


# --- traces ----------------------------------------------------------------------------------

@extend_schema_field({"oneOf": [{"type": "integer"}, OBJECT_SCHEMA]})
class LengthField(serializers.JSONField):
    """A token count, or a distribution object (checked by the trace generator)."""


@extend_schema_field({**OBJECT_SCHEMA, "nullable": True})
class ArrivalField(serializers.JSONField):
    """An arrival process object, or null (checked by the trace generator)."""


class TraceSerializer(serializers.ModelSerializer):
    summary = ObjectField(read_only=True, help_text="Counts and token statistics.")
    generator = ObjectField(read_only=True,
                            help_text="How a generated trace was made ({} for an upload).")

    class Meta:
        model = Trace
        fields = ["name", "description", "source", "requests", "duration_s", "sha256",
                  "summary", "generator", "created_by", "created_at"]
        read_only_fields = fields


class TraceUploadSerializer(serializers.Serializer):
    name = StrictCharField(max_length=63, help_text="Lowercase letters, digits and hyphens.")
    description = serializers.CharField(required=False, allow_blank=True, default="")
    # The metaclass moves declared fields off the class, so this does not hide Field.source.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=SOURCES, default="auto", help_text="auto detects the format from the first line.")
    file = serializers.FileField(
        allow_empty_file=True,  # the service says "the trace has no requests"
        help_text="fleetctl JSONL, Mooncake JSONL or Azure CSV; read line by line.")


class TraceGenerateSerializer(serializers.Serializer):
    name = StrictCharField(max_length=63)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    n = serializers.IntegerField(min_value=1, max_value=1_000_000, default=1000,
                                 help_text="How many requests.")
    seed = serializers.IntegerField(default=0, help_text="Same seed, same trace.")
    prompt_tokens = LengthField(default=512, help_text=LENGTH_HELP)  # type: ignore[arg-type]
    completion_tokens = LengthField(default=128,  # type: ignore[arg-type]
                                    help_text=LENGTH_HELP)
    arrival = ArrivalField(required=False, allow_null=True, default=None,
                                    help_text=ARRIVAL_HELP)
    shared_prefix_groups = serializers.IntegerField(min_value=0, default=0)
    shared_prefix_tokens = serializers.IntegerField(min_value=0, default=0)
    latency_class = serializers.ChoiceField(choices=["interactive", "standard", "batch"],
                                            required=False, allow_null=True, default=None)


# --- runs ------------------------------------------------------------------------------------

class LevelsField(serializers.ListField):
    """A list of concurrency levels: whole numbers ≥ 1 (not "4", not 4.5, not true)."""

    child = serializers.IntegerField()
    default_error_messages = {
        "levels": "Give concurrency levels as a list of whole numbers ≥ 1, e.g. [1, 4, 16, 64];"
                  " {value} is not one.",
    }

    def to_internal_value(self, data: Any) -> list[int]:
        if not isinstance(data, list):
            self.fail("not_a_list", input_type=type(data).__name__)
        for value in data:
            if type(value) is not int or value < 1:
                self.fail("levels", value=json_text(value))
        return list(data)


class SpeedsField(serializers.ListField):
    """Trace speed factors: numbers > 0 and ≤ 1000 (not "2", not true)."""

    child = serializers.FloatField()
    default_error_messages = {
        "speeds": "Give trace speeds as a list of numbers > 0 and ≤ 1000, e.g. [0.5, 1, 2, 4]"
                  " (1 = the trace's own timing); {value} is not one.",
    }

    def to_internal_value(self, data: Any) -> list[float]:
        import math

        if not isinstance(data, list):
            self.fail("not_a_list", input_type=type(data).__name__)
        for value in data:
            if (type(value) not in (int, float) or not math.isfinite(value)
                    or not 0 < value <= 1000):
                self.fail("speeds", value=json_text(value))
        return [float(v) for v in data]


def json_text(value: Any) -> str:
    import json

    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


# Component names say "Bench": another app has runs of its own (conformance probes).
@extend_schema_serializer(component_name="BenchRunCreate")
class RunCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    trace = serializers.SlugRelatedField(
        slug_field="name", queryset=Trace.objects.all(),
        error_messages={"does_not_exist": "No trace named {value}; see GET /api/v1/bench/traces/."})
    pools = pool_by_name(many=True)
    model_id = StrictCharField(max_length=200, help_text="The model every pool must serve.")
    mode = serializers.ChoiceField(choices=Run.Mode.choices, default=Run.Mode.SEARCH)
    levels = LevelsField(required=False, default=list,
                         help_text="mode=levels: the concurrency levels, e.g. [1, 4, 16].")
    timing = serializers.ChoiceField(
        choices=Run.Timing.choices, default=Run.Timing.CONCURRENCY,
        help_text="concurrency: fixed streams (mode, levels); trace: the trace's own arrival "
                  "times scaled by each of `speeds` (mode and levels are ignored).")
    speeds = SpeedsField(required=False, default=list,
                         help_text="timing=trace: speed factors, e.g. [0.5, 1, 2, 4].")
    max_concurrency = serializers.IntegerField(default=256, help_text="mode=search: the ceiling.")
    slo_ttft_p95_ms = serializers.FloatField(help_text="1 … 600,000 ms")
    slo_tpot_p95_ms = serializers.FloatField(help_text="0.1 … 10,000 ms")
    slo_error_rate = serializers.FloatField(help_text="0 … 0.5 (errors and timeouts / measured)")
    warmup_s = serializers.FloatField(
        default=DEFAULT_WARMUP_S, help_text="Seconds per level before the window (0 … 600).")
    window_s = serializers.FloatField(
        default=DEFAULT_WINDOW_S, help_text="Steady-state seconds per level (0.5 … 3600).")
    ramp_s = serializers.FloatField(
        required=False, allow_null=True, default=None,
        help_text="timing=concurrency: seconds over which a level's streams send their first "
                  "requests (0 … warmup_s); null = half the warm-up.")
    min_samples = serializers.IntegerField(default=30)
    shards = serializers.IntegerField(default=1, help_text="Client processes per level (1 … 64).")
    lag_limit_ms = serializers.FloatField(default=25.0)

    def validate_pools(self, pools: list[Pool]) -> list[Pool]:
        if not pools:
            raise serializers.ValidationError("Name at least one pool.")
        return pools


class LevelSerializer(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.name", read_only=True)
    summary = ObjectField(read_only=True, help_text="The level's measured numbers.")

    class Meta:
        model = Level
        fields = ["id", "pool", "concurrency", "speed", "attempt", "verdict", "binding", "note",
                  "output_tokens_per_s", "ttft_p95_ms", "tpot_p95_ms", "error_rate",
                  "cost_per_1m", "summary", "started_at", "finished_at"]
        read_only_fields = fields


@extend_schema_serializer(component_name="BenchRun")
class RunSerializer(serializers.ModelSerializer):
    trace = serializers.CharField(source="trace.name", read_only=True)
    pools: Any = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    url = serializers.SerializerMethodField(help_text="The run's dashboard page.")
    levels = serializers.ListField(child=serializers.IntegerField(), read_only=True,
                                   help_text="mode=levels: the concurrency levels.")
    speeds = serializers.ListField(child=serializers.FloatField(), read_only=True,
                                   help_text="timing=trace: speed factors, e.g. [0.5, 1, 2, 4].")

    class Meta:
        model = Run
        fields = ["id", "name", "trace", "pools", "model_id", "mode", "levels", "timing", "speeds",
                  "max_concurrency", "slo_ttft_p95_ms", "slo_tpot_p95_ms", "slo_error_rate",
                  "warmup_s", "window_s", "ramp_s", "min_samples", "shards", "lag_limit_ms",
                  "status",
                  "error", "created_by", "created_at", "started_at", "finished_at", "url"]
        read_only_fields = fields

    def get_url(self, run: Run) -> str:
        return f"/bench/runs/{run.pk}/"


class PoolResultSerializer(serializers.Serializer):
    """One pool's answer: its highest SLO-passing level (null: none passed)."""

    pool = serializers.CharField()
    currency = serializers.CharField()
    node_hourly_rate = serializers.CharField()
    best_concurrency = serializers.IntegerField(allow_null=True)
    best_speed = serializers.FloatField(
        allow_null=True, help_text="timing=trace: the highest trace speed that met the SLO.")
    output_tokens_per_s = serializers.FloatField(allow_null=True)
    ttft_p95_ms = serializers.FloatField(allow_null=True)
    tpot_p95_ms = serializers.FloatField(allow_null=True)
    error_rate = serializers.FloatField(allow_null=True)
    binding = serializers.CharField(allow_null=True,
                                    help_text="The SLO term closest to its limit.")
    cost_per_1m = serializers.CharField(
        allow_null=True, help_text="node hourly rate / output tokens per s × 1e6 / 3600")
    cost_formula = serializers.CharField()
    client_bound = serializers.BooleanField(
        help_text="The search stopped because the client, not the server, set the pace.")
    note = serializers.CharField()


class ProgressSerializer(serializers.Serializer):
    status = serializers.CharField()
    doing = serializers.CharField(help_text="What is being measured now.")
    levels_done = serializers.IntegerField()
    levels_planned = serializers.IntegerField(allow_null=True,
                                              help_text="null in search mode")
    percent = serializers.IntegerField(allow_null=True)


@extend_schema_serializer(component_name="BenchRunDetail")
class RunDetailSerializer(RunSerializer):
    progress = serializers.SerializerMethodField()
    results = serializers.SerializerMethodField()
    level_rows = serializers.SerializerMethodField()

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "progress", "results", "level_rows"]
        read_only_fields = fields

    def _levels(self, run: Run) -> list[Level]:
        cache = cast(dict[str, Any], self.context).setdefault("_levels", {})
        if run.pk not in cache:
            cache[run.pk] = list(selectors.run_levels(run=run))
        return cache[run.pk]  # type: ignore[no-any-return]

    @extend_schema_field(ProgressSerializer)
    def get_progress(self, run: Run) -> dict[str, Any]:
        return selectors.run_progress(run=run, levels=self._levels(run)).as_dict()

    @extend_schema_field(PoolResultSerializer(many=True))
    def get_results(self, run: Run) -> list[dict[str, Any]]:
        return [outcome.as_dict() for outcome in selectors.run_outcomes(run=run)]

    @extend_schema_field(LevelSerializer(many=True))
    def get_level_rows(self, run: Run) -> Any:
        return LevelSerializer(self._levels(run), many=True).data


class SampleSerializer(serializers.ModelSerializer):
    pool = serializers.CharField(source="level.pool.name", read_only=True)
    concurrency = serializers.IntegerField(source="level.concurrency", read_only=True)
    speed = serializers.FloatField(source="level.speed", read_only=True, allow_null=True)
    attempt = serializers.IntegerField(source="level.attempt", read_only=True)
    itl_s = serializers.ListField(child=serializers.FloatField(), read_only=True,
                                  help_text="Seconds between consecutive streamed tokens.")

    class Meta:
        model = Sample
        fields = ["pool", "concurrency", "speed", "attempt", "shard", "index", "stream",
                  "endpoint", "warmup", "status",
                  "http_status", "scheduled_s", "schedule_lag_s", "ttft_s", "tpot_s", "e2e_s",
                  "itl_s", "input_tokens", "output_tokens", "window_tokens", "tokens_source",
                  "error"]
        read_only_fields = fields


class ExportSampleSerializer(SampleSerializer):
    verdict = serializers.CharField(source="level.verdict", read_only=True)

    class Meta(SampleSerializer.Meta):
        fields = [*SampleSerializer.Meta.fields[:4], "verdict", *SampleSerializer.Meta.fields[4:]]
        read_only_fields = fields


@extend_schema_serializer(component_name="BenchRunExport")
class RunExportSerializer(RunDetailSerializer):
    """For the schema only: what …/export.json streams (exports.json_chunks)."""

    samples = ExportSampleSerializer(many=True, read_only=True)

    class Meta(RunDetailSerializer.Meta):
        fields = [*RunDetailSerializer.Meta.fields, "samples"]
        read_only_fields = fields


__all__ = ["LevelSerializer", "RunCreateSerializer", "RunDetailSerializer", "RunExportSerializer",
           "RunSerializer", "SampleSerializer", "TraceGenerateSerializer", "TraceSerializer",
           "TraceUploadSerializer"]
