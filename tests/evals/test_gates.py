"""What the plan's gates read from eval runs: stage 2's "Eval suite passes on this backend"
follows the verdict of the newest `eval` evidence the eval system recorded; stage 4's
"Quality unchanged" reads only `live-quality` (an eval made in stage 2 never satisfies it);
migration 0004 moved existing plans' stage-4 check over; and nothing typed in by a person or
posted by another system stands in for either."""

from __future__ import annotations

import importlib
import random
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.core.exceptions import ValidationError

from fleetctl.accounts.actor import Actor
from fleetctl.evals import stats
from migrations_plan import evidence as ev
from migrations_plan import services
from migrations_plan.models import Evidence, GateCheck, Plan
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.migrations_plan.test_api import service_token

pytestmark = pytest.mark.django_db

EVAL = Actor.for_system("eval")


def statistics(drop: int) -> dict[str, Any]:
    """A 600-item run's statistics: the candidate wrong on `drop` more items than the primary."""
    rng = random.Random(drop)
    primary = [float(rng.random() < 0.9) for _ in range(600)]
    right = [i for i, s in enumerate(primary) if s]
    worse = set(rng.sample(right, drop))
    rows = []
    for i, p in enumerate(primary):
        rows.append({"pool": "h200-us", "item": f"i{i}", "score": p, "tags": ["t"]})
        rows.append({"pool": "mi300x-us", "item": f"i{i}",
                     "score": 0.0 if i in worse else p, "tags": ["t"]})
    return stats.run_statistics(rows, candidate="mi300x-us", primary="h200-us", margin=0.02,
                                confidence=0.95, min_items=100)


def record(w: World, kind: str, out: dict[str, Any], *, run: int = 7,
           stage: int = 2) -> Evidence:
    """What an eval run's finish records (services.run_finish): the verdict, the summary and
    the statistics."""
    return services.evidence_record(
        actor=EVAL, pool=w.candidate, kind=kind,
        verdict=stats.verdict_for_evidence(out["verdict"]), summary=out["summary"],
        data={"run": run, "source": "eval", "stage": stage, "suite": "fleetctl-core",
              "suite_version": 1, "items": out["paired"]["n"], "min_items": 100,
              "margin": 0.02, "confidence": 0.95, "candidate": "mi300x-us",
              "primary": "h200-us", "pools": out["pools"], "paired": out["paired"],
              "tags": out["tags"]},
        model_id="llama-3.1-8b-instruct", source=f"eval run {run}",
        url=f"/evals/runs/{run}/")


def check(plan: Plan, stage: int, key: str) -> ev.CheckOutcome:
    gate = ev.evaluate_gate(Plan.objects.get(pk=plan.pk), stage=stage)
    return next(o for o in gate.outcomes if o.check.key == key)


# --- stage 2: the eval check ---------------------------------------------------------------------

def test_the_stage_2_eval_check_waits_for_an_eval_run(world: World):  # noqa: F811
    outcome = check(world.plan(), 2, "eval")
    assert outcome.status == ev.INSUFFICIENT
    assert outcome.result.summary.startswith("No eval suite evidence for mi300x-us yet. It "
                                             "comes from eval runs")


@pytest.mark.parametrize(("drop", "status"), [(0, ev.PASS), (60, ev.FAIL), (15, ev.WARN)])
def test_the_stage_2_eval_check_follows_the_runs_verdict(world: World, drop: int,  # noqa: F811
                                                         status: str):
    plan = world.plan()
    out = statistics(drop)
    assert out["verdict"] == status
    row = record(world, "eval", out)
    outcome = check(plan, 2, "eval")
    assert outcome.status == status
    assert outcome.result.summary == out["summary"]
    [ref] = outcome.result.evidence
    assert (ref.ref, ref.origin, ref.source, ref.url) == (
        f"evidence:{row.pk}", "measured", "eval run 7", "/evals/runs/7/")


def test_the_newest_eval_decides_and_an_insufficient_run_is_no_verdict(world: World):  # noqa: F811
    plan = world.plan()
    record(world, "eval", statistics(60), run=1)
    record(world, "eval", statistics(0), run=2)
    assert check(plan, 2, "eval").status == ev.PASS
    few = stats.run_statistics(
        [{"pool": p, "item": f"i{i}", "score": 1.0, "tags": []}
         for i in range(20) for p in ("h200-us", "mi300x-us")],
        candidate="mi300x-us", primary="h200-us", margin=0.02, confidence=0.95, min_items=100)
    assert few["verdict"] == "insufficient"
    row = record(world, "eval", few, run=3)
    assert row.verdict == "info"
    assert check(plan, 2, "eval").status == ev.INSUFFICIENT


# --- stage 4: live quality -----------------------------------------------------------------------

def test_a_stage_2_eval_never_satisfies_stage_4s_quality_check(world: World):  # noqa: F811
    plan = world.plan()
    record(world, "eval", statistics(0))
    assert check(plan, 2, "eval").status == ev.PASS
    outcome = check(plan, 4, "quality")
    assert outcome.status == ev.INSUFFICIENT
    assert outcome.result.summary.startswith(
        "No quality on live traffic (stage 4) evidence for mi300x-us yet.")
    assert not outcome.result.evidence


@pytest.mark.parametrize(("drop", "status"), [(0, ev.PASS), (60, ev.FAIL)])
def test_live_quality_evidence_satisfies_stage_4s_check(world: World, drop: int,  # noqa: F811
                                                        status: str):
    plan = world.plan()
    out = statistics(drop)
    row = record(world, "live-quality", out, run=9, stage=4)
    outcome = check(plan, 4, "quality")
    assert outcome.status == status
    assert outcome.result.evidence[0].ref == f"evidence:{row.pk}"
    # ... and it is not an `eval` row: stage 2's check does not read it.
    assert check(plan, 2, "eval").status == ev.INSUFFICIENT


# --- migration 0004 ------------------------------------------------------------------------------

MIGRATION = importlib.import_module("migrations_plan.migrations.0004_live_quality_check")


def test_migration_0004_moves_an_existing_plans_stage_4_check_from_eval_to_live_quality(
        world: World):  # noqa: F811
    plan = world.plan()
    quality = plan.checks.get(stage=4, key="quality")
    # As a plan made before 0004 has it (a custom window kept across the move).
    GateCheck.objects.filter(pk=quality.pk).update(params={"kind": "eval", "within_days": 14})
    record(world, "eval", statistics(0))
    assert check(plan, 4, "quality").status == ev.PASS  # the hole 0004 closes
    stage_2 = plan.checks.get(stage=2, key="eval")
    MIGRATION.forwards(django_apps, None)
    quality.refresh_from_db()
    assert quality.params == {"kind": "live-quality", "within_days": 14}
    assert check(plan, 4, "quality").status == ev.INSUFFICIENT
    stage_2.refresh_from_db()
    assert stage_2.params["kind"] == "eval"  # stage 2 keeps reading eval
    # Idempotent, and reversible.
    MIGRATION.forwards(django_apps, None)
    quality.refresh_from_db()
    assert quality.params["kind"] == "live-quality"
    MIGRATION.backwards(django_apps, None)
    quality.refresh_from_db()
    assert quality.params == {"kind": "eval", "within_days": 14}


def test_migration_0004_leaves_a_quality_check_a_lead_pointed_elsewhere(world: World):  # noqa: F811
    plan = world.plan()
    quality = plan.checks.get(stage=4, key="quality")
    GateCheck.objects.filter(pk=quality.pk).update(params={"kind": "shadow"})
    MIGRATION.forwards(django_apps, None)
    quality.refresh_from_db()
    assert quality.params == {"kind": "shadow"}


# --- nothing typed in stands in ------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["eval", "live-quality"])
def test_a_person_cannot_record_eval_or_live_quality(world: World, kind: str):  # noqa: F811
    with pytest.raises(ValidationError) as refused:
        services.evidence_record(actor=world.actor("lead"), pool=world.candidate, kind=kind,
                                 verdict="pass", summary="looked fine to me")
    assert "only its own jobs record it" in " ".join(refused.value.message_dict["kind"])
    assert not Evidence.objects.exists()


@pytest.mark.parametrize(("about", "stage", "key"), [("eval", 2, "eval"),
                                                     ("live-quality", 4, "quality")])
def test_a_report_about_eval_or_live_quality_never_satisfies_the_check(
        world: World, system, about: str, stage: int, key: str):  # noqa: F811
    plan = world.plan()
    client = service_token(system, "read", "jobs")
    posted = client.post("/api/v1/evidence/", {
        "pool": "mi300x-us", "kind": about, "verdict": "pass", "summary": "98 % on our suite"},
        format="json")
    assert posted.status_code == 400, posted.json()
    assert not Evidence.objects.exists()
    reported = client.post("/api/v1/evidence/", {
        "pool": "mi300x-us", "kind": "external", "reported_by": "ci-evals", "about": about,
        "verdict": "pass", "summary": "98 % on our suite"}, format="json")
    assert reported.status_code == 201, reported.json()
    outcome = check(plan, stage, key)
    assert outcome.status == ev.INSUFFICIENT
    assert "Reported by ci-evals: pass — not measured by fleetctl" in outcome.result.summary
