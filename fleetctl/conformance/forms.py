"""The dashboard's form to start a conformance run. Shapes only; the service decides."""

from __future__ import annotations

from typing import Any

from django import forms

from fleetctl.fleet.models import Pool
from migrations_plan.models import Plan


class RunForm(forms.Form):
    pool = forms.ModelChoiceField(queryset=Pool.objects.order_by("name"), to_field_name="name",
                                  help_text="Every endpoint of it is probed.")
    plan = forms.ModelChoiceField(queryset=Plan.objects.order_by("name"), to_field_name="name",
                                  required=False,
                                  help_text="Optional: a plan whose candidate is the pool; its "
                                            "primary becomes the reference.")
    primary = forms.ModelChoiceField(queryset=Pool.objects.order_by("name"),
                                     to_field_name="name", required=False,
                                     label="Reference pool",
                                     help_text="Without a plan: the pool to compare with "
                                               "(prompt-token and max-context parity).")
    model = forms.CharField(max_length=200, required=False,
                            help_text="Default: the plan's routes' model or the pool's only one.")
    include_saturation = forms.BooleanField(
        required=False, label="Include the saturation case",
        help_text="Floods the pool with concurrent requests until it answers 429: only on a "
                  "pool that carries no traffic.")

    def service_kwargs(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {"pool": data["pool"], "plan": data.get("plan"), "primary": data.get("primary"),
                "model_id": data.get("model") or "",
                "include_saturation": bool(data.get("include_saturation"))}
