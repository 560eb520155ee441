"""The dashboard's shadow forms: start a run for a plan, adjust a running one, stop one.
Shapes only (bounds come from the model's own fields, so a form and the API refuse the same
numbers); the services decide everything else and their refusals land on these forms."""

from __future__ import annotations

from functools import partial
from typing import Any

from django import forms

from fleetctl.bench.models import Trace
from fleetctl.core.forms import model_form_field
from fleetctl.shadow.models import ShadowRun
from fleetctl.traffic.models import Route

# The numbers a lead may set when starting and change while running.
TUNABLE = ("sample_percent", "max_rps", "max_tokens_per_day", "content", "retention_hours",
           "min_pairs")


_model_field = partial(model_form_field, ShadowRun)


class StartForm(forms.Form):
    mode = forms.ChoiceField(choices=ShadowRun.Mode.choices, initial=ShadowRun.Mode.MIRROR,
                             help_text="Mirror copies the route's live requests at its "
                                       "gateways; replay sends a stored trace's requests.")
    route = forms.ModelChoiceField(queryset=Route.objects.none(), to_field_name="name",
                                   required=False,
                                   help_text="Mirror: the plan route whose traffic is copied. "
                                             "Replay: the route whose residency pin applies.")
    trace = forms.ModelChoiceField(queryset=Trace.objects.order_by("name"),
                                   to_field_name="name", required=False,
                                   help_text="Replay only: a trace whose requests carry "
                                             "prompt texts.")

    def __init__(self, *args: Any, plan: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        routes = plan.routes.order_by("name")
        field = self.fields["route"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = routes
        if len(routes) == 1:
            field.initial = routes[0].name
        self.fields.update({
            "sample_percent": _model_field("sample_percent", label="Sample, %"),
            "max_rps": _model_field("max_rps", label="Cap: sampled requests/s"),
            "max_tokens_per_day": _model_field("max_tokens_per_day",
                                               label="Cap: tokens per UTC day"),
            "content": _model_field("content", label="Content storage"),
            "retention_hours": _model_field("retention_hours", label="Keep text for (hours)"),
            "min_pairs": _model_field("min_pairs", label="Minimum pairs for a verdict"),
        })

    def service_kwargs(self) -> dict[str, Any]:
        data = self.cleaned_data
        kwargs = {"mode": data["mode"], "route": data.get("route"), "trace": data.get("trace")}
        kwargs.update({name: data[name] for name in TUNABLE if data.get(name) is not None})
        return kwargs


class AdjustForm(forms.Form):
    """Every field optional: only what is filled in changes."""

    def __init__(self, *args: Any, run: ShadowRun | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("sample_percent", "max_rps", "max_tokens_per_day"):
            self.fields[name] = _model_field(name, required=False)
        self.fields["sample_percent"].label = "Sample, %"
        self.fields["max_rps"].label = "Cap: sampled requests/s"
        self.fields["max_tokens_per_day"].label = "Cap: tokens per UTC day"
        if run is not None and not self.is_bound:
            for name in ("sample_percent", "max_rps", "max_tokens_per_day"):
                self.fields[name].initial = getattr(run, name)

    def changes(self) -> dict[str, Any]:
        return {name: value for name, value in self.cleaned_data.items() if value is not None}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors and not any(v is not None for v in data.values()):
            raise forms.ValidationError("Change at least one of the sample or the caps.")
        return data


class StopForm(forms.Form):
    reason = forms.CharField(
        max_length=500, strip=True,
        widget=forms.TextInput(attrs={"placeholder": "why: e.g. candidate diverging, "
                                                     "spend, incident"}),
        help_text="Goes in the audit log and the run's record.")
    # Where to go back to when stopped (the plan page's panel); only a local path is used.
    next = forms.CharField(required=False, widget=forms.HiddenInput)
