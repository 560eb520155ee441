"""Health probing: real HTTP probes, state flips after K results, and a real Celery worker."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.test import override_settings

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import HealthCheck, HealthTransition, Pool
from fleetctl.fleet.probe import probe_pool
from fleetctl.fleet.services import health_history_prune, pool_health_record
from fleetctl.fleet.tasks import pool_probe, pools_probe_due
from tests.conftest import ROOT, _worker_env
from tests.fleet.fake_endpoint import FakeEndpoint
from tests.support.waiting import wait_until

# The probe asks the registry which addresses are fleetctl's own (core.destinations).
pytestmark = pytest.mark.django_db


@pytest.fixture
def endpoint() -> Iterator[FakeEndpoint]:
    server = FakeEndpoint()
    yield server
    server.close()


# The probes below get a 10 s timeout: the fake endpoint answers in ~1 ms, but a loaded
# machine may be slow to schedule its thread, and a longer limit costs nothing when it answers.

def test_a_probe_reads_the_model_list_health_and_version(endpoint):
    result = probe_pool([endpoint.url], timeout_s=10)
    assert result.ok and result.models_seen == ["llama-3.1-8b-instruct"]
    assert result.latency_ms is not None and result.latency_ms > 0
    assert endpoint.requests == ["/v1/models", "/health", "/version"]
    assert result.reported == {"server_version": None, "max_model_len": {},
                               "model_revision": {}}  # none: 404


def test_a_base_url_ending_in_v1_is_probed_at_the_servers_root(endpoint):
    result = probe_pool([f"{endpoint.url}/v1/"], timeout_s=10)
    assert result.ok
    assert endpoint.requests == ["/v1/models", "/health", "/version"]


def test_a_server_without_a_health_route_is_still_healthy(endpoint):
    endpoint.has_health = False
    assert probe_pool([endpoint.url], timeout_s=10).ok


def test_a_failing_or_unreachable_endpoint_fails_with_a_readable_error(endpoint):
    endpoint.status = 503
    result = probe_pool([endpoint.url], timeout_s=10)
    assert not result.ok and "HTTP 503" in result.error
    down = probe_pool(["http://127.0.0.1:9"], timeout_s=10)
    assert not down.ok and "could not connect" in down.error


def test_a_probe_never_reaches_an_address_a_pool_may_not_have(endpoint, settings):
    """Checked on every probe: a pool's name may resolve elsewhere since it was registered."""
    settings.OUTBOUND_ALLOWED_NETWORKS = {"pools": []}
    result = probe_pool([endpoint.url], timeout_s=10)
    assert not result.ok and "loopback" in result.error and "OUTBOUND_ALLOW_POOLS" in result.error
    assert endpoint.requests == []


def test_one_bad_endpoint_makes_the_pool_fail(endpoint):
    result = probe_pool([endpoint.url, "http://127.0.0.1:9"], timeout_s=10)
    assert not result.ok and "127.0.0.1:9" in result.error


@pytest.mark.django_db
@override_settings(HEALTH_FAILURES_TO_UNHEALTHY=3, HEALTH_SUCCESSES_TO_HEALTHY=2)
def test_health_flips_after_k_failures_and_back_after_recovery(make_pool):
    pool = make_pool()

    def record(ok: bool) -> str:
        pool_health_record(pool_id=pool.pk, ok=ok, status_code=200 if ok else 500,
                           latency_ms=5.0, error="" if ok else "HTTP 500")
        return Pool.objects.get(pk=pool.pk).health_state

    assert record(True) == "healthy"  # first answer from an unknown pool settles it
    assert [record(False), record(False)] == ["healthy", "healthy"]
    assert record(False) == "unhealthy"
    assert record(True) == "unhealthy"
    assert record(True) == "healthy"
    flips = list(HealthTransition.objects.order_by("at", "id").values_list("from_state",
                                                                             "to_state"))
    assert flips == [("unknown", "healthy"), ("healthy", "unhealthy"),
                     ("unhealthy", "healthy")]
    audited = AuditEvent.objects.filter(action="pool.health_changed").order_by("at", "id")
    assert [e.after["health_state"] for e in audited] == ["healthy", "unhealthy", "healthy"]
    assert audited[1].actor == "system:health-probe"
    assert "3 consecutive failed probes" in audited[1].message
    assert HealthCheck.objects.filter(pool=pool).count() == 6


def test_old_health_rows_are_pruned(make_pool):
    from datetime import timedelta

    from django.utils import timezone

    pool = make_pool()
    HealthCheck.objects.create(pool=pool, ok=True, checked_at=timezone.now() - timedelta(days=30))
    HealthCheck.objects.create(pool=pool, ok=True)
    assert health_history_prune(older_than_days=14) == 1
    assert HealthCheck.objects.count() == 1


@pytest.mark.slow
def test_a_real_worker_probes_every_pool_and_marks_the_dead_one_unhealthy(
    celery_worker, make_pool, endpoint, settings
):
    alive = make_pool(name="alive", base_urls=[endpoint.url])
    dead = make_pool(name="dead", base_urls=["http://127.0.0.1:9"])
    for round_no in range(1, settings.HEALTH_FAILURES_TO_UNHEALTHY + 1):
        pools_probe_due.delay()

        def probed_both(n: int = round_no) -> bool:
            return (HealthCheck.objects.filter(pool=dead).count() >= n
                    and HealthCheck.objects.filter(pool=alive).count() >= n)

        wait_until(probed_both, timeout_s=60, what="a probe of each pool by the worker")
    alive.refresh_from_db()
    dead.refresh_from_db()
    assert alive.health_state == "healthy" and alive.last_probe_latency_ms
    assert dead.health_state == "unhealthy"
    assert "could not connect" in dead.last_probe_error

    endpoint.status = 500
    for _ in range(settings.HEALTH_FAILURES_TO_UNHEALTHY):
        pool_probe.delay(alive.pk)
    wait_until(lambda: Pool.objects.get(pk=alive.pk).health_state == "unhealthy",
               timeout_s=60, what="the worker to mark the failing pool unhealthy")


@pytest.mark.slow
def test_beat_schedules_probes_on_its_interval(celery_worker, make_pool, endpoint, tmp_path):
    pool = make_pool(base_urls=[endpoint.url])
    from django.db import connection

    env = _worker_env(connection.settings_dict["NAME"]) | {"HEALTH_PROBE_INTERVAL_S": "1"}
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "fleetctl", "beat", "-l", "INFO",
         "-s", str(tmp_path / "beat-schedule")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: HealthCheck.objects.filter(pool=pool).count() >= 3, timeout_s=90,
                   what="three beat-scheduled probes")
    finally:
        beat.terminate()
        beat.wait(timeout=10)
