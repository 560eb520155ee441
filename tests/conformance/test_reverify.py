"""Upgrades re-verified by themselves, end to end with a real simulator and worker: a pool
past stage 1 starts reporting another server version (`fleetctl sim fault --server-version`,
an upgrade nobody registered). The next health probe records it; the stage-1 conformance
evidence measured on the old server stops counting, so the plan is at risk; a conformance
probe of the pool is started by `system:reverify` without anyone clicking, and its passing
evidence clears the risk."""

from __future__ import annotations

import httpx
import pytest
from django.db import transaction
from django.utils import timezone

from fleetctl.conformance import services
from fleetctl.conformance.models import ConformanceRun
from fleetctl.fleet.models import Pool
from fleetctl.fleet.tasks import pool_probe
from fleetctl.sim.faults import SERVER_VERSION
from migrations_plan import evidence as ev
from migrations_plan import services as plans
from migrations_plan.models import Plan
from tests.conformance.test_runs import conformance_check, finished, point
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.migrations_plan.helpers import walk_to
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def test_an_unregistered_upgrade_is_reprobed_by_itself_and_the_plan_is_at_risk_meanwhile(
        celery_worker, world: World, conformance_sim):  # noqa: F811
    url = conformance_sim.url("good")
    candidate = point(world.candidate, conformance_sim, "good")
    point(world.primary, conformance_sim, "twin")
    assert pool_probe(candidate.pk) is True  # the server's version, as first reported
    plan = world.plan()
    first = finished(services.run_create(actor=world.actor("oncall"), pool=candidate,
                                         plan=plan))
    assert first.verdict == "pass", first.summary
    plan = walk_to(world, Plan.objects.get(pk=plan.pk), 2)
    try:
        httpx.post(f"{url}/admin/faults", json={"server_version": "0.9.0"}).raise_for_status()
        # In one transaction, so the report hooks (the re-verification) wait for its end and
        # what it did before them can be read without a race.
        with transaction.atomic():
            assert pool_probe(candidate.pk) is True
            assert Pool.objects.get(pk=candidate.pk).reported["server_version"] == "0.9.0"
            # The evidence measured on the old server no longer counts, and says why.
            ctx = ev.RuleContext(plan=plan, candidate=Pool.objects.get(pk=candidate.pk),
                                 primary=world.primary, routes=list(plan.routes.all()),
                                 now=timezone.now())
            valid, expired = ctx.evidence("conformance")
            assert not valid and expired[0][1] == (
                f"server version (as the pool reports it) changed from {SERVER_VERSION} to "
                f"0.9.0")
            plans.plan_refresh(plan=Plan.objects.get(pk=plan.pk))
            at_risk = Plan.objects.get(pk=plan.pk)
            assert at_risk.at_risk_since is not None
            assert at_risk.risk == [
                f"stage 1: Passes the OpenAI-contract conformance probe is being re-verified: "
                f"server version (as the pool reports it) changed from {SERVER_VERSION} to "
                f"0.9.0"]
            assert not ConformanceRun.objects.filter(created_by="system:reverify").exists()

        # Re-verified without anyone clicking: a probe by system:reverify, on the plan's trail.
        again = wait_until(lambda: ConformanceRun.objects.filter(
            pool=candidate, plan=plan, created_by="system:reverify").first(),
            timeout_s=30, what="the re-verification probe")
        again = finished(again)
        assert again.verdict == "pass", again.summary
        plans.plan_refresh(plan=Plan.objects.get(pk=plan.pk))
        plan = Plan.objects.get(pk=plan.pk)
        assert plan.at_risk_since is None and plan.risk == [], plan.risk
        assert conformance_check(plan).status == ev.PASS
    finally:
        httpx.post(f"{url}/admin/reset").raise_for_status()
