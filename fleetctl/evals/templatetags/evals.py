"""What the plan page needs from evals: the Evals panel (the plan's latest runs with their
verdicts, and "Run the stage's eval") and, on the stage-2 `eval` and stage-4 `quality`
checks, the run whose evidence the check read, or the button. A template tag, so the plans
app renders them without importing evals (plans sit below evals)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import template
from django.urls import reverse

from fleetctl.core.display import or_dash
from fleetctl.core.templatetags.panels import count, item, percent
from fleetctl.evals.forms import DEFAULT_SUITE
from fleetctl.evals.models import EvalRun

register = template.Library()

PANEL_RUNS = 5


def new_run_url(plan: Any) -> str:
    """The new-run form prefilled with the plan, its candidate and primary and the bundled
    mix suite."""
    query = {"plan": plan.name, "candidate": plan.candidate_pool.name,
             "primary": plan.primary_pool.name, "suite": DEFAULT_SUITE}
    return f"{reverse('evals:run-new')}?{urlencode(query)}"


def _plan_runs(plan: Any) -> Any:
    return (EvalRun.objects.filter(plan=plan).select_related("suite")
            .order_by("-created_at", "-id"))


@register.simple_tag
def evals_panel(plan: Any) -> dict[str, Any]:
    runs = list(_plan_runs(plan)[:PANEL_RUNS])
    active = next((run for run in runs if run.active), None)
    return {"runs": runs, "active": active, "new_url": new_run_url(plan)}


def _evidence_ids(result: Any) -> list[int]:
    ids = []
    for ref in getattr(result, "evidence", None) or []:
        kind, _, pk = str(getattr(ref, "ref", "")).partition(":")
        if kind == "evidence" and pk.isdigit():
            ids.append(int(pk))
    return ids


@register.simple_tag
def eval_gate(plan: Any, result: Any, check_key: str) -> dict[str, Any]:
    """`check_key` "eval" (stage 2, kind eval) or "quality" (stage 4, kind live-quality):
    the run that recorded the evidence the check read (None when the evidence came from
    elsewhere, e.g. a shadow run or a report), the plan's run still going, and the link."""
    ids = _evidence_ids(result)
    field = "live_evidence_id__in" if check_key == "quality" else "evidence_id__in"
    fed = (EvalRun.objects.filter(**{field: ids}).select_related("suite")
           .order_by("-created_at", "-id").first() if ids else None)
    latest = _plan_runs(plan).first()
    return {"fed": fed, "latest": latest,
            "active": latest if latest is not None and latest.active else None,
            "new_url": new_run_url(plan)}


# A score (0..1) as a percentage: 0.873 -> "87.3 %"; a count with thousands separators;
# sequence[index], or None.
register.filter("eval_pct", percent)
register.filter("eval_count", count)
register.filter("at", item)


@register.filter
@or_dash
def eval_points(value: Any) -> str:
    """A difference of scores in points, signed with a real minus: -0.031 -> "−3.1"."""
    return f"{float(value) * 100:+.1f}".replace("-", "\u2212")


@register.filter
@or_dash
def eval_p(value: Any) -> str:
    """A p-value as a person reads it: "= 0.0312", "< 0.0001"; "—" when unknown."""
    return "< 0.0001" if float(value) < 0.0001 else f"= {float(value):.4f}"

