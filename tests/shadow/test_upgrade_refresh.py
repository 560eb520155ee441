"""A pool of a running shadow run that changes (it reports an upgrade, or a registry edit
changes its fingerprint) gets its run judged at once by fleet's report and change hooks: the
`shadow` evidence is recorded on the new fingerprints then, not at the next refresh up to
EVIDENCE_EVERY_S later, so the stage-2 divergence check does not sit on an expired row. Only
with new pairs, as any refresh: the same pairs are never recorded again under new
fingerprints. Real services, hooks and database; pairs stored as the worker stores them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_update
from fleetctl.shadow import live, services
from fleetctl.shadow.models import ShadowRun
from migrations_plan import evidence as ev
from migrations_plan.models import Evidence, Plan
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.shadow import forget_shadow_keys
from tests.shadow.test_api import _pair

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    """A run publishes its route to Redis; the test database rolls back, Redis does not."""
    yield
    forget_shadow_keys(live.client())


def reports(pool: Pool, server_version: str) -> None:
    """One health probe of the pool that reads this server version (fleet's own service)."""
    pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=5.0,
                       reported={"server_version": server_version})


def judged_run(w: World, capture) -> ShadowRun:
    """A running shadow run with 12 stored pairs, judged once (its first evidence row), then
    2 more pairs: within EVIDENCE_EVERY_S, judged again it records nothing new."""
    with capture(execute=True):
        run = services.run_create(actor=w.actor("lead"), plan=w.plan(), min_pairs=10)
    for n in range(12):
        _pair(run, n)
    services.run_judge(run=run)
    first = ShadowRun.objects.get(pk=run.pk).evidence_id
    for n in (12, 13):
        _pair(run, n)
    services.run_judge(run=run)
    assert first is not None and ShadowRun.objects.get(pk=run.pk).evidence_id == first
    return ShadowRun.objects.get(pk=run.pk)


def divergence(plan: Plan) -> ev.CheckOutcome:
    gate = ev.evaluate_gate(Plan.objects.get(pk=plan.pk), stage=2)
    return next(o for o in gate.outcomes if o.check.key == "divergence")


def test_an_upgrade_the_candidate_reports_is_judged_at_once(
        world: World, django_capture_on_commit_callbacks):  # noqa: F811
    reports(world.candidate, "0.6.0")  # a first report: recorded, not a change
    run = judged_run(world, django_capture_on_commit_callbacks)
    before = Evidence.objects.get(pk=run.evidence_id)
    assert before.pool_fingerprint["server_version"] == "0.6.0"
    assert divergence(run.plan).result.evidence[0].ref == f"evidence:{before.pk}"

    with django_capture_on_commit_callbacks(execute=True):
        reports(world.candidate, "0.7.0")
    run.refresh_from_db()
    after = Evidence.objects.get(pk=run.evidence_id)
    assert after.pk != before.pk
    assert after.pool_fingerprint["server_version"] == "0.7.0"
    assert after.data["fingerprints"]["candidate"]["server_version"] == "0.7.0"
    assert after.data["pairs"] == 14 and after.verdict == before.verdict
    # The gate reads the new row, not an expired one.
    assert divergence(run.plan).result.evidence[0].ref == f"evidence:{after.pk}"

    # Another upgrade with no pair since: the same pairs are not recorded again under the
    # newer fingerprints; the gate reads the row as measured on another server version.
    with django_capture_on_commit_callbacks(execute=True):
        reports(world.candidate, "0.8.0")
    assert ShadowRun.objects.get(pk=run.pk).evidence_id == after.pk
    outcome = divergence(run.plan)
    assert outcome.status == ev.INSUFFICIENT, outcome.result.summary


def test_a_registry_edit_of_the_primary_is_judged_at_once(
        world: World, django_capture_on_commit_callbacks):  # noqa: F811
    run = judged_run(world, django_capture_on_commit_callbacks)
    before = Evidence.objects.get(pk=run.evidence_id)
    with django_capture_on_commit_callbacks(execute=True):
        pool_update(actor=Actor.for_system("registry"), pool=world.primary,
                    runtime_version="cuda-12.8")
    after = Evidence.objects.get(pk=ShadowRun.objects.get(pk=run.pk).evidence_id)
    assert after.pk != before.pk
    assert after.data["fingerprints"]["primary"]["runtime_version"] == "cuda-12.8"
    assert before.data["fingerprints"]["primary"]["runtime_version"] != "cuda-12.8"
    assert after.data["fingerprints"]["candidate"] == before.data["fingerprints"]["candidate"]
