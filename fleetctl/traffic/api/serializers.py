from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleetctl.core.api.fields import MillisecondsField, StrictBooleanField, StrictCharField
from fleetctl.core.api.schema import ObjectField
from fleetctl.fleet.models import Pool
from fleetctl.traffic.api.waiting import WaitGatewaySerializer
from fleetctl.traffic.models import (
    ContextTier,
    Drain,
    Gateway,
    GatewayPush,
    GatewayPushAttempt,
    Route,
    SplitRevision,
)
from fleetctl.traffic.split import as_percentages

WEIGHTS_SCHEMA = {"type": "object", "additionalProperties": {"type": "number"}}


@extend_schema_field(WEIGHTS_SCHEMA)
class WeightsField(serializers.JSONField):
    """Pool name → percent. Checked by the service (pools, sum, precision), which names
    the pool at fault; here only documented."""


WEIGHTS_HELP = ('Pool name → percent (up to two decimals, adding up to 100), e.g. '
                '{"h200-us-east": 99.9, "mi300x-us-east": 0.1}.')


class RevisionSerializer(serializers.ModelSerializer):
    route = serializers.CharField(source="route.name", read_only=True)
    weights = serializers.SerializerMethodField(help_text="Pool name → percent.")
    parent = serializers.IntegerField(  # type: ignore[assignment]
        source="parent.number", read_only=True, allow_null=True)

    class Meta:
        model = SplitRevision
        fields = ["route", "number", "parent", "kind", "weights", "reason", "forced",
                  "created_by", "created_at"]
        read_only_fields = fields

    @extend_schema_field(WEIGHTS_SCHEMA)
    def get_weights(self, revision: SplitRevision) -> dict[str, float]:
        return as_percentages(revision.weights)


class RevisionAnswerSerializer(RevisionSerializer):
    """The answer to a split change: the revision, whether it was new, and with
    ?wait=verified whether every gateway holds it."""

    unchanged = serializers.SerializerMethodField(
        help_text="True when the split asked for is the one in force: no revision was made "
                  "and nothing pushed; this is the current revision (answered 200).")
    verified = serializers.BooleanField(
        required=False, help_text="With ?wait=verified: every gateway verified it in time.")
    gateways = WaitGatewaySerializer(
        many=True, required=False, source="wait_gateways",
        help_text="With ?wait=verified: each gateway's push of this revision.")

    class Meta(RevisionSerializer.Meta):
        fields = [*RevisionSerializer.Meta.fields, "unchanged", "verified", "gateways"]
        read_only_fields = RevisionSerializer.Meta.fields

    def get_unchanged(self, revision: SplitRevision) -> bool:
        return bool(getattr(revision, "unchanged", False))


class RouteAffinitySerializer(serializers.Serializer):
    """A route's prefix affinity (PUT /routes/{name}/affinity/). Checked by the service,
    which names the field at fault; here only documented."""

    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=Route.PrefixAffinity.choices,
        help_text="off; header: the caller's x-fleetctl-prefix-key only; prompt: that key, "
                  "else a hash of the prompt text's leading prefix_bytes. Requests with "
                  "the same key go to the same endpoint of a pool (Envoy gateways only).")
    prefix_bytes = serializers.IntegerField(
        required=False, allow_null=True, min_value=64, max_value=65_536,
        help_text="prompt only: the leading bytes of the prompt's text that make its key "
                  "(default 4096; left out keeps the route's).")


class RouteSerializer(serializers.ModelSerializer):
    primary_pool = serializers.SlugRelatedField(slug_field="name", queryset=Pool.objects.all())
    gateways: Any = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    current = serializers.SerializerMethodField(
        help_text="The revision in force (null before the first).")
    prefix_affinity = serializers.SerializerMethodField(
        help_text="Prefix affinity: {source, prefix_bytes}; set it with PUT affinity/.")

    class Meta:
        model = Route
        fields = ["id", "name", "model_id", "latency_class", "residency", "primary_pool",
                  "health_policy", "reverify_policy", "reverify_benchmark", "revision_number",
                  "current", "gateways", "prefix_affinity",
                  "mirror_percent", "mirror_owner", "created_at"]
        read_only_fields = ["id", "revision_number", "current", "gateways", "mirror_percent",
                            "mirror_owner", "created_at", "prefix_affinity"]
        extra_kwargs: dict[str, Any] = {"name": {"validators": []}}
        validators: list[Any] = []

    @extend_schema_field(RevisionSerializer(allow_null=True))
    def get_current(self, route: Route) -> dict[str, Any] | None:
        current = self.context.get("current_revisions", {}).get(route.pk)
        return RevisionSerializer(current).data if current else None

    @extend_schema_field(RouteAffinitySerializer)
    def get_prefix_affinity(self, route: Route) -> dict[str, Any]:
        from fleetctl.traffic.services.affinity import affinity_dict

        return affinity_dict(route)


class RouteCreateSerializer(RouteSerializer):
    weights = WeightsField(required=False, help_text=WEIGHTS_HELP + " Default: all "
                                    "to the primary.")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000)
    force = serializers.BooleanField(required=False, default=False)

    class Meta(RouteSerializer.Meta):
        fields = [*RouteSerializer.Meta.fields, "weights", "reason", "force"]


class RouteHealthPolicySerializer(serializers.Serializer):
    health_policy = serializers.ChoiceField(
        choices=Route.HealthPolicy.choices,
        help_text="off: a person drains; drain: the health policy drains a pool with weight "
                  "that turns unhealthy; drain-restore: and restores it when healthy again.")


class RouteReverifyPolicySerializer(serializers.Serializer):
    reverify_policy = serializers.ChoiceField(
        choices=Route.ReverifyPolicy.choices,
        help_text="While a changed pool with weight here is re-verified: hold (ramps on the "
                  "route paused, nothing drained) or drain (and drain the pool off the route, "
                  "as system:reverify, if its conformance re-run fails).")
    reverify_benchmark = serializers.BooleanField(
        required=False,
        help_text="After a passing conformance re-run, also re-run the plan candidate's last "
                  "benchmark (plans on this route whose gate has a benchmark check).")


class TierSerializer(serializers.Serializer):
    """One context tier as sent (PUT). Checked by the service, which names the tier at fault
    (`tiers[1].max_prompt_tokens`); here only documented."""

    max_prompt_tokens = serializers.IntegerField(
        min_value=1, allow_null=True, required=False,
        help_text="Prompts of at most this many tokens (above the tier below); leave it out "
                  "(or null) on the last tier: every prompt above the last bound.")
    behaviour = serializers.ChoiceField(
        choices=ContextTier.Behaviour.choices,
        help_text="When no eligible pool can take a request: queue (bounded, 429/503 with "
                  "Retry-After), reject (413), failover (across vendors), failover-class "
                  "(within the latency class), pinned (never fail over).")
    queue_max = serializers.IntegerField(min_value=1, allow_null=True, required=False,
                                         help_text="queue only: requests held waiting at "
                                                   "most, per pool of the tier (Envoy).")
    retry_after_s = serializers.IntegerField(
        min_value=1, allow_null=True, required=False,
        help_text="queue only: the Retry-After of a full queue's answer, in seconds.")


class RouteTiersSetSerializer(serializers.Serializer):
    tiers = TierSerializer(many=True, help_text="Every tier of the route, smallest bound "
                                                "first; [] removes them.")


class IneligiblePoolSerializer(serializers.Serializer):
    pool = serializers.CharField()
    reason = serializers.CharField(help_text="Why it may not serve the tier: other "
                                             "jurisdiction, latency class, stage, context "
                                             "too small, reports less than registered.")


class TierPoolsSerializer(serializers.Serializer):
    max_prompt_tokens = serializers.IntegerField(source="tier.max_prompt_tokens",
                                                 allow_null=True)
    behaviour = serializers.CharField(source="tier.behaviour")
    queue_max = serializers.IntegerField(source="tier.queue_max", allow_null=True)
    retry_after_s = serializers.IntegerField(source="tier.retry_after_s", allow_null=True)
    above_tokens = serializers.IntegerField(source="above",
                                            help_text="The bound of the tier below (0: none).")
    needed_tokens = serializers.IntegerField(
        source="needed", help_text="The context a pool needs to serve this tier.")
    eligible_pools = serializers.ListField(
        child=serializers.CharField(), source="eligible_names",
        help_text="Computed now from the registry and what the pools report; never stored.")
    not_eligible = serializers.SerializerMethodField()

    @extend_schema_field(IneligiblePoolSerializer(many=True))
    def get_not_eligible(self, view: Any) -> list[dict[str, str]]:
        return [{"pool": c.pool.name, "reason": why} for c, why in view.others]


class TierLivePoolSerializer(serializers.Serializer):
    pool = serializers.CharField()
    requests = serializers.IntegerField()
    share = serializers.FloatField(help_text="Of the tier's requests, 0..1.")
    percent = serializers.FloatField(help_text="The share in %, one decimal.")


class TierLiveEntrySerializer(serializers.Serializer):
    requests = serializers.IntegerField(help_text="Requests the tier's gateway entry routed.")
    pools = TierLivePoolSerializer(many=True)


class TierLiveSerializer(serializers.Serializer):
    minutes = serializers.FloatField(required=False)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)
    tiers = serializers.DictField(
        child=TierLiveEntrySerializer(),
        help_text="By tier index (\"0\", \"1\", ...) and \"unknown\" (prompts the gateway "
                  "could not size, sent where the last tier goes): what the gateways' access "
                  "logs say each tier carried in the last 15 minutes. Tiers that carried "
                  "nothing are absent.")


class RouteTiersSerializer(serializers.Serializer):
    route = serializers.CharField()
    tiers = TierPoolsSerializer(many=True)
    live = TierLiveSerializer(help_text="The live share of each tier per pool (telemetry).")


class RevisionCreateSerializer(serializers.Serializer):
    weights = WeightsField(help_text=WEIGHTS_HELP)
    base_revision = serializers.IntegerField(
        min_value=0, help_text="The revision number you are changing (409 if it moved on).")
    reason = serializers.CharField(max_length=2000)
    force = serializers.BooleanField(
        default=False, help_text="Allow weight on an unhealthy pool (audited). Never "
                                 "overrides residency.")


class PoolCapacitySerializer(serializers.Serializer):
    pool = serializers.CharField()
    tokens_per_s = serializers.FloatField(
        source="capacity.tokens_per_s", allow_null=True,
        help_text="SLO-qualified output tokens/s at today's endpoints (null: no figure).")
    streams = serializers.FloatField(
        source="capacity.streams", allow_null=True,
        help_text="Concurrent streams at which the benchmark's SLO held, at today's "
                  "endpoints.")
    run = serializers.IntegerField(source="capacity.run", allow_null=True,
                                   help_text="The benchmark run the figure comes from.")
    measured_on = serializers.CharField(source="capacity.measured_on")
    basis = serializers.CharField(source="capacity.source",
                                  help_text="Where the figure comes from, or why none.")
    live_streams = serializers.IntegerField(
        allow_null=True, help_text="Streams in flight at the gateways now (null: no recent "
                                   "sample, unknown).")
    current_percent = serializers.FloatField()
    suggested_percent = serializers.FloatField()
    left_out = serializers.CharField(help_text="Why the pool gets no share (empty when it "
                                               "does).")


class RouteCapacitySerializer(serializers.Serializer):
    route = serializers.CharField()
    model_id = serializers.CharField()
    revision = serializers.IntegerField(help_text="The route's revision this was read at: "
                                                  "send it as base_revision to apply.")
    weights = serializers.SerializerMethodField(help_text="The suggested split, pool → "
                                                          "percent ({} when refused).")
    reason = serializers.CharField(help_text="The reason the applied revision will carry.")
    refusal = serializers.CharField(help_text="Why no split is offered (empty when one is).")
    unchanged = serializers.BooleanField(help_text="The suggested split is in force already.")
    pools = PoolCapacitySerializer(many=True, source="rows")

    @extend_schema_field(WEIGHTS_SCHEMA)
    def get_weights(self, split: Any) -> dict[str, float]:
        return as_percentages(split.weights)


class CapacityApplySerializer(serializers.Serializer):
    base_revision = serializers.IntegerField(
        min_value=1, help_text="The route's revision you read the capacity split at (409 if "
                               "it moved on).")
    note = serializers.CharField(max_length=2000, required=False, allow_blank=True,
                                 default="", help_text="Your words, added to the reason.")


class GatewaySerializer(serializers.ModelSerializer):
    routes = serializers.SlugRelatedField(slug_field="name", many=True,
                                          queryset=Route.objects.all(), required=False)
    admin_address = StrictCharField(max_length=300)
    options = ObjectField(required=False)
    supports_mirror = serializers.SerializerMethodField(
        help_text="Whether this gateway's kind can copy a share of a route's requests to the "
                  "shadow collector (a mirror shadow run); HAProxy cannot: use a replay run.")

    @extend_schema_field(serializers.BooleanField())
    def get_supports_mirror(self, gateway: Gateway) -> bool:
        from fleetctl.traffic.gateways import registry

        kind = registry.find(gateway.kind)
        return kind.supports_mirror if kind is not None else False

    def get_fields(self) -> dict[str, Any]:
        """kind, admin_address and options as the registered kinds define them (the
        registry finds kinds from their folders, so these are built per serializer)."""
        from fleetctl.traffic.gateways import registry

        fields = super().get_fields()
        kinds = registry.kinds().values()
        fields["kind"] = serializers.ChoiceField(choices=registry.choices(), required=False)
        fields["admin_address"].help_text = "How fleetctl reaches the gateway: " + "; ".join(
            f"{kind.name}: {kind.address.help}" for kind in kinds) + "."
        fields["options"].help_text = (
            "The kind's options (unknown keys, wrong types and missing required options are "
            "refused, naming the option). " + " ".join(
                f"{kind.name}: " + "; ".join(info.describe() for info in kind.option_infos())
                + "." for kind in kinds))
        return fields

    class Meta:
        model = Gateway
        # The mirror secret itself is never answered: only when it was last rotated.
        fields = ["id", "name", "kind", "admin_address", "options", "routes", "state",
                  "state_changed_at", "last_error", "last_verified_at", "supports_mirror",
                  "mirror_secret_rotated_at", "created_at"]
        read_only_fields = ["id", "state", "state_changed_at", "last_error",
                            "last_verified_at", "supports_mirror", "mirror_secret_rotated_at",
                            "created_at"]
        extra_kwargs: dict[str, Any] = {"name": {"validators": []}}


class PushAttemptSerializer(serializers.ModelSerializer):
    duration_ms = MillisecondsField(allow_null=True)

    class Meta:
        model = GatewayPushAttempt
        fields = ["number", "sent_at", "answered_at", "applied", "verified", "method",
                  "detail", "error", "duration_ms"]
        read_only_fields = fields


class PushSerializer(serializers.ModelSerializer):
    gateway = serializers.CharField(
        source="recorded_gateway_name", read_only=True,
        help_text="The gateway's name (the name it had, if it was deleted since).")
    gateway_deleted = serializers.BooleanField(
        read_only=True, help_text="The gateway was deleted; this push is kept as history.")
    route = serializers.CharField(source="revision.route.name", read_only=True)
    revision = serializers.IntegerField(source="revision.number", read_only=True)
    attempt_rows = PushAttemptSerializer(many=True, read_only=True)

    class Meta:
        model = GatewayPush
        fields = ["id", "gateway", "gateway_deleted", "route", "revision", "reason", "status",
                  "created_at",
                  "applied_at", "verified_at", "attempts", "last_error", "attempt_rows"]
        read_only_fields = fields


class DrainGatewaySerializer(serializers.Serializer):
    """One gateway's push of one route's drain revision."""

    gateway = serializers.CharField(help_text="The gateway's name (the name it had, if it "
                                              "was deleted since).")
    gateway_deleted = serializers.BooleanField(
        help_text="The gateway was deleted; with status abandoned, before it verified.")
    route = serializers.CharField()
    revision = serializers.IntegerField()
    status = serializers.ChoiceField(choices=GatewayPush.Status.choices)
    attempts = serializers.IntegerField()
    applied_at = serializers.DateTimeField(allow_null=True)
    verified_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField(allow_blank=True)


class RouteRevisionSerializer(serializers.Serializer):
    route = serializers.CharField()
    revision = serializers.IntegerField()


class DrainSerializer(serializers.ModelSerializer):
    route = serializers.CharField(source="route.name", read_only=True, allow_null=True)
    pool = serializers.CharField(source="pool.name", read_only=True, allow_null=True)
    revisions = serializers.SerializerMethodField(
        help_text='The revisions this drain stored, as labels ("llama-8b r10"); the same as '
                  'route_revisions.')
    route_revisions = serializers.SerializerMethodField(
        help_text="The revisions this drain stored: each route and revision number.")
    drained_pools = serializers.ListField(child=serializers.CharField(), read_only=True)
    verified_ms = MillisecondsField(allow_null=True)
    duration_ms = MillisecondsField(allow_null=True)
    gateways = serializers.SerializerMethodField(
        help_text="Per gateway and route: the drain revision's push, applied and verified.")
    capacity = ObjectField(
        read_only=True,
        help_text="The capacity check: `decision` (instant, spread, stepped or forced), `why`, "
                  "and per route the load moved (`load_streams`) and each pool's "
                  "`capacity_streams`, `live_streams`, `room_streams`, `source` and "
                  "`given_bp`; a stepped drain's `steps`. {} for a restore.")
    next_step_at = serializers.DateTimeField(
        read_only=True, allow_null=True,
        help_text="A stepped drain's next step; null once its last step is stored.")

    class Meta:
        model = Drain
        fields = ["id", "action", "route", "pool", "restores", "drained_pools", "revisions",
                  "route_revisions",
                  "requested_by", "reason", "requested_at", "status", "verified_at",
                  "in_flight_zero_at", "completed_at", "verified_ms", "duration_ms",
                  "last_error", "failure_reason", "gateways", "capacity", "next_step_at"]
        read_only_fields = fields

    def _revisions(self, drain: Drain) -> list[SplitRevision]:
        # A drain just made carries what it stored (push.drain_push_now's answer).
        return list(drain.new_revisions if drain.new_revisions is not None
                    else drain.revisions.all())

    def get_revisions(self, drain: Drain) -> list[str]:
        return [f"{rev.route.name} r{rev.number}" for rev in self._revisions(drain)]

    @extend_schema_field(RouteRevisionSerializer(many=True))
    def get_route_revisions(self, drain: Drain) -> list[dict[str, Any]]:
        return [{"route": rev.route.name, "revision": rev.number}
                for rev in self._revisions(drain)]

    @extend_schema_field(DrainGatewaySerializer(many=True))
    def get_gateways(self, drain: Drain) -> list[dict[str, Any]]:
        from fleetctl.traffic.selectors import drain_gateway_times

        pages = self.context.get("gateway_times", {})  # a list's page, read at once
        pushes = drain.first_pushes if drain.first_pushes is not None \
            else pages[drain.pk] if drain.pk in pages else drain_gateway_times(drain=drain)
        return [
            {"gateway": p.recorded_gateway_name, "gateway_deleted": p.gateway_deleted,
             "route": p.revision.route.name,
             "revision": p.revision.number, "status": p.status, "attempts": p.attempts,
             "applied_at": p.applied_at, "verified_at": p.verified_at,
             "last_error": p.last_error}
            for p in pushes
        ]


class DrainAnswerSerializer(DrainSerializer):
    """The answer to a drain or restore; with ?wait=verified, after waiting for the gateways
    (`gateways` and `status` then read from the rows)."""

    verified = serializers.BooleanField(
        required=False, help_text="With ?wait=verified: every gateway verified the drain's "
                                  "revisions in time.")

    class Meta(DrainSerializer.Meta):
        fields = [*DrainSerializer.Meta.fields, "verified"]
        read_only_fields = DrainSerializer.Meta.fields


class DrainCreateSerializer(serializers.Serializer):
    route = serializers.SlugRelatedField(slug_field="name", queryset=Route.objects.all(),
                                         required=False)
    pool = serializers.SlugRelatedField(slug_field="name", queryset=Pool.objects.all(),
                                        required=False)
    reason = serializers.CharField(max_length=2000)
    force = StrictBooleanField(
        required=False, default=False,
        help_text="On-call: move everything to the primary at once, whatever its capacity "
                  "(the record says forced). Without it the drain is capacity-checked: "
                  "spread over the pools carrying the route (in its pin, if pinned), or "
                  "stepped.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("route" in attrs) == ("pool" in attrs):
            raise serializers.ValidationError("Name exactly one of route or pool to drain.")
        return attrs


class RestoreSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True)
