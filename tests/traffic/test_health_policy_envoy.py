"""The health policy end to end, all real: simulated pools, an Envoy gateway, the probe, and
the Celery worker that runs the policy and pushes. A pool put down (the simulator's fault)
loses its weight to the primary without anyone acting, and comes back under drain-restore.
Which pool served a request is read from the pools' own counters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.models import HealthTransition, Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.fleet.tasks import pool_probe
from fleetctl.traffic import selectors
from fleetctl.traffic.models import Drain, GatewayPush, Route
from fleetctl.traffic.services import gateway_create, route_create
from fleetctl.traffic.tasks import health_policy
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
MODEL = "llama-3.1-8b-instruct"


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("health-sims"), TEST_PROFILES,
                            dict.fromkeys(("hp-primary", "hp-cand"), "quick"), models=[MODEL])
    yield sim
    sim.stop()


@pytest.fixture
def envoy(tmp_path: Path) -> Iterator[EnvoyProcess]:
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    yield process
    process.stop()


def _fault(sims: SimProcess, pool: str, *, down: bool) -> None:
    httpx.post(f"{sims.url(pool)}/admin/faults", json={"down": down},
               timeout=5).raise_for_status()


def served(sims: SimProcess, pool: str) -> int:
    text = httpx.get(f"{sims.url(pool)}/metrics", timeout=5).text
    return int(sum(sample.value for family in text_string_to_metric_families(text)
                   if family.name == "vllm:request_success"
                   for sample in family.samples if sample.name.endswith("_total")))


def _ask_many(envoy: EnvoyProcess, n: int) -> None:
    client = openai.OpenAI(base_url=f"{envoy.listen_url}/v1", api_key="x", max_retries=0,
                           timeout=30)
    for _ in range(n):
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])


def _probe_until(pool: Pool, state: str) -> HealthTransition:
    """The probe task, run here as beat would run it, until the pool flips."""
    needed = max(settings.HEALTH_FAILURES_TO_UNHEALTHY, settings.HEALTH_SUCCESSES_TO_HEALTHY)
    for _ in range(needed + 1):
        pool_probe(pool.pk)
        pool.refresh_from_db()
        if pool.health_state == state:
            break
    assert pool.health_state == state, pool.last_probe_error
    return HealthTransition.objects.filter(pool=pool).order_by("-at", "-id").first()


def _weights(route: Route) -> dict[str, int]:
    route.refresh_from_db()
    return selectors.revision_current(route=route).weights


@pytest.fixture
def fleet(celery_worker, sims, envoy, make_pool, system):
    for pool in ("hp-primary", "hp-cand"):
        _fault(sims, pool, down=False)
    pools = {name: make_pool(name=name, base_urls=[sims.url(name)])
             for name in ("hp-primary", "hp-cand")}
    for pool in pools.values():
        pool_model_create(actor=system, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = route_create(actor=system, name="llama", model_id=MODEL,
                         primary_pool=pools["hp-primary"],
                         weights={"hp-primary": 50, "hp-cand": 50}, reason="test",
                         health_policy="drain-restore")
    gateway_create(actor=system, name="envoy-hp", kind="envoy", admin_address=envoy.admin_url,
                   options={"config_dir": str(envoy.workdir)}, routes=[route])
    wait_until(lambda: not GatewayPush.objects.exclude(status="verified").exclude(
        status="superseded").exists(), timeout_s=30, what="the first push to verify")
    yield {"pools": pools, "route": route}
    for pool in ("hp-primary", "hp-cand"):
        _fault(sims, pool, down=False)


def test_a_pool_put_down_is_drained_automatically_and_restored_when_healthy(
        fleet, sims, envoy):
    cand, route = fleet["pools"]["hp-cand"], fleet["route"]
    _fault(sims, "hp-cand", down=True)
    down = _probe_until(cand, Pool.Health.UNHEALTHY)

    drain = wait_until(lambda: Drain.objects.filter(
        health_transition=down, verified_at__isnull=False).first(), timeout_s=30,
        what="the health policy's drain to verify at the gateway")
    assert drain.requested_by == "system:health-policy"
    assert f"health check {down.health_check_id}" in drain.reason
    assert _weights(route) == {"hp-primary": 10_000}
    before = {p: served(sims, p) for p in ("hp-primary", "hp-cand")}
    _ask_many(envoy, 20)
    assert served(sims, "hp-primary") - before["hp-primary"] == 20

    _fault(sims, "hp-cand", down=False)
    back = _probe_until(cand, Pool.Health.HEALTHY)
    restore = wait_until(lambda: Drain.objects.filter(
        restores=drain, health_transition=back, verified_at__isnull=False).first(),
        timeout_s=30, what="the automatic restore to verify")
    assert restore.requested_by == "system:health-policy"
    assert _weights(route) == {"hp-primary": 5_000, "hp-cand": 5_000}
    before = served(sims, "hp-cand")
    _ask_many(envoy, 40)  # 50/50: none of 40 on hp-cand has probability 1e-12
    assert served(sims, "hp-cand") > before


def test_under_drain_the_pool_stays_drained_when_healthy_again(fleet, sims, envoy):
    cand, route = fleet["pools"]["hp-cand"], fleet["route"]
    Route.objects.filter(pk=route.pk).update(health_policy=Route.HealthPolicy.DRAIN)
    _fault(sims, "hp-cand", down=True)
    down = _probe_until(cand, Pool.Health.UNHEALTHY)
    drain = wait_until(lambda: Drain.objects.filter(
        health_transition=down, verified_at__isnull=False).first(), timeout_s=30,
        what="the health policy's drain to verify at the gateway")

    _fault(sims, "hp-cand", down=False)
    back = _probe_until(cand, Pool.Health.HEALTHY)
    # The policy for this flip, run here as well (it is idempotent): it restores nothing.
    assert health_policy(back.pk) == 0
    assert not Drain.objects.filter(restores=drain).exists()
    assert _weights(route) == {"hp-primary": 10_000}
