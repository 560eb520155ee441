"""Eval suites and runs over REST. Inputs are shapes and ranges only; the services decide what
is allowed (the `jobs` permission, a suite that is not retired, distinct pools that serve the
model, a suite file whose every line is valid) and say why when it is not."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from fleetctl.core.api.fields import (
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    range_messages,
)
from fleetctl.core.api.schema import OBJECT_SCHEMA, ObjectField
from fleetctl.evals import selectors
from fleetctl.evals.models import EvalItem, EvalResult, EvalRun, EvalRunPool, EvalSuite
from fleetctl.fleet.api.serializers import TaskCostSerializer, pool_by_name
from migrations_plan.api.serializers import plan_by_name

STRINGS = {"type": "array", "items": {"type": "string"}}
COUNTS = {"type": "object", "additionalProperties": {"type": "integer"}}


def _ranged(message: str) -> dict[str, Any]:
    """The range's text also when the value is missing."""
    return range_messages(message, "required")




def _pool_field(help_text: str, **kwargs: Any) -> serializers.SlugRelatedField:
    return pool_by_name(help_text=help_text,
                        error_messages={"invalid": "Give a pool by its name (text)."}, **kwargs)


# --- suites ----------------------------------------------------------------------------------

@extend_schema_field(COUNTS)
class CountsField(serializers.JSONField):
    """{tag or scorer: items}."""


class EvalSuiteSerializer(serializers.ModelSerializer):
    retired = serializers.BooleanField(read_only=True,
                                       help_text="Retired suites cannot start runs.")
    generator = ObjectField(read_only=True, help_text="Bundled: {family, seed, n}, enough to "
                                                      "generate it again byte for byte.")
    decoding = ObjectField(read_only=True, help_text="Request parameters every item is sent "
                                                     "with unless it says otherwise.")
    tags = CountsField(read_only=True, help_text="Tag → items.")
    scorers = CountsField(read_only=True, help_text="Scorer → items.")
    # The metaclass moves declared fields off the class, so this does not hide Field.label.
    label = serializers.CharField(  # type: ignore[assignment]
        read_only=True, help_text="name vN")
    url = serializers.SerializerMethodField(help_text="The suite's dashboard page.")
    download_url = serializers.SerializerMethodField(
        help_text="The canonical JSONL (its SHA-256 is `sha256`).")

    class Meta:
        model = EvalSuite
        fields = ["id", "name", "version", "label", "sha256", "description", "source",
                  "generator", "decoding", "item_count", "tags", "scorers", "retired",
                  "retired_at", "retired_by", "created_by", "created_at", "url", "download_url"]
        read_only_fields = fields

    def get_url(self, suite: EvalSuite) -> str:
        return f"/evals/suites/{suite.pk}/"

    def get_download_url(self, suite: EvalSuite) -> str:
        return f"/api/v1/eval-suites/{suite.pk}/download/"


class EvalSuiteUploadedSerializer(EvalSuiteSerializer):
    """The suite an upload made or found: `created` false when the same content was already
    stored under that name (that version is answered, nothing new is stored)."""

    created = serializers.SerializerMethodField(
        help_text="true: a new version was stored; false: identical content already existed "
                  "as this version.")
    message = serializers.SerializerMethodField(help_text="What happened, for a person.")

    class Meta(EvalSuiteSerializer.Meta):
        fields = [*EvalSuiteSerializer.Meta.fields, "created", "message"]
        read_only_fields = fields

    def get_created(self, suite: EvalSuite) -> bool:
        return bool(self.context.get("created"))

    def get_message(self, suite: EvalSuite) -> str:
        if self.context.get("created"):
            return (f"Stored {suite.name} v{suite.version}: {suite.item_count} items, "
                    f"sha256 {suite.sha256}.")
        return (f"Identical content is already stored as {suite.name} v{suite.version} "
                f"(sha256 {suite.sha256}); no new version was made.")


class EvalSuiteUploadSerializer(serializers.Serializer):
    # Blank or not a slug: the service says what a name is, naming the field.
    name = StrictCharField(max_length=63, allow_blank=True,
                           error_messages={"max_length": "Use 1-63 lowercase letters, digits "
                                                         "and hyphens."},
                           help_text="Lowercase letters, digits and hyphens; an upload with "
                                     "an existing name makes its next version.")
    description = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=10_000,
        error_messages={"max_length": "At most 10,000 characters; shorten it."},
        help_text="Default: the file header's description.")
    file = serializers.FileField(
        allow_empty_file=True,  # the service says "the suite has no items"
        help_text="The suite as JSONL (an optional header line, then one item per line); read "
                  "line by line, every bad line reported with its number, nothing stored.")


class EvalSuiteBundledSerializer(serializers.Serializer):
    names = serializers.ListField(
        child=StrictCharField(max_length=63), required=False, default=list, max_length=20,
        help_text="Which bundled suites (default: all of them: fleetctl-core and one per "
                  "family).")

    def validate_names(self, names: list[str]) -> list[str]:
        from fleetctl.evals import bundled

        unknown = [n for n in names if n not in bundled.SUITES]
        if unknown:
            raise serializers.ValidationError(
                f"No bundled suite named {', '.join(unknown)}; bundled suites: "
                f"{', '.join(sorted(bundled.SUITES))}.")
        return names


@extend_schema_field({"type": "array", "nullable": True, "items": OBJECT_SCHEMA})
class MessagesField(serializers.JSONField):
    """Chat messages ({role, content}), or null for a prompt item."""


class EvalItemSerializer(serializers.ModelSerializer):
    messages = MessagesField(read_only=True)
    references = serializers.ListField(child=serializers.CharField(), read_only=True)
    params = ObjectField(read_only=True, help_text="The scorer's parameters, defaults filled.")
    tags = serializers.ListField(child=serializers.CharField(), read_only=True)
    request = ObjectField(read_only=True,
                          help_text="Item-level request parameters over the suite's decoding.")

    class Meta:
        model = EvalItem
        fields = ["position", "item_id", "messages", "prompt", "references", "scorer",
                  "params", "tags", "request"]
        read_only_fields = fields


# --- runs ------------------------------------------------------------------------------------

class EvalRunCreateSerializer(serializers.Serializer):
    suite = StrictCharField(
        max_length=80,
        help_text='The suite: its id, its name (the newest version that is not retired) or '
                  '"name@version".')
    candidate = _pool_field("The pool judged. Default: the plan's candidate.",
                            required=False, allow_null=True, default=None)
    primary = _pool_field("The pool it is compared with, item by item. Default: the plan's "
                          "primary.", required=False, allow_null=True, default=None)
    others = serializers.ListField(
        child=_pool_field("Another pool scored alongside (not judged)."),
        required=False, default=list, max_length=8,
        help_text="More pools scored on the same items (no verdict of their own).")
    plan = plan_by_name(
        required=False, allow_null=True, default=None,
        help_text="A plan: candidate, primary, model and margin default to its; the run's "
                  "evidence is recorded for it.",
        error_messages={"invalid": "Give the plan by its name (text)."})
    model = StrictCharField(max_length=200, required=False, allow_blank=True, default="",
                            help_text="Default: the plan's model, else the one model every "
                                      "pool serves.")
    concurrency = StrictIntegerField(
        min_value=1, max_value=256, default=16,
        error_messages=_ranged("Give concurrency as a whole number from 1 to 256: requests "
                               "in flight at once, across the run's pools."),
        help_text="Requests in flight at once, across the run's pools.")
    max_rps = StrictFloatField(
        min_value=0.01, max_value=10000, required=False, allow_null=True, default=None,
        error_messages=_ranged("Give max_rps as a number from 0.01 to 10000 requests per "
                               "second (or null: no limit)."),
        help_text="Requests per second across the run's pools (null: no limit).")
    timeout_s = StrictFloatField(
        min_value=1, max_value=3600, default=120,
        error_messages=_ranged("Give timeout_s as a number of seconds from 1 to 3600."),
        help_text="Seconds an answer may take.")
    max_attempts = StrictIntegerField(
        min_value=1, max_value=10, default=3,
        error_messages=_ranged("Give max_attempts as a whole number from 1 to 10 (a retry "
                               "only after a transport error before any byte)."),
        help_text="Attempts per item; a retry only after a transport error before any byte.")
    decoding = serializers.DictField(
        required=False, allow_null=True, default=None,
        help_text="Overrides of the suite's decoding: temperature, top_p, seed, max_tokens.")
    margin_pct = StrictFloatField(
        min_value=0, max_value=100, required=False, allow_null=True, default=None,
        error_messages=_ranged("Give margin_pct as a number of percentage points from 0 to "
                               "100 (default: the plan's quality margin, else 2)."),
        help_text="Score points the candidate may lose (default: the plan's quality margin).")
    confidence = StrictFloatField(
        min_value=0.5, max_value=0.999, default=0.95,
        error_messages=_ranged("Give confidence as a number from 0.5 to 0.999, e.g. 0.95."),
        help_text="Of the intervals the verdict reads.")
    min_items = StrictIntegerField(
        min_value=1, max_value=1_000_000, default=100,
        error_messages=_ranged("Give min_items as a whole number from 1 to 1000000: below "
                               "it the verdict is insufficient data."),
        help_text="Items scored on both pools below which the verdict is insufficient.")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("candidate") is None and data.get("plan") is None:
            raise serializers.ValidationError({"candidate": [
                "Name the candidate pool, or a plan (its candidate is used)."]})
        return data


class EvalRunPoolSerializer(serializers.ModelSerializer):
    name = serializers.CharField(source="pool.name", read_only=True)
    fingerprint = ObjectField(read_only=True,
                              help_text="The pool's runtime, driver and model revision when "
                                        "the run was created.")
    endpoints = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = EvalRunPool
        fields = ["name", "role", "position", "fingerprint", "endpoints"]
        read_only_fields = fields


@extend_schema_serializer(component_name="EvalSuiteRef")
class SuiteRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    version = serializers.IntegerField()
    sha256 = serializers.CharField(help_text="The pin the run used (the suite's digest).")


@extend_schema_serializer(component_name="EvalProgress")
class ProgressSerializer(serializers.Serializer):
    done = serializers.IntegerField(help_text="Result rows scored.")
    total = serializers.IntegerField(help_text="Items × pools.")
    percent = serializers.FloatField(help_text="done / total × 100, to 0.1.")


@extend_schema_serializer(component_name="EvalRun")
class EvalRunSerializer(serializers.ModelSerializer):
    plan = serializers.CharField(source="plan.name", read_only=True, allow_null=True,
                                 default=None)
    suite = serializers.SerializerMethodField()
    candidate = serializers.SerializerMethodField(help_text="The candidate pool's name.")
    primary = serializers.SerializerMethodField(help_text="The primary pool's name, if any.")
    model = serializers.CharField(source="model_id", read_only=True)
    decoding = ObjectField(read_only=True)
    progress = serializers.SerializerMethodField()
    # Blank until the run finishes: documented, so a generated client accepts "".
    verdict = serializers.ChoiceField(choices=EvalRun.Verdict.choices, allow_blank=True,
                                      read_only=True)
    margin_pct = serializers.SerializerMethodField(help_text="margin × 100, score points.")
    url = serializers.SerializerMethodField(help_text="The run's dashboard page.")

    class Meta:
        model = EvalRun
        fields = ["id", "plan", "plan_stage", "suite", "candidate", "primary", "model",
                  "status", "progress", "verdict", "summary", "decoding", "concurrency",
                  "max_rps", "timeout_s", "max_attempts", "margin", "margin_pct",
                  "confidence", "min_items", "evidence_id", "live_evidence_id", "error",
                  "created_by", "created_at", "started_at", "finished_at", "cancelled_by",
                  "resumed", "url"]
        read_only_fields = fields

    def _pools(self, run: EvalRun) -> list[EvalRunPool]:
        return list(run.run_pools.all())

    def _role(self, run: EvalRun, role: str) -> str | None:
        return next((rp.pool.name for rp in self._pools(run) if rp.role == role), None)

    @extend_schema_field(SuiteRefSerializer)
    def get_suite(self, run: EvalRun) -> dict[str, Any]:
        return {"id": run.suite_id, "name": run.suite.name, "version": run.suite.version,
                "sha256": run.suite_sha256}

    def get_candidate(self, run: EvalRun) -> str | None:
        return self._role(run, EvalRunPool.Role.CANDIDATE)

    @extend_schema_field({"type": "string", "nullable": True})
    def get_primary(self, run: EvalRun) -> str | None:
        return self._role(run, EvalRunPool.Role.PRIMARY)

    @extend_schema_field(ProgressSerializer)
    def get_progress(self, run: EvalRun) -> dict[str, Any]:
        percent = round(100 * run.done / run.total, 1) if run.total else 0.0
        return {"done": run.done, "total": run.total, "percent": percent}

    def get_margin_pct(self, run: EvalRun) -> float:
        return round(run.margin * 100, 6)

    def get_url(self, run: EvalRun) -> str:
        return f"/evals/runs/{run.pk}/"


@extend_schema_serializer(component_name="EvalRunDetail")
class EvalRunDetailSerializer(EvalRunSerializer):
    """The run with its pools (role, fingerprint, endpoints), its statistics and the evidence
    it recorded."""

    pools = serializers.SerializerMethodField()
    stats = ObjectField(
        read_only=True,
        help_text="Per pool {n, score, lower, upper, method}; paired {n, estimate, lower, "
                  "upper, p_value, method, verdict, …}; per tag; verdict and summary "
                  "(fleetctl/evals/stats.py). Empty until there are scores.")
    evidence_url = serializers.SerializerMethodField(
        help_text="The `eval` evidence the run recorded (null until it finished).")
    live_evidence_url = serializers.SerializerMethodField(
        help_text="The `live-quality` evidence of runs made before eval runs stopped "
                  "recording it (now always null: only a stage-4 shadow run records it).")

    task_costs = serializers.SerializerMethodField(
        help_text="Per pool, its cost per item passed (full marks): the pool's hourly rate × "
                  "the run's time ÷ the items it passed; failed items and retries counted in "
                  "the spend.")

    class Meta(EvalRunSerializer.Meta):
        fields = [*EvalRunSerializer.Meta.fields, "pools", "stats", "evidence_url",
                  "live_evidence_url", "task_costs"]
        read_only_fields = fields

    @extend_schema_field(TaskCostSerializer(many=True))
    def get_task_costs(self, run: EvalRun) -> Any:
        return TaskCostSerializer([c.as_dict() for c in selectors.run_task_costs(run)],
                                  many=True).data

    @extend_schema_field(EvalRunPoolSerializer(many=True))
    def get_pools(self, run: EvalRun) -> Any:
        return EvalRunPoolSerializer(self._pools(run), many=True).data

    @extend_schema_field({"type": "string", "nullable": True})
    def get_evidence_url(self, run: EvalRun) -> str | None:
        return f"/api/v1/evidence/{run.evidence_id}/" if run.evidence_id else None

    @extend_schema_field({"type": "string", "nullable": True})
    def get_live_evidence_url(self, run: EvalRun) -> str | None:
        return f"/api/v1/evidence/{run.live_evidence_id}/" if run.live_evidence_id else None


class EvalResultSerializer(serializers.ModelSerializer):
    pool = serializers.CharField(source="run_pool.pool.name", read_only=True)
    role = serializers.CharField(source="run_pool.role", read_only=True)
    item = serializers.CharField(source="item.item_id", read_only=True)
    tags = serializers.ListField(source="item.tags", child=serializers.CharField(),
                                 read_only=True)
    attempts = serializers.ListField(child=ObjectField(), read_only=True,
                                     help_text="Every attempt: {at, endpoint, ms, error}.")
    tool_calls = serializers.ListField(child=ObjectField(), read_only=True)

    class Meta:
        model = EvalResult
        fields = ["id", "position", "pool", "role", "item", "tags", "status", "attempts",
                  "endpoint", "http_status", "error", "text", "tool_calls", "finish_reason",
                  "score", "reason", "extracted", "prompt_tokens", "completion_tokens",
                  "ttft_ms", "latency_ms", "scored_at"]
        read_only_fields = fields


@extend_schema_serializer(component_name="EvalDiffSide")
class DiffSideSerializer(serializers.Serializer):
    pool = serializers.CharField()
    score = serializers.FloatField()
    reason = serializers.CharField()
    extracted = serializers.CharField()
    text = serializers.CharField()
    error = serializers.CharField()
    endpoint = serializers.CharField(help_text="The endpoint that answered.")


class EvalDiffSerializer(serializers.Serializer):
    """One item the candidate and the primary scored differently, side by side."""

    item = serializers.CharField(help_text="The item's id in its suite.")
    position = serializers.IntegerField(help_text="The item's position in its suite.")
    direction = serializers.ChoiceField(choices=["regressed", "improved"],
                                        help_text="regressed: the candidate scored lower.")
    delta = serializers.FloatField(help_text="candidate score − primary score.")
    tags = serializers.ListField(child=serializers.CharField())
    scorer = serializers.CharField()
    prompt = serializers.CharField(help_text="The prompt, or the last user message.")
    references = serializers.ListField(child=serializers.CharField())
    candidate = DiffSideSerializer()
    primary = DiffSideSerializer()


__all__ = ["EvalDiffSerializer", "EvalItemSerializer", "EvalResultSerializer",
           "EvalRunCreateSerializer", "EvalRunDetailSerializer", "EvalRunSerializer",
           "EvalSuiteBundledSerializer", "EvalSuiteSerializer", "EvalSuiteUploadSerializer",
           "EvalSuiteUploadedSerializer"]
