"""Guarded ramps end to end, every part real: simulated pools behind a real Envoy that writes
its access log, the telemetry ingester process following that log and scraping the pools'
/metrics, streamed chat traffic from the `openai` client, the Celery worker ticking the ramps
(a loop sends `ramps.tick` as beat does) and pushing the splits and drains to Envoy. What the
gateway holds is read back from Envoy's own runtime, never taken from our rows.

Holds are short (6 s) and steps few, so each test takes well under half a minute of ramping:
this module's telemetry windows are 5 s (TELEMETRY_WINDOW_S, in the ingester, the worker that
ticks the ramps and this process alike), the guard judging 5-s windows as it would 10-s ones.
One worker of the module's own ticks the ramps (queue `watch`, the session's worker leaves it
meanwhile) with a 6-s ramp lease; the killed-worker test kills it and starts its successor."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from tests.support.profiles import TEST_PROFILES

pytestmark = [pytest.mark.slow]
SYSTEM = Actor.for_system("e2e")
# 10 requests/s, all streamed: 2/s reach a candidate at 20 %, 10 in a 5 s window.
RPS = 10.0
WINDOW_S = 5
HOLD_S = 6
SHORT = [{"percent": 20, "hold_s": HOLD_S}, {"percent": 50, "hold_s": HOLD_S}]
# A TTFT SLO far above what a healthy simulated pool answers even while the whole suite
# starts on two cores (a healthy candidate's p95 reached 311 ms there, over the 250 ms the
# benchmarks judge with, and the ramp paused on a warning), and a fault far above the SLO.
THRESHOLDS = {**e2e.THRESHOLDS, "slo_ttft_p95_ms": 600.0}
FAULT_MS = 1000


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("ramp-sims"), TEST_PROFILES,
                            {"primary": "quick", "cand": "quick", "twin": "quick"})
    yield sim
    sim.stop()


@pytest.fixture
def envoy(tmp_path: Path) -> Iterator[EnvoyProcess]:
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    yield process
    process.stop()


@dataclass
class Ticker:
    """The module's worker on the `watch` queue (ramps.tick), on WINDOW_S telemetry."""

    env: dict[str, str]
    logs: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, name: str, **env: str) -> subprocess.Popen[bytes]:
        self.proc = e2e.start_worker({**self.env, **env}, self.logs / f"{name}.log",
                                     name=f"{name}-{os.getpid()}", queues="watch")
        return self.proc

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker_env(celery_worker_process: subprocess.Popen[bytes],
               django_db_blocker) -> dict[str, str]:
    """The environment of this module's processes: the test database, 5-s windows."""
    from django.db import connection

    with django_db_blocker.unblock():
        name = connection.settings_dict["NAME"]
    return {**_worker_env(name), "TELEMETRY_WINDOW_S": str(WINDOW_S), "RAMP_LEASE_S": "6"}


@pytest.fixture(scope="module")
def ticker(worker_env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ticker]:
    from fleetctl.celery import app

    # The session worker consumes `watch` too, on 10-s windows: off that queue meanwhile.
    session = [name for reply in (app.control.ping(timeout=1) or []) for name in reply]
    for name in session:
        app.control.cancel_consumer("watch", destination=[name], reply=True)
    ticker = Ticker(worker_env, tmp_path_factory.mktemp("ramp-workers"))
    try:
        ticker.start("ramps")
        yield ticker
    finally:
        ticker.stop()
        for name in session:
            app.control.add_consumer("watch", destination=[name], reply=True)


@pytest.fixture
def world(celery_worker, ticker, sims, envoy, worker_env, tmp_path, settings):
    """Pools, a route on the primary, the gateway with its access log, the ingester running,
    traffic flowing and ramps ticking. Faults are cleared before and after."""
    settings.TELEMETRY_WINDOW_S = WINDOW_S
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

    fields = {"min_samples": 8, "window_s": WINDOW_S, "failure_threshold": 2, **THRESHOLDS,
              **overrides}
    return ramp_create(actor=SYSTEM, route=world["route"], pool=world["pools"][pool],
                       steps=steps, reason="e2e", **fields)


def finished(ramp) -> bool:
    ramp.refresh_from_db()
    return not ramp.active


def test_a_ramp_on_a_healthy_pool_steps_through_its_holds_and_completes(world):
    ramp = start_ramp(world, "cand", SHORT)

    e2e.wait_for(lambda: finished(ramp), timeout_s=150, what="the ramp to finish",
                 explain=lambda: e2e.explain(ramp))

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
    ramp = start_ramp(world, "cand", [{"percent": 20, "hold_s": HOLD_S},
                                      {"percent": 50, "hold_s": 600}])
    e2e.wait_for(lambda: (ramp.refresh_from_db() or ramp.step_index == 1), timeout_s=120,
                 what="the ramp to reach 50 %", explain=lambda: e2e.explain(ramp))
    assert ramp.state == "running", e2e.explain(ramp)

    e2e.set_fault(world["sims"].url("cand"), added_latency_ms=FAULT_MS)

    e2e.wait_for(lambda: finished(ramp), timeout_s=90, what="the guard to roll back",
                 explain=lambda: e2e.explain(ramp))
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


def test_a_fault_while_paused_is_still_rolled_back_and_drained_on_the_gateway(world):
    """A pause stops the steps, not the guard: the candidate keeps its 20 % while people
    look, so a fault then is rolled back as it would be while running."""
    from fleetctl.ramps.services import ramp_pause

    ramp = start_ramp(world, "cand", [{"percent": 20, "hold_s": 600}])
    e2e.wait_for(lambda: (ramp.refresh_from_db() or ramp.step_started_at is not None),
                 timeout_s=60, what="the first step", explain=lambda: e2e.explain(ramp))
    ramp_pause(actor=SYSTEM, ramp=ramp, reason="a person looks at the dashboards")
    ramp.refresh_from_db()
    assert ramp.state == "paused", e2e.explain(ramp)

    e2e.set_fault(world["sims"].url("cand"), added_latency_ms=FAULT_MS)

    e2e.wait_for(lambda: finished(ramp), timeout_s=90, what="the guard to roll back",
                 explain=lambda: e2e.explain(ramp))
    assert ramp.state == "rolled-back", e2e.explain(ramp)
    assert "failed while paused" in ramp.state_reason, e2e.explain(ramp)
    e2e.wait_for(lambda: Drain.objects.get(pk=ramp.drain_id).verified_at is not None,
                 timeout_s=60, what="the drain to be verified on the gateway")
    held = e2e.envoy_weights(world["envoy"], "llama")
    assert held.get("cand", 0) == 0 and held["primary"] == 100, held


def test_an_aa_ramp_whose_candidate_is_the_primarys_twin_never_rolls_back(world):
    ramp = start_ramp(world, "twin", SHORT)

    e2e.wait_for(lambda: finished(ramp), timeout_s=150, what="the ramp to finish",
                 explain=lambda: e2e.explain(ramp))

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
        world, ticker):
    """The module's worker (the only one on `watch`, 6-s ramp lease) is killed with SIGKILL
    mid-ramp; a successor finishes the ramp and stays the module's worker."""
    own = ticker.proc
    assert own is not None and own.poll() is None
    # Two steps: the kill comes in the first, so the successor has a hold to judge and a
    # step to set before it completes the ramp.
    ramp = start_ramp(world, "cand", [{"percent": 20, "hold_s": HOLD_S},
                                      {"percent": 50, "hold_s": HOLD_S}])
    e2e.wait_for(lambda: (ramp.refresh_from_db() or ramp.step_index >= 0), timeout_s=60,
                 what="the first step", explain=lambda: e2e.explain(ramp))
    # Kill it in the middle of a tick (holding the ramp's lease) when we catch one in 3 s
    # of looking (ticks come every 2 s); otherwise in the middle of the first hold.
    def leased() -> Any:
        ramp.refresh_from_db()
        return ramp.lease_owner and ramp.lease_until

    caught = None
    with contextlib.suppress(AssertionError):  # none caught: killed mid-hold instead
        caught = e2e.wait_for(leased, timeout_s=3, every_s=0, what="a tick holding the lease")
    os.kill(own.pid, signal.SIGKILL)
    own.wait()
    ramp.refresh_from_db()
    step_when_killed, events_when_killed = ramp.step_index, ramp.events.count()
    ticker.start("ramps2")
    e2e.wait_for(lambda: finished(ramp), timeout_s=150, what="the ramp to finish",
                 explain=lambda: e2e.explain(ramp))
    assert ramp.state == "complete", e2e.explain(ramp)
    assert step_when_killed < 1 == ramp.step_index
    if caught is not None:
        # Nobody drove it until the dead worker's lease had expired.
        later = ramp.events.order_by("at", "id")[events_when_killed:]
        assert all(e.at >= caught for e in later if e.kind in ("step", "pass")), \
            e2e.explain(ramp)
