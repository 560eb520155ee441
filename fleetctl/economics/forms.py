"""The business case's edit form: the seven burden rows, the engineer cost and its currency,
the expected volume, the override and the peak window. The form reads what was typed (as
text, so the service's message naming the field and its range is the one shown); the service
(`economics.services`) judges it."""

from __future__ import annotations

from typing import Any

from django import forms

from fleetctl.economics.models import BURDEN_ROWS, BusinessCase
from fleetctl.economics.services import EDITABLE
from fleetctl.fleet.models import CURRENCIES


def _number(label: str, help_text: str = "", required: bool = True) -> forms.CharField:
    return forms.CharField(label=label, help_text=help_text, required=required, max_length=40,
                           widget=forms.TextInput(attrs={"inputmode": "decimal"}))


class BusinessCaseForm(forms.Form):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, title, means, default, why in BURDEN_ROWS:
            self.fields[name] = _number(f"{title} (weeks/year)",
                                        f"{means}. Default {default:g}: {why}.")
        self.fields["engineer_cost_per_year"] = _number(
            "Engineer cost per year", "One engineer-year, loaded (salary and overheads).")
        self.fields["engineer_cost_currency"] = forms.ChoiceField(
            label="Currency", choices=[(c, c) for c in CURRENCIES])
        self.fields["expected_mtokens_per_month"] = _number(
            "Expected volume (M output tokens/month)",
            "What the plan expects to move to the candidate; empty: not set.", required=False)
        self.fields["override"] = forms.ChoiceField(
            label="Capacity or residency override", required=False,
            choices=BusinessCase.Override.choices)
        self.fields["override_reason"] = forms.CharField(
            label="Why", required=False, max_length=2000,
            widget=forms.Textarea(attrs={"rows": 2}),
            help_text="Required with an override: the region, quota or contract that decides.")
        self.fields["peak_days"] = _number("Peak demand over (days)", "1 to 30.")

    def service_kwargs(self) -> dict[str, Any]:
        return {name: self.cleaned_data.get(name) for name in EDITABLE}


def initial_of(row: BusinessCase) -> dict[str, Any]:
    values = {name: getattr(row, name) for name in EDITABLE}
    return {name: ("" if value is None else value) for name, value in values.items()}
