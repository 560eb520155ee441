"""Dashboard forms for ramps: start one on a route (steps typed as "1:60, 5:60, 10:120"),
act on one (pause, resume, skip, abort: always with a reason; abort also confirmed), and the
list's filters.

The form only reads what was typed; the service (`ramps.services.ramp_create`) judges it with
the database in hand (steps, residency, a plan below stage 4, another active ramp) and its
errors are put back on the form by the view.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from fleetctl.core.forms import reason_field
from fleetctl.ramps.models import Ramp


def parse_steps(text: str) -> list[dict[str, Any]]:
    """"1:60, 5:60, 10:120" → [{"percent": 1, "hold_s": 60}, ...]: percent, then how many
    seconds to hold it. Commas, semicolons or new lines between steps. The last percent may
    be "capacity" (the pool's share of the route's capacity split, resolved at the start)."""
    steps = []
    for raw in text.replace(";", ",").replace("\n", ",").split(","):
        item = raw.strip()
        if not item:
            continue
        percent, sep, hold = item.partition(":")
        try:
            if not sep:
                raise ValueError
            share = percent.strip().rstrip("%").strip()
            steps.append({"percent": share.lower() if share.lower() == "capacity"
                          else float(share), "hold_s": float(hold.strip().rstrip("s").strip())})
        except ValueError:
            raise ValidationError(
                f"{item!r} is not a step: write percent:seconds, e.g. 5:60 "
                "(5 % held for 60 s).") from None
    if not steps:
        raise ValidationError("Give at least one step, e.g. 1:60, 5:60, 10:120.")
    for step in steps:
        if step["hold_s"] == int(step["hold_s"]):
            step["hold_s"] = int(step["hold_s"])
    return steps


def steps_text(steps: list[dict[str, Any]]) -> str:
    return ", ".join(f"{float(s['percent']):g}:{float(s['hold_s']):g}" for s in steps)


class StepsField(forms.CharField):
    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        return parse_steps(text) if text else text


class RampStartForm(forms.Form):
    pool = forms.ChoiceField(label="Candidate pool",
                             help_text="Pools that serve the route's model (and sit inside "
                                       "its residency pin), other than its primary.")
    steps = StepsField(
        label="Steps", max_length=400,
        widget=forms.TextInput(attrs={"placeholder": "1:60, 5:60, 10:120", "size": 30}),
        help_text="percent:seconds held, strictly increasing: 1:60, 5:60, 10:120; the last "
                  "may be capacity:120 (the pool's share of the route's capacity split).")
    min_samples = forms.IntegerField(
        label="Minimum samples", min_value=1, initial=50,
        help_text="Requests the pool must answer in a hold before the guard judges it.")
    window_s = forms.IntegerField(label="Judging window, s", min_value=1, initial=30)
    failure_threshold = forms.IntegerField(
        label="Failed checks before rollback", min_value=1, max_value=20, initial=2)
    slo_ttft_p95_ms = forms.FloatField(label="SLO: TTFT p95, ms", min_value=0, required=False)
    slo_tpot_p95_ms = forms.FloatField(label="SLO: TPOT p95, ms", min_value=0, required=False)
    slo_error_pct = forms.FloatField(label="SLO: error rate, %", min_value=0, max_value=100,
                                     required=False)
    latency_margin_pct = forms.FloatField(
        label="Latency margin vs the primary, %", min_value=0, required=False)
    slo_e2e_p95_ms = forms.FloatField(
        label="SLO: whole-answer p95, ms", min_value=1, required=False,
        help_text="Streamed or not; empty: the plan's, else not judged.")
    reason = reason_field(help_text="Goes in the ramp's record, its revisions and the "
                                    "audit log.")

    def __init__(self, *args: Any, pools: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["pool"].choices = [(name, name) for name in pools]  # type: ignore[attr-defined]

    def service_kwargs(self) -> dict[str, Any]:
        data = self.cleaned_data
        kwargs: dict[str, Any] = {
            "steps": data["steps"], "min_samples": data["min_samples"],
            "window_s": data["window_s"], "failure_threshold": data["failure_threshold"],
            "slo_ttft_p95_ms": data.get("slo_ttft_p95_ms"),
            "slo_tpot_p95_ms": data.get("slo_tpot_p95_ms"),
            "slo_error_rate": (None if data.get("slo_error_pct") is None
                               else data["slo_error_pct"] / 100),
            "latency_margin_pct": data.get("latency_margin_pct"),
            "slo_e2e_p95_ms": data.get("slo_e2e_p95_ms"),
            "reason": data["reason"],
        }
        return kwargs


class RampActionForm(forms.Form):
    ACTIONS = ("pause", "resume", "skip", "abort")

    action = forms.ChoiceField(choices=[(a, a) for a in ACTIONS], widget=forms.HiddenInput)
    reason = reason_field(error_messages={"required": "Say why: the reason goes in the "
                                                      "ramp's timeline and the audit log."})
    confirm = forms.BooleanField(required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("action") == "abort" and not data.get("confirm"):
            self.add_error("confirm", "Tick the box to confirm: aborting drains the pool off "
                                      "the route at once.")
        return data


class RampFilterForm(forms.Form):
    state = forms.ChoiceField(required=False,
                              choices=[("", "any"), ("active", "active (running or paused)"),
                                       *Ramp.State.choices])
    route = forms.CharField(required=False, max_length=63)
    pool = forms.CharField(required=False, max_length=63)


class WatchActionForm(forms.Form):
    """A standing watch: change its policy (`policy`) or end it (`end`), with a reason."""

    ACTIONS = ("policy", "end")

    action = forms.ChoiceField(choices=[(a, a) for a in ACTIONS], widget=forms.HiddenInput)
    policy = forms.ChoiceField(required=False, choices=[("alert", "alert"), ("drain", "drain")])
    reason = reason_field(error_messages={"required": "Say why: the reason goes in the audit "
                                                      "log."})

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("action") == "policy" and not data.get("policy"):
            self.add_error("policy", "Choose a policy: alert or drain.")
        return data
