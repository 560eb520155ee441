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
