from __future__ import annotations

from decimal import Decimal
from typing import Any

from rest_framework import serializers

from fleetctl.core.api.fields import StrictCharField, by_name
from fleetctl.fleet.models import (
    CurrencyRate,
    HealthCheck,
    HealthTransition,
    Pool,
    PoolModel,
    Region,
)


def pool_by_name(**kwargs: Any) -> serializers.SlugRelatedField:
    """A pool a request names; an unknown name is refused with where pools are listed."""
    return by_name(Pool.objects.all(), "No pool named {value}; see GET /api/v1/pools/.",
                   **kwargs)


class RegionSerializer(serializers.ModelSerializer):
    pool_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Region
        fields = ["id", "code", "name", "jurisdiction", "pool_count", "created_at"]
        read_only_fields = ["id", "created_at"]


class PoolModelNestedSerializer(serializers.ModelSerializer):
    class Meta:
        model = PoolModel
        fields = ["id", "model_id", "revision", "quantisation", "weight_format",
                  "max_context_tokens"]


class PoolReportedSerializer(serializers.Serializer):
    """What the pool's servers last reported of themselves (the health probe)."""

    server_version = serializers.CharField(
        allow_null=True, default=None,
        help_text="GET /version's version (vLLM); null: never reported.")
    max_model_len = serializers.DictField(
        child=serializers.IntegerField(), default=dict,
        help_text="Model → max_model_len as /v1/models lists it.")


class PoolListSerializer(serializers.ListSerializer):
    """A page of pools: the interruption taxes of all of them in one drill read."""

    def to_representation(self, data: Any) -> Any:
        from fleetctl.fleet.interruption import effective_rates

        pools = list(data.all() if hasattr(data, "all") else data)
        taxes = effective_rates(pools)
        self.child._taxes = {pool.pk: taxes[pool.name] for pool in pools}  # type: ignore[union-attr]
        return super().to_representation(pools)


class PoolSerializer(serializers.ModelSerializer):
    region = serializers.SlugRelatedField(slug_field="code", queryset=Region.objects.all())
    reported = PoolReportedSerializer(
        read_only=True, help_text="What its servers last reported of themselves; a change "
                                  "nobody registered starts re-verification.")
    jurisdiction = serializers.CharField(source="region.jurisdiction", read_only=True)
    models = PoolModelNestedSerializer(many=True, read_only=True)
    base_urls = serializers.ListField(
        child=StrictCharField(max_length=300), min_length=1, max_length=16
    )
    labels = serializers.DictField(child=StrictCharField(max_length=200), required=False)
    node_hourly_rate = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0)
    cost_stale = serializers.SerializerMethodField(
        help_text="True when the hourly rate or currency changed since the benchmark the "
                  "cost comes from: the cost no longer holds until a benchmark re-measures it.")
    cost_stale_reason = serializers.SerializerMethodField(
        help_text="Why the cost is stale (null when it is not).")
    reclaims_per_month = serializers.DecimalField(
        max_digits=6, decimal_places=2, required=False, allow_null=True,
        help_text="Expected reclaims a month, above 0 and at most 720 (interruptible only).")
    standby_pct = serializers.DecimalField(
        max_digits=5, decimal_places=2, required=False, allow_null=True,
        help_text="Idle capacity kept to absorb a reclaim, 0-100 % (interruptible only).")
    interruption_tax = serializers.SerializerMethodField(
        help_text="An interruptible pool's tax, itemised (fleet/interruption.py): reclaim "
                  "and standby cost per hour, effective rate, uplift %, the drill it was "
                  "measured by, or not_measured with the reason; null when not interruptible.")
    cost_per_1m_incl_tax = serializers.SerializerMethodField(
        help_text="cost_per_1m_output_tokens with the interruption tax (equal to it when the "
                  "pool is not interruptible; null when the tax is not measured).")

    class Meta:
        model = Pool
        fields = [
            "id", "name", "runtime", "runtime_version", "accelerator", "region", "jurisdiction",
            "base_urls", "latency_class", "max_context_tokens", "node_hourly_rate", "currency",
            "labels", "interruptible", "reclaims_per_month", "standby_pct",
            "interruption_tax", "cost_per_1m_incl_tax", "models", "cost_per_1m_output_tokens",
            "cost_measured_at",
            "cost_hourly_rate", "cost_currency", "cost_source", "cost_stale",
            "cost_stale_reason", "health_state", "health_changed_at", "consecutive_failures",
            "last_probe_at",
            "last_probe_latency_ms", "last_probe_error", "reported", "reported_at",
            "created_at", "updated_at",
        ]
        read_only_fields = [
            "id", "cost_per_1m_output_tokens", "cost_measured_at", "cost_hourly_rate",
            "cost_currency", "cost_source", "health_state",
            "health_changed_at", "consecutive_failures", "last_probe_at",
            "last_probe_latency_ms", "last_probe_error", "reported", "reported_at",
            "created_at", "updated_at",
        ]
        # Uniqueness is checked by the service (full_clean) so the message is the same
        # everywhere; DRF's own check would be a second, differently worded one.
        extra_kwargs: dict[str, Any] = {"name": {"validators": []}}
        list_serializer_class = PoolListSerializer

    def get_cost_stale(self, pool: Pool) -> bool:
        return pool.cost_stale_reason is not None

    def get_cost_stale_reason(self, pool: Pool) -> str | None:
        return pool.cost_stale_reason

    def _tax(self, pool: Pool) -> Any:
        from fleetctl.fleet.interruption import effective_rate

        cache = self._taxes = getattr(self, "_taxes", {})
        if pool.pk not in cache:
            cache[pool.pk] = effective_rate(pool)  # no query when not interruptible
        return cache[pool.pk]

    def get_interruption_tax(self, pool: Pool) -> dict[str, Any] | None:
        return self._tax(pool).as_json() if pool.interruptible else None

    def get_cost_per_1m_incl_tax(self, pool: Pool) -> str | None:
        cost = self._tax(pool).apply(pool.cost_per_1m_output_tokens)
        return None if cost is None else str(cost)


class PoolModelSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="name", queryset=Pool.objects.all())

    class Meta:
        model = PoolModel
        fields = ["id", "pool", "model_id", "revision", "quantisation", "weight_format",
                  "max_context_tokens", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators: list[Any] = []


class HealthCheckSerializer(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.name", read_only=True)
    models_seen = serializers.ListField(child=serializers.CharField(), read_only=True,
                                        help_text="The model ids the pool listed.")

    class Meta:
        model = HealthCheck
        fields = ["id", "pool", "checked_at", "ok", "status_code", "latency_ms", "error",
                  "models_seen"]
        read_only_fields = fields


class HealthTransitionSerializer(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.name", read_only=True)

    class Meta:
        model = HealthTransition
        fields = ["id", "pool", "at", "from_state", "to_state", "reason"]
        read_only_fields = fields


class CurrencyRateSerializer(serializers.ModelSerializer):
    rate = serializers.DecimalField(max_digits=18, decimal_places=8,
                                    min_value=Decimal("0.00000001"),
                                    help_text="How many to_currency one from_currency buys.")
    text = serializers.CharField(source="label", read_only=True,
                                 help_text='The rate as written: "1.08 USD/EUR".')

    class Meta:
        model = CurrencyRate
        fields = ["id", "from_currency", "to_currency", "rate", "text", "as_of", "source",
                  "created_by", "created_at"]
        read_only_fields = ["id", "text", "created_by", "created_at"]
        # Checked by the service with a message that says what to do.
        validators: list[Any] = []


class TaskCostSerializer(serializers.Serializer):
    """Cost per successful task of a batch job or an eval run's pool (fleet.costs.TaskCost)."""

    pool = serializers.CharField()
    unit = serializers.CharField(help_text="What one success is, in words.")
    currency = serializers.CharField(help_text="The pool's currency.")
    hourly_rate = serializers.CharField(
        help_text="The pool's node_hourly_rate now, with its interruption tax if any.")
    seconds = serializers.FloatField(allow_null=True,
                                     help_text="Seconds the pool was busy with the work.")
    spend = serializers.CharField(allow_null=True, help_text="hourly rate × seconds ÷ 3600.")
    attempts = serializers.IntegerField(help_text="Every request sent, retries included.")
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    retries = serializers.IntegerField()
    cost_per_success = serializers.CharField(
        allow_null=True, help_text="spend ÷ succeeded; null with `not_measured`.")
    not_measured = serializers.CharField(
        allow_blank=True, help_text='"not measured: <reason>" when cost_per_success is null.')
    how = serializers.CharField(allow_blank=True, help_text="The arithmetic, in words.")
    interruption = serializers.CharField(
        allow_blank=True, help_text="An interruptible pool's tax in the rate, in words.")
