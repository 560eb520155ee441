"""Routes, their immutable split revisions, the gateways that carry them, every push attempt,
and drain records. Rows, not logs, are the record."""

from __future__ import annotations

from typing import Any

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from fleetctl.fleet.models import JURISDICTIONS, Pool, model_id_validator, slug_validator
from fleetctl.traffic.mirror_auth import new_secret


class ImmutableError(Exception):
    pass


class Route(models.Model):
    """What a caller asks for: a model, optionally a latency class and a residency pin."""

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    model_id = models.CharField(max_length=200, validators=[model_id_validator])
    latency_class = models.CharField(
        max_length=12, blank=True, choices=Pool.LatencyClass.choices,
        help_text="Empty: requests of any latency class.",
    )
    residency = models.CharField(
        max_length=2, blank=True, choices=sorted(JURISDICTIONS.items()),
        help_text="Jurisdiction pin: requests carrying it may only reach pools in it.",
    )
    primary_pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="+",
                                     help_text="Where a drain sends traffic back to.")
    # The current revision number; bumped with a conditional UPDATE so two concurrent changes
    # cannot both win. The revision rows themselves are the record.
    revision_number = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Mirroring (a shadow run): the share of the route's requests its gateways copy to the
    # shadow collector, and the pools the copies are compared on ({name: id}: the identity
    # behind each name, as SplitRevision.pool_ids). Not a revision: no request's answer
    # changes. Written only by services.route_mirror_set / route_mirror_clear; gateways get
    # 0 whenever a pool here is gone, renamed or outside the pin (selectors, fails closed).
    mirror_percent = models.FloatField(
        default=0, editable=False,
        validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="Percent of requests copied to the shadow collector (0: none).")
    mirror_pools = models.JSONField(default=dict, blank=True, editable=False)
    mirror_owner = models.CharField(max_length=100, blank=True, editable=False,
                                    help_text='Who mirrors, e.g. "shadow run 12".')

    class HealthPolicy(models.TextChoices):
        OFF = "off", "off: a person drains"
        DRAIN = "drain", "drain an unhealthy pool; restore by hand"
        DRAIN_RESTORE = "drain-restore", "drain an unhealthy pool; restore when healthy again"

    # What happens when a pool carrying live weight on this route turns unhealthy (the health
    # probe): traffic.health_policy drains it, as the system, with the probe's evidence.
    health_policy = models.CharField(
        max_length=14, choices=HealthPolicy.choices, default=HealthPolicy.DRAIN,
        help_text="When a pool with weight on this route turns unhealthy: drain it "
                  "automatically, and restore it when it is healthy again (or by hand).")

    class ReverifyPolicy(models.TextChoices):
        HOLD = "hold", "hold: pause ramps on the route, drain nothing"
        DRAIN = "drain", "drain the pool if a required re-verification check fails"

    # What happens meanwhile when a pool with weight here, or a plan's candidate on it, is
    # re-verified after a change (reported by its servers or registered):
    # conformance/reverify.py. Ramps hold either way; `drain` also drains the pool off this
    # route, as system:reverify, when its conformance re-run fails.
    reverify_policy = models.CharField(
        max_length=5, choices=ReverifyPolicy.choices, default=ReverifyPolicy.HOLD,
        help_text="While a changed pool is re-verified: hold (ramps on the route paused, "
                  "nothing drained) or drain (and drain the pool off the route if its "
                  "conformance re-run fails).")
    reverify_benchmark = models.BooleanField(
        default=False,
        help_text="After a passing conformance re-run, also re-run the last benchmark of a "
                  "plan's candidate (plans on this route whose gate has a benchmark check).")

    class PrefixAffinity(models.TextChoices):
        OFF = "off", "off: the pool's endpoints share requests by load"
        HEADER = "header", "the caller's prefix key (x-fleetctl-prefix-key) only"
        PROMPT = "prompt", "the caller's prefix key, else the prompt's leading bytes"

    # Prefix affinity (issue 28): requests with the same key return to the same endpoint of
    # a pool (consistent hashing with bounded load on Envoy), where their prompt's prefix is
    # already cached. Written only by services.route_affinity_set.
    prefix_affinity = models.CharField(
        max_length=6, choices=PrefixAffinity.choices, default=PrefixAffinity.OFF,
        editable=False,
        help_text="Send requests that share a prompt prefix to the same endpoint of a pool.")
    prefix_affinity_bytes = models.PositiveIntegerField(
        default=4096, editable=False,
        help_text="prompt: how many leading bytes of the prompt's text make its key.")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["model_id", "latency_class", "residency"],
                                    name="one_route_per_model_class_pin"),
        ]

    def __str__(self) -> str:
        return self.name


class ContextTier(models.Model):
    """One context tier of a route: the requests whose prompt is at most `max_prompt_tokens`
    (and above the tier below), and what happens when none of the tier's pools can take one.
    A route is one model, latency class and residency pin, so a route's tiers are the
    per-model policy of the issue. Which pools may serve a tier is computed, never stored
    (traffic/tiers.py): a registry edit changes it at once. Written only by
    services.route_tiers_set, which replaces all of a route's tiers in one audited call."""

    class Behaviour(models.TextChoices):
        QUEUE = "queue", "queue (bounded; 429/503 with Retry-After when full)"
        REJECT = "reject", "reject with 413 (never a silent downgrade)"
        FAILOVER = "failover", "fail over to another eligible pool, across vendors"
        FAILOVER_CLASS = "failover-class", "fail over only within the latency class"
        PINNED = "pinned", "pinned: never fail over"

    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="context_tiers")
    # None: every prompt above the tier below (only the last tier may be open-ended).
    max_prompt_tokens = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Prompts of at most this many tokens; empty: above the last bound.")
    behaviour = models.CharField(max_length=14, choices=Behaviour.choices)
    queue_max = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="queue: requests held at most; beyond it 429 with Retry-After.")
    retry_after_s = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="queue: the Retry-After a full queue answers with, in seconds.")

    class Meta:
        ordering = ["route", models.F("max_prompt_tokens").asc(nulls_last=True)]
        constraints = [
            models.UniqueConstraint(fields=["route", "max_prompt_tokens"],
                                    name="one_tier_per_route_bound"),
            models.UniqueConstraint(fields=["route"],
                                    condition=models.Q(max_prompt_tokens__isnull=True),
                                    name="one_open_tier_per_route"),
        ]

    def __str__(self) -> str:
        bound = f"≤ {self.max_prompt_tokens}" if self.max_prompt_tokens else "above"
        return f"{self.route_id} {bound}: {self.behaviour}"

    @property
    def label(self) -> str:
        return (f"≤ {self.max_prompt_tokens:,} tokens" if self.max_prompt_tokens is not None
                else "above the last bound")


class SplitRevision(models.Model):
    """One immutable, numbered split of a route across pools."""

    class Kind(models.TextChoices):
        CREATE = "create", "create"
        CHANGE = "change", "change"
        DRAIN = "drain", "drain"
        RESTORE = "restore", "restore"
        # The split in proportion to each pool's SLO-qualified capacity (capacity_split.py).
        CAPACITY = "capacity", "capacity"

    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    parent = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True,
                               related_name="+")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    # {pool name: basis points}; empty means no pool may serve the route (fails closed).
    weights = models.JSONField(default=dict)
    # {pool name: pool id} when the revision was stored: the identity behind each name. A pool
    # deleted and registered again under the same name is another pool, and gateways give it
    # none of this revision's weight (selectors.gateway_desired_state).
    pool_ids = models.JSONField(default=dict)
    reason = models.TextField(blank=True)
    forced = models.BooleanField(default=False)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["route", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["route", "number"], name="revision_numbers_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.route.name} r{self.number}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise ImmutableError("Split revisions are immutable; create a new one.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ImmutableError("Split revisions are immutable and are never deleted.")

    def percentages(self) -> dict[str, float]:
        return {pool: bp / 100 for pool, bp in sorted(self.weights.items())}


class GatewayKindField(models.CharField):
    """Gateway.kind: text in the database, one of the registry's kinds everywhere else
    (fleetctl.traffic.gateways.registry finds them from their folders). Migrations see a plain
    CharField without choices, so a new kind needs no migration; forms get a choice of the
    registered kinds, and validation refuses any other."""

    def formfield(self, **kwargs: Any) -> Any:
        from django import forms
        from django.utils.text import capfirst

        from fleetctl.traffic.gateways import registry

        return forms.ChoiceField(choices=registry.choices, initial=self.default,
                                 label=capfirst(self.verbose_name), help_text=self.help_text)

    def validate(self, value: Any, model_instance: Any) -> None:
        from django.core.exceptions import ValidationError

        from fleetctl.traffic.gateways import registry

        super().validate(value, model_instance)
        if registry.find(value) is None:
            raise ValidationError(registry.unknown_kind_message(value), code="invalid_choice")

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.CharField", args, kwargs


class Gateway(models.Model):
    class State(models.TextChoices):
        UNKNOWN = "unknown", "unknown"
        IN_SYNC = "in-sync", "in sync"
        FAILING = "failing", "failing"

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    kind = GatewayKindField(max_length=16, default="envoy",
                            help_text="The kind of gateway: one of the registered kinds.")
    admin_address = models.CharField(
        max_length=300, help_text="How fleetctl reaches the gateway; each kind says what it "
                                  "holds (a URL, a socket, a directory).",
        validators=[RegexValidator(r"^\S+$", "No spaces.")],
    )
    options = models.JSONField(default=dict, blank=True)
    routes = models.ManyToManyField(Route, related_name="gateways", blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.UNKNOWN,
                             editable=False)
    state_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    last_verified_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # The mirror secret (traffic/mirror_auth.py): generated here, never typed in and never
    # shown. Not editable, so no form, serializer or audit snapshot carries it; only
    # services.gateway_mirror_secret_rotate changes it. The gateway's copies of a route carry
    # an HMAC of the route's key with it; the previous secret's are still accepted for
    # MIRROR_SECRET_GRACE_S after a rotation, while the gateway takes its new config.
    mirror_secret = models.CharField(max_length=64, default=new_secret, editable=False)
    mirror_secret_previous = models.CharField(max_length=64, blank=True, editable=False)
    mirror_secret_rotated_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_kind_display(self) -> str:
        from fleetctl.traffic.gateways import registry

        kind = registry.find(self.kind)
        return kind.label if kind is not None else self.kind

    @property
    def supports_mirror(self) -> bool:
        """Can it copy a share of a route's requests to the shadow collector (its kind)?"""
        from fleetctl.traffic.gateways import registry

        kind = registry.find(self.kind)
        return kind is None or kind.supports_mirror

    def clean(self) -> None:
        """The kind's own rules (registry): what admin_address holds, and the options schema
        (unknown keys, types, required options), each problem naming its option."""
        from django.core.exceptions import ValidationError

        from fleetctl.traffic.gateways import registry
        from fleetctl.traffic.gateways.schema import OptionsError

        kind = registry.find(self.kind)
        if kind is None:
            return  # the field's own validation says so
        errors: dict[str, list[str]] = {}
        problem = kind.address_problem(self.admin_address)
        if problem:
            errors["admin_address"] = [problem]
        try:
            kind.parse_options(self.options)
        except OptionsError as exc:
            errors["options"] = exc.problems
        if errors:
            raise ValidationError(errors)


class GatewayPush(models.Model):
    """Getting one gateway to hold one revision (of one route). Attempts are child rows.

    A push outlives its gateway: deleting a gateway keeps its pushes and their attempts (the
    history of every drain and ramp that reached it) with the gateway's name and kind copied
    onto them and the link nulled; a push still open then is `abandoned` — the gateway was
    deleted before it verified (services.gateway_delete)."""

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        VERIFIED = "verified", "verified"
        RETRYING = "retrying", "retrying"
        FAILED = "failed", "failed"
        SUPERSEDED = "superseded", "superseded"
        ABANDONED = "abandoned", "abandoned: gateway deleted before verifying"

    revision = models.ForeignKey(SplitRevision, on_delete=models.CASCADE, related_name="pushes")
    gateway = models.ForeignKey(Gateway, on_delete=models.SET_NULL, null=True, blank=True,
                                related_name="pushes")
    # The gateway as it was when it was deleted (empty while it exists): the record still
    # names it.
    gateway_name = models.CharField(max_length=63, blank=True)
    gateway_kind = models.CharField(max_length=16, blank=True)
    gateway_deleted_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    reason = models.CharField(max_length=20, default="revision")  # revision | reconcile
    created_at = models.DateTimeField(default=timezone.now)
    applied_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["gateway", "status"])]

    def __str__(self) -> str:
        return f"{self.revision} → {self.gateway_label}: {self.status}"

    @property
    def gateway_deleted(self) -> bool:
        return self.gateway_id is None

    @property
    def live_gateway(self) -> Gateway:
        """The gateway of a push the engine works on. An open push always has one: deleting
        a gateway abandons its open pushes in the same transaction."""
        if self.gateway is None:
            raise Gateway.DoesNotExist(f"push {self.pk}: gateway {self.gateway_name} was "
                                       f"deleted")
        return self.gateway

    @property
    def live_gateway_id(self) -> int:
        if self.gateway_id is None:
            raise Gateway.DoesNotExist(f"push {self.pk}: gateway {self.gateway_name} was "
                                       f"deleted")
        return self.gateway_id

    @property
    def recorded_gateway_name(self) -> str:
        """The gateway's name now, or the name it had when it was deleted."""
        return self.gateway.name if self.gateway is not None else self.gateway_name

    @property
    def gateway_label(self) -> str:
        """The gateway's name, or the name it had followed by "(deleted)"."""
        if self.gateway is not None:
            return self.gateway.name
        return f"{self.gateway_name or 'a gateway'} (deleted)"


class GatewayPushAttempt(models.Model):
    push = models.ForeignKey(GatewayPush, on_delete=models.CASCADE, related_name="attempt_rows")
    number = models.PositiveIntegerField()
    sent_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)
    applied = models.BooleanField(default=False)
    verified = models.BooleanField(default=False)
    method = models.CharField(max_length=20, blank=True)
    detail = models.TextField(blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["push", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.push_id}"


class Drain(models.Model):
    """One on-call action: move a route, or every route using a pool, back to the primary —
    or restore the split from before a drain. Timed end to end."""

    class Action(models.TextChoices):
        DRAIN = "drain", "drain"
        RESTORE = "restore", "restore"

    class Status(models.TextChoices):
        PUSHING = "pushing", "pushing to gateways"
        VERIFIED = "verified", "all gateways verified; waiting for in-flight requests"
        COMPLETE = "complete", "complete"
        PARTIAL = "partial", "partial: a gateway still routes to the pool"
        FAILED = "failed", "failed"

    action = models.CharField(max_length=8, choices=Action.choices, default=Action.DRAIN)
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="drains", null=True,
                             blank=True, help_text="The pool drained (a pool drain, or the "
                                                   "pool a route drain moved traffic off).")
    route = models.ForeignKey(Route, on_delete=models.PROTECT, null=True, blank=True,
                              related_name="drains", help_text="Set for a route drain.")
    restores = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True,
                                 related_name="restored_by")
    revisions = models.ManyToManyField(SplitRevision, related_name="drains")
    # Pools that lost all their weight on the drained routes: their in-flight requests are
    # what the drain waits for.
    drained_pools = models.JSONField(default=list)
    requested_by = models.CharField(max_length=150)
    reason = models.TextField()
    requested_at = models.DateTimeField(default=timezone.now)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PUSHING)
    verified_at = models.DateTimeField(null=True, blank=True)
    in_flight_zero_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # Why a drain gave up (status failed): a gateway refused for good, or the drain was not
    # verified everywhere within DRAIN_WATCH_TIMEOUT_S.
    failure_reason = models.TextField(blank=True)
    # A drain (or restore) the health policy made: the transition that triggered it (its
    # probe evidence: the failing check and its error).
    health_transition = models.ForeignKey(
        "fleet.HealthTransition", on_delete=models.SET_NULL, null=True, blank=True,
        related_name="drains")
    # The capacity check (traffic/drain_capacity.py): per route, the load the drained pools
    # carried, each pool's SLO capacity and live streams, and the decision (instant, spread,
    # stepped or forced) with why; a stepped drain's steps too.
    capacity = models.JSONField(default=dict, blank=True)
    # A stepped drain's next step (the converge task takes it); None once the last is stored.
    next_step_at = models.DateTimeField(null=True, blank=True, db_index=True)

    # Not a column: the pushes drain_request / drain_restore just stored, for the caller to
    # attempt after its commit (push.drain_push_now); None on a record read from the database.
    push_ids: list[int] | None = None
    # Not columns either: the revisions the service stored, and the pushes as push.drain_push_now
    # recorded them, so the API answers from what it has in hand instead of reading it back.
    new_revisions: list[SplitRevision] | None = None
    first_pushes: list[GatewayPush] | None = None

    class Meta:
        ordering = ["-requested_at", "-id"]

    def __str__(self) -> str:
        target = self.route or self.pool or "?"
        return f"{self.action} {target} at {self.requested_at:%Y-%m-%d %H:%M:%S}"

    @property
    def verified_ms(self) -> float | None:
        if self.verified_at is None:
            return None
        return (self.verified_at - self.requested_at).total_seconds() * 1000

    @property
    def duration_ms(self) -> float | None:
        if self.completed_at is None:
            return None
        return (self.completed_at - self.requested_at).total_seconds() * 1000


class PoolTrafficSample(models.Model):
    """Per-pool counters read from one gateway at one moment; rates are differences between
    consecutive samples (a counter that went down means the gateway restarted)."""

    gateway = models.ForeignKey(Gateway, on_delete=models.CASCADE, related_name="samples")
    pool = models.CharField(max_length=63)
    at = models.DateTimeField(default=timezone.now)
    requests_total = models.BigIntegerField()
    errors_total = models.BigIntegerField()
    active = models.IntegerField()

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["gateway", "pool", "-at"])]

    def __str__(self) -> str:
        return f"{self.gateway_id}/{self.pool} at {self.at:%H:%M:%S}"
