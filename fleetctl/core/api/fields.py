from typing import Any

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of quietly turning them to text."""

    default_error_messages = {"not_text": "Must be text (a JSON string), not {kind}."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("not_text", kind=type(data).__name__)
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """true or false, not "yes", 1 or "true"."""

    default_error_messages = {"strict": "Must be true or false (a JSON boolean)."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("strict")
        return data


class MillisecondsField(serializers.FloatField):
    """A read-only duration in milliseconds, answered to 0.1 ms (core.numbers.round_ms): no
    binary noise such as 41.223000000000006."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("read_only", True)
        kwargs.setdefault("help_text", "Milliseconds, to 0.1 ms.")
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        from fleetctl.core.numbers import round_ms

        return round_ms(float(value))
