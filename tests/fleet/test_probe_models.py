"""The probe's model check (a pool must list every model it is configured to serve) and the
health hooks called after a flip commits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetctl.fleet import services
from fleetctl.fleet.models import HealthTransition, Pool
from fleetctl.fleet.probe import probe_pool
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.fleet.tasks import pool_probe
from tests.conftest import SYSTEM
from tests.fleet.fake_endpoint import FakeEndpoint

# The probe asks the registry which addresses are fleetctl's own (core.destinations).
pytestmark = pytest.mark.django_db

SERVED = "llama-3.1-8b-instruct"


@pytest.fixture
def endpoint() -> Iterator[FakeEndpoint]:
    server = FakeEndpoint()
    yield server
    server.close()


def test_a_configured_model_missing_from_v1_models_fails_the_probe(endpoint):
    assert probe_pool([endpoint.url], timeout_s=10, configured=[SERVED]).ok
    result = probe_pool([endpoint.url], timeout_s=10, configured=[SERVED, "qwen2.5-7b-instruct"])
    assert not result.ok
    assert result.error == (f"model qwen2.5-7b-instruct is configured on the pool but "
                            f"{endpoint.url}/v1/models does not list it")
    assert result.models_seen == [SERVED]


def test_the_probe_task_checks_the_pools_configured_models(endpoint, make_pool, settings):
    settings.HEALTH_FAILURES_TO_UNHEALTHY = 2
    pool = make_pool(base_urls=[endpoint.url])
    pool_model_create(actor=SYSTEM, pool=pool, model_id=SERVED, max_context_tokens=4096)
    assert pool_probe(pool.pk) is True
    pool_model_create(actor=SYSTEM, pool=pool, model_id="qwen2.5-7b-instruct",
                      max_context_tokens=4096)
    assert pool_probe(pool.pk) is False
    assert pool_probe(pool.pk) is False
    pool.refresh_from_db()
    assert pool.health_state == Pool.Health.UNHEALTHY
    assert "model qwen2.5-7b-instruct is configured on the pool" in pool.last_probe_error


def test_health_hooks_run_after_the_flip_commits(make_pool, django_capture_on_commit_callbacks,
                                                 monkeypatch):
    calls: list[tuple[int, int]] = []
    # Only this test's hook: the traffic policy's would queue a task.
    monkeypatch.setattr(services, "HEALTH_HOOKS", [])
    services.register_health_hook(lambda pool_id, transition_id: calls.append(
        (pool_id, transition_id)))
    pool = make_pool()
    with django_capture_on_commit_callbacks(execute=True):
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    with django_capture_on_commit_callbacks(execute=True):
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    flip = HealthTransition.objects.get(pool=pool)
    assert calls == [(pool.pk, flip.pk)]  # one flip (unknown → healthy), one call
