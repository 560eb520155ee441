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


class StrictFloatField(serializers.FloatField):
    """A number, not true or false (float(True) is 1: a quiet 1 instead of a refusal)."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        return float(super().to_internal_value(data))


class StrictIntegerField(serializers.IntegerField):
    """A whole number, not true or false, not 4.5 and not "4"."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


def by_name(queryset: Any, missing: str, **kwargs: Any) -> serializers.SlugRelatedField:
    """A row a request names by its `name`; `missing` refuses an unknown name and says where
    the names are listed."""
    error_messages = {"does_not_exist": missing, **kwargs.pop("error_messages", {})}
    return serializers.SlugRelatedField(slug_field="name", queryset=queryset,
                                        error_messages=error_messages, **kwargs)


RANGE_ERRORS = ("min_value", "max_value", "invalid", "max_string_length", "null", "overflow")


def range_messages(message: str, *also: str) -> dict[str, Any]:
    """The same actionable text for a value below or above its range, or not a number (and
    for the error keys in `also`), as a field's `error_messages`."""
    return dict.fromkeys((*RANGE_ERRORS, *also), message)
