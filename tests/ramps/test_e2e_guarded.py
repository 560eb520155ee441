"""Guarded ramps end to end, every part real: simulated pools behind a real Envoy that writes
its access log, the telemetry ingester process following that log and scraping the pools'
/metrics, streamed chat traffic from the `openai` client, the Celery worker ticking the ramps
(a loop sends `ramps.tick` as beat does) and pushing the splits and drains to Envoy. What the
gateway holds is read back from Envoy's own runtime, never taken from our rows.

Holds are short (12 s, TELEMETRY_WINDOW_S is 10) and steps few, so each test takes well under
a minute of ramping."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal
from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.services import region_create
from fleetctl.traffic.models import Drain, SplitRevision
from fleetctl.traffic.services import route_create
from tests.conftest import _worker_env
from tests.ramps import e2e
from tests.sim.simproc import sim_with_profiles

pytestmark = [pytest.mark.slow]
SYSTEM = Actor.for_system("e2e")
# 10 requests/s, all streamed: 2/s reach a candidate at 20 %, 20 in a 10 s window.
RPS = 10.0
SHORT = [{"percent": 20, "hold_s": 12}, {"percent": 50, "hold_s": 12}]


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("ramp-sims"), e2e.PROFILES,
                            {"primary": "quick", "cand": "quick", "twin": "quick"})
    yield sim
    sim.stop()


@pytest.fixture
def envoy(tmp_path: Path) -> Iterator[EnvoyProcess]:
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    yield process
    process.stop()


@pytest.fixture
def worker_env(celery_worker: subprocess.Popen[bytes]) -> dict[str, str]:
    from django.db import connection

    return _worker_env(connection.settings_dict["NAME"])


@pytest.fixture
def world(celery_worker, sims, envoy, worker_env, tmp_path):
    """Pools, a route on the primary, the gateway with its access log, the ingester running,
    traffic flowing and ramps ticking. Faults are cleared before and after."""
    for name in ("primary", "cand", "twin"):
        e2e.set_fault(sims.url(name), added_latency_ms=0, down=False, error_rate=0)
    region = region_create(actor=SYSTEM, code="us-east", name="US East", jurisdiction="US")
    pools = e2e.make_pools(SYSTEM, sims, ["primary", "cand", "twin"], region)
    route = route_create(actor=SYSTEM, name="llama", model_id=e2e.MODEL,
                         primary_pool=pools["primary"], reason="e2e")
    gateway = e2e.make_gateway(SYSTEM, envoy, [route])
    ingester = e2e.Ingester(worker_env, tmp_path / "ingester.log").start()
    traffic = e2e.Traffic(envoy.listen_url, RPS).start()
    ticks = e2e.TickLoop().start()
    try:
        yield {"pools": pools, "route": route, "gateway": gateway, "envoy": envoy,
               "sims": sims, "traffic": traffic}
    finally:
        ticks.stop()
        traffic.stop()
        ingester.stop()
        for name in ("primary", "cand", "twin"):
            e2e.set_fault(sims.url(name), added_latency_ms=0, down=False, error_rate=0)


def start_ramp(world, pool: str, steps, **overrides):
    from fleetctl.ramps.services import ramp_create

    fields = {"min_samples": 8, "window_s": 10, "failure_threshold": 2, **e2e.THRESHOLDS,
              **overrides}
    return ramp_create(actor=SYSTEM, route=world["route"], pool=world["pools"][pool],
                       steps=steps, reason="e2e", **fields)


def finished(ramp) -> bool:
    ramp.refresh_from_db()
    return not ramp.active


def test_a_ramp_on_a_healthy_pool_steps_through_its_holds_and_completes(world):
    ramp = start_ramp(world, "cand", SHORT)

    e2e.wait_for(lambda: finished(ramp), timeout_s=150, what="the ramp to finish")

    assert ramp.state == "complete", e2e.explain(ramp)
    kinds = e2e.ramp_events(ramp)
    assert kinds.count("step") == 2 and kinds.count("pass") == 2, e2e.explain(ramp)
    assert "fail" not in kinds and "rollback" not in kinds
    assert e2e.envoy_weights(world["envoy"], "llama") == {"primary": 50, "cand": 50}
    # Every step went out as a revision of the route, authored by the ramp.
    authors = set(SplitRevision.objects.filter(route=world["route"], number__gt=1)
                  .values_list("created_by", flat=True))
    assert authors == {f"system:ramp-{ramp.pk}"}
    assert world["traffic"].outcomes["ok"] > 0


def test_a_latency_fault_mid_ramp_is_rolled_back_by_the_guard_and_drained_on_the_gateway(
        world):
    ramp = start_ramp(world, "cand", [{"percent": 20, "hold_s": 12},
                                      {"percent": 50, "hold_s": 600}])
    e2e.wait_for(lambda: (ramp.refresh_from_db() or ramp.step_index == 1), timeout_s=120,
                 what="the ramp to reach 50 %")
    assert ramp.state == "running", e2e.explain(ramp)

    e2e.set_fault(world["sims"].url("cand"), added_latency_ms=300)

    e2e.wait_for(lambda: finished(ramp), timeout_s=90, what="the guard to roll back")
    assert ramp.state == "rolled-back", e2e.explain(ramp)
    kinds = e2e.ramp_events(ramp)
    assert "fail" in kinds and kinds.count("rollback") == 1, e2e.explain(ramp)
    assert ramp.drain is not None
    assert ramp.events.get(kind="rollback").drain_id == ramp.drain_id
    e2e.wait_for(lambda: Drain.objects.get(pk=ramp.drain_id).verified_at is not None,
                 timeout_s=60, what="the drain to be verified on the gateway")
    held = e2e.envoy_weights(world["envoy"], "llama")
    assert held.get("cand", 0) == 0 and held["primary"] == 100, held
    fail = ramp.events.filter(kind="fail").last()
    assert fail.numbers, "the decision keeps the numbers it used"


def test_an_aa_ramp_whose_candidate_is_the_primarys_twin_never_rolls_back(world):
    ramp = start_ramp(world, "twin", SHORT)

    e2e.wait_for(lambda: finished(ramp), timeout_s=150, what="the ramp to finish")

    assert ramp.state == "complete", e2e.explain(ramp)
    assert not {"fail", "rollback", "warn"} & set(e2e.ramp_events(ramp)), e2e.explain(ramp)


def test_a_pool_that_goes_down_loses_its_weight_by_the_health_policy_and_gets_it_back(
        world):
    from fleetctl.celery import app
    from fleetctl.traffic.services import revision_create

    route = world["route"]
    route.health_policy = "drain-restore"
    route.save(update_fields=["health_policy"])
    revision_create(actor=SYSTEM, route=route, weights={"primary": 80, "cand": 20},
                    base_revision=route.revision_number, reason="e2e: a share for cand")
    cand = world["pools"]["cand"]
    e2e.wait_for(lambda: e2e.envoy_weights(world["envoy"], "llama").get("cand") == 20,
                 timeout_s=60, what="Envoy to hold the 80/20 split")

    def probe_until(state: str) -> bool:
        app.send_task("fleet.pool_probe", args=(cand.pk,))  # what beat's round does
        cand.refresh_from_db()
        return cand.health_state == state

    e2e.set_fault(world["sims"].url("cand"), down=True)
    e2e.wait_for(lambda: probe_until("unhealthy"), timeout_s=60, every_s=1.0,
                 what="the pool to turn unhealthy")
    drain = e2e.wait_for(lambda: Drain.objects.filter(pool=cand,
                                                      health_transition__isnull=False).first(),
                         timeout_s=60, what="the health policy's drain")
    e2e.wait_for(lambda: e2e.envoy_weights(world["envoy"], "llama").get("cand", 0) == 0,
                 timeout_s=60, what="Envoy to hold no weight for the down pool")
    assert drain.health_transition.to_state == "unhealthy"

    e2e.set_fault(world["sims"].url("cand"), down=False)
    e2e.wait_for(lambda: probe_until("healthy"), timeout_s=60, every_s=1.0,
                 what="the pool to turn healthy")
    e2e.wait_for(lambda: e2e.envoy_weights(world["envoy"], "llama").get("cand") == 20,
                 timeout_s=60, what="drain-restore to give the pool its 20 % back")


def test_a_revision_posted_twice_with_one_idempotency_key_over_rest_makes_one_revision(
        world, live_server, make_user):
    user = make_user("olga", "on-call")
    token = token_create_personal(actor=Actor(user=user), name="cli", scopes=["ramp", "read"])
    route = world["route"]
    key = str(uuid.uuid4())
    body = {"weights": {"primary": 90, "cand": 10}, "base_revision": route.revision_number,
            "reason": "e2e: a retried POST"}
    with httpx.Client(base_url=live_server.url, timeout=60, headers={
            "Authorization": f"Bearer {token.secret}", "Idempotency-Key": key}) as http:
        first = http.post("/api/v1/routes/llama/revisions/?wait=verified&timeout=30", json=body)
        again = http.post("/api/v1/routes/llama/revisions/?wait=verified&timeout=30", json=body)
        other = http.post("/api/v1/routes/llama/revisions/", json={**body, "reason": "other"})

    assert first.status_code in (200, 201), first.text
    assert again.status_code == first.status_code and again.json() == first.json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert other.status_code == 422, other.text
    assert SplitRevision.objects.filter(route=route).count() == 2  # the first and this one
    assert first.json().get("verified") is True, first.json()
    assert e2e.envoy_weights(world["envoy"], "llama") == {"primary": 90, "cand": 10}


def test_a_ramp_whose_worker_is_killed_resumes_under_a_new_worker_once_the_lease_expires(
        world, worker_env, tmp_path):
    """The session's worker keeps the other queues; this test's ramps are ticked by a worker
    of its own on `watch` only (lease 4 s), killed with SIGKILL mid-ramp and replaced."""
    from fleetctl.celery import app

    env = {**worker_env, "RAMP_LEASE_S": "4"}
    # The session worker consumes `watch` too: take it off that queue for this test.
    session = [name for reply in (app.control.ping(timeout=1) or []) for name in reply]
    for name in session:
        app.control.cancel_consumer("watch", destination=[name], reply=True)
    own = e2e.start_worker(env, tmp_path / "worker-1.log", name=f"ramps1-{os.getpid()}",
                           queues="watch")
    try:
        ramp = start_ramp(world, "cand", [{"percent": 10, "hold_s": 12},
                                          {"percent": 30, "hold_s": 12},
                                          {"percent": 50, "hold_s": 12}])
        e2e.wait_for(lambda: (ramp.refresh_from_db() or ramp.step_index >= 0), timeout_s=60,
                     what="the first step")
        # Kill it in the middle of a tick (holding the ramp's lease) when we catch one in a
        # few seconds of looking; otherwise in the middle of the hold.
        caught = None
        for _ in range(1500):
            ramp.refresh_from_db()
            if ramp.lease_owner and ramp.lease_until is not None:
                caught = ramp.lease_until
                break
        os.kill(own.pid, signal.SIGKILL)
        own.wait()
        ramp.refresh_from_db()
        step_when_killed, events_when_killed = ramp.step_index, ramp.events.count()
        own = e2e.start_worker(env, tmp_path / "worker-2.log", name=f"ramps2-{os.getpid()}",
                               queues="watch")
        e2e.wait_for(lambda: finished(ramp), timeout_s=150, what="the ramp to finish")
        assert ramp.state == "complete", e2e.explain(ramp)
        assert step_when_killed < 2 == ramp.step_index
        if caught is not None:
            # Nobody drove it until the dead worker's lease had expired.
            later = ramp.events.order_by("at", "id")[events_when_killed:]
            assert all(e.at >= caught for e in later if e.kind in ("step", "pass")), \
                e2e.explain(ramp)
    finally:
        if own.poll() is None:
            own.terminate()
            own.wait(timeout=30)
        for name in session:
            app.control.add_consumer("watch", destination=[name], reply=True)
