"""Dashboard forms for schedules: add one (kind, plan or pool, cron, time zone, window…) and
edit one (cron, time zone, window, suite, note, enabled). The form reads what was typed; the
service (`schedules.services`) judges it (cron, time zone, window, targets) and its errors
are put back on the fields by the view."""

from __future__ import annotations

from typing import Any

from django import forms

from fleetctl.evals.models import EvalSuite
from fleetctl.fleet.models import Pool
from fleetctl.schedules.api.serializers import HELP
from fleetctl.schedules.models import Schedule
from migrations_plan.models import Plan


def _suite_choices() -> list[tuple[str, str]]:
    return [("", "the plan's last eval run's suite")] + [
        (str(suite.pk), suite.label) for suite in EvalSuite.objects.order_by("name", "-version")]


class ScheduleEditForm(forms.Form):
    cron = forms.CharField(max_length=100, help_text=HELP["cron"],
                           widget=forms.TextInput(attrs={"placeholder": "30 2 * * 6"}))
    timezone = forms.CharField(max_length=64, initial="UTC", label="Time zone",
                               help_text=HELP["timezone"])
    # Not an IntegerField's min: the service's message (naming the field) is the one shown.
    window_minutes = forms.IntegerField(initial=60, label="Window (minutes)",
                                        help_text=HELP["window_minutes"])
    eval_suite = forms.ChoiceField(required=False, label="Eval suite",
                                   help_text="Eval schedules only.")
    enabled = forms.BooleanField(required=False, initial=True)
    note = forms.CharField(required=False, max_length=2000,
                           widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["eval_suite"].choices = _suite_choices()  # type: ignore[attr-defined]

    def clean_eval_suite(self) -> EvalSuite | None:
        value = self.cleaned_data.get("eval_suite")
        return EvalSuite.objects.filter(pk=value).first() if value else None

    def service_kwargs(self) -> dict[str, Any]:
        return dict(self.cleaned_data)


class ScheduleForm(ScheduleEditForm):
    field_order = ["kind", "plan", "pool"]
    kind = forms.ChoiceField(choices=Schedule.Kind.choices, help_text=HELP["kind"])
    plan = forms.ChoiceField(required=False, help_text=HELP["plan"])
    pool = forms.ChoiceField(required=False, help_text=HELP["pool"])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["plan"].choices = [("", "none")] + [  # type: ignore[attr-defined]
            (p.name, p.name) for p in Plan.objects.exclude(
                state__in=Plan.CLOSED_STATES).order_by("name")]
        self.fields["pool"].choices = [("", "none (the plan's candidate)")] + [  # type: ignore[attr-defined]
            (p.name, p.name) for p in Pool.objects.order_by("name")]

    def service_kwargs(self) -> dict[str, Any]:
        data = dict(self.cleaned_data)
        data["plan"] = Plan.objects.filter(name=data.get("plan")).first() \
            if data.get("plan") else None
        data["pool"] = Pool.objects.filter(name=data.get("pool")).first() \
            if data.get("pool") else None
        return data
