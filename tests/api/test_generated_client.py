"""A client generated from /api/schema/ (openapi-python-client, no hand-written HTTP) parses
every answer of the API into its models without losing, changing or not knowing a field, and
drives a ramp, a drain and a restore through real Envoy gateways."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import pytest
from django.test import Client as DjangoClient

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import GatewayPush
from fleetctl.wsgi import application
from tests.api import generated_client as gen
from tests.api.test_schemathesis import (  # noqa: F401 - fixtures
    _real_path_parameters,
    in_test_transaction,
    rows,
)
from tests.support.waiting import wait_until
from tests.traffic.test_drain_e2e import envoys, sims  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
MODEL = "llama-3.1-8b-instruct"
SCHEMA_ACCEPT = {"Accept": "application/vnd.oai.openapi+json"}
# Answers that are not JSON: files and the Prometheus text.
NOT_JSON = {"/api/v1/metrics", "/api/v1/bench/traces/{name}/download/",
            "/api/v1/bench/runs/{id}/export/", "/api/v1/audit-events/export/",
            "/api/v1/eval-suites/{id}/download/", "/api/v1/batch/jobs/{id}/output/",
            "/api/v1/batch/jobs/{id}/errors/", "/api/v1/plans/{name}/report/",
            "/api/v1/pools/{name}/alert-rules/", "/api/v1/plans/{name}/alert-rules/"}


def _in_process(token: str) -> tuple[dict[str, Any], Any]:
    """The live schema, and a generated AuthenticatedClient that talks to the app in-process
    (httpx's WSGI transport, so through the test's transaction)."""
    transport = httpx.WSGITransport(app=application)
    with httpx.Client(transport=transport, base_url="http://testserver") as http:
        schema = http.get("/api/schema/", headers=SCHEMA_ACCEPT).raise_for_status().json()
    client = gen.generate(schema)
    return schema, client.AuthenticatedClient(
        base_url="http://testserver", token=token, raise_on_unexpected_status=True,
        httpx_args={"transport": transport})


def _signed_in(schema: dict[str, Any], user: Any) -> Any:
    """A generated Client with a dashboard session (the schema's cookieAuth): what an admin
    reads that no token may (people, service tokens)."""
    browser = DjangoClient()
    browser.force_login(user)
    return gen.generate(schema).Client(
        base_url="http://testserver", raise_on_unexpected_status=True,
        cookies={"sessionid": browser.cookies["sessionid"].value},
        httpx_args={"transport": httpx.WSGITransport(app=application)})


def _check(response: Any, status: int, where: str) -> Any:
    assert response.status_code == status, (where, response.status_code, response.content)
    assert response.parsed is not None, f"{where}: the generated client parsed nothing"
    problems = gen.roundtrip(response.parsed, httpx.Response(200, content=response.content)
                             .json(), where)
    assert not problems, "\n".join(problems)
    return response.parsed


def test_the_generated_client_parses_every_read_with_real_rows(rows, in_test_transaction):  # noqa: F811
    schema, api = _in_process(rows["authorization"].removeprefix("Bearer "))
    client = gen.generate(schema)
    assert not gen.warnings(client), gen.warnings(client)
    admin = _signed_in(schema, rows["admin"])
    failures: list[str] = []
    read = empty = 0
    for path, operations in schema["paths"].items():
        get = operations.get("get")
        if get is None or path in NOT_JSON:
            continue
        module = gen.operation(client, get["operationId"])
        params = _real_path_parameters(path, rows)
        try:
            response = module.sync_detailed(client=api, **params)
            if response.status_code == 403:  # for a signed-in admin only
                response = module.sync_detailed(client=admin, **params)
            parsed = _check(response, 200, f"GET {path}")
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            failures.append(f"GET {path} {params}: {type(exc).__name__}: {exc}")
            continue
        read += 1
        results = getattr(parsed, "results", None)
        if isinstance(results, list) and not results:
            empty += 1
    assert not failures, "\n\n".join(failures)
    assert read > 40  # every list and detail, not a schema that lost its paths
    assert empty < read // 3, f"{empty} of {read} reads were empty lists: rows are missing"


def test_the_generated_client_parses_the_answers_to_writes(rows, in_test_transaction):  # noqa: F811
    schema, api = _in_process(rows["authorization"].removeprefix("Bearer "))
    client = gen.generate(schema)
    models = client.models

    def call(operation_id: str, status: int, body: tuple[str, dict[str, Any]] | None = None,
             **params: Any) -> Any:
        kwargs = dict(params)
        if body is not None:
            kwargs["body"] = getattr(models, body[0]).from_dict(body[1])
        response = gen.operation(client, operation_id).sync_detailed(client=api, **kwargs)
        return _check(response, status, operation_id) if status != 204 else response

    region = call("v1_regions_create", 201, ("RegionRequest", {
        "code": "eu-west", "name": "EU West", "jurisdiction": "EU"}))
    assert region.code == "eu-west" and region.pool_count == 0
    pool = call("v1_pools_create", 201, ("PoolRequest", {
        "name": "l40s-eu", "runtime": "cuda", "accelerator": "L40S", "region": "eu-west",
        "base_urls": ["http://127.0.0.1:9"], "max_context_tokens": 8192,
        "node_hourly_rate": "4.20"}))
    call("v1_pools_partial_update", 200, ("PatchedPoolRequest", {"node_hourly_rate": "4.50"}),
         name=pool.name)
    call("v1_pool_models_create", 201, ("PoolModelRequest", {
        "pool": "l40s-eu", "model_id": MODEL, "max_context_tokens": 8192}))
    route = call("v1_routes_create", 201, ("RouteCreateRequest", {
        "name": "llama-b", "model_id": MODEL, "latency_class": "standard",
        "primary_pool": rows["pool"]}))
    assert route.current.weights.additional_properties == {rows["pool"]: 100}
    # The split in force: no new revision, the current one answered 200 as unchanged.
    same = call("v1_routes_revisions_create", 200, ("RevisionCreateRequest", {
        "weights": {rows["pool"]: 100}, "base_revision": route.revision_number,
        "reason": "same split"}), name="llama-b")
    assert same.unchanged is True and same.number == route.revision_number
    revision = call("v1_routes_revisions_create", 201, ("RevisionCreateRequest", {
        "weights": {rows["pool"]: 90, rows["spare"]: 10}, "base_revision": route.revision_number,
        "reason": "canary"}), name="llama-b")
    assert revision.unchanged is False
    history = call("v1_routes_revisions_list", 200, name="llama-b")
    assert [r.number for r in history.results] == [revision.number, route.revision_number]
    gateway = call("v1_gateways_create", 201, ("GatewayRequest", {
        "name": "envoy-b", "kind": "envoy", "admin_address": "http://127.0.0.1:1",
        "options": {"config_dir": "/nonexistent/envoy-b"}, "routes": ["llama-b"]}))
    call("v1_gateways_partial_update", 200, ("PatchedGatewayRequest", {"routes": []}),
         name=gateway.name)
    call("v1_gateways_destroy", 204, name=gateway.name)
    trace = call("v1_bench_traces_generate_create", 201, ("TraceGenerateRequest", {
        "name": "tiny", "n": 5, "seed": 1, "prompt_tokens": {"kind": "uniform", "lo": 8,
                                                             "hi": 16}}))
    assert trace.requests == 5
    # An error answer parses too, into the one error model.
    stale = gen.operation(client, "v1_routes_revisions_create").sync_detailed(
        client=api, name="llama-b", body=models.RevisionCreateRequest.from_dict({
            "weights": {rows["pool"]: 100}, "base_revision": route.revision_number,
            "reason": "stale"}))
    assert stale.status_code == 409
    assert stale.parsed.error.code == "conflict" and stale.parsed.error.fields
    assert stale.parsed.current_revision == revision.number


# --- a ramp, a drain and a restore over HTTP, through real Envoy gateways ------------------------

@pytest.fixture
def envoy_fleet(celery_worker, sims, envoys, make_pool, make_user, system,  # noqa: F811
                live_server) -> Iterator[dict[str, Any]]:
    primary = make_pool(name="us-primary", base_urls=[sims.url("us-primary")])
    candidate = make_pool(name="us-cand", runtime="rocm", base_urls=[sims.url("us-cand")])
    for pool in (primary, candidate):
        pool_model_create(actor=system, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = traffic.route_create(actor=system, name="llama", model_id=MODEL,
                                 primary_pool=primary, reason="test")
    for i, envoy in enumerate(envoys):
        traffic.gateway_create(actor=system, name=f"envoy-{i}", kind="envoy",
                               admin_address=envoy.admin_url,
                               options={"config_dir": str(envoy.workdir)}, routes=[route])
    wait_until(lambda: not GatewayPush.objects.filter(status__in=["pending", "retrying"])
               .exists(), timeout_s=60, what="the first pushes to verify")
    oncall = make_user("olga", "on-call")
    issued = token_create_personal(actor=Actor(user=oncall), name="ramp-bot",
                                   scopes=["read", "ramp", "drain"])
    with httpx.Client(base_url=live_server.url) as http:
        schema = http.get("/api/schema/", headers=SCHEMA_ACCEPT).raise_for_status().json()
    client = gen.generate(schema)
    api = client.AuthenticatedClient(base_url=live_server.url, token=issued.secret,
                                     raise_on_unexpected_status=True, timeout=httpx.Timeout(30))
    yield {"client": client, "api": api}


def _weights(client: ModuleType, api: Any) -> dict[str, float]:
    route = _check(gen.operation(client, "v1_routes_retrieve").sync_detailed(
        client=api, name="llama"), 200, "GET route")
    return dict(route.current.weights.additional_properties)


def _pushes_verified(client: ModuleType, api: Any, revision: int) -> bool:
    pushes = _check(gen.operation(client, "v1_pushes_list").sync_detailed(
        client=api, revision_route_name="llama", page_size=100), 200, "GET pushes")
    mine = [p for p in pushes.results if p.revision == revision]
    return len(mine) == 2 and all(p.status == "verified" for p in mine)


def _finished(client: ModuleType, api: Any, drain_id: int) -> Any:
    drain = _check(gen.operation(client, "v1_drains_retrieve").sync_detailed(
        client=api, id=drain_id), 200, "GET drain")
    return drain if drain.status in ("complete", "failed") else None


def test_a_generated_client_drives_a_ramp_a_drain_and_a_restore_through_envoy(envoy_fleet):
    client, api = envoy_fleet["client"], envoy_fleet["api"]
    models = client.models
    assert _weights(client, api) == {"us-primary": 100}

    route = _check(gen.operation(client, "v1_routes_retrieve").sync_detailed(
        client=api, name="llama"), 200, "GET route")
    ramp = _check(gen.operation(client, "v1_routes_revisions_create").sync_detailed(
        client=api, name="llama", body=models.RevisionCreateRequest.from_dict({
            "weights": {"us-primary": 90, "us-cand": 10},
            "base_revision": route.revision_number, "reason": "canary at 10 %"})),
        201, "POST revision")
    wait_until(lambda: _pushes_verified(client, api, ramp.number), timeout_s=60,
               what="both Envoys to verify the ramp")
    assert _weights(client, api) == {"us-primary": 90, "us-cand": 10}

    drain = _check(gen.operation(client, "v1_drains_create").sync_detailed(
        client=api, body=models.DrainCreateRequest.from_dict({
            "pool": "us-cand", "reason": "p95 regression on the candidate"})),
        202, "POST drain")
    assert drain.action == "drain" and drain.drained_pools == ["us-cand"]
    assert [(r.route, r.revision) for r in drain.route_revisions] == [("llama", ramp.number + 1)]
    assert drain.revisions == [f"llama r{ramp.number + 1}"]
    assert {g.gateway for g in drain.gateways} == {"envoy-0", "envoy-1"}
    done = wait_until(lambda: _finished(client, api, drain.id), timeout_s=90,
                      what="the drain to finish")
    assert done.status == "complete", done.failure_reason
    assert all(g.status == "verified" for g in done.gateways)
    assert _weights(client, api) == {"us-primary": 100}

    restore = _check(gen.operation(client, "v1_drains_restore_create").sync_detailed(
        client=api, id=drain.id, body=models.RestoreRequest.from_dict({
            "reason": "candidate fixed"})), 202, "POST restore")
    assert restore.action == "restore" and restore.restores == drain.id
    done = wait_until(lambda: _finished(client, api, restore.id), timeout_s=90,
                      what="the restore to finish")
    assert done.status == "complete", done.failure_reason
    assert _weights(client, api) == {"us-primary": 90, "us-cand": 10}
    listed = _check(gen.operation(client, "v1_drains_list").sync_detailed(client=api), 200,
                    "GET drains")
    assert {d.id for d in listed.results} == {drain.id, restore.id}
