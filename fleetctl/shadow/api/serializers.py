"""Shadow runs over REST. Inputs are shapes and ranges only; the services decide what is
allowed (the `jobs` permission, an open plan, a route of the plan, the candidate inside the
route's residency pin, a gateway able to mirror, a trace with prompt texts, one running run
per plan) and say why when it is not."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleetctl.bench.models import Trace
from fleetctl.core.api.fields import StrictCharField, StrictFloatField, range_messages
from fleetctl.core.api.schema import ObjectField
from fleetctl.shadow.live import COUNTER_FIELDS
from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun
from fleetctl.traffic.models import Route
from migrations_plan.api.serializers import plan_by_name

# The adjustable settings of a running run (services.run_adjust).
ADJUSTABLE = ("sample_percent", "max_rps", "max_tokens_per_day", "content", "retention_hours",
              "min_pairs")
# The counters the collector and the workers keep (fleetctl/shadow/live.py), always answered
# (0 when nothing was counted yet), so a client reads every one without a missing-key case.
COUNTERS = COUNTER_FIELDS




def _sample_percent(**kwargs: Any) -> serializers.FloatField:
    return StrictFloatField(
        min_value=0.01, max_value=100,
        error_messages=range_messages("Give sample_percent as a number from 0.01 to 100: "
                                      "the percentage of the route's requests copied "
                                      "(replay: of the trace's)."),
        help_text="Mirror: share of the route's requests the gateways copy, %. Replay: share "
                  "of the trace's requests sent.", **kwargs)


def _max_rps(**kwargs: Any) -> serializers.FloatField:
    return StrictFloatField(
        min_value=0.01, max_value=1000,
        error_messages=range_messages("Give max_rps as a number from 0.01 to 1000: sampled "
                                      "requests per second sent on (each costs three calls)."),
        help_text="Spend cap: sampled requests per second sent on (each costs three calls).",
        **kwargs)


def _max_tokens_per_day(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=1000, max_value=10**12,
        error_messages=range_messages("Give max_tokens_per_day as a whole number from 1000 "
                                      "to 1000000000000: prompt + completion tokens per UTC "
                                      "day, all three sides."),
        help_text="Spend cap: prompt + completion tokens per UTC day, all three sides.",
        **kwargs)


def _content(**kwargs: Any) -> serializers.ChoiceField:
    return serializers.ChoiceField(
        choices=ShadowRun.Content.choices,
        error_messages={"invalid_choice": "Give content as full, redacted (e-mails, numbers "
                                          "and keys masked) or off (metrics and hashes only, "
                                          "no text stored); {input} is not one."},
        help_text="What is stored of prompts and answers: full, redacted, or off (no text "
                  "anywhere).", **kwargs)


def _retention_hours(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=1, max_value=24 * 90,
        error_messages=range_messages("Give retention_hours as a whole number from 1 to 2160 "
                                      "(90 days): stored text is purged this long after it "
                                      "arrived."),
        help_text="Stored prompt and answer text is purged this long after it was received.",
        **kwargs)


def _min_pairs(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=10, max_value=1_000_000,
        error_messages=range_messages("Give min_pairs as a whole number from 10 to 1000000: "
                                      "below it the verdict is insufficient data."),
        help_text="Below this many compared pairs the verdict is insufficient data.", **kwargs)


class ShadowRunCreateSerializer(serializers.Serializer):
    plan = plan_by_name(
        help_text="The plan (by name): its candidate is shadowed against its primary.")
    mode = serializers.ChoiceField(
        choices=ShadowRun.Mode.choices, default=ShadowRun.Mode.MIRROR,
        error_messages={"invalid_choice": "Give mode as mirror (copy a route's live traffic "
                                          "at its gateways) or replay (send a stored trace); "
                                          "{input} is not one."},
        help_text="mirror: copy live traffic of a route at its gateways; replay: send a "
                  "stored trace's requests (for HAProxy-only routes or quiet ones).")
    route = serializers.SlugRelatedField(
        slug_field="name", queryset=Route.objects.all(), required=False, allow_null=True,
        default=None,
        help_text="A route of the plan (by name). Default: the plan's only route.",
        error_messages={"does_not_exist": "No route named {value}; see the plan's routes at "
                                          "GET /api/v1/plans/<name>/."})
    trace = serializers.SlugRelatedField(
        slug_field="name", queryset=Trace.objects.all(), required=False, allow_null=True,
        default=None, help_text="Replay: a stored trace (by name) whose requests carry prompt "
                                "texts.",
        error_messages={"does_not_exist": "No trace named {value}; see GET "
                                          "/api/v1/bench/traces/."})
    sample_percent = _sample_percent(default=10.0)
    max_rps = _max_rps(default=2.0)
    max_tokens_per_day = _max_tokens_per_day(default=2_000_000)
    content = _content(default=ShadowRun.Content.REDACTED)
    retention_hours = _retention_hours(default=168)
    min_pairs = _min_pairs(default=200)
    confidence = StrictFloatField(
        min_value=0.5, max_value=0.999, default=0.95,
        error_messages=range_messages(
            "Give confidence as a number from 0.5 to 0.999, e.g. 0.95."),
        help_text="Confidence level of the bounds the verdict uses.")


class ShadowRunAdjustSerializer(serializers.Serializer):
    """What may change while a run is running; the rest (plan, mode, route, trace, confidence)
    is fixed for the run's evidence to mean one thing: stop it and start another."""

    sample_percent = _sample_percent(required=False)
    max_rps = _max_rps(required=False)
    max_tokens_per_day = _max_tokens_per_day(required=False)
    content = _content(required=False)
    retention_hours = _retention_hours(required=False)
    min_pairs = _min_pairs(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        fixed = sorted(set(self.initial_data) - set(ADJUSTABLE)) \
            if isinstance(self.initial_data, dict) else []
        if fixed:
            raise serializers.ValidationError({name: [
                f"{name} cannot change while the run is running; stop it and start another "
                f"run. Adjustable: {', '.join(ADJUSTABLE)}."] for name in fixed})
        if not attrs:
            raise serializers.ValidationError(
                f"Nothing to change: give one or more of {', '.join(ADJUSTABLE)}.")
        return attrs


class ShadowRunStopSerializer(serializers.Serializer):
    reason = StrictCharField(
        max_length=500, trim_whitespace=True,
        error_messages={"blank": "Say why the run is stopped (audited; shown on the run).",
                        "required": "Say why the run is stopped (audited; shown on the run)."},
        help_text="Why it is stopped: audited and shown on the run.")


@extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"},
                      "description": "received, sampled, dropped_<reason>, pairs, "
                                     "pair_errors, tokens (every one, 0 when none)."})
class CountersField(serializers.JSONField):
    """A run's counters: every known one (0 when absent) plus any other the workers keep."""

    def to_representation(self, value: Any) -> dict[str, int]:  # type: ignore[override]
        counters = {name: 0 for name in COUNTERS}
        counters.update({str(k): int(v) for k, v in (value or {}).items()})
        return counters


_FIGURE = {"type": "object", "required": ["n", "p50", "p95"], "properties": {
    "n": {"type": "integer"}, "p50": {"type": "number"}, "p95": {"type": "number"}}}


@extend_schema_field({
    "type": "object",
    "description": "Per side (primary, secondary, candidate) and figure (ttft_ms, tpot_ms: "
                   "streamed answers only; latency_ms: every answer): n, p50, p95 over the "
                   "judged pairs' successful answers, milliseconds. The sides answered the "
                   "same requests at the same moment. Empty before the first judgement.",
    "additionalProperties": {"type": "object", "additionalProperties": _FIGURE}})
class LatencyField(serializers.JSONField):
    """A judgement's latency summary per side, as the judge stored it."""


class ShadowMetricSerializer(serializers.Serializer):
    """One metric of one judgement: the candidate's rate against the noise floor's."""

    metric = serializers.CharField()
    gated = serializers.BooleanField(help_text="Counts for the verdict (else informational).")
    n = serializers.IntegerField(help_text="Pairs where both comparisons had the metric.")
    noise_rate = serializers.FloatField(allow_null=True,
                                        help_text="Primary vs secondary: the noise floor.")
    signal_rate = serializers.FloatField(allow_null=True, help_text="Primary vs candidate.")
    estimate = serializers.FloatField(allow_null=True,
                                      help_text="signal_rate − noise_rate (rate units).")
    lower = serializers.FloatField(allow_null=True)
    upper = serializers.FloatField(allow_null=True)
    p_value = serializers.FloatField(allow_null=True)
    method = serializers.CharField(allow_blank=True)
    verdict = serializers.ChoiceField(choices=ShadowRun.Verdict.choices, allow_blank=True)


def metric_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """A judgement's {metric: numbers} as rows, gated metrics first."""
    rows = []
    for name, numbers in (metrics or {}).items():
        numbers = numbers if isinstance(numbers, dict) else {}
        rows.append({
            "metric": name, "gated": bool(numbers.get("gated", False)),
            "n": int(numbers.get("n") or 0),
            **{key: _number(numbers.get(key)) for key in
               ("noise_rate", "signal_rate", "estimate", "lower", "upper", "p_value")},
            "method": str(numbers.get("method") or ""),
            "verdict": str(numbers.get("verdict") or ""),
        })
    return sorted(rows, key=lambda row: (not row["gated"], row["metric"]))


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


class ShadowJudgementSerializer(serializers.ModelSerializer):
    metrics = serializers.SerializerMethodField()
    counters = CountersField(read_only=True)
    latency = LatencyField(read_only=True)

    class Meta:
        model = ShadowJudgement
        fields = ["id", "at", "pairs", "verdict", "metrics", "counters", "latency"]
        read_only_fields = fields

    @extend_schema_field(ShadowMetricSerializer(many=True))
    def get_metrics(self, judgement: ShadowJudgement) -> list[dict[str, Any]]:
        return metric_rows(judgement.metrics)


class ShadowRunSerializer(serializers.ModelSerializer):
    plan = serializers.CharField(source="plan.name", read_only=True)
    route = serializers.CharField(source="route.name", read_only=True, allow_null=True,
                                  default=None)
    candidate = serializers.CharField(source="candidate.name", read_only=True)
    primary = serializers.CharField(source="primary.name", read_only=True)
    model = serializers.CharField(source="model_id", read_only=True)
    trace = serializers.CharField(source="trace.name", read_only=True, allow_null=True,
                                  default=None)
    # Blank until the first judgement: documented, so a generated client accepts "".
    verdict = serializers.ChoiceField(choices=ShadowRun.Verdict.choices, allow_blank=True,
                                      read_only=True)
    gateways_without_mirror = serializers.ListField(
        child=serializers.CharField(), read_only=True,
        help_text="Gateways of the route that cannot mirror (HAProxy), named at the start.")
    url = serializers.SerializerMethodField(help_text="The run's dashboard page.")
    judged_since = serializers.DateTimeField(
        read_only=True, allow_null=True,
        help_text="The judgement counts only pairs received after this (a pool of the run "
                  "changed then); null: every pair counts. Earlier pairs stay exportable.")
    judged_since_why = serializers.CharField(
        read_only=True, help_text="Which pool changed to what, when judged_since is set.")
    # The job columns (migrations_plan/jobs.py) under the names this API has always used.
    stopped_by = serializers.CharField(source="cancelled_by", read_only=True)
    stopped_at = serializers.DateTimeField(source="finished_at", read_only=True,
                                           allow_null=True)

    class Meta:
        model = ShadowRun
        fields = ["id", "plan", "route", "candidate", "primary", "model", "mode", "trace",
                  "sample_percent", "max_rps", "max_tokens_per_day", "content",
                  "retention_hours", "min_pairs", "confidence", "margin", "status",
                  "stop_reason", "verdict", "summary", "gateways_without_mirror",
                  "evidence_id", "judged_at", "judged_since", "judged_since_why",
                  "created_by", "created_at", "stopped_by", "stopped_at", "url"]
        read_only_fields = fields

    def get_url(self, run: ShadowRun) -> str:
        return f"/shadow/runs/{run.pk}/"


class ShadowRunDetailSerializer(ShadowRunSerializer):
    """The run with what is live: counters (Redis merged with the judge's fold), the latest
    judgement's per-metric numbers, the evidence it recorded and whether the route's gateways
    can mirror at all."""

    counters = serializers.SerializerMethodField()
    latest_judgement = serializers.SerializerMethodField()
    evidence_url = serializers.SerializerMethodField(
        help_text="The `shadow` evidence the run recorded last (null before the first).")
    mirror_supported = serializers.SerializerMethodField(
        help_text="Whether at least one gateway of the route can mirror (HAProxy cannot).")
    mirror_note = serializers.SerializerMethodField(
        help_text="What mirror_supported means for this run, for a person (may be empty).")

    class Meta(ShadowRunSerializer.Meta):
        fields = [*ShadowRunSerializer.Meta.fields, "counters", "latest_judgement",
                  "evidence_url", "mirror_supported", "mirror_note"]
        read_only_fields = fields

    @extend_schema_field(CountersField())
    def get_counters(self, run: ShadowRun) -> dict[str, int]:
        live = self.context.get("live_counters")
        return CountersField().to_representation(run.counters if live is None else live)

    @extend_schema_field(ShadowJudgementSerializer(allow_null=True))
    def get_latest_judgement(self, run: ShadowRun) -> dict[str, Any] | None:
        latest = self.context.get("latest_judgement")
        return ShadowJudgementSerializer(latest).data if latest is not None else None

    def get_evidence_url(self, run: ShadowRun) -> str | None:
        return f"/api/v1/evidence/{run.evidence_id}/" if run.evidence_id else None

    def get_mirror_supported(self, run: ShadowRun) -> bool:
        return self._mirror(run)[0]

    def get_mirror_note(self, run: ShadowRun) -> str:
        return self._mirror(run)[1]

    def _mirror(self, run: ShadowRun) -> tuple[bool, str]:
        """Both fields from one look at the route's gateways."""
        seen: dict[int, tuple[bool, str]] = self.__dict__.setdefault("_mirror_seen", {})
        if run.pk not in seen:
            seen[run.pk] = mirror_support(run)
        return seen[run.pk]


def mirror_support(run: ShadowRun) -> tuple[bool, str]:
    """(can any gateway of the run's route mirror, a note for a person). Read from the
    gateways' kinds now, since gateways join and leave a route after the run started."""
    if run.route is None:
        return False, "The run's route was deleted: nothing is mirrored."
    gateways = list(run.route.gateways.all())
    able = [g.name for g in gateways if g.supports_mirror]
    unable = [g.name for g in gateways if not g.supports_mirror]
    if not gateways:
        return False, (f"Route {run.route.name} has no gateway: nothing can be mirrored; "
                       "replay a trace instead.")
    if not able:
        return False, (f"HAProxy cannot mirror: no gateway of route {run.route.name} copies "
                       f"its requests ({', '.join(unable)}); start a replay run instead.")
    if unable:
        return True, (f"Only {', '.join(able)} mirror; {', '.join(unable)} cannot (HAProxy), "
                      "so requests through them are not sampled.")
    return True, ""


class ShadowPairSerializer(serializers.ModelSerializer):
    params = ObjectField(read_only=True, help_text="The request's parameters, no content.")
    sides = ObjectField(read_only=True, help_text="primary, secondary, candidate: endpoint, "
                                                  "status, error, finish, tokens, timings.")
    noise = ObjectField(read_only=True, help_text="Primary vs secondary (the noise floor).")
    signal = ObjectField(read_only=True, help_text="Primary vs candidate.")
    content = serializers.SerializerMethodField(
        help_text="prompt and one text per side, as the run's content policy stored them; "
                  "null when it stores none (off) or the retention purge emptied it.")

    class Meta:
        model = ShadowPair
        fields = ["id", "source", "received_at", "completed_at", "request_hash", "greedy",
                  "params", "sides", "noise", "signal", "noise_diverged", "signal_diverged",
                  "candidate_error", "divergence_score", "content", "content_purged_at"]
        read_only_fields = fields

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_content(self, pair: ShadowPair) -> dict[str, Any] | None:
        return pair.content or None
