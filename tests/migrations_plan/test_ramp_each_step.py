"""Stage 4's "Per-pool percentiles hold at each ramp step": every step of the candidate's newest
guarded ramp must have passed its hold; a later ramp replaces an earlier one."""

from __future__ import annotations

import pytest

from fleetctl.accounts.actor import Actor
from migrations_plan import evidence as ev
from migrations_plan import services
from tests.migrations_plan.helpers import walk_to

pytestmark = pytest.mark.django_db
RAMP = Actor.for_system("ramp")


DAY = 86400.0


def hold(world, *, ramp: int, step: int, percent: float, verdict: str, total: int = 3,
         held_s: float = 8 * DAY) -> None:
    services.evidence_record(
        actor=RAMP, pool=world.candidate, kind="ramp-slo", verdict=verdict,
        summary=f"step {step + 1} at {percent:g} %: {verdict}", route=world.route,
        data={"ramp": ramp, "route": world.route.name, "step": step, "percent": percent,
              "steps_total": total, "decision": verdict, "held_s": held_s},
        source=f"ramp {ramp}")


def ramp_check(plan):
    gate = ev.evaluate_gate(plan, stage=4)
    return next(o for o in gate.outcomes if o.check.key == "ramp-slo")


def test_every_step_of_the_newest_ramp_decides(world):
    plan = world.plan()
    assert plan.checks.get(stage=4, key="ramp-slo").rule == "ramp.each_step"
    outcome = ramp_check(plan)
    assert outcome.status == ev.INSUFFICIENT
    assert "No guarded ramp" in outcome.result.summary

    hold(world, ramp=7, step=0, percent=1, verdict="pass")
    hold(world, ramp=7, step=1, percent=5, verdict="pass")
    outcome = ramp_check(plan)
    assert outcome.status == ev.INSUFFICIENT
    assert "held 2 of its 3 steps" in outcome.result.summary

    hold(world, ramp=7, step=2, percent=10, verdict="warn")
    assert ramp_check(plan).status == ev.WARN
    # A person resumed and the hold was judged again: the step's newest row counts.
    hold(world, ramp=7, step=2, percent=10, verdict="pass")
    outcome = ramp_check(plan)
    assert outcome.status == ev.PASS
    assert outcome.result.summary == "Ramp 7 held the SLO at each of its 3 steps (1 %, 5 %, 10 %)."
    assert outcome.result.numbers["verdicts"] == {"1": "pass", "2": "pass", "3": "pass"}

    # A newer ramp that failed at its second step: the check fails, naming the step.
    hold(world, ramp=9, step=0, percent=1, verdict="pass", total=4)
    hold(world, ramp=9, step=1, percent=5, verdict="fail", total=4)
    outcome = ramp_check(plan)
    assert outcome.status == ev.FAIL
    assert outcome.result.summary.startswith("Ramp 9: step 2 (5 %) failed")


def test_the_first_live_step_must_hold_a_week_on_the_clock(world):
    """Every step passed, but the first held 3.2 days of the 7 the check asks (its default):
    insufficient, with the progress; a check set to a shorter span (the demo's) passes."""
    plan = world.plan()
    hold(world, ramp=7, step=0, percent=1, verdict="pass", held_s=3.2 * DAY)
    hold(world, ramp=7, step=1, percent=5, verdict="pass", held_s=600)
    hold(world, ramp=7, step=2, percent=10, verdict="pass", held_s=600)
    outcome = ramp_check(plan)
    assert outcome.status == ev.INSUFFICIENT
    assert outcome.result.summary == (
        "Ramp 7: step 1 (1 %) held 3.2 days of the 7.0 days the first live step must hold: "
        "a longer first hold, or wait for it.")
    assert outcome.result.numbers["first_step"] == {"held_days": 3.2, "required_days": 7.0}
    check = plan.checks.get(stage=4, key="ramp-slo")
    services.check_update(actor=world.actor("lead"), check=check,
                          params={**check.params, "first_step_min_days": 3})
    assert ramp_check(plan).status == ev.PASS


def test_stage_four_plans_read_it_and_old_checks_are_moved(world):
    from importlib import import_module

    from django.apps import apps

    plan = walk_to(world, world.plan(slo_ttft_p95_ms=800), 1)
    check = plan.checks.get(stage=4, key="ramp-slo")
    check.rule, check.params = "evidence.latest", {"kind": "ramp-slo", "within_days": 7}
    check.save(update_fields=["rule", "params"])
    migration = import_module("migrations_plan.migrations.0005_ramp_each_step_check")
    migration.forwards(apps, None)
    check.refresh_from_db()
    assert (check.rule, check.params) == ("ramp.each_step", {"within_days": 7})
    migration.backwards(apps, None)
    check.refresh_from_db()
    assert (check.rule, check.params) == ("evidence.latest", {"kind": "ramp-slo",
                                                              "within_days": 7})
