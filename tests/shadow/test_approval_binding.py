"""An approval binds to a shadow run's judgement, not to the newest evidence row: the judge
re-records one judgement as pairs arrive (a refreshed kind), and an approval given at a warn
holds while the check stays at warn on the same judgement of the same run with more pairs.
It goes stale when the status changes, when the evidence expires, or when the evidence is
another run's or was measured on other fingerprints (migrations_plan.evidence
.snapshot_difference). Real services and database; the clock is moved, never slept on."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from migrations_plan import evidence as ev
from migrations_plan import permissions, services
from migrations_plan.models import Approval, Plan
from migrations_plan.services._shared import _void_stale_approvals
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.migrations_plan.helpers import attest_all

SHADOW = Actor.for_system("shadow")
PRINTS = {"primary": {"runtime_version": "cuda-12.4"}, "candidate": {"runtime_version": "rocm"}}


def in_stage_2(w: World) -> Plan:
    plan = w.plan()
    attest_all(w, plan)
    services.approve(actor=w.actor("lead"), plan=plan,
                     justification="stage 1 signed off for this test of stage 2")
    plan = services.advance(actor=w.actor("lead"), plan=plan, reason="to stage 2")
    attest_all(w, plan)
    return plan


def judged(w: World, *, run: int = 7, verdict: str = "warn", pairs: int = 400,
           prints: dict[str, Any] | None = None, ttl_hours: float | None = None) -> None:
    """One `shadow` row as the judge records it (services.run_judge)."""
    services.evidence_record(
        actor=SHADOW, pool=w.candidate, kind="shadow", verdict=verdict,
        summary=f"divergence +2.8 pts over {pairs} pairs: {verdict} (margin 2 pts)",
        data={"run": run, "pairs": pairs, "fingerprints": prints or PRINTS},
        route=w.route, model_id="llama-3.1-8b-instruct", source=f"shadow run {run}",
        url=f"/shadow/runs/{run}/", ttl_hours=ttl_hours)


def approved_at_warn(w: World, **kwargs: Any) -> tuple[Plan, Approval]:
    plan = in_stage_2(w)
    judged(w, **kwargs)
    assert divergence(plan).status == ev.WARN
    approval = services.approve(actor=w.actor("lead2"), plan=plan,
                                justification="divergence warns; the diff is near-ties, read")
    return plan, approval


def divergence(plan: Plan) -> ev.CheckOutcome:
    gate = ev.evaluate_gate(Plan.objects.get(pk=plan.pk))
    return next(o for o in gate.outcomes if o.check.key == "divergence")


def standing(plan: Plan, approval: Approval) -> str | None:
    """Why the approval no longer counts (None: it counts), and void it if so, as the
    plan refresh does."""
    plan = Plan.objects.get(pk=plan.pk)
    gate = ev.evaluate_gate(plan)
    why = next(s.why_not for s in permissions.approval_standings(
        [Approval.objects.get(pk=approval.pk)], gate))
    voided = _void_stale_approvals(plan)
    assert (approval.pk in {a.pk for a in voided}) == (why is not None)
    return why


def test_the_same_judgement_with_more_pairs_keeps_the_approval(world):  # noqa: F811
    plan, approval = approved_at_warn(world, pairs=400)
    for pairs in (800, 1600):
        judged(world, pairs=pairs)
        assert standing(plan, approval) is None
    assert "1600 pairs" in divergence(plan).result.summary  # the gate shows the newest row
    assert Approval.objects.get(pk=approval.pk).voided_at is None


def test_a_verdict_change_voids_the_approval(world):  # noqa: F811
    plan, approval = approved_at_warn(world)
    judged(world, verdict="fail", pairs=900)
    why = standing(plan, approval)
    assert why is not None and "went from warn to fail" in why, why
    assert Approval.objects.get(pk=approval.pk).voided_at is not None


def test_another_runs_judgement_voids_the_approval_even_at_the_same_status(world):  # noqa: F811
    plan, approval = approved_at_warn(world, run=7)
    judged(world, run=8, pairs=900)
    why = standing(plan, approval)
    assert why is not None and "the evidence behind check" in why and "another run" in why, why


def test_a_judgement_on_other_fingerprints_voids_the_approval(world):  # noqa: F811
    plan, approval = approved_at_warn(world)
    judged(world, pairs=900, prints={**PRINTS, "primary": {"runtime_version": "cuda-12.6"}})
    why = standing(plan, approval)
    assert why is not None and "other fingerprints" in why, why


def test_an_expired_judgement_voids_the_approval_a_refreshed_one_does_not(
        world, monkeypatch):  # noqa: F811
    start = timezone.now()
    plan, approval = approved_at_warn(world, ttl_hours=1)
    # 50 minutes on, the judge refreshes the judgement (valid another hour); at 70 minutes
    # the row the approval saw has expired, the judgement has not.
    monkeypatch.setattr(timezone, "now", lambda: start + timedelta(minutes=50))
    judged(world, pairs=900, ttl_hours=1)
    monkeypatch.setattr(timezone, "now", lambda: start + timedelta(minutes=70))
    assert standing(plan, approval) is None
    # Nothing refreshes it again: at two hours the judgement itself has expired.
    monkeypatch.setattr(timezone, "now", lambda: start + timedelta(hours=2))
    why = standing(plan, approval)
    assert why is not None and ("expired" in why or "went from warn" in why), why


def test_a_kind_that_is_not_refreshed_still_binds_to_the_row(world):  # noqa: F811
    """Conformance rows are separate measurements: a new one, same verdict, is new
    evidence, as before."""
    probe = Actor.for_system("conformance")
    plan = world.plan()
    services.evidence_record(actor=probe, pool=world.candidate, kind="conformance",
                             verdict="pass", summary="40/40 cases", source="probe 1")
    approval = services.approve(actor=world.actor("lead"), plan=plan,
                                justification="cost and health are not in yet, that's fine")
    services.evidence_record(actor=probe, pool=world.candidate, kind="conformance",
                             verdict="pass", summary="40/40 cases", source="probe 1")
    why = standing(plan, approval)
    assert why is not None and "the evidence behind check" in why, why


@pytest.mark.parametrize("verdict", ["pass", "warn", "fail", "info"])
def test_the_judgement_string_names_job_verdict_and_fingerprints(world, verdict):  # noqa: F811
    judged(world, verdict=verdict)
    row = world.candidate.evidence.get(kind="shadow")
    ref = ev.evidence_ref(row)
    assert ref.judgement.startswith(f"shadow|shadow run 7|route:{world.route.pk}|")
    assert f"|{verdict}|" in ref.judgement
    assert ref.as_json()["judgement"] == ref.judgement
