"""The demo's schedules on the MI300X plan: made once, and they fire (`make demo` runs the
same function after seeding the plans)."""

from __future__ import annotations

from datetime import timedelta

from fleetctl.accounts.actor import Actor
from fleetctl.evals.services import suite_install_bundled
from fleetctl.schedules import services
from fleetctl.schedules.demo import PLAN, seed_demo_schedules
from fleetctl.schedules.models import Schedule
from tests.schedules.conftest import World, next_run


def test_the_demo_plan_gets_its_schedules_once_and_they_fire(world: World):
    plan = world.plan(name=PLAN)
    suite_install_bundled(actor=Actor.for_system("demo-seed"))
    notes: list[str] = []
    made = seed_demo_schedules(note=notes.append)
    assert len(made) == 3 and not notes, (made, notes)
    assert seed_demo_schedules(note=notes.append) == []
    kinds = {s.kind: s for s in Schedule.objects.filter(plan=plan)}
    assert set(kinds) == {"conformance", "rehearsal", "eval"}
    assert (kinds["rehearsal"].cron, kinds["rehearsal"].window_minutes,
            kinds["rehearsal"].timezone) == ("*/10 * * * *", 3, "UTC")
    assert all("Demo" in s.note for s in kinds.values())
    # At the eval's first occurrence (a 15-minute mark is a 5-minute mark too, and every
    # second one a 10-minute mark) the eval and the probe fire; earlier marks past their
    # window are recorded missed first.
    now = next_run(kinds["eval"]) + timedelta(seconds=30)
    fired = services.schedules_due(now)
    runs = {run.schedule.kind: run for run in fired if run.outcome != "missed"}
    assert runs["conformance"].outcome == "started"
    assert runs["eval"].outcome == "started", runs["eval"].detail
    # The demo plan is in stage 2: its rehearsals wait for stage 4, visibly, and say so.
    later = next_run(Schedule.objects.get(pk=kinds["rehearsal"].pk)) + timedelta(seconds=30)
    [rehearsal] = [run for run in services.schedules_due(later)
                   if run.schedule.kind == "rehearsal"]
    assert rehearsal.outcome == "skipped" and "stage 4" in rehearsal.detail
