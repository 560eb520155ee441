"""The probe's model check (a pool must list every model it is configured to serve) and the
health hooks called after a flip commits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetctl.fleet import hooks
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
    monkeypatch.setattr(hooks, "HEALTH_HOOKS", [])
    hooks.register_health_hook(lambda pool_id, transition_id: calls.append(
        (pool_id, transition_id)))
    pool = make_pool()
    with django_capture_on_commit_callbacks(execute=True):
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    with django_capture_on_commit_callbacks(execute=True):
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    flip = HealthTransition.objects.get(pool=pool)
    assert calls == [(pool.pk, flip.pk)]  # one flip (unknown → healthy), one call


def test_a_pool_reports_its_server_version_and_a_change_nobody_registered_calls_the_hooks(
        endpoint, make_pool, django_capture_on_commit_callbacks, monkeypatch):
    """GET /version (vLLM's) is kept as the pool's `reported` version. No endpoint, or an
    answer that says nothing readable, is "not reported": the last known stays and nothing
    changed. A new version is a change: audited, and the report hooks run after commit."""
    from fleetctl.audit.models import AuditEvent

    calls: list[tuple[int, list[str]]] = []
    monkeypatch.setattr(hooks, "REPORT_HOOKS", [])
    hooks.register_report_hook(lambda pool_id, changes: calls.append((pool_id, changes)))
    pool = make_pool(base_urls=[endpoint.url])

    def probe() -> Pool:
        with django_capture_on_commit_callbacks(execute=True):
            assert pool_probe(pool.pk) is True
        return Pool.objects.get(pk=pool.pk)

    assert probe().reported == {"server_version": None, "max_model_len": {},
                                "model_revision": {}}  # no /version, no revision
    endpoint.version = "0.6.3"
    first = probe()
    assert first.reported["server_version"] == "0.6.3" and first.reported_at is not None
    assert calls == []  # a first report is recorded, not a change
    for silent in (None, b"<html>busy</html>", "x" * 65):
        endpoint.version = silent
        assert probe().reported["server_version"] == "0.6.3"  # not reported ≠ changed
    assert calls == []
    endpoint.version = "0.7.0"
    upgraded = probe()
    assert upgraded.reported["server_version"] == "0.7.0"
    assert calls == [(pool.pk, ["server version 0.6.3 → 0.7.0"])]
    assert AuditEvent.objects.filter(action="pool.reported_change", object_id=str(pool.pk),
                                     message__contains="0.6.3 → 0.7.0").exists()
    probe()
    assert len(calls) == 1  # the same version again is no news


def test_evidence_measured_on_the_old_server_no_longer_counts_after_an_upgrade(
        endpoint, make_pool):
    """The reported version is part of the evidence fingerprint; evidence measured before
    the pool ever reported one is not expired by its first report."""
    from migrations_plan.evidence import fingerprint_change, pool_fingerprint

    pool = make_pool(base_urls=[endpoint.url])
    before_any = pool_fingerprint(pool, [SERVED])
    endpoint.version = "0.6.3"
    pool_probe(pool.pk)
    pool.refresh_from_db()
    on_063 = pool_fingerprint(pool, [SERVED])
    assert fingerprint_change(before_any, on_063) is None
    endpoint.version = "0.7.0"
    pool_probe(pool.pk)
    pool.refresh_from_db()
    assert fingerprint_change(on_063, pool_fingerprint(pool, [SERVED])) == (
        "server version (as the pool reports it) changed from 0.6.3 to 0.7.0")
