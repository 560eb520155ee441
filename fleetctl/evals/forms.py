"""The dashboard's eval forms: upload a suite, start a run, retire a suite. Shapes only (the
run's bounds come from the model's own fields, so the form and the API refuse the same
numbers); the services decide everything else, and their refusals land on these forms."""

from __future__ import annotations

from functools import partial
from typing import Any

from django import forms

from fleetctl.core.forms import model_form_field
from fleetctl.evals.models import EvalRun, EvalSuite
from fleetctl.fleet.models import Pool
from migrations_plan.models import Plan

DEFAULT_SUITE = "fleetctl-core"  # bundled.MIX: every family in one suite


_model_field = partial(model_form_field, EvalRun)


class SuiteUploadForm(forms.Form):
    name = forms.SlugField(max_length=63, help_text=(
        "Lowercase letters, digits and hyphens. The same name again makes the next version; "
        "the same content again is the version that already has it."))
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    file = forms.FileField(allow_empty_file=True, help_text=(
        "JSONL, one item per line (an optional header line first). Checked line by line; "
        "every bad line is reported with its number and nothing is kept."))


class SuiteChoiceField(forms.ModelChoiceField):  # type: ignore[type-arg]
    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.name} v{obj.version} · {obj.item_count:,} items · {obj.sha256[:12]}"


class RunForm(forms.Form):
    suite = SuiteChoiceField(
        queryset=EvalSuite.objects.filter(retired_at__isnull=True).order_by("name", "-version"),
        help_text="The pinned version the run scores (a retired suite cannot start runs).")
    plan = forms.ModelChoiceField(
        queryset=Plan.objects.order_by("name"), to_field_name="name", required=False,
        help_text="Optional: its candidate and primary are the default pools, its quality "
                  "margin the margin, and the run's verdict becomes the plan's evidence.")
    candidate = forms.ModelChoiceField(
        queryset=Pool.objects.order_by("name"), to_field_name="name", required=False,
        help_text="The pool being judged. Default: the plan's candidate.")
    primary = forms.ModelChoiceField(
        queryset=Pool.objects.order_by("name"), to_field_name="name", required=False,
        help_text="The pool it is compared with, item by item. Default: the plan's primary; "
                  "without one, the run scores the candidate alone (verdict: insufficient).")
    model = forms.CharField(
        max_length=200, required=False,
        help_text="Default: the plan's model, else the one model every pool serves. Every "
                  "pool must serve it.")
    margin_pct = forms.FloatField(
        required=False, min_value=0, max_value=100, label="Quality margin (points)",
        help_text="How far below the primary the candidate may score. Default: the plan's "
                  "quality margin, else 2.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields.update({
            "concurrency": _model_field("concurrency"),
            "max_rps": _model_field("max_rps", label="Max requests/s", required=False),
            "timeout_s": _model_field("timeout_s", label="Timeout per request (s)"),
            "max_attempts": _model_field("max_attempts", label="Attempts per item"),
            "confidence": _model_field("confidence"),
            "min_items": _model_field("min_items", label="Minimum items for a verdict"),
        })

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors and data.get("candidate") is None and data.get("plan") is None:
            self.add_error("candidate", "Choose the candidate pool, or a plan whose candidate "
                                        "it is.")
        return data

    def service_kwargs(self) -> dict[str, Any]:
        data = self.cleaned_data
        plan = data.get("plan")
        kwargs: dict[str, Any] = {
            "suite": data["suite"], "plan": plan,
            "candidate": data.get("candidate") or (plan.candidate_pool if plan else None),
            "primary": data.get("primary"), "model_id": data.get("model") or "",
            "concurrency": data["concurrency"], "max_rps": data.get("max_rps"),
            "timeout_s": data["timeout_s"], "max_attempts": data["max_attempts"],
            "confidence": data["confidence"], "min_items": data["min_items"],
        }
        if data.get("margin_pct") is not None:
            kwargs["margin"] = data["margin_pct"] / 100
        return kwargs


class RetireForm(forms.Form):
    confirm = forms.BooleanField(
        label="Yes, retire this suite version",
        help_text="No new run can use it; runs that used it keep it, and it can still be "
                  "downloaded.",
        error_messages={"required": "Tick the box to confirm: retiring cannot be undone."})


class RunFilterForm(forms.Form):
    plan = forms.CharField(required=False, max_length=63)
    status = forms.ChoiceField(required=False,
                               choices=[("", "any"), *EvalRun.Status.choices])


class DiffFilterForm(forms.Form):
    """The item diff's filters. A value it does not know (a tag not in the suite) is an
    error on the form, never silently "everything"."""

    DIRECTIONS = [("", "both ways"),
                  ("regressed", "regressed: candidate wrong, primary right"),
                  ("improved", "improved: candidate right, primary wrong")]

    direction = forms.ChoiceField(required=False, choices=DIRECTIONS)
    tag = forms.ChoiceField(required=False)
    q = forms.CharField(required=False, max_length=200, label="Text")

    def __init__(self, *args: Any, tags: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["tag"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", "any"), *((t, t) for t in tags)]

    def filters(self) -> dict[str, str] | None:
        """The filters to apply; None when the form is bound and invalid (show nothing)."""
        if not self.is_bound:
            return {"direction": "", "tag": "", "q": ""}
        if not self.is_valid():
            return None
        return {name: self.cleaned_data.get(name) or "" for name in ("direction", "tag", "q")}
