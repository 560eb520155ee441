"""The metric-source pages' forms: the source itself (administrators) and a test query."""

from __future__ import annotations

from typing import Any

from django import forms

from fleetctl.prometheus.models import MetricSource
from fleetctl.prometheus.query import MAX_QUERY_CHARS


class MetricSourceForm(forms.Form):
    name = forms.SlugField(max_length=63, help_text="Lower-case letters, digits and dashes; "
                                                    "gate checks and ramps name it.")
    kind = forms.ChoiceField(choices=MetricSource.Kind.choices)
    base_url = forms.CharField(
        max_length=500, label="Base URL",
        help_text="http(s) URL of the Prometheus, or the JSON endpoint's base (a check's "
                  "query is the path under it). Loopback and link-local only where "
                  "OUTBOUND_ALLOW_METRICS lists them; fleetctl's own services never.")
    bearer_token = forms.CharField(
        max_length=500, required=False, widget=forms.PasswordInput(render_value=False),
        help_text="Sent as Authorization: Bearer …. Never shown again.")
    clear_token = forms.BooleanField(required=False, label="Remove the token")
    timeout_s = forms.FloatField(min_value=0.1, max_value=60, initial=5.0,
                                 label="Timeout (seconds)",
                                 help_text="A query with no answer by then is insufficient.")

    def __init__(self, *args: Any, editing: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if editing:
            # A gate check or a ramp names the source: its name stays.
            self.fields["name"].disabled = True
            self.fields["name"].help_text = "A source keeps its name (checks name it)."
            self.fields["bearer_token"].help_text = ("Sent as Authorization: Bearer …. "
                                                     "Never shown again; leave empty to keep "
                                                     "the current one.")
        else:
            del self.fields["clear_token"]

    def changes(self) -> dict[str, Any]:
        """The service's keyword arguments: an empty token field keeps the token."""
        data = dict(self.cleaned_data)
        if data.pop("clear_token", False):
            data["bearer_token"] = ""
        elif not data.get("bearer_token"):
            data.pop("bearer_token", None)
        return data


class TestQueryForm(forms.Form):
    query = forms.CharField(
        max_length=MAX_QUERY_CHARS, widget=forms.Textarea(attrs={"rows": 2}),
        help_text="PromQL for a Prometheus; for an HTTP JSON source the path under its base "
                  "URL. $pool, $route and $model stand for the names below.")
    field = forms.CharField(max_length=200, required=False, label="Field",
                            help_text="HTTP JSON only: the dotted path of the value in the "
                                      "answer (e.g. data.error_rate or items.0.value).")
    success = forms.CharField(max_length=200, required=False, label="Success condition",
                              help_text="e.g. result < 0.05. Leave both conditions empty "
                                        "to see the values unjudged.")
    failure = forms.CharField(max_length=200, required=False, label="Failure condition",
                              help_text="e.g. result >= 0.1")
    pool = forms.CharField(max_length=63, required=False, label="$pool")
    route = forms.CharField(max_length=63, required=False, label="$route")
    model = forms.CharField(max_length=200, required=False, label="$model")
