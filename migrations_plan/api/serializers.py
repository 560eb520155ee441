"""Plans, gates, checks, approvals and evidence over REST. Inputs are shapes only: the
services decide what is allowed and say why when it is not."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleetctl.core.api.fields import StrictCharField, by_name
from fleetctl.core.api.schema import NullableObjectField, ObjectField
from fleetctl.fleet.api.serializers import pool_by_name
from fleetctl.traffic.models import Route
from migrations_plan import evidence as ev
from migrations_plan import permissions, selectors
from migrations_plan.models import (
    STAGE_NAMES,
    Approval,
    Attestation,
    CheckStatusChange,
    CostUnit,
    Evidence,
    GateCheck,
    Plan,
    StageMove,
)
from migrations_plan.services import EDITABLE_FIELDS

User = get_user_model()
STATUS_HELP = "; ".join(f"{status}: {ev.STATUS_MEANINGS[status]}" for status in ev.STATUSES)


def _status_field(**kwargs: Any) -> serializers.ChoiceField:
    """A check's or a gate's status: one vocabulary (evidence.STATUSES) for the API, the CLI,
    the dashboard, the metrics and the approvals."""
    return serializers.ChoiceField(choices=list(ev.STATUSES), help_text=STATUS_HELP, **kwargs)


class StatusField(serializers.ChoiceField):
    """A stored status, read in today's vocabulary (an older "pending" reads
    awaiting-attestation)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=list(ev.STATUSES), help_text=STATUS_HELP, **kwargs)

    def to_representation(self, value: Any) -> str:
        return ev.normalise_status(str(value))


def plan_by_name(**kwargs: Any) -> serializers.SlugRelatedField:
    """A plan a request names; an unknown name is refused with where plans are listed."""
    return by_name(Plan.objects.all(), "No plan named {value}; see GET /api/v1/plans/.",
                   **kwargs)


def _owner_field(**kwargs: Any) -> serializers.SlugRelatedField:
    return serializers.SlugRelatedField(
        slug_field="username", queryset=User.objects.filter(is_active=True),
        error_messages={"does_not_exist": "No active user named {value}."},
        help_text="Username of the person who owns the plan (default: you).", **kwargs)


# --- what a gate says -------------------------------------------------------------------------

class EvidenceRefSerializer(serializers.Serializer):
    kind = serializers.CharField()
    ref = serializers.CharField(help_text='What the check used, e.g. "evidence:40", "drain:12".')
    label: Any = serializers.CharField()
    version = serializers.CharField(help_text="Changes whenever what the evidence says changes.")
    url = serializers.CharField(help_text="Where the details are (may be empty).")
    observed_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    origin = serializers.ChoiceField(
        choices=list(ev.ORIGINS),
        help_text="measured (by fleetctl: a job or its records), reported (by another system; "
                  "never satisfies a measured check), attested (by a person).")
    source: Any = serializers.CharField(
        help_text="Who: the job or record (measured), the system (reported), the person "
                  "(attested).")
    source_url = serializers.CharField(help_text="The job's run or the report's link (may be "
                                                 "empty).")
    source_label = serializers.CharField(
        help_text='"measured by <job>", "reported by <system>" or "attested by <person>".')


class AttestationSerializer(serializers.ModelSerializer):
    by = serializers.CharField(source="by.username", read_only=True)

    class Meta:
        model = Attestation
        fields = ["id", "by", "role", "note", "at", "withdrawn_at", "withdrawn_reason"]
        read_only_fields = fields


class CheckStatusChangeSerializer(serializers.ModelSerializer):
    """One change of a check's status (or its first status), as the plan refresh saw it."""

    status_label = serializers.SerializerMethodField()

    class Meta:
        model = CheckStatusChange
        fields = ["status", "status_label", "at", "summary"]
        read_only_fields = fields

    def get_status_label(self, change: CheckStatusChange) -> str:
        return ev.status_label(change.status)


class CheckOutcomeSerializer(serializers.Serializer):
    """One check of a gate, evaluated now."""

    id = serializers.IntegerField(source="check.pk")
    key = serializers.CharField(source="check.key")
    title = serializers.CharField(source="check.title")
    kind = serializers.CharField(source="check.kind", help_text="evidence or attested")
    rule = serializers.CharField(source="check.rule")
    params = ObjectField(source="check.params")
    attest_role = serializers.CharField(source="check.attest_role")
    status = _status_field()
    status_label = serializers.SerializerMethodField()
    summary = serializers.CharField(source="result.summary")
    numbers = ObjectField(source="result.numbers", help_text="The numbers the rule used.")
    evidence = EvidenceRefSerializer(source="result.evidence", many=True)
    attestation = serializers.SerializerMethodField(help_text="The standing attestation, if any.")
    history = serializers.SerializerMethodField(
        help_text=f"The check's status changes (and its first status), newest first, at most "
                  f"{selectors.HISTORY_LIMIT}: each {{status, at, summary}}.")

    def get_status_label(self, outcome: ev.CheckOutcome) -> str:
        return ev.status_label(outcome.status)

    @extend_schema_field(CheckStatusChangeSerializer(many=True))
    def get_history(self, outcome: ev.CheckOutcome) -> Any:
        return CheckStatusChangeSerializer(selectors.check_history(check=outcome.check),
                                           many=True).data

    @extend_schema_field(AttestationSerializer(allow_null=True))
    def get_attestation(self, outcome: ev.CheckOutcome) -> dict[str, Any] | None:
        standing = permissions.standing_attestation(outcome.check)
        return AttestationSerializer(standing).data if standing else None


class GateSerializer(serializers.Serializer):
    """One stage's gate: pass advances; warn or insufficient data needs a written
    justification to approve; fail or awaiting-attestation blocks (`blocks_advance`)."""

    stage = serializers.IntegerField()
    stage_name = serializers.SerializerMethodField()
    status = _status_field()
    status_label = serializers.SerializerMethodField()
    blocks_advance = serializers.BooleanField(
        help_text="The gate can be neither approved nor advanced (status fail or "
                  "awaiting-attestation); the dashboard says blocked.")
    evaluated_at = serializers.DateTimeField(source="at")
    snapshot_hash = serializers.SerializerMethodField(
        help_text="What an approval given now binds to.")
    passed = serializers.IntegerField()
    total = serializers.SerializerMethodField()
    blockers = serializers.SerializerMethodField(help_text="Titles of the checks that block.")
    needs_justification = serializers.SerializerMethodField(
        help_text="Titles of the checks that are warn or insufficient data.")
    checks = CheckOutcomeSerializer(source="outcomes", many=True)

    def get_stage_name(self, gate: ev.GateEvaluation) -> str:
        return STAGE_NAMES[gate.stage]

    def get_status_label(self, gate: ev.GateEvaluation) -> str:
        return ev.status_label(gate.status)

    def get_snapshot_hash(self, gate: ev.GateEvaluation) -> str:
        return gate.hash()

    def get_total(self, gate: ev.GateEvaluation) -> int:
        return len(gate.outcomes)

    def get_blockers(self, gate: ev.GateEvaluation) -> list[str]:
        return [o.check.title for o in gate.blockers]

    def get_needs_justification(self, gate: ev.GateEvaluation) -> list[str]:
        return [o.check.title for o in gate.needs_justification]


class ApprovalEvidenceSerializer(serializers.Serializer):
    """One piece of evidence an approval bound to, as its snapshot recorded it."""

    check = serializers.CharField(help_text="The check's key.")
    check_title = serializers.CharField()
    check_status = serializers.CharField(help_text="The check's status when approved.")
    kind = serializers.CharField()
    ref = serializers.CharField(help_text='e.g. "evidence:40", "drain:12".')
    label = serializers.CharField()  # type: ignore[assignment]  # the API's key, not Field's
    url = serializers.CharField(allow_blank=True, help_text="Its page, when it has one.")
    source = serializers.CharField(  # type: ignore[assignment]
        allow_blank=True, help_text="Who or what produced it.")
    observed_at = serializers.DateTimeField(allow_null=True)


class GateApprovalSerializer(serializers.Serializer):
    """An approval of the gate shown, whether it still counts, and the evidence it saw."""

    id = serializers.IntegerField(source="approval.pk")
    stage = serializers.IntegerField(source="approval.stage")
    by = serializers.CharField(source="approval.by.username")
    at = serializers.DateTimeField(source="approval.at")
    gate_status = StatusField(source="approval.gate_status")
    gate_status_label = serializers.CharField(source="approval.gate_status_label")
    justification = serializers.CharField(source="approval.justification")
    snapshot_hash = serializers.CharField(source="approval.snapshot_hash")
    evidence = ApprovalEvidenceSerializer(
        source="approval.evidence_seen", many=True,
        help_text="The evidence it bound to: per check, each piece with its link.")
    counts = serializers.BooleanField(help_text="Counts towards advancing on today's evidence.")
    why_not = serializers.SerializerMethodField(help_text="Why it does not count, if it does not.")

    def get_why_not(self, standing: permissions.ApprovalStanding) -> str | None:
        return standing.why_not


class StageGateSerializer(GateSerializer):
    required_approvals = serializers.SerializerMethodField()
    approvals = serializers.SerializerMethodField()

    def get_required_approvals(self, gate: ev.GateEvaluation) -> int:
        return gate.plan.required_approvals

    @extend_schema_field(GateApprovalSerializer(many=True))
    def get_approvals(self, gate: ev.GateEvaluation) -> Any:
        views = selectors.approvals_for_gate(plan=gate.plan, gate=gate)
        return GateApprovalSerializer(views, many=True).data


# --- plans ------------------------------------------------------------------------------------

class GateBriefSerializer(serializers.Serializer):
    """The current stage's gate in brief."""

    stage = serializers.IntegerField()
    status = _status_field()
    status_label = serializers.CharField()
    blocks_advance = serializers.BooleanField(
        help_text="Neither approvable nor advanceable now (fail or awaiting-attestation).")
    passed = serializers.IntegerField()
    total = serializers.IntegerField()
    blockers = serializers.ListField(child=serializers.CharField(),
                                     help_text="Titles of the checks that block.")


class PlanSerializer(serializers.ModelSerializer):
    candidate_pool = serializers.CharField(source="candidate_pool.name", read_only=True)
    primary_pool = serializers.CharField(source="primary_pool.name", read_only=True)
    routes = serializers.SerializerMethodField()
    owner = serializers.CharField(source="owner.username", read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True)
    state = serializers.ChoiceField(choices=Plan.State.choices, read_only=True,
                                    help_text="Where the plan is: stage-1 … stage-4, paused "
                                              "(at `stage`), abandoned or completed.")
    state_label = serializers.CharField(source="get_state_display", read_only=True)
    stage_name = serializers.CharField(read_only=True)
    gate = serializers.SerializerMethodField(
        help_text="The current stage's gate in brief (null for a closed plan).")
    at_risk = serializers.SerializerMethodField(
        help_text="A gate the plan already passed lost what it was approved on (see risk).")
    risk = serializers.ListField(
        child=serializers.CharField(), read_only=True,
        help_text="Why it is at risk: per passed stage, each check that got worse since its "
                  "approval (empty when not at risk).")

    class Meta:
        model = Plan
        fields = ["id", "name", "state", "state_label", "stage", "stage_name",
                  "stage_entered_at", "candidate_pool", "primary_pool", "routes",
                  "slo_ttft_p95_ms", "slo_tpot_p95_ms", "slo_error_rate", "slo_e2e_p95_ms",
                  "latency_margin_pct",
                  "cost_margin_pct", "cost_unit", "quality_margin_pct", "owner", "created_by",
                  "target_date",
                  "required_approvals", "notes", "predicted_cost_per_1m",
                  "predicted_cost_currency", "predicted_cost_source", "predicted_cost_at",
                  "created_at", "closed_at", "gate", "at_risk", "at_risk_since", "risk"]
        read_only_fields = fields

    def get_at_risk(self, plan: Plan) -> bool:
        return plan.at_risk_since is not None

    def get_routes(self, plan: Plan) -> list[str]:
        return sorted(r.name for r in plan.routes.all())

    @extend_schema_field(GateBriefSerializer(allow_null=True))
    def get_gate(self, plan: Plan) -> dict[str, Any] | None:
        if not plan.is_open:
            return None
        return selectors.gate_summary(ev.evaluate_gate(plan))


class PlanDetailSerializer(PlanSerializer):
    """A plan with its current gate, each check evaluated now, and that gate's approvals."""

    gate = serializers.SerializerMethodField(  # type: ignore[assignment]
        help_text="The current stage's gate, evaluated now.")
    approvals = serializers.SerializerMethodField(
        help_text="Approvals of the current stage, each marked whether it still counts.")

    class Meta(PlanSerializer.Meta):
        fields = [*PlanSerializer.Meta.fields, "approvals"]
        read_only_fields = fields

    def _gate(self, plan: Plan) -> ev.GateEvaluation:
        """Evaluated once per plan: the gate and its approvals must describe the same now."""
        cached: dict[int, ev.GateEvaluation] = self.__dict__.setdefault("_gates", {})
        if plan.pk not in cached:
            cached[plan.pk] = ev.evaluate_gate(plan)
        return cached[plan.pk]

    @extend_schema_field(GateSerializer)
    def get_gate(self, plan: Plan) -> dict[str, Any]:  # type: ignore[override]
        return GateSerializer(self._gate(plan)).data  # type: ignore[return-value]

    @extend_schema_field(GateApprovalSerializer(many=True))
    def get_approvals(self, plan: Plan) -> Any:
        views = selectors.approvals_for_gate(plan=plan, gate=self._gate(plan))
        return GateApprovalSerializer(views, many=True).data


def _cost_unit_field() -> serializers.ChoiceField:
    """Plan.cost_unit, refused with the choices named (a 400 changes nothing)."""
    choices = ", ".join(CostUnit.values)
    return serializers.ChoiceField(
        choices=CostUnit.choices, required=False,
        error_messages={"invalid_choice": f'Unknown cost unit "{{input}}"; one of {choices} '
                                          f'(per 1M output tokens, or per successful task: '
                                          f"a soak's spend ÷ the custom_ids that succeeded)."},
        help_text="The unit stage 3's cost arbitrage is judged in: per_1m_output_tokens "
                  "(default) or per_successful_task (retries and failures counted).")


class PlanCreateSerializer(serializers.ModelSerializer):
    name = StrictCharField(max_length=63, help_text="A slug, e.g. mi300x-llama.")
    candidate_pool = pool_by_name(help_text="Name of the pool joining the routes.")
    primary_pool = pool_by_name(help_text="Name of the pool serving the routes today.")
    routes = serializers.ListField(
        child=StrictCharField(max_length=63), max_length=50,
        help_text="Names of the routes (models) the candidate will join.")
    owner = _owner_field(required=False)
    notes = StrictCharField(required=False, allow_blank=True, max_length=10_000)
    cost_unit = _cost_unit_field()

    class Meta:
        model = Plan
        fields = ["name", "candidate_pool", "primary_pool", "routes", "slo_ttft_p95_ms",
                  "slo_tpot_p95_ms", "slo_error_rate", "slo_e2e_p95_ms", "latency_margin_pct",
                  "cost_margin_pct", "cost_unit", "quality_margin_pct", "owner", "target_date",
                  "required_approvals", "notes"]
        # The service's full_clean checks uniqueness and ranges with the words used everywhere.
        validators: list[Any] = []

    def validate_routes(self, names: list[str]) -> list[Route]:
        wanted = list(dict.fromkeys(names))
        found = {r.name: r for r in Route.objects.filter(name__in=wanted)}
        missing = [n for n in wanted if n not in found]
        if missing:
            raise serializers.ValidationError(
                f"No route named {', '.join(missing)}; see GET /api/v1/routes/.")
        return [found[n] for n in wanted]


class PlanUpdateSerializer(serializers.ModelSerializer):
    owner = _owner_field(required=False)
    cost_unit = _cost_unit_field()
    notes = StrictCharField(required=False, allow_blank=True, max_length=10_000)
    predicted_cost_per_1m = serializers.DecimalField(
        max_digits=14, decimal_places=4, required=False, allow_null=True,
        help_text="Stage 3's predicted cost per 1M output tokens on the candidate (sent with "
                  "predicted_cost_currency; both null/empty clears it).")
    predicted_cost_currency = StrictCharField(
        required=False, allow_blank=True, allow_null=True, max_length=3,
        help_text="The prediction's currency, one of the fleet's (USD, EUR, ...).")
    predicted_cost_source = StrictCharField(
        required=False, allow_blank=True, max_length=200,
        help_text="Where the figure comes from, e.g. \"Q3 capacity plan\" (default: who set "
                  "it).")

    class Meta:
        model = Plan
        fields = EDITABLE_FIELDS
        validators: list[Any] = []

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        sent = set(getattr(self, "initial_data", {}) or {})
        known = {f.name for f in Plan._meta.get_fields()} | {"routes"}
        refused = {
            name: [("This cannot be changed once the plan is open" if name in known
                    else "Unknown field") + f" (editable: {', '.join(EDITABLE_FIELDS)})."]
            for name in sorted(sent - set(EDITABLE_FIELDS))}
        if refused:
            raise serializers.ValidationError(refused)
        if not attrs:
            raise serializers.ValidationError(
                f"Nothing to change: send one or more of {', '.join(EDITABLE_FIELDS)}.")
        return attrs


# --- checks -----------------------------------------------------------------------------------

class GateCheckSerializer(serializers.ModelSerializer):
    stage_name = serializers.SerializerMethodField()
    attestations = AttestationSerializer(many=True, read_only=True)
    params = ObjectField(read_only=True)

    class Meta:
        model = GateCheck
        fields = ["id", "stage", "stage_name", "key", "title", "kind", "rule", "params",
                  "attest_role", "position", "added_by", "added_at", "removed_at", "removed_by",
                  "removed_reason", "last_status", "last_status_at", "attestations"]
        read_only_fields = fields

    def get_stage_name(self, check: GateCheck) -> str:
        return STAGE_NAMES.get(check.stage, "")


class CheckCreateSerializer(serializers.Serializer):
    stage = serializers.IntegerField(help_text="1 abstraction, 2 shadow, 3 batch, 4 live.")
    title = StrictCharField(required=False, allow_blank=True, default="", max_length=200,
                            help_text="Default for a rule: the rule's label.")
    rule = StrictCharField(required=False, allow_blank=True, default="", max_length=63,
                           help_text="Evidence-backed: a rule name from /api/v1/evidence-rules/.")
    params = NullableObjectField(required=False, default=None,
                                 help_text='The rule\'s parameters, e.g. {"hours": 24}.')
    attest_role = StrictCharField(required=False, allow_blank=True, default="", max_length=20,
                                  help_text="Attested: the role whose holder confirms it.")
    key = StrictCharField(required=False, allow_blank=True, default="", max_length=55)


class CheckUpdateSerializer(serializers.Serializer):
    title = StrictCharField(required=False, max_length=200, allow_blank=True)
    params = ObjectField(required=False, help_text="New thresholds (evidence-backed).")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError("Send a title, params or both.")
        return attrs


class ReasonSerializer(serializers.Serializer):
    reason = StrictCharField(required=False, allow_blank=True, default="", max_length=2000,
                             help_text="Why; it goes in the plan's timeline.")


class RegressSerializer(ReasonSerializer):
    stage = serializers.IntegerField(help_text="The earlier stage to go back to (1–3).")


class NoteSerializer(serializers.Serializer):
    note = StrictCharField(required=False, allow_blank=True, default="", max_length=2000,
                           help_text="What you confirm.")


class ApproveSerializer(serializers.Serializer):
    justification = StrictCharField(
        required=False, allow_blank=True, default="", max_length=5000,
        help_text="Required when a check is warn or insufficient data: why approve anyway.")


# --- the record -------------------------------------------------------------------------------

class ApprovalSerializer(serializers.ModelSerializer):
    by = serializers.CharField(source="by.username", read_only=True)
    active = serializers.BooleanField(source="is_active", read_only=True)
    snapshot = ObjectField(read_only=True, help_text="The gate as it was approved.")

    class Meta:
        model = Approval
        fields = ["id", "stage", "by", "at", "gate_status", "justification", "snapshot_hash",
                  "active", "voided_at", "void_reason", "used_at", "snapshot"]
        read_only_fields = fields

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["gate_status"] = StatusField(read_only=True)
        return fields


class StageMoveSerializer(serializers.ModelSerializer):
    gate_status = serializers.SerializerMethodField()
    approvals: Any = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    approved_by = serializers.SerializerMethodField()
    gate_snapshot = ObjectField(read_only=True, help_text="The gate as it was at the move.")
    drains: Any = serializers.PrimaryKeyRelatedField(
        many=True, read_only=True, help_text="Drains that took the candidate off stage 4 first.")

    class Meta:
        model = StageMove
        fields = ["id", "kind", "from_state", "to_state", "by", "at", "reason", "gate_status",
                  "snapshot_hash", "approvals", "approved_by", "drains", "gate_snapshot"]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=list(ev.STATUSES), allow_null=True))
    def get_gate_status(self, move: StageMove) -> str | None:
        status = (move.gate_snapshot or {}).get("status")
        return ev.normalise_status(status) if status else None

    def get_approved_by(self, move: StageMove) -> list[str]:
        return [a.by.username for a in move.approvals.all()]


# --- evidence ---------------------------------------------------------------------------------

class EvidenceSerializer(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.name", read_only=True)
    route = serializers.CharField(source="route.name", read_only=True, allow_null=True)
    origin = serializers.SerializerMethodField(
        help_text="measured (by one of fleetctl's jobs) or reported (by another system).")
    source_label = serializers.SerializerMethodField(
        help_text='"measured by <job>" or "reported by <system>".')
    data: Any = ObjectField(read_only=True, help_text="As the kind's data_schema says.")
    pool_fingerprint = ObjectField(read_only=True,
                                   help_text="The pool as it was when this was observed.")

    class Meta:
        model = Evidence
        fields = ["id", "kind", "pool", "route", "model_id", "verdict", "summary", "data", "url",
                  "origin", "source", "source_label", "reported_by", "about", "observed_at",
                  "expires_at", "pool_fingerprint"]
        read_only_fields = fields
        extra_kwargs = {
            "source": {"help_text": "Measured: the job that wrote it. Reported: who posted it."},
            "reported_by": {"help_text": "Reported: the system that reports it."},
            "about": {"help_text": "Reported: the kind or check it speaks to."},
        }

    @extend_schema_field(serializers.ChoiceField(choices=[ev.MEASURED, ev.REPORTED]))
    def get_origin(self, row: Evidence) -> str:
        return ev.evidence_ref(row).origin

    def get_source_label(self, row: Evidence) -> str:
        return ev.evidence_ref(row).source_label


class EvidenceCreateSerializer(serializers.Serializer):
    """What another system reports about a pool. Kinds fleetctl measures are refused (400,
    saying which job measures them); a report is shown as "reported by <reported_by>" and never
    satisfies a check over a measured kind."""

    pool = pool_by_name(help_text="Name of the pool the report is about.")
    kind = StrictCharField(max_length=40, required=False, default=ev.EXTERNAL,
                           help_text="external (the only kind that can be posted; default).")
    reported_by = StrictCharField(
        max_length=100, required=False, allow_blank=True, default="",
        help_text="The system that reports it, e.g. grafana-slo-bot (required).")
    about = StrictCharField(
        max_length=63, required=False, allow_blank=True, default="",
        help_text="What it speaks to (required): an evidence kind (e.g. shadow) or your own "
                  "check (e.g. slo-burn).")
    verdict = StrictCharField(help_text="pass, warn, fail or info.")
    summary = StrictCharField(max_length=300, allow_blank=True,
                              help_text="What was found, one line.")
    data: Any = NullableObjectField(
        required=False, default=None,
        help_text="An object matching the kind's data_schema (GET /api/v1/evidence-kinds/); "
                  "for external: flat numbers, labels and flags.")
    url = StrictCharField(required=False, allow_blank=True, default="", max_length=300)
    route = serializers.SlugRelatedField(
        slug_field="name", queryset=Route.objects.all(), required=False, allow_null=True,
        default=None, error_messages={"does_not_exist": "No route named {value}."})
    model_id = StrictCharField(required=False, allow_blank=True, default="", max_length=200)
    ttl_hours = serializers.FloatField(required=False, allow_null=True, default=None,
                                       help_text="It stops counting after this many hours.")


class ParamSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="float, int or str")
    default = serializers.JSONField()
    min = serializers.FloatField(allow_null=True)
    max = serializers.FloatField(allow_null=True)
    help = serializers.CharField()
    choices = serializers.ListField(child=serializers.CharField(), allow_null=True)


class EvidenceRuleSerializer(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.CharField()
    label: Any = serializers.CharField()
    description = serializers.CharField()
    params = serializers.DictField(child=ParamSerializer())


class EvidenceKindSerializer(serializers.Serializer):
    name = serializers.CharField()
    label: Any = serializers.CharField()
    produced_by = serializers.CharField(help_text="What produces it; empty when nothing does yet.")
    measured = serializers.BooleanField(
        help_text="Written only by fleetctl's own jobs; cannot be posted.")
    data_schema = ObjectField(
        help_text="The JSON Schema every row's data matches (checked when written).")
    rules = serializers.ListField(child=serializers.CharField())


def rule_json(rule: ev.Rule) -> dict[str, Any]:
    return {
        "name": rule.name, "kind": rule.kind, "label": rule.label,
        "description": rule.description,
        "params": {
            name: {"type": p.type.__name__, "default": p.default, "min": p.min, "max": p.max,
                   "help": p.help, "choices": p.choices() if p.choices else None}
            for name, p in rule.params.items()
        },
    }


def kind_json(kind: ev.EvidenceKind) -> dict[str, Any]:
    return {"name": kind.name, "label": kind.label, "produced_by": kind.produced_by,
            "measured": kind.measured, "data_schema": kind.schema,
            "rules": sorted(r.name for r in ev.RULES.values() if r.kind == kind.name)}
