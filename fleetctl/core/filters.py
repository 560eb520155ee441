"""One strictness for every list filter, in the API and on the dashboard: a value a filter
cannot read is an error naming the parameter and what it takes, never quietly dropped (which
would answer everything, as if no filter had been given).

`FilterSet` is the base for the apps' FilterSets; the API's filter backend
(core/api/filters.py) gives the same strictness to any FilterSet a view names, so the API
answers 400 and a page shows the error on its filter form and lists nothing.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet

# A choice list longer than this is cut short in an error.
MAX_LISTED = 40


def _allowed(field: forms.ChoiceField) -> list[str]:
    choices: Any = field.choices  # pairs, by now (Django normalises them)
    return [str(value) for value, _ in choices if value not in ("", None)]


def _takes(field: forms.Field) -> str:
    """What a field that is not a choice reads, for an error ('' when it reads any text)."""
    if isinstance(field, forms.IntegerField):
        return "a whole number"
    if isinstance(field, forms.DecimalField | forms.FloatField):
        return "a number"
    if isinstance(field, forms.DateTimeField):
        return "a date-time in ISO 8601, e.g. 2026-01-31T12:00:00Z"
    if isinstance(field, forms.DateField):
        return "a date, e.g. 2026-01-31"
    if isinstance(field, forms.UUIDField):
        return "a UUID"
    return ""


class StrictFilterForm(forms.Form):
    """The form a strict FilterSet validates with: choice errors list the allowed values,
    and a yes/no filter refuses what is neither (its widget would read it as "any")."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, field in self.fields.items():
            takes = _takes(field)
            raw = self.data.get(self.add_prefix(name)) if self.is_bound else None
            if takes and isinstance(raw, str):
                # Django's "Enter a number." names neither the value nor the parameter.
                # (Said without the value when it holds a %: some fields format it.)
                shown = f"“{raw[:100]}” is" if "%" not in raw else "That is"
                field.error_messages["invalid"] = (
                    f"{shown} not a valid {name}; allowed: {takes}.")
            if isinstance(field, forms.ModelChoiceField | forms.ModelMultipleChoiceField):
                field.error_messages["invalid_choice"] = (
                    f"“%(value)s” is not a valid {name}: nothing has that id.")
                field.error_messages["invalid_pk_value"] = (
                    f"“%(pk)s” is not a valid {name}: nothing has that id.")
            elif isinstance(field, forms.ChoiceField):
                allowed = _allowed(field)
                listed = (", ".join(allowed) if len(allowed) <= MAX_LISTED
                          else ", ".join(allowed[:MAX_LISTED]) + ", …")
                field.error_messages["invalid_choice"] = (
                    f"“%(value)s” is not a valid {name}; allowed: {listed}.")

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        for name, field in self.fields.items():
            if not isinstance(field, forms.NullBooleanField):
                continue
            raw = self.data.get(self.add_prefix(name))
            if not isinstance(raw, str) or raw.strip() in ("", "unknown"):
                continue
            if field.widget.value_from_datadict(self.data, self.files,
                                                self.add_prefix(name)) is None:
                self.add_error(name, f"“{raw}” is not a valid {name}; allowed: true, false.")
        return cleaned


class StrictFilterSetMixin:
    """Validate with StrictFilterForm; a bound FilterSet that is not valid filters to
    nothing (a page shows its errors; the API backend answers 400 before asking)."""

    form: forms.Form
    queryset: QuerySet[Any]
    is_bound: bool

    def get_form_class(self) -> type[forms.Form]:
        form: type[forms.Form] = super().get_form_class()  # type: ignore[misc]
        if issubclass(form, StrictFilterForm):
            return form
        return type(form.__name__, (StrictFilterForm, form), {})

    @property
    def qs(self) -> QuerySet[Any]:
        if self.is_bound and not self.form.is_valid():
            return self.queryset.none()
        return super().qs  # type: ignore[misc,no-any-return]


class FilterSet(StrictFilterSetMixin, django_filters.FilterSet):
    """The base of every app's FilterSet."""


_strict: dict[type, type] = {}


def strict(filterset_class: type[django_filters.FilterSet]) -> type[django_filters.FilterSet]:
    """`filterset_class` with the strictness above (itself when it has it already)."""
    if issubclass(filterset_class, StrictFilterSetMixin):
        return filterset_class
    if filterset_class not in _strict:
        _strict[filterset_class] = type(filterset_class.__name__,
                                        (StrictFilterSetMixin, filterset_class),
                                        {"__module__": filterset_class.__module__})
    return _strict[filterset_class]
