"""Form fields every app's forms declare the same way."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db import models


def model_form_field(model: type[models.Model], name: str, **overrides: Any) -> forms.Field:
    """The model's own field (validators, help text) as a form field, so a form and the model
    it fills cannot disagree on what a value may be."""
    model_field = model._meta.get_field(name)
    assert isinstance(model_field, models.Field)
    field = model_field.formfield(**overrides)
    assert field is not None
    return field


def reason_field(**kwargs: Any) -> forms.CharField:
    """Why a person acts: a short text area (it goes in a timeline and the audit log)."""
    return forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), **kwargs)
