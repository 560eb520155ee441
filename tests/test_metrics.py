"""`GET /api/v1/metrics`: Prometheus text read from the database at scrape time, behind the
API's authentication, in a number of queries that does not grow with the fleet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, Route
from migrations_plan import services as plans
from migrations_plan.models import Plan

pytestmark = pytest.mark.django_db

URL = "/api/v1/metrics"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# What Prometheus 2.x sends (it asks for OpenMetrics first).
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;"
                     "q=0.5,*/*;q=0.1")
MODEL = "llama-3.1-8b-instruct"
# These gateways are never reached: no worker runs here and push tasks are only queued
# after a commit, which these (transaction-wrapped) tests never make.
NOWHERE = {
    "envoy": {"admin_address": "http://127.0.0.1:1",
              "options": {"config_dir": "/nonexistent/fleetctl-test"}},
    "haproxy": {"admin_address": "/nonexistent/haproxy.sock",
                "options": {"bind": "127.0.0.1:1", "config_path": "/nonexistent/haproxy.cfg",
                            "master_socket": "/nonexistent/master.sock"}},
    "nginx": {"admin_address": "/nonexistent/nginx", "options": {"listen": "127.0.0.1:1"}},
}
VERIFIED_AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def samples(response: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == CONTENT_TYPE
    found = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in found, f"duplicate series {key}"
            found[key] = sample.value
    return found


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def of(found: dict[tuple[str, frozenset[tuple[str, str]]], float],
       name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (sample, labels), value in found.items() if sample == name}


def healthy(*pools: Pool) -> None:
    for pool in pools:
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)


def gateway(system: Actor, name: str, kind: str, routes: list[Route]) -> Gateway:
    return traffic.gateway_create(actor=system, name=name, kind=kind, routes=routes,
                                  **NOWHERE[kind])


def drain_at(drain: Drain, status: str, requested_ago_s: float,
             duration_s: float | None = None) -> None:
    """What the push tasks and the drain watcher would have recorded."""
    requested_at = timezone.now() - timedelta(seconds=requested_ago_s)
    completed_at = requested_at + timedelta(seconds=duration_s) if duration_s else None
    Drain.objects.filter(pk=drain.pk).update(status=status, requested_at=requested_at,
                                             completed_at=completed_at)


@pytest.fixture
def fleet(make_pool, make_user, system) -> dict[str, Any]:
    """Four pools (healthy, healthy, unhealthy, never probed), a 70/30 route, a route drained
    and restored a few times, three gateways in three states, three plans (one closed)."""
    pools = {
        "h200-us": make_pool(name="h200-us"),
        "mi300x-us": make_pool(name="mi300x-us", runtime="rocm"),
        "gaudi-us": make_pool(name="gaudi-us", runtime="gaudi"),
        "tpu-us": make_pool(name="tpu-us", runtime="tpu"),
    }
    for pool in pools.values():
        pool_model_create(actor=system, pool=pool, model_id=MODEL, max_context_tokens=8192)
        pool_model_create(actor=system, pool=pool, model_id="qwen-7b", max_context_tokens=8192)
    healthy(pools["h200-us"], pools["mi300x-us"], pools["gaudi-us"])
    for _ in range(settings.HEALTH_FAILURES_TO_UNHEALTHY):
        pool_health_record(pool_id=pools["gaudi-us"].pk, ok=False, status_code=500,
                           latency_ms=1.0, error="HTTP 500")

    llama = traffic.route_create(actor=system, name="llama", model_id=MODEL,
                                 primary_pool=pools["h200-us"],
                                 weights={"h200-us": 70, "mi300x-us": 30})
    qwen = traffic.route_create(actor=system, name="qwen", model_id="qwen-7b",
                                primary_pool=pools["h200-us"],
                                weights={"h200-us": 60, "mi300x-us": 40})
    drain1 = traffic.drain_request(actor=system, route=qwen, reason="canary errors")
    restore1 = traffic.drain_restore(actor=system, drain=drain1, reason="fixed")
    drain2 = traffic.drain_request(actor=system, route=qwen, reason="again")
    restore2 = traffic.drain_restore(actor=system, drain=drain2, reason="fixed again")
    drain3 = traffic.drain_request(actor=system, route=qwen, reason="for good")
    drain_at(drain1, Drain.Status.COMPLETE, requested_ago_s=3600, duration_s=4)
    drain_at(restore1, Drain.Status.COMPLETE, requested_ago_s=3000, duration_s=0.25)
    drain_at(drain2, Drain.Status.PARTIAL, requested_ago_s=2000)
    drain_at(restore2, Drain.Status.PUSHING, requested_ago_s=1000)
    drain_at(drain3, Drain.Status.COMPLETE, requested_ago_s=100, duration_s=1.5)

    envoy = gateway(system, "envoy-a", "envoy", [llama, qwen])
    haproxy = gateway(system, "haproxy-b", "haproxy", [llama, qwen])
    gateway(system, "nginx-c", "nginx", [])
    now = timezone.now()
    Gateway.objects.filter(pk=envoy.pk).update(
        state=Gateway.State.IN_SYNC, state_changed_at=now - timedelta(seconds=600),
        last_verified_at=VERIFIED_AT)
    Gateway.objects.filter(pk=haproxy.pk).update(
        state=Gateway.State.FAILING, state_changed_at=now - timedelta(seconds=90),
        last_error="connection refused")
    # One push per route each (the routes were set): envoy-a has one still pending,
    # haproxy-b one retrying and one failed for good.
    GatewayPush.objects.filter(gateway=envoy, revision__route=qwen).update(
        status=GatewayPush.Status.VERIFIED)
    GatewayPush.objects.filter(gateway=haproxy, revision__route=llama).update(
        status=GatewayPush.Status.RETRYING)
    GatewayPush.objects.filter(gateway=haproxy, revision__route=qwen).update(
        status=GatewayPush.Status.FAILED)

    lead = Actor(user=make_user("alice", "platform-lead"))
    plan = dict(primary_pool=pools["h200-us"], slo_ttft_p95_ms=800, slo_tpot_p95_ms=60,
                slo_error_rate=0.01)
    gaudi = plans.plan_create(actor=lead, name="gaudi-llama", candidate_pool=pools["gaudi-us"],
                              routes=[llama], **plan)
    Plan.objects.filter(pk=gaudi.pk).update(state=Plan.State.STAGE_3, stage=3)
    tpu = plans.plan_create(actor=lead, name="tpu-llama", candidate_pool=pools["tpu-us"],
                            routes=[llama], **plan)
    plans.abandon(actor=lead, plan=tpu, reason="vendor gone")
    # The paused plan's candidate carries no weight (a plan's candidate may not: mi300x-us,
    # which carries 30 % of llama, could not be one).
    paused = plans.plan_create(actor=lead, name="tpu-qwen", candidate_pool=pools["tpu-us"],
                               routes=[qwen], **plan)
    plans.pause(actor=lead, plan=paused, reason="incident")
    return pools


def test_gateway_states_and_open_pushes(client_for, fleet):
    found = samples(client_for("viewer").get(URL))
    assert of(found, "fleetctl_gateway_in_sync") == {
        frozenset({("gateway", "envoy-a"), ("kind", "envoy")}): 1,
        frozenset({("gateway", "haproxy-b"), ("kind", "haproxy")}): 0,
        frozenset({("gateway", "nginx-c"), ("kind", "nginx")}): 0,
    }
    assert of(found, "fleetctl_gateway_failing") == {
        frozenset({("gateway", "envoy-a"), ("kind", "envoy")}): 0,
        frozenset({("gateway", "haproxy-b"), ("kind", "haproxy")}): 1,
        frozenset({("gateway", "nginx-c"), ("kind", "nginx")}): 0,
    }
    assert of(found, "fleetctl_gateway_pushes_open") == {
        frozenset({("gateway", "envoy-a"), ("kind", "envoy")}): 1,  # pending
        frozenset({("gateway", "haproxy-b"), ("kind", "haproxy")}): 1,  # retrying
        frozenset({("gateway", "nginx-c"), ("kind", "nginx")}): 0,  # none at all
    }
    # Only a gateway that was ever verified has a last-verified time.
    assert of(found, "fleetctl_gateway_last_verified_timestamp_seconds") == {
        frozenset({("gateway", "envoy-a"), ("kind", "envoy")}): VERIFIED_AT.timestamp(),
    }
    assert 600 <= found[key("fleetctl_gateway_state_seconds", gateway="envoy-a",
                            kind="envoy")] < 660
    assert 90 <= found[key("fleetctl_gateway_state_seconds", gateway="haproxy-b",
                           kind="haproxy")] < 150
    # Never pushed: in its first state since it was registered, a moment ago.
    assert 0 <= found[key("fleetctl_gateway_state_seconds", gateway="nginx-c",
                          kind="nginx")] < 60


def test_route_splits_as_fractions_and_revisions(client_for, fleet):
    found = samples(client_for("viewer").get(URL))
    assert of(found, "fleetctl_route_weight_ratio") == {
        frozenset({("route", "llama"), ("pool", "h200-us")}): 0.7,
        frozenset({("route", "llama"), ("pool", "mi300x-us")}): 0.3,
        # Drained three times, restored twice: everything on the primary.
        frozenset({("route", "qwen"), ("pool", "h200-us")}): 1.0,
    }
    assert of(found, "fleetctl_route_revision") == {
        frozenset({("route", "llama")}): 1, frozenset({("route", "qwen")}): 6,
    }


def test_drains_by_action_and_status_open_and_last_duration(client_for, fleet):
    found = samples(client_for("viewer").get(URL))
    drains = of(found, "fleetctl_drains")
    # Every action × status is present, zero when there is none.
    assert len(drains) == len(Drain.Action.values) * len(Drain.Status.values)
    assert {labels: n for labels, n in drains.items() if n} == {
        frozenset({("action", "drain"), ("status", "complete")}): 2,
        frozenset({("action", "drain"), ("status", "partial")}): 1,
        frozenset({("action", "restore"), ("status", "complete")}): 1,
        frozenset({("action", "restore"), ("status", "pushing")}): 1,
    }
    assert found[key("fleetctl_drains", action="drain", status="failed")] == 0
    assert found[key("fleetctl_drains_open")] == 2  # the partial drain, the pushing restore
    # The most recently completed of each action (not the longest, not the first).
    assert of(found, "fleetctl_drain_last_duration_seconds") == {
        frozenset({("action", "drain")}): 1.5, frozenset({("action", "restore")}): 0.25,
    }


def test_pool_health_and_open_plans(client_for, fleet):
    found = samples(client_for("viewer").get(URL))
    assert of(found, "fleetctl_pool_healthy") == {
        frozenset({("pool", "h200-us"), ("runtime", "cuda"), ("region", "us-east")}): 1,
        frozenset({("pool", "mi300x-us"), ("runtime", "rocm"), ("region", "us-east")}): 1,
        frozenset({("pool", "gaudi-us"), ("runtime", "gaudi"), ("region", "us-east")}): 0,
        frozenset({("pool", "tpu-us"), ("runtime", "tpu"), ("region", "us-east")}): 0,
    }
    # Open plans only: a paused one keeps its stage; the abandoned one has no sample.
    assert of(found, "fleetctl_plan_stage") == {
        frozenset({("plan", "gaudi-llama"), ("candidate", "gaudi-us"),
                   ("state", "stage-3")}): 3,
        frozenset({("plan", "tpu-qwen"), ("candidate", "tpu-us"),
                   ("state", "paused")}): 1,
    }



def test_the_gate_status_of_each_plan_at_a_stage_in_the_apis_words(client_for, fleet):
    viewer = client_for("viewer")
    # No sample until the refresh has evaluated the gate.
    assert not of(samples(viewer.get(URL)), "fleetctl_plan_gate_status")
    for plan in Plan.objects.all():
        plans.plan_refresh(plan=plan)
    found = samples(viewer.get(URL))
    # gaudi-llama's stage-3 gate: a check fails or waits for an attestation; the API agrees.
    status = viewer.get("/api/v1/plans/gaudi-llama/").json()["gate"]["status"]
    gate = of(found, "fleetctl_plan_gate_status")
    assert {dict(labels)["status"]: value for labels, value in gate.items()} == {
        s: (1 if s == status else 0)
        for s in ("fail", "awaiting-attestation", "insufficient", "warn", "pass")}
    assert {dict(labels)["plan"] for labels in gate} == {"gaudi-llama"}  # paused: no sample
    assert of(found, "fleetctl_plan_gate_blocks_advance") == {
        frozenset({("plan", "gaudi-llama"), ("stage", "3")}): 1}


def test_every_metric_has_help_and_a_gauge_type(client_for, fleet):
    text = client_for("viewer").get(URL).content.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == {
        "fleetctl_gateway_in_sync", "fleetctl_gateway_failing",
        "fleetctl_gateway_state_seconds", "fleetctl_gateway_last_verified_timestamp_seconds",
        "fleetctl_gateway_pushes_open", "fleetctl_route_weight_ratio",
        "fleetctl_route_revision", "fleetctl_drains", "fleetctl_drains_open",
        "fleetctl_drain_last_duration_seconds", "fleetctl_pool_healthy",
        "fleetctl_plan_stage", "fleetctl_plan_gate_status", "fleetctl_plan_gate_blocks_advance",
    }
    for family in families.values():
        assert family.type == "gauge", family.name
        assert len(family.documentation) > 40, family.name


def test_an_empty_fleet_scrapes_cleanly(client_for):
    found = samples(client_for("viewer").get(URL))
    assert found[key("fleetctl_drains_open")] == 0
    assert not of(found, "fleetctl_gateway_in_sync")
    assert not of(found, "fleetctl_drain_last_duration_seconds")


# --- authentication ----------------------------------------------------------------------

def test_without_credentials_it_is_401(api):
    response = api.get(URL, HTTP_ACCEPT=PROMETHEUS_ACCEPT)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "not_authenticated"


def test_a_bad_token_is_401(api):
    response = api.get(URL, HTTP_AUTHORIZATION="Bearer fct_nope")
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "Unknown API token."


@pytest.mark.parametrize(("scopes", "roles", "service"), [
    (["drain"], ("on-call",), False),  # the person may read; this token may not
    (["drain", "ramp"], (), True),
])
def test_a_token_without_read_is_403_and_audited(token_client, scopes, roles, service):
    client = token_client(scopes, *roles, service=service)
    response = client.get(URL, HTTP_ACCEPT=PROMETHEUS_ACCEPT)
    assert response.status_code == 403
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "permission_denied"
    event = AuditEvent.objects.get(action=f"api.read:{URL}")
    assert event.outcome == AuditEvent.Outcome.DENIED
    assert event.token_prefix == client.token.prefix


def test_a_person_without_a_role_is_403(client_for):
    assert client_for().get(URL).status_code == 403


@pytest.mark.parametrize(("roles", "service"), [(("viewer",), False), ((), True)])
def test_a_read_token_scrapes_with_prometheus_accept_header(token_client, fleet, roles,
                                                            service):
    client = token_client(["read"], *roles, service=service)
    response = client.get(URL, HTTP_ACCEPT=PROMETHEUS_ACCEPT)
    found = samples(response)  # 200, text/plain 0.0.4
    assert found[key("fleetctl_gateway_failing", gateway="haproxy-b", kind="haproxy")] == 1
    assert response.content.decode().startswith("# HELP ")


@pytest.mark.parametrize("accept", ["application/json", "application/openmetrics-text",
                                    "text/html,*/*;q=0.8"])
def test_any_accept_header_gets_the_text_format(client_for, accept):
    response = client_for("viewer").get(URL, HTTP_ACCEPT=accept)
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE


def test_options_keeps_the_api_json(client_for):
    response = client_for("viewer").options(URL)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json()["name"] == "Metrics"


def test_the_openapi_schema_documents_it_as_text(client_for):
    schema = client_for("viewer").get(
        "/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    operation = schema["paths"][URL]["get"]
    assert list(operation["responses"]["200"]["content"]) == ["text/plain"]
    assert "0.0.4" in operation["responses"]["200"]["description"]


# --- cost ----------------------------------------------------------------------------------

def grow(system: Actor, lead: Actor, first: int, last: int) -> None:
    """Per i: two pools, a route split 80/20 between them, a gateway carrying it with a
    pending push, a completed drain, and a plan taking the drained pool back onto it."""
    from fleetctl.fleet.services import region_create

    region = region_create(actor=system, code=f"r-{first}", name="Somewhere",
                           jurisdiction="US")
    for i in range(first, last):
        a = traffic_pool(system, f"a-{i}", region, f"m-{i}")
        b = traffic_pool(system, f"b-{i}", region, f"m-{i}")
        route = traffic.route_create(actor=system, name=f"route-{i}", model_id=f"m-{i}",
                                     primary_pool=a, weights={a.name: 80, b.name: 20})
        gateway(system, f"gw-{i}", ("envoy", "haproxy", "nginx")[i % 3], [route])
        drain = traffic.drain_request(actor=system, route=route, reason="test")
        drain_at(drain, Drain.Status.COMPLETE, requested_ago_s=60, duration_s=0.5)
        plans.plan_create(actor=lead, name=f"plan-{i}", candidate_pool=b, primary_pool=a,
                          routes=[route], slo_ttft_p95_ms=800, slo_tpot_p95_ms=60,
                          slo_error_rate=0.01)
    Gateway.objects.filter(name__startswith="gw-").update(
        state=Gateway.State.IN_SYNC, state_changed_at=timezone.now(),
        last_verified_at=timezone.now())


def traffic_pool(system: Actor, name: str, region: Any, model_id: str) -> Pool:
    from fleetctl.fleet.services import pool_create

    pool = pool_create(actor=system, name=name, runtime="cuda", accelerator="H200",
                       region=region, base_urls=["http://127.0.0.1:2"],
                       max_context_tokens=32768, node_hourly_rate="10.50")
    pool_model_create(actor=system, pool=pool, model_id=model_id, max_context_tokens=8192)
    healthy(pool)
    return pool


def test_the_query_count_does_not_grow_with_the_fleet(client_for, make_user, system,
                                                      django_assert_max_num_queries):
    viewer = client_for("viewer")
    lead = Actor(user=make_user("lead", "platform-lead"))
    grow(system, lead, 0, 2)
    with django_assert_max_num_queries(16) as small:
        found = samples(viewer.get(URL))
    assert len(of(found, "fleetctl_gateway_in_sync")) == 2
    grow(system, lead, 2, 10)
    with django_assert_max_num_queries(16) as large:
        found = samples(viewer.get(URL))
    assert len(of(found, "fleetctl_gateway_in_sync")) == 10
    assert len(of(found, "fleetctl_route_weight_ratio")) == 10  # drained: one pool each
    assert len(of(found, "fleetctl_pool_healthy")) == 20
    assert len(of(found, "fleetctl_plan_stage")) == 10
    assert found[key("fleetctl_drains", action="drain", status="complete")] == 10
    assert len(large) == len(small), [q["sql"] for q in large.captured_queries]
