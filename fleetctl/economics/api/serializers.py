"""The business case over REST: the inputs a PUT may change (each optional; the service
checks ranges and says which field is wrong), and the case as judged now."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rest_framework import serializers

from fleetctl.core.api.fields import StrictCharField, StrictIntegerField, range_messages
from fleetctl.economics.models import (
    BURDEN_ROWS,
    MAX_ENGINEER_COST,
    MAX_PEAK_DAYS,
    MAX_VOLUME_M,
    MAX_WEEKS,
    MIN_VOLUME_M,
    BusinessCase,
)
from fleetctl.fleet.models import CURRENCIES


def _weeks(title: str, means: str) -> serializers.DecimalField:
    return serializers.DecimalField(
        max_digits=5, decimal_places=1, required=False, min_value=Decimal("0"),
        max_value=MAX_WEEKS, help_text=f"{title}: {means}. Engineer-weeks a year, 0–52.",
        error_messages=range_messages(f"{title}: give 0 to {MAX_WEEKS} engineer-weeks a year, "
                                      f"to one decimal.", "max_digits", "max_decimal_places",
                                      "max_whole_digits"))


class BusinessCaseInputSerializer(serializers.Serializer):
    engineer_cost_per_year = serializers.DecimalField(
        max_digits=12, decimal_places=2, required=False, min_value=Decimal("0.01"),
        max_value=MAX_ENGINEER_COST, help_text="One engineer-year, loaded.",
        error_messages=range_messages(f"Give what one engineer-year costs, above 0 and at most "
                                      f"{MAX_ENGINEER_COST:,}.", "max_digits",
                                      "max_decimal_places", "max_whole_digits"))
    engineer_cost_currency = serializers.ChoiceField(
        choices=list(CURRENCIES), required=False,
        error_messages={"invalid_choice": f"Unknown currency: use one of "
                                          f"{', '.join(CURRENCIES)}."})
    expected_mtokens_per_month = serializers.DecimalField(
        max_digits=14, decimal_places=3, required=False, allow_null=True,
        min_value=MIN_VOLUME_M, max_value=MAX_VOLUME_M,
        help_text="Output tokens a month the plan expects to move, in millions; null: not set.",
        error_messages=range_messages(f"Give the output tokens a month in millions, from "
                                      f"{MIN_VOLUME_M} to {MAX_VOLUME_M:,}.", "max_digits",
                                      "max_decimal_places", "max_whole_digits"))
    override = serializers.ChoiceField(choices=BusinessCase.Override.values, required=False,
                                       help_text="capacity, residency, or empty.")
    override_reason = StrictCharField(required=False, allow_blank=True, max_length=2000)
    peak_days = StrictIntegerField(
        required=False, min_value=1, max_value=MAX_PEAK_DAYS,
        help_text="Days of live telemetry the peak demand is taken over.",
        error_messages=range_messages(f"Give 1 to {MAX_PEAK_DAYS} days."))

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        for name, title, means, *_ in BURDEN_ROWS:
            fields[name] = _weeks(title, means)
        return fields


class BusinessCaseSerializer(serializers.Serializer):
    """The inputs stored (or the defaults) and the case judged from them now."""

    plan = serializers.CharField()
    inputs = serializers.DictField(help_text="The editable inputs, as PUT takes them.")
    verdict = serializers.ChoiceField(choices=["pays", "does-not-pay", "justified",
                                               "not-measured"])
    verdict_words = serializers.CharField()
    headline = serializers.CharField()
    currency = serializers.CharField()
    reasons = serializers.ListField(child=serializers.CharField())
    what_would_change_it = serializers.ListField(child=serializers.CharField())
    numbers = serializers.DictField()
    burden = serializers.ListField(child=serializers.DictField())
    capacity_forecast = serializers.DictField(allow_null=True)
    recorded_verdict = serializers.CharField(allow_blank=True)
    judged_at = serializers.DateTimeField(allow_null=True)
