"""Dashboard forms for migration plans.

They shape input (pools and routes by name, parameters as JSON) and nothing more: the
services decide what is allowed (roles, separation of duties, the gate, closed plans) and
their errors are put back on these forms by the views.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from fleetctl.accounts import roles
from fleetctl.core.forms import model_form_field, reason_field
from fleetctl.fleet.models import CURRENCIES, Pool
from fleetctl.traffic.models import Route
from migrations_plan import evidence as ev
from migrations_plan.models import STAGE_NAMES, CostUnit, GateCheck, Plan

User = get_user_model()


class PoolChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.name} — {obj.accelerator}, {obj.get_runtime_display()}, {obj.region.code}"


class RouteChoiceField(forms.ModelMultipleChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        pin = f", pinned to {obj.residency}" if obj.residency else ""
        return f"{obj.name} — {obj.model_id} (primary {obj.primary_pool.name}{pin})"


class OwnerChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        full = obj.get_full_name()
        return f"{obj.get_username()} ({full})" if full else obj.get_username()


_plan_field = partial(model_form_field, Plan)


class PlanForm(forms.Form):
    name = forms.CharField(max_length=63, help_text="Lowercase letters, digits and hyphens, "
                                                    "e.g. mi300x-llama.")
    candidate_pool = PoolChoiceField(queryset=Pool.objects.none(), to_field_name="name",
                                     empty_label="— the new pool —",
                                     label="Candidate pool")
    primary_pool = PoolChoiceField(queryset=Pool.objects.none(), to_field_name="name",
                                   empty_label="— the pool it is judged against —",
                                   label="Primary pool")
    routes = RouteChoiceField(queryset=Route.objects.none(), to_field_name="name",
                              widget=forms.CheckboxSelectMultiple,
                              help_text="The routes (models) the candidate will join.")
    slo_ttft_p95_ms = _plan_field("slo_ttft_p95_ms", label="SLO: TTFT p95 (ms)")
    slo_tpot_p95_ms = _plan_field("slo_tpot_p95_ms", label="SLO: TPOT p95 (ms)")
    slo_error_rate = _plan_field("slo_error_rate", label="SLO: error rate (0–0.5)")
    slo_e2e_p95_ms = _plan_field("slo_e2e_p95_ms", label="SLO: whole-answer p95 (ms)",
                                 required=False)
    latency_margin_pct = _plan_field("latency_margin_pct", label="Latency margin (%)")
    cost_margin_pct = _plan_field("cost_margin_pct", label="Cost margin (%)")
    cost_unit = _plan_field("cost_unit", label="Cost arbitrage unit", required=False)
    quality_margin_pct = _plan_field("quality_margin_pct", label="Quality margin (points)")
    owner = OwnerChoiceField(queryset=User.objects.none(), required=False,
                             empty_label="— me —",
                             help_text="Who drives the plan. Neither you nor the owner may "
                                       "approve its gates.")
    target_date = forms.DateField(required=False,
                                  widget=forms.DateInput(attrs={"type": "date"}))
    required_approvals = _plan_field("required_approvals",
                                     label="Approvals required per gate")
    notes = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pools = Pool.objects.select_related("region").order_by("name")
        self.fields["candidate_pool"].queryset = pools  # type: ignore[attr-defined]
        self.fields["primary_pool"].queryset = pools  # type: ignore[attr-defined]
        self.fields["routes"].queryset = (  # type: ignore[attr-defined]
            Route.objects.select_related("primary_pool").order_by("name"))
        self.fields["owner"].queryset = (  # type: ignore[attr-defined]
            User.objects.filter(is_active=True).order_by("username"))

    def clean_cost_unit(self) -> str:
        """Left out (a form from before plans had a unit): the default."""
        return str(self.cleaned_data.get("cost_unit") or CostUnit.PER_1M_OUTPUT_TOKENS)

    def clean_owner(self) -> Any:
        return self.cleaned_data.get("owner") or None


class ApproveForm(forms.Form):
    justification = forms.CharField(
        required=False, max_length=4000, widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Required when a check is warn or insufficient data: why you sign off anyway. "
                  "It is kept with your approval.")


class AdvanceForm(forms.Form):
    reason = forms.CharField(required=False, max_length=2000, label="Note",
                             help_text="Optional; goes in the stage move and the timeline.")


class ReasonForm(forms.Form):
    reason = reason_field(help_text="Goes in the plan's timeline.")

    def __init__(self, *args: Any, label: str = "Reason", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["reason"].label = label


class RegressForm(ReasonForm):
    to_stage = forms.TypedChoiceField(coerce=int, label="Back to stage",
                                      choices=[(n, f"{n} · {name}")
                                               for n, name in STAGE_NAMES.items()])

    def __init__(self, *args: Any, plan: Plan, **kwargs: Any) -> None:
        super().__init__(*args, label="Why move back", **kwargs)
        earlier = [(n, f"{n} · {name}") for n, name in STAGE_NAMES.items() if n < plan.stage]
        self.fields["to_stage"].choices = earlier  # type: ignore[attr-defined]
        self.order_fields(["to_stage", "reason"])


class AttestForm(forms.Form):
    note = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}),
                           label="What you confirm",
                           help_text="e.g. the Grafana board and the paging alert exist.")


def parse_params(text: str) -> dict[str, Any] | None:
    """An empty box means "the rule's defaults"; otherwise a JSON object."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"Not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}). "
                              'Write an object, e.g. {"hours": 24}.') from None
    if not isinstance(value, dict):
        raise ValidationError('Write an object, e.g. {"hours": 24}.')
    return value


def rule_choices() -> list[tuple[str, str]]:
    return [(name, f"{name} — {rule.description}") for name, rule in sorted(ev.RULES.items())]


class CheckAddForm(forms.Form):
    kind = forms.ChoiceField(choices=GateCheck.Kind.choices, widget=forms.RadioSelect,
                             initial=GateCheck.Kind.EVIDENCE, label="Decided by")
    rule = forms.ChoiceField(required=False, label="Rule (evidence-backed)")
    params = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                             label="Parameters (JSON)",
                             help_text='Empty for the rule\'s defaults, e.g. {"hours": 48}.')
    attest_role = forms.ChoiceField(required=False, label="Role that attests (attested)",
                                    choices=[("", "—"), *[(r, r) for r in roles.ROLES
                                                          if r != roles.VIEWER]])
    title = forms.CharField(required=False, max_length=200,
                            help_text="What the check confirms; a rule's checks default to "
                                      "its label.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["rule"].choices = [("", "—"), *rule_choices()]  # type: ignore[attr-defined]

    def clean_params(self) -> dict[str, Any] | None:
        return parse_params(self.cleaned_data.get("params", ""))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        # The unused half of the form is ignored, so switching the radio is enough.
        if data.get("kind") == GateCheck.Kind.ATTESTED:
            data["rule"], data["params"] = "", None
        else:
            data["attest_role"] = ""
        return data


class CheckEditForm(forms.Form):
    title = forms.CharField(max_length=200)
    params = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                             label="Thresholds (JSON)")

    def clean_params(self) -> dict[str, Any] | None:
        return parse_params(self.cleaned_data.get("params", ""))


def check_edit_initial(check: GateCheck) -> dict[str, Any]:
    return {"title": check.title,
            "params": json.dumps(check.params, sort_keys=True) if check.params else ""}


class PredictedCostForm(forms.Form):
    """Stage 3's predicted cost per 1M output tokens, set or replaced by a platform lead
    (services.plan_update checks the pair and the currency, and audits it). Both empty clears
    the prediction."""

    predicted_cost_per_1m = forms.DecimalField(
        required=False, min_value=0, max_digits=14, decimal_places=4,
        label="Predicted cost per 1M output tokens")
    predicted_cost_currency = forms.ChoiceField(
        required=False, label="Currency",
        choices=[("", "—"), *[(c, c) for c in CURRENCIES]])
    predicted_cost_source = forms.CharField(
        required=False, max_length=200, label="Where the figure comes from",
        help_text="e.g. the capacity plan it is taken from (default: your name).")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if (cleaned.get("predicted_cost_per_1m") is None) != (
                not cleaned.get("predicted_cost_currency")):
            raise ValidationError("Give the amount and its currency together (both empty "
                                  "clears the prediction).")
        return cleaned
