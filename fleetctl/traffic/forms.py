"""Dashboard forms for traffic: the ramp form (a percent per pool) and the drain and restore
confirmations.

The ramp form checks the split with the same function the service uses (`parse_percentages`),
so a person sees "adds up to 110 %" on the form; the service checks again with the database in
hand (health, residency, a change that landed meanwhile) and its errors are put back on the
form by the view.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from fleetctl.core.forms import reason_field
from fleetctl.fleet.models import Pool
from fleetctl.traffic.models import Route
from fleetctl.traffic.split import parse_percentages


class SplitWidget(forms.Widget):
    """Reads one `<name>-<pool>` input per offered pool. The route page renders those inputs
    itself (a row per pool with its region, health and current share), so this widget only
    parses. Inputs are keyed by pool name, not position: if the offered pools change between
    showing the form and submitting it, a number can never land on the wrong pool."""

    def __init__(self, pools: list[str]) -> None:
        super().__init__()
        self.pools = pools

    def value_from_datadict(self, data: Mapping[str, Any], files: Any, name: str) -> Any:
        return {pool: data.get(f"{name}-{pool}", "") for pool in self.pools}

    def value_omitted_from_data(self, data: Mapping[str, Any], files: Any, name: str) -> bool:
        return False


class SplitField(forms.Field):
    """{pool: percent text} → {pool: Decimal percent}; an empty input means 0 %."""

    widget = SplitWidget

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(widget=SplitWidget(pools=[]), **kwargs)

    def clean(self, value: Any) -> dict[str, Decimal]:
        raw = {pool: (str(text).strip() or "0") for pool, text in (value or {}).items()}
        try:
            parse_percentages(raw)
        except ValidationError as exc:
            # The service keys its errors by "weights"; on this field they need no key.
            raise ValidationError(exc.messages) from None
        return {pool: Decimal(text) for pool, text in raw.items()}


class RampForm(forms.Form):
    # Set by the view after a 409: the inputs hold what was typed, on the fresh revision.
    stale = False

    weights = SplitField(label="New split")
    reason = reason_field(help_text="Goes in the revision record and the audit log.")
    base_revision = forms.IntegerField(min_value=0, widget=forms.HiddenInput)
    force = forms.BooleanField(
        required=False, label="Force: allow weight on a pool that is not healthy",
        help_text="Audited. Never overrides residency.",
    )

    def __init__(self, *args: Any, pools: list[Pool], current: dict[str, float],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pools = pools
        self.current = current
        self.fields["weights"].widget = SplitWidget(pools=[pool.name for pool in pools])
        self.fields["weights"].initial = {
            pool.name: f"{current.get(pool.name, 0):g}" for pool in pools
        }

    def rows(self) -> list[dict[str, Any]]:
        """One row per offered pool: the pool, its share now and the value in its input."""
        values = self["weights"].value() or {}
        return [
            {"pool": pool, "current": self.current.get(pool.name, 0.0),
             "value": values.get(pool.name, ""), "name": f"weights-{pool.name}",
             "id": f"id_weights-{pool.name}"}
            for pool in self.pools
        ]


class DrainForm(forms.Form):
    """Typing the target's name is the confirmation: a drain moves production traffic now."""

    confirm_name = forms.CharField(
        max_length=63,
        widget=forms.TextInput(attrs={"autocomplete": "off", "autocapitalize": "none",
                                      "spellcheck": "false"}),
    )
    reason = forms.CharField(
        max_length=2000, widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Why you drain: it goes in the drain record and the audit log.",
    )
    force = forms.BooleanField(
        required=False, label="Force: move everything to the primary now, whatever its capacity",
        help_text="On-call only. Without it the drain is capacity-checked: a share the "
                  "primary cannot carry spreads over the route's pools that carry weight "
                  "(in its pin, if pinned), or moves in steps. The record says forced.")

    def __init__(self, *args: Any, expected: str, what: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.expected = expected
        self.what = what
        self.fields["confirm_name"].label = f"Type the {what} name, {expected}, to confirm"

    def clean_confirm_name(self) -> str:
        typed: str = self.cleaned_data["confirm_name"].strip()
        if typed != self.expected:
            raise ValidationError(
                f"That is not {self.expected}; type the {self.what} name exactly. "
                "Nothing was drained."
            )
        return typed


class RestoreForm(forms.Form):
    reason = reason_field(
        required=False, help_text="Optional; without one the record says which drain it undoes.")


class HealthPolicyForm(forms.Form):
    health_policy = forms.ChoiceField(choices=Route.HealthPolicy.choices, label="Health policy")


class ReverifyPolicyForm(forms.Form):
    reverify_policy = forms.ChoiceField(choices=Route.ReverifyPolicy.choices,
                                        label="Re-verification policy")
    reverify_benchmark = forms.BooleanField(required=False, label="and re-run the benchmark")
