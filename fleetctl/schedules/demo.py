"""The demo's schedules (called by `demo_seed` after the batch step): the MI300X plan's
re-runs fire by themselves on `make demo`. Demo spans are short on purpose and say so in
their notes: production schedules run daily or weekly inside a real maintenance window.

- conformance probe of the candidate every 5 minutes (window 3 min);
- eval re-run every 15 minutes (window 3 min) of the bundled `fleetctl-core` suite (not
  made when the suite is not installed);
- drain rehearsal every 10 minutes inside a 3-minute window, cron read in UTC (the demo
  plan's time zone). The MI300X plan is in stage 2 on a fresh demo: a rehearsal moves live
  traffic only in stage 4, so until the plan gets there each occurrence is recorded
  *skipped* with that reason (nothing drains, nothing notifies).

No re-benchmark: the demo has no benchmark of the MI300X to repeat (a scheduled one would be
recorded failed, saying to run one first).

Each is created once (a plan that has a schedule of that kind keeps it)."""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import ValidationError
from django.db import transaction

from fleetctl.accounts.actor import Actor
from fleetctl.core.errors import DomainError
from fleetctl.evals import bundled
from fleetctl.evals.models import EvalSuite
from fleetctl.schedules import services
from fleetctl.schedules.models import Schedule
from migrations_plan.models import Plan

PLAN = "mi300x-llama-8b"
DEMO_TIMEZONE = "UTC"
NOTE = "Demo: a short span, so it fires while you watch (production: daily or weekly)."
DEMO_SCHEDULES = (
    (Schedule.Kind.CONFORMANCE, "*/5 * * * *", 3),
    (Schedule.Kind.REHEARSAL, "*/10 * * * *", 3),
    (Schedule.Kind.EVAL, "*/15 * * * *", 3),
)


def seed_demo_schedules(note: Callable[[str], None] = print) -> list[str]:
    """Create the demo plan's schedules that are not there yet: what was made (a refusal is
    passed to `note`)."""
    said: list[str] = []
    plan = Plan.objects.filter(name=PLAN).first()
    if plan is None:
        note(f"no schedules: plan {PLAN} is not there")
        return said
    actor = Actor.for_system("demo-seed")
    suite = (EvalSuite.objects.filter(name=bundled.MIX).order_by("-version", "-pk").first())
    for kind, cron, window in DEMO_SCHEDULES:
        if Schedule.objects.filter(plan=plan, kind=kind).exists():
            continue
        if kind == Schedule.Kind.EVAL and suite is None:
            note(f"no eval schedule for {PLAN}: suite {bundled.MIX} is not installed")
            continue
        try:
            with transaction.atomic():
                made = services.schedule_create(
                    actor=actor, kind=kind, plan=plan, cron=cron, timezone=DEMO_TIMEZONE,
                    window_minutes=window, note=NOTE,
                    eval_suite=suite if kind == Schedule.Kind.EVAL else None)
        except (ValidationError, DomainError) as exc:
            note(f"{kind} schedule of {PLAN} not created: {exc}")
            continue
        said.append(f"schedule {made.pk} ({kind} of {PLAN}, {cron} {DEMO_TIMEZONE})")
    return said
