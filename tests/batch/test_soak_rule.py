"""Stage 3's soak check, measured on the clock (fleetctl/batch/soak_rule.py): the span the
soak's jobs covered, not the length it was configured with; a missed scheduled job fails it;
the demo's shortened span says so in the check's title. Rows carry the times, so a week is
written, not waited for."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from fleetctl.accounts.actor import Actor
from migrations_plan import evidence as ev
from migrations_plan import services
from migrations_plan.models import Plan
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture

SOAKER = Actor.for_system("soak")
HOUR = timedelta(hours=1)


def soak_row(w: World, *, start: datetime, jobs: int, every: timedelta, verdict: str = "pass",
             skip: int | None = None) -> None:
    """A soak's evidence row: `jobs` jobs every `every` from `start`, 10 minutes each."""
    rows = []
    for n in range(jobs):
        if n == skip:
            continue
        began = start + n * every
        rows.append({"job": 100 + n, "state": "completed",
                     "started_at": began.isoformat(),
                     "finished_at": (began + timedelta(minutes=10)).isoformat()})
    services.evidence_record(actor=SOAKER, pool=w.candidate, kind="soak", verdict=verdict,
                             summary=f"Soak 7 {verdict}ed", data={
                                 "soak": 7, "every_s": every.total_seconds(), "jobs": rows})


def soak_check(plan: Plan, now: datetime | None = None) -> ev.CheckOutcome:
    gate = ev.evaluate_gate(Plan.objects.get(pk=plan.pk), stage=3, now=now)
    return next(o for o in gate.outcomes if o.check.key == "soak")


def test_a_soak_counts_the_days_its_jobs_covered_not_the_days_it_was_set_to(world):  # noqa: F811
    plan = world.plan()
    check = plan.checks.get(stage=3, key="soak")
    assert (check.rule, check.title) == ("soak.sustained",
                                         "Batch soak of 7 days with no manual intervention")
    assert soak_check(plan).status == ev.INSUFFICIENT
    now = timezone.now()
    # Eight minutes of jobs (the demo's soak): passed, but not a week.
    soak_row(world, start=now - timedelta(minutes=9), jobs=4, every=timedelta(minutes=2))
    outcome = soak_check(plan)
    assert outcome.status == ev.INSUFFICIENT
    assert "passed but covered 16.0 min of the 7.0 days asked" in outcome.result.summary
    # A week of hourly jobs, every one run.
    soak_row(world, start=now - 7 * 24 * HOUR - HOUR, jobs=7 * 24 + 1, every=HOUR)
    outcome = soak_check(plan)
    assert outcome.status == ev.PASS, outcome.result.summary
    assert outcome.result.numbers["measured_days"] >= 7
    assert outcome.result.summary.endswith("every scheduled job ran.")
    # The same week with one hourly job that never ran: a gap, however green the jobs.
    soak_row(world, start=now - 7 * 24 * HOUR - HOUR, jobs=7 * 24 + 1, every=HOUR, skip=50)
    outcome = soak_check(plan)
    assert outcome.status == ev.FAIL
    assert "missed 1 scheduled job(s): no job between job 149" in outcome.result.summary
    # A failed soak fails the check whatever its span.
    soak_row(world, start=now - 8 * 24 * HOUR, jobs=8 * 24, every=HOUR, verdict="fail")
    assert soak_check(plan).status == ev.FAIL


def test_a_shorter_span_is_a_parameter_and_the_title_says_it(world):  # noqa: F811
    plan = world.plan()
    soak_row(world, start=timezone.now() - timedelta(minutes=9), jobs=4,
             every=timedelta(minutes=2))
    check = plan.checks.get(stage=3, key="soak")
    services.check_update(actor=world.actor("lead"), check=check,
                          params={"min_days": 10 / 1440},
                          title="Batch soak of 10 min (demo span; 7 days in production)")
    outcome = soak_check(plan)
    assert outcome.status == ev.PASS, outcome.result.summary
    assert outcome.check.title == "Batch soak of 10 min (demo span; 7 days in production)"
