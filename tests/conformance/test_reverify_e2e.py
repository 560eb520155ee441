"""Re-verification end to end, every part real (issue 27): simulated pools behind a real
Envoy, the Celery worker probing, probing conformance and pushing drains. A pool carrying
20 % of a route starts reporting another server version mid-run, and its new server breaks
the OpenAI contract (`fleetctl sim fault --server-version 0.9.0 --error-rate 1`; its health
probe still passes: `/v1/models`, `/health` and `/version` answer). The probe that sees the
version starts a conformance probe of the pool against the route's primary by itself
(`system:reverify`); it fails; the route's `reverify_policy` decides: `drain` takes the pool
off the route through the drain service (audited, `drain.automatic` webhook) and Envoy holds
no weight for it; `hold` drains nothing. Conditions are waited on, never fixed sleeps."""

from __future__ import annotations

import httpx
import pytest

from fleetctl.audit.models import AuditEvent
from fleetctl.conformance.models import ConformanceRun
from fleetctl.fleet.models import Pool
from fleetctl.traffic.models import Drain, Route
from fleetctl.traffic.services import revision_create
from fleetctl.webhooks.models import Delivery
from fleetctl.webhooks.services import webhook_create
from tests.ramps import e2e
from tests.ramps.test_e2e_guarded import (  # noqa: F401 - the fixtures
    SYSTEM,
    envoy,
    sims,
    ticker,
    worker_env,
    world,
)

pytestmark = [pytest.mark.slow]


def probe(pool: Pool) -> Pool:
    """What beat's round does: a probe of the pool, on the worker."""
    from fleetctl.celery import app

    app.send_task("fleet.pool_probe", args=(pool.pk,))
    return Pool.objects.get(pk=pool.pk)


@pytest.mark.parametrize("policy", ["drain", "hold"])
def test_an_upgrade_that_breaks_the_contract_is_reverified_and_handled_by_the_routes_policy(
        world, policy: str):  # noqa: F811
    route: Route = world["route"]
    cand: Pool = world["pools"]["cand"]
    url = world["sims"].url("cand")
    Route.objects.filter(pk=route.pk).update(reverify_policy=policy)
    hook = webhook_create(actor=SYSTEM, name="drains", events=["drain.automatic"],
                          url="http://127.0.0.1:9/hook")
    revision_create(actor=SYSTEM, route=Route.objects.get(pk=route.pk),
                    weights={"primary": 80, "cand": 20},
                    base_revision=Route.objects.get(pk=route.pk).revision_number,
                    reason="e2e: a share for cand")
    e2e.wait_for(lambda: e2e.envoy_weights(world["envoy"], "llama").get("cand") == 20,
                 timeout_s=60, what="Envoy to hold the 80/20 split")
    try:
        # The version as first reported: recorded, not a change.
        e2e.wait_for(lambda: probe(cand).reported.get("server_version") == "0.8.5+sim",
                     timeout_s=60, every_s=1.0, what="the first reported version")
        assert not ConformanceRun.objects.filter(pool=cand).exists()
        # Mid-run: the server is upgraded (nobody registered it) and the upgrade broke it.
        e2e.set_fault(url, server_version="0.9.0", error_rate=1.0)
        e2e.wait_for(lambda: probe(cand).reported.get("server_version") == "0.9.0",
                     timeout_s=60, every_s=1.0, what="the probe to read the new version")
        assert AuditEvent.objects.filter(action="pool.reported_change",
                                         object_id=str(cand.pk)).exists()
        # Re-verification started by itself: a conformance probe against the route's primary.
        run = e2e.wait_for(lambda: ConformanceRun.objects.filter(
            pool=cand, created_by="system:reverify").first(),
            timeout_s=30, what="the re-verification probe")
        assert run.primary.name == "primary" and run.plan is None
        run = e2e.wait_for(lambda: ConformanceRun.objects.filter(
            pk=run.pk).exclude(status__in=ConformanceRun.ACTIVE).first(),
            timeout_s=120, what="the re-verification probe to finish")
        assert (run.status, run.verdict) == ("complete", "fail"), (run.error, run.summary)
        assert AuditEvent.objects.filter(action="pool.reverify", object_id=str(cand.pk),
                                         message__contains=f"conformance run {run.pk} "
                                                           f"started").exists()
        if policy == "drain":
            drain = e2e.wait_for(lambda: Drain.objects.filter(
                pool=cand, requested_by="system:reverify").first(),
                timeout_s=60, what="the re-verification policy's drain")
            assert f"conformance run {run.pk}" in drain.reason
            e2e.wait_for(lambda: e2e.envoy_weights(world["envoy"], "llama").get("cand", 0)
                         == 0, timeout_s=60, what="Envoy to hold no weight for the pool")
            e2e.wait_for(lambda: Drain.objects.get(pk=drain.pk).verified_at is not None,
                         timeout_s=60, what="the drain to be verified on the gateway")
            assert AuditEvent.objects.filter(action="drain.request",
                                             actor="system:reverify").exists()
            # The delivery row is written in the worker beside the drain; wait for it rather
            # than assume it landed before the gateway confirmed.
            e2e.wait_for(lambda: Delivery.objects.filter(webhook=hook,
                                                         event="drain.automatic").exists(),
                         timeout_s=30, what="the drain.automatic delivery")
            assert Delivery.objects.get(webhook=hook).payload["data"]["policy"] == "reverify"
        else:
            e2e.wait_for(lambda: AuditEvent.objects.filter(
                action="pool.reverify", object_id=str(cand.pk),
                message__contains="policy hold").exists(),
                timeout_s=60, what="the hold to be recorded")
            assert not Drain.objects.filter(pool=cand).exists()
            assert e2e.envoy_weights(world["envoy"], "llama").get("cand") == 20
    finally:
        httpx.post(f"{url}/admin/reset", timeout=5).raise_for_status()
