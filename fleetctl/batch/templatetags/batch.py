"""What the plan page needs from batch (stage 3): the running or last soak with its current
job's progress, the latest drill's verdict, the cost arbitrage (predicted against measured,
in one currency or with the conversion stated), and "Start a soak". A template tag, so the
plans app renders the panel without importing batch (plans sit below batch). Also the number
filters of the batch pages."""

from __future__ import annotations

from typing import Any

from django import template

from fleetctl.batch import cost, selectors
from fleetctl.batch.forms import SoakStartForm, duration_text
from fleetctl.batch.models import BatchJob, Soak
from fleetctl.core.display import or_dash
from fleetctl.core.templatetags.panels import percent
from fleetctl.fleet.models import money

register = template.Library()

PANEL_JOBS = 5


@register.simple_tag
def batch_plan_panel(plan: Any) -> dict[str, Any]:
    """The panel's data for `plan`: a handful of bounded queries, whatever the soak's size."""
    from fleetctl.batch import soak
    soaks = Soak.objects.filter(plan=plan).select_related("pool", "input_file", "evidence",
                                                          "cost_evidence")
    current = (soaks.filter(state=Soak.State.RUNNING).first()
               or soaks.order_by("-started_at", "-id").first())
    job = None
    progress = None
    if current is not None:
        job = current.jobs.order_by("-created_at", "-id").first()
        progress = selectors.job_progress(job) if job is not None else None
    drill = (BatchJob.objects.filter(plan=plan).exclude(drill="")
             .select_related("evidence").order_by("-created_at", "-id").first())
    stage3 = plan.state == plan.State.STAGE_3
    running = current is not None and current.state == Soak.State.RUNNING
    return {
        "soak": current, "running": running,
        "summary": soak.soak_summary(current) if current is not None else None,
        "job": job, "progress": progress,
        "percent": (round(100 * progress.done / progress.total, 1)
                    if progress is not None and progress.total else None),
        "drill": drill,
        "arbitrage": cost.plan_arbitrage(plan, current),
        "stage3": stage3,
        "form": SoakStartForm() if stage3 and not running else None,
        "jobs": list(BatchJob.objects.filter(plan=plan).select_related("pool")
                     .order_by("-created_at", "-id")[:PANEL_JOBS]),
    }


# A job's or a soak's state → the shared run-status colours (static/css/app.css).
STATE_CLASSES = {"queued": "run-queued", "running": "run-running", "paused": "run-partial",
                 "completed": "run-complete", "passed": "run-complete",
                 "failed": "run-failed", "expired": "run-failed",
                 "cancelled": "run-cancelled", "stopped": "run-cancelled"}


@register.filter
def batch_state_class(state: Any) -> str:
    return STATE_CLASSES.get(str(state), "")


@register.filter
@or_dash
def batch_rate(value: Any) -> str:
    """A rate per second: 12.345 → "12.3"; "—" when unknown."""
    number = float(value)
    return f"{number:,.1f}" if number >= 10 else f"{number:.2f}"


@register.filter
@or_dash
def batch_seconds(value: Any) -> str:
    """Seconds as a person reads them: 4.2 → "4.2 s", 754 → "12 min 34 s", 86400 → "24h";
    "—" when unknown."""
    seconds = float(value)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds == int(seconds) and int(seconds) % 3600 == 0:
        return duration_text(int(seconds))
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


# A share (0..1) as a percentage: 0.873 → "87.3 %"; "—" when unknown.
register.filter("batch_pct", percent)


@register.filter
@or_dash
def batch_money(value: Any, currency: str = "") -> str:
    """An amount with its currency, as fleet shows money: "500.00 EUR"; "—" when
    unknown. Never without the currency when one is known."""
    return f"{money(value)} {currency}".strip()
