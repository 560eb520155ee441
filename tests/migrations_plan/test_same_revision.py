"""Candidate and primary serving different weight revisions is a gate finding (issue 27):
stage 1's "Candidate and primary serve the same weights revision" (rule
`models.same_revision`) reads what each pool's servers report of themselves (the health
probe's `reported`, from the `revision` on each `/v1/models` card), never the registry.
Different revisions fail; a pool that does not report one is insufficient data. With a real
simulator: the sim reports a revision, and swapping it (`fleetctl sim fault
--model-revision`) is a reported change that turns the check red."""

from __future__ import annotations

import importlib

import httpx
import pytest
from django.apps import apps as django_apps

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool
from fleetctl.fleet.tasks import pool_probe
from fleetctl.sim.faults import MODEL_REVISION
from migrations_plan import evidence as ev
from migrations_plan import services as plans
from migrations_plan.models import GateCheck, Plan
from tests.conformance.conftest import conformance_sim  # noqa: F401 - the fixture
from tests.conformance.test_runs import point
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db


def same_revision(plan: Plan) -> ev.CheckOutcome:
    gate = ev.evaluate_gate(Plan.objects.get(pk=plan.pk), stage=1)
    return next(o for o in gate.outcomes if o.check.key == "same-revision")


def reports(pool: Pool, revision: str | None) -> None:
    Pool.objects.filter(pk=pool.pk).update(
        reported={"server_version": None, "max_model_len": {},
                  "model_revision": {MODEL: revision} if revision else {}})


def test_a_new_plans_stage_1_has_the_check(world: World):  # noqa: F811
    check = world.plan().checks.get(stage=1, key="same-revision")
    assert (check.rule, check.title) == (
        "models.same_revision", "Candidate and primary serve the same weights revision")


@pytest.mark.parametrize(("candidate", "primary", "status", "summary"), [
    (None, None, ev.INSUFFICIENT, "Not reported: mi300x-us does not report the revision of "
                                  "llama-3.1-8b-instruct; h200-us does not report"),
    ("abc123", None, ev.INSUFFICIENT, "Not reported: h200-us does not report the revision"),
    ("abc123", "abc123", ev.PASS, "Both serve llama-3.1-8b-instruct@abc123."),
    ("abc124", "abc123", ev.FAIL, "Different weights: llama-3.1-8b-instruct: mi300x-us serves "
                                  "abc124, h200-us serves abc123."),
])
def test_the_rule_compares_what_both_pools_report(world: World, candidate, primary,  # noqa: F811
                                                 status, summary):
    plan = world.plan()
    reports(world.candidate, candidate)
    reports(world.primary, primary)
    outcome = same_revision(plan)
    assert outcome.status == status
    assert outcome.result.summary.startswith(summary), outcome.result.summary
    assert outcome.result.numbers["candidate_reports"] == {MODEL: candidate}


def test_the_registry_alone_never_passes_it(world: World):  # noqa: F811
    """Both PoolModel rows say revision abc123 (the world's registry); nothing reported."""
    assert same_revision(world.plan()).status == ev.INSUFFICIENT


@pytest.mark.slow
def test_a_simulator_reports_its_revision_and_a_swap_fails_the_check(
        world: World, conformance_sim):  # noqa: F811
    url = conformance_sim.url("good")
    candidate = point(world.candidate, conformance_sim, "good")
    primary = point(world.primary, conformance_sim, "twin")
    plan = world.plan()
    try:
        assert pool_probe(candidate.pk) is True and pool_probe(primary.pk) is True
        assert Pool.objects.get(pk=candidate.pk).reported["model_revision"][MODEL] == \
            MODEL_REVISION
        outcome = same_revision(plan)
        assert outcome.status == ev.PASS, outcome.result.summary
        plans.evidence_record(actor=Actor.for_system("conformance-probe"),
                              pool=Pool.objects.get(pk=candidate.pk), kind="conformance",
                              verdict="pass", summary="40/40 cases")
        httpx.post(f"{url}/admin/faults", json={"model_revision": "weights-2"}
                   ).raise_for_status()
        assert pool_probe(candidate.pk) is True
        assert Pool.objects.get(pk=candidate.pk).reported["model_revision"][MODEL] == \
            "weights-2"
        assert AuditEvent.objects.filter(
            action="pool.reported_change", object_id=str(candidate.pk),
            message__contains=f"{MODEL} weights revision {MODEL_REVISION} → weights-2").exists()
        outcome = same_revision(plan)
        assert outcome.status == ev.FAIL
        assert f"mi300x-us serves weights-2, h200-us serves {MODEL_REVISION}" in \
            outcome.result.summary
        # The evidence measured on the old weights no longer counts, and says why.
        conformance = next(o for o in ev.evaluate_gate(Plan.objects.get(pk=plan.pk), stage=1)
                           .outcomes if o.check.key == "conformance")
        assert conformance.status == ev.INSUFFICIENT
        assert conformance.result.numbers["expired_why"] == (
            f"weights revision (as the pool reports it) changed from {MODEL}@{MODEL_REVISION} "
            f"to {MODEL}@weights-2")
        # A bad value is refused by the simulator, naming the field; nothing changes.
        refused = httpx.post(f"{url}/admin/faults", json={"model_revision": "no spaces"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == \
            "model_revision"
    finally:
        httpx.post(f"{url}/admin/reset").raise_for_status()


MIGRATION = importlib.import_module("migrations_plan.migrations.0010_check_history")


def test_migration_0010_adds_the_check_to_open_plans_once(world: World):  # noqa: F811
    plan = world.plan()
    GateCheck.objects.filter(plan=plan, key="same-revision").delete()  # as before 0010
    MIGRATION.add_same_revision(django_apps, None)
    MIGRATION.add_same_revision(django_apps, None)
    added = plan.checks.filter(stage=1, key="same-revision", removed_at__isnull=True)
    assert added.count() == 1
    assert added.get().position > plan.checks.get(stage=1, key="healthy").position
    MIGRATION.remove_same_revision(django_apps, None)
    assert not plan.checks.filter(key="same-revision").exists()
