"""A drain rehearsal follows its drain from the rows, one look at a time: it stops at once
when the drain failed (no restore, no waiting out its own deadline)."""

from __future__ import annotations

import pytest

from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Drain, Gateway, Route
from migrations_plan import services
from migrations_plan import tasks as plan_tasks
from tests.migrations_plan.helpers import walk_to

pytestmark = pytest.mark.django_db


def _ramp(world, percent: float) -> None:
    route = Route.objects.get(pk=world.route.pk)
    traffic.revision_create(actor=world.actor("oncall"), route=route,
                            base_revision=route.revision_number,
                            weights={"h200-us": 100 - percent, "mi300x-us": percent},
                            reason=f"{percent} %")


def test_a_rehearsal_whose_drain_failed_finishes_at_once_without_a_restore(
    world, settings, tmp_path
):
    plan = walk_to(world, world.plan(), 4)
    _ramp(world, 20)
    # A gateway that refuses every push for good (nginx cannot hold a header name with a
    # space): the rehearsal's drain gives up as soon as its first push is refused.
    settings.TRAFFIC_RESIDENCY_HEADER = "x residency"
    traffic.gateway_create(actor=world.actor("admin"), name="edge-nginx", kind="nginx",
                           admin_address=str(tmp_path), options={"listen": "127.0.0.1:1"},
                           routes=[world.route])

    drain = services.rehearsal_start(actor=world.actor("oncall"), plan=plan)

    drain.refresh_from_db()
    assert drain.status == Drain.Status.FAILED
    assert "edge-nginx refused llama" in drain.failure_reason
    # The watcher's look: done, nothing restored, however long its own deadline is.
    assert services.rehearsal_finish(drain_id=drain.pk, timeout_s=900) == (True, None)
    plan_tasks.rehearsal_finish(drain.pk)  # the task's look returns without re-queueing
    assert not Drain.objects.filter(restores=drain).exists()
    assert Route.objects.get(pk=world.route.pk).revisions.first().weights == {
        "h200-us": 10000}  # traffic stays on the primary, the safe side


def test_a_rehearsal_restores_once_its_drain_completed(world, tmp_path):
    # The world's gateway is down (nothing listens): its pushes retry, the drain waits.
    Gateway.objects.filter(name="envoy-a").update(options={"config_dir": str(tmp_path)})
    plan = walk_to(world, world.plan(), 4)
    _ramp(world, 20)
    drain = services.rehearsal_start(actor=world.actor("oncall"), plan=plan)
    assert services.rehearsal_finish(drain_id=drain.pk, timeout_s=900) == (False, None)
    Drain.objects.filter(pk=drain.pk).update(status=Drain.Status.COMPLETE)

    done, restore = services.rehearsal_finish(drain_id=drain.pk, timeout_s=900)

    assert done and restore is not None and restore.restores_id == drain.pk
    assert Route.objects.get(pk=world.route.pk).revisions.first().weights == {
        "h200-us": 8000, "mi300x-us": 2000}
    # A second look (a message delivered twice) restores nothing more.
    assert services.rehearsal_finish(drain_id=drain.pk, timeout_s=900) == (True, None)


def test_only_a_drain_that_took_the_candidates_weight_off_is_its_rehearsal(
        world, make_pool, system):
    """A drain of another pool on the plan's route (a ramp's rollback, an on-call drain) says
    nothing of how fast the candidate's weight comes off: drain.rehearsed does not read it.
    A drain of the candidate, or of the whole route while it carried weight, is read."""
    from django.utils import timezone

    from fleetctl.fleet.services import pool_health_record, pool_model_create
    from migrations_plan.evidence import RuleContext
    from migrations_plan.rules import drain_rehearsed

    plan = walk_to(world, world.plan(), 4)
    other = make_pool(name="a100-us")
    pool_model_create(actor=system, pool=other, model_id=world.route.model_id,
                      revision="abc123", max_context_tokens=8192)
    pool_health_record(pool_id=other.pk, ok=True, status_code=200, latency_ms=1.0)
    route = Route.objects.get(pk=world.route.pk)
    traffic.revision_create(actor=world.actor("oncall"), route=route,
                            base_revision=route.revision_number,
                            weights={"h200-us": 80, "a100-us": 20}, reason="another canary")

    def check():
        ctx = RuleContext(plan=plan, candidate=world.candidate, primary=world.primary,
                          routes=[Route.objects.get(pk=world.route.pk)], now=timezone.now())
        return drain_rehearsed(ctx, {"within_days": 7, "max_ms": 600_000})

    other_drain = traffic.drain_request(actor=world.actor("oncall"), pool=other,
                                        reason="a100 rollback")
    Drain.objects.filter(pk=other_drain.pk).update(status=Drain.Status.COMPLETE)
    result = check()
    assert result.status == "insufficient", result.summary
    assert "No drain of mi300x-us off llama" in result.summary

    _ramp(world, 20)
    mine = traffic.drain_request(actor=world.actor("oncall"), pool=world.candidate,
                                 reason="rehearsal")
    Drain.objects.filter(pk=mine.pk).update(status=Drain.Status.COMPLETE)
    result = check()
    assert [ref.ref for ref in result.evidence] == [f"drain:{mine.pk}"], result.summary
