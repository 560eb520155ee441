"""A ramp driving a real Envoy: each step's split is pushed by the Celery worker and read
back from Envoy, and the guard's rollback drain is pushed and verified like any drain; then
requests through Envoy reach the primary only. Telemetry is written as Window rows (the
ingester's own tests cover reading Envoy's log); each tick is called with the time it runs
at, so holds take no wall time."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetctl.accounts.actor import Actor
from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.ramps.models import Ramp
from fleetctl.ramps.services import ramp_create, ramps_tick, step_data_start
from fleetctl.traffic.models import Drain, GatewayPush, SplitRevision
from fleetctl.traffic.services import gateway_create, route_create
from tests.conftest import SYSTEM
from tests.ramps.windows import traffic
from tests.support.waiting import wait_until
from tests.traffic.envoy.conftest import MODEL, sims  # noqa: F401 - the session's simulators

pytestmark = pytest.mark.slow
GOOD = [5.0] * 60
SLOW = [305.0] * 60


@pytest.fixture
def envoy(tmp_path: Path) -> Iterator[EnvoyProcess]:
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    yield process
    process.stop()


def served(sims, pool: str) -> int:  # noqa: F811
    text = httpx.get(f"{sims.url(pool)}/metrics", timeout=5).text
    return int(sum(sample.value for family in text_string_to_metric_families(text)
                   if family.name == "vllm:request_success"
                   for sample in family.samples if sample.name.endswith("_total")))


def verified(revision_number: int) -> bool:
    pushes = GatewayPush.objects.filter(revision__number=revision_number,
                                        revision__route__name="llama")
    return pushes.exists() and all(p.status == "verified" for p in pushes)


def test_a_ramp_steps_through_envoy_and_its_rollback_drain_verifies(
        celery_worker, sims, envoy, make_pool, make_user):  # noqa: F811
    pools = {name: make_pool(name=name, base_urls=[sims.url(name)]) for name in ("pa", "pb")}
    for pool in pools.values():
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = route_create(actor=SYSTEM, name="llama", model_id=MODEL, primary_pool=pools["pa"],
                         reason="test")
    gateway_create(actor=SYSTEM, name="envoy-1", kind="envoy", admin_address=envoy.admin_url,
                   options={"config_dir": str(envoy.workdir)}, routes=[route])
    wait_until(lambda: verified(1), timeout_s=60, what="the route on Envoy")

    oncall = Actor(user=make_user("oncall", "on-call"))
    ramp = ramp_create(actor=oncall, route=route, pool=pools["pb"],
                       steps=[{"percent": 10, "hold_s": 30}, {"percent": 50, "hold_s": 30}],
                       slo_ttft_p95_ms=150, slo_tpot_p95_ms=50, slo_error_rate=0.05,
                       latency_margin_pct=100)
    # The worker's first tick (queued on commit) sets step 1, and pushes it.
    ramp = wait_until(lambda: Ramp.objects.filter(pk=ramp.pk, step_index=0).first(),
                      timeout_s=60, what="the first step")
    wait_until(lambda: verified(ramp.revision_number), timeout_s=60, what="step 1 on Envoy")
    first = SplitRevision.objects.get(route=route, number=ramp.revision_number)
    assert first.weights == {"pa": 9000, "pb": 1000}

    t0 = ramp.step_started_at
    traffic(since=t0, until=t0 + timedelta(seconds=31), per_window={"pa": GOOD, "pb": GOOD})
    ramps_tick(now=t0 + timedelta(seconds=31))
    ramp = Ramp.objects.get(pk=ramp.pk)
    assert ramp.step_index == 1
    wait_until(lambda: verified(ramp.revision_number), timeout_s=60, what="step 2 on Envoy")
    before = {name: served(sims, name) for name in pools}
    client = openai.OpenAI(base_url=f"{envoy.listen_url}/v1", api_key="x", max_retries=0,
                           timeout=30)
    for _ in range(40):
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    assert served(sims, "pb") > before["pb"]  # 50 %: both pools answer (P(none) = 2^-40)

    # The guard reads the step's own windows: from the first boundary after it was set.
    t1 = step_data_start(ramp.step_started_at)
    traffic(since=t1, until=t1 + timedelta(seconds=8), per_window={"pa": GOOD, "pb": SLOW})
    ramps_tick(now=t1 + timedelta(seconds=5))
    ramps_tick(now=t1 + timedelta(seconds=7))
    ramp = Ramp.objects.get(pk=ramp.pk)
    assert ramp.state == "rolled-back" and ramp.drain_id is not None
    drain = Drain.objects.get(pk=ramp.drain_id)
    assert drain.status in (Drain.Status.VERIFIED, Drain.Status.COMPLETE), drain.last_error
    assert drain.verified_at is not None and drain.pool_id == pools["pb"].pk

    before = {name: served(sims, name) for name in pools}
    for _ in range(20):
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    wait_until(lambda: served(sims, "pa") - before["pa"] == 20, timeout_s=10,
               what="the primary to count the requests")
    assert served(sims, "pb") == before["pb"]
