"""Dashboard forms for the fleet registry.

They shape input (types, one URL per line, key=value labels) and then run the model's own
validation on a preview of the result, so a person sees every error after one submit. The
service validates again and stays the authority (permissions, races, audit); its errors are
put back on the form by the view.
"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db import models

from fleetctl.core.views import form_add_service_errors
from fleetctl.fleet import selectors
from fleetctl.fleet.models import (
    CURRENCIES,
    JURISDICTIONS,
    CurrencyRate,
    Pool,
    PoolModel,
    Region,
)


def preview_model_validation(form: forms.Form, candidate: models.Model) -> None:
    """full_clean() the would-be row and show its errors on the form. Fields that already
    failed to parse are left out, so each field shows one error, not a follow-on one."""
    for name, value in form.cleaned_data.items():
        setattr(candidate, name, value)
    try:
        candidate.full_clean(exclude=list(form.errors))
    except ValidationError as exc:
        form_add_service_errors(form, exc)


class RegionChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.code} — {obj.name} ({obj.jurisdiction})"


def parse_lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip()]


def parse_labels(value: str) -> dict[str, str]:
    """`key=value` per line; the first `=` splits, so values may contain `=`."""
    labels: dict[str, str] = {}
    problems: list[str] = []
    for number, line in enumerate(value.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        key, sep, item = line.partition("=")
        key, item = key.strip(), item.strip()
        if not sep or not key:
            problems.append(f"Line {number}: {line!r} is not key=value.")
        elif key in labels:
            problems.append(f"Line {number}: the key {key!r} is given twice.")
        else:
            labels[key] = item
    if problems:
        raise ValidationError(problems)
    return labels


class PoolForm(forms.Form):
    name = forms.CharField(
        max_length=63,
        help_text="Lowercase letters, digits and hyphens; routes and URLs use it.",
    )
    runtime = forms.ChoiceField(choices=Pool.Runtime.choices, label="Vendor / runtime")
    runtime_version = forms.CharField(
        max_length=64, required=False, help_text="e.g. vLLM 0.6.3 + ROCm 6.2",
    )
    accelerator = forms.CharField(max_length=64, help_text="e.g. H200, MI300X, TPU v5e")
    region = RegionChoiceField(
        queryset=Region.objects.none(), to_field_name="code", empty_label="— pick a region —",
        error_messages={
            "invalid_choice": "There is no region with that code; create it under Regions first.",
        },
    )
    base_urls = forms.CharField(
        label="Base URLs", widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One OpenAI-compatible endpoint per line, e.g. http://10.0.0.5:8000/v1",
        error_messages={"required": "Give at least one base URL, one per line."},
    )
    latency_class = forms.ChoiceField(
        choices=Pool.LatencyClass.choices, initial=Pool.LatencyClass.STANDARD,
    )
    max_context_tokens = forms.IntegerField(label="Max context (tokens)", initial=32768)
    node_hourly_rate = forms.DecimalField(
        max_digits=12, decimal_places=4, label="Node hourly rate",
        help_text="What one node costs per hour; cost per 1M tokens is derived from it.",
    )
    currency = forms.ChoiceField(choices=[(c, c) for c in CURRENCIES], initial="USD")
    labels = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Optional, one key=value per line, e.g. driver=550.54",
    )
    interruptible = forms.BooleanField(
        required=False, label="Interruptible (spot, preemptible)",
        help_text="The provider may reclaim its nodes; every cost of the pool then includes "
                  "the interruption tax, priced by its own drills.")
    reclaims_per_month = forms.DecimalField(
        required=False, max_digits=6, decimal_places=2, label="Reclaims a month",
        help_text="Interruptible only: expected reclaims a month, above 0, at most 720.")
    standby_pct = forms.DecimalField(
        required=False, max_digits=5, decimal_places=2, label="Standby (%)",
        help_text="Interruptible only: idle capacity kept to absorb a reclaim, 0-100 % of "
                  "the serving capacity.")

    def __init__(self, *args: Any, pool: Pool | None = None, **kwargs: Any) -> None:
        if pool is not None:
            kwargs.setdefault("initial", self.initial_for(pool))
        super().__init__(*args, **kwargs)
        self.pool = pool
        self.fields["region"].queryset = selectors.region_list().order_by("code")  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # A copy: the preview must not change the pool the view still holds.
        preview_model_validation(self, copy.copy(self.pool) if self.pool else Pool())
        return cleaned

    @classmethod
    def initial_for(cls, pool: Pool) -> dict[str, Any]:
        return {
            "name": pool.name, "runtime": pool.runtime, "runtime_version": pool.runtime_version,
            "accelerator": pool.accelerator, "region": pool.region,
            "base_urls": "\n".join(pool.base_urls or []),
            "latency_class": pool.latency_class, "max_context_tokens": pool.max_context_tokens,
            "node_hourly_rate": pool.node_hourly_rate, "currency": pool.currency,
            "labels": "\n".join(f"{k}={v}" for k, v in (pool.labels or {}).items()),
            "interruptible": pool.interruptible, "reclaims_per_month": pool.reclaims_per_month,
            "standby_pct": pool.standby_pct,
        }

    def clean_base_urls(self) -> list[str]:
        urls = parse_lines(self.cleaned_data["base_urls"])
        if not urls:
            raise ValidationError("Give at least one base URL.")
        return urls

    def clean_labels(self) -> dict[str, str]:
        return parse_labels(self.cleaned_data.get("labels") or "")


class PoolModelForm(forms.Form):
    model_id = forms.CharField(
        max_length=200, label="Model id", help_text="As callers send it, e.g. llama-3.1-70b",
    )
    revision = forms.CharField(max_length=100, required=False, help_text="e.g. a commit hash")
    quantisation = forms.ChoiceField(
        choices=PoolModel.Quantisation.choices, initial=PoolModel.Quantisation.BF16,
    )
    weight_format = forms.CharField(max_length=32, required=False, help_text="e.g. safetensors")
    max_context_tokens = forms.IntegerField(label="Max context (tokens)")

    def __init__(self, *args: Any, pool: Pool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool = pool
        # Most models are served at the pool's full context; start from that.
        self.fields["max_context_tokens"].initial = pool.max_context_tokens

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        preview_model_validation(self, PoolModel(pool=self.pool))
        return cleaned


class RegionForm(forms.Form):
    code = forms.CharField(max_length=63, help_text="e.g. eu-west-1; lowercase and hyphens")
    name = forms.CharField(max_length=100, help_text="A readable name, e.g. Frankfurt")
    jurisdiction = forms.ChoiceField(
        choices=[
            ("", "— pick a jurisdiction —"),
            *((code, f"{code} — {name}") for code, name in sorted(JURISDICTIONS.items())),
        ],
        help_text="Residency pins match on this, never on the region name.",
    )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        preview_model_validation(self, Region())
        return cleaned


class CurrencyRateForm(forms.Form):
    from_currency = forms.ChoiceField(choices=[(c, c) for c in CURRENCIES], initial="EUR",
                                      label="From")
    to_currency = forms.ChoiceField(choices=[(c, c) for c in CURRENCIES], initial="USD",
                                    label="To")
    rate = forms.DecimalField(max_digits=18, decimal_places=8, min_value=Decimal("0.00000001"),
                              help_text="How many of the “to” currency one “from” buys, e.g. "
                                        "1.08 for EUR → USD.")
    as_of = forms.DateField(label="As of", widget=forms.DateInput(attrs={"type": "date"}),
                            help_text="The day the rate is for (YYYY-MM-DD).")
    source = forms.CharField(max_length=200, required=False,
                             help_text="Where it comes from, e.g. a central bank's reference "
                                       "rate.")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        preview_model_validation(self, CurrencyRate())
        return cleaned
