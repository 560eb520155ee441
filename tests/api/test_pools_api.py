from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool, PoolModel, Region

pytestmark = pytest.mark.django_db

VALID_POOL: dict[str, Any] = {
    "name": "mi300x-us-east", "runtime": "rocm", "accelerator": "MI300X", "region": "us-east",
    "base_urls": ["http://10.0.0.5:8000"], "latency_class": "interactive",
    "max_context_tokens": 131072, "node_hourly_rate": "31.50", "currency": "USD",
    "labels": {"driver": "rocm-6.2"},
}


def test_listing_pools_without_credentials_is_401_in_the_common_error_shape(api):
    response = api.get("/api/v1/pools/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert set(response.json()["error"]) == {"code", "message", "fields"}


def test_a_platform_lead_registers_a_pool_and_the_write_is_audited(client_for, region):
    lead = client_for("platform-lead")
    response = lead.post("/api/v1/pools/", VALID_POOL, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["jurisdiction"] == "US"
    assert body["cost_per_1m_output_tokens"] is None
    assert body["health_state"] == "unknown"
    event = AuditEvent.objects.get(action="pool.create")
    assert event.actor == "platform-lead"
    assert event.after["name"] == "mi300x-us-east"
    assert event.object_id == str(body["id"])


def test_cost_per_1m_cannot_be_typed_in(client_for, region):
    lead = client_for("platform-lead")
    response = lead.post(
        "/api/v1/pools/", {**VALID_POOL, "cost_per_1m_output_tokens": "0.01"}, format="json"
    )
    assert response.status_code == 201
    assert Pool.objects.get().cost_per_1m_output_tokens is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"base_urls": ["ftp://10.0.0.5/"]}, "base_urls"),
        ({"base_urls": ["not a url"]}, "base_urls"),
        ({"base_urls": []}, "base_urls"),
        ({"node_hourly_rate": "-1"}, "node_hourly_rate"),
        ({"node_hourly_rate": "ten"}, "node_hourly_rate"),
        ({"region": "mars-1"}, "region"),
        ({"name": "x" * 64}, "name"),
        ({"name": "Has Spaces"}, "name"),
        ({"runtime": "abacus"}, "runtime"),
        ({"max_context_tokens": "lots"}, "max_context_tokens"),
        ({"labels": {"k": 3}}, "labels"),
        ({"currency": "DOGE"}, "currency"),
    ],
)
def test_bad_pool_input_names_the_field_and_writes_nothing(client_for, region, change, field):
    lead = client_for("platform-lead")
    audit_before = AuditEvent.objects.count()
    response = lead.post("/api/v1/pools/", {**VALID_POOL, **change}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["fields"], error
    assert field in error["message"]
    assert not Pool.objects.exists()
    assert AuditEvent.objects.count() == audit_before


def test_a_duplicate_pool_name_is_refused_with_the_field_named(client_for, make_pool):
    make_pool(name="mi300x-us-east")
    lead = client_for("platform-lead")
    response = lead.post("/api/v1/pools/", VALID_POOL, format="json")
    assert response.status_code == 400
    assert "already exists" in response.json()["error"]["fields"]["name"][0]
    assert Pool.objects.count() == 1


def test_malformed_json_is_a_400_with_a_message(client_for, region):
    lead = client_for("platform-lead")
    response = lead.generic("POST", "/api/v1/pools/", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]


def test_an_update_records_only_what_changed(client_for, make_pool):
    pool = make_pool(name="h200-a")
    lead = client_for("platform-lead")
    response = lead.patch(f"/api/v1/pools/{pool.name}/", {"node_hourly_rate": "12.00"},
                          format="json")
    assert response.status_code == 200, response.json()
    event = AuditEvent.objects.get(action="pool.update")
    assert event.before == {"node_hourly_rate": "10.5000"}
    assert event.after == {"node_hourly_rate": "12.0000"}


def test_deleting_a_region_that_still_has_pools_is_a_409(client_for, make_pool):
    make_pool()
    lead = client_for("platform-lead")
    response = lead.delete("/api/v1/regions/us-east/")
    assert response.status_code == 409
    assert "pool-1" in response.json()["error"]["message"]


def test_an_unknown_jurisdiction_is_refused(client_for):
    lead = client_for("platform-lead")
    response = lead.post("/api/v1/regions/", {"code": "x-1", "name": "X", "jurisdiction": "XX"},
                         format="json")
    assert response.status_code == 400
    assert "jurisdiction" in response.json()["error"]["fields"]


def test_a_served_model_may_not_exceed_the_pool_context(client_for, make_pool):
    pool = make_pool(max_context_tokens=8192)
    lead = client_for("platform-lead")
    response = lead.post("/api/v1/pool-models/", {
        "pool": pool.name, "model_id": "llama-3.1-8b-instruct", "quantisation": "fp8",
        "max_context_tokens": 131072,
    }, format="json")
    assert response.status_code == 400
    assert "max_context_tokens" in response.json()["error"]["fields"]
    assert not PoolModel.objects.exists()


def test_pools_filter_by_runtime_jurisdiction_and_model(client_for, make_pool, system):
    from fleetctl.fleet.services import pool_model_create, region_create

    eu = region_create(actor=system, code="eu-west", name="EU West", jurisdiction="EU")
    make_pool(name="h200-us")
    rocm = make_pool(name="mi300x-eu", runtime="rocm", region=eu)
    pool_model_create(actor=system, pool=rocm, model_id="qwen2.5-7b", max_context_tokens=8192)
    viewer = client_for("viewer")

    def names(query: str) -> list[str]:
        return [p["name"] for p in viewer.get(f"/api/v1/pools/?{query}").json()["results"]]

    assert names("runtime=rocm") == ["mi300x-eu"]
    assert names("jurisdiction=EU") == ["mi300x-eu"]
    assert names("model=qwen2.5-7b") == ["mi300x-eu"]
    assert names("region=us-east") == ["h200-us"]


def _list_queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_list_endpoints_use_a_constant_number_of_queries(client_for, make_pool, system):
    from fleetctl.fleet.services import pool_health_record, pool_model_create

    viewer = client_for("viewer")
    urls = ["/api/v1/pools/", "/api/v1/pool-models/", "/api/v1/health-checks/",
            "/api/v1/regions/", "/api/v1/audit-events/"]

    def grow(n: int) -> None:
        for _ in range(n):
            pool = make_pool()
            pool_model_create(actor=system, pool=pool, model_id="m", max_context_tokens=4096)
            pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=3.0)

    grow(3)
    small = {url: _list_queries(viewer, url) for url in urls}
    grow(30)
    large = {url: _list_queries(viewer, url) for url in urls}
    assert large == small


def test_a_pool_may_not_be_named_like_a_dashboard_path(client_for, region):
    lead = client_for("platform-lead")
    response = lead.post("/api/v1/pools/", {**VALID_POOL, "name": "new"}, format="json")
    assert response.status_code == 400
    assert "reserved" in response.json()["error"]["fields"]["name"][0]


# --- a PATCH that waits behind a rename or a delete of its pool ----------------------------------

def _hold_open(change, holding: threading.Event, release: threading.Event) -> None:
    """Make `change` in a transaction of this thread and keep it open (its row lock held)
    until `release`."""
    try:
        with transaction.atomic():
            change()
            holding.set()
            release.wait(30)
    finally:
        connection.close()


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND wait_event_type = 'Lock'")
        return bool(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("meanwhile", "status", "says"), [
    ("rename", 409, "Pool h200 was renamed to h200-b while this request waited for it; "
                    "nothing was changed."),
    ("delete", 404, "Pool h200 was deleted while this request waited for it; nothing was "
                    "changed."),
])
def test_a_pool_patch_that_waited_behind_a_rename_or_delete_is_refused_not_a_500(
        make_pool, client_for, meanwhile, status, says):
    from fleetctl.fleet import services
    from tests.conftest import SYSTEM
    from tests.support.waiting import wait_until

    pool = make_pool(name="h200")
    admin = client_for("admin")
    admin.raise_request_exception = False
    holding, release = threading.Event(), threading.Event()
    change = ((lambda: services.pool_update(actor=SYSTEM, pool=pool, name="h200-b"))
              if meanwhile == "rename" else
              (lambda: services.pool_delete(actor=SYSTEM, pool=pool)))
    other = threading.Thread(target=_hold_open, args=(change, holding, release))
    other.start()
    assert holding.wait(30)
    answers = []

    def patch() -> None:
        try:  # finds the pool by its old name (the change is not committed yet), then waits
            answers.append(admin.patch("/api/v1/pools/h200/", {"labels": {"team": "a"}},
                                       format="json"))
        finally:
            connection.close()

    patching = threading.Thread(target=patch)
    patching.start()
    wait_until(_waiting_on_a_lock, what="the PATCH to wait for the pool's row lock")
    release.set()
    other.join()
    patching.join()

    answer = answers[0]
    assert answer.status_code == status, answer.content
    assert answer.json()["error"]["message"].startswith(says)
    assert not Pool.objects.filter(labels__team="a").exists()
    refused = AuditEvent.objects.get(action="pool.update", outcome="denied")
    assert refused.message.startswith(says)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("meanwhile", "status", "says"), [
    ("rename", 409, "Region eu-north was renamed to eu-n while this request waited for it; "
                    "nothing was changed."),
    ("delete", 404, "Region eu-north was deleted while this request waited for it; nothing "
                    "was changed."),
])
def test_a_region_patch_that_waited_behind_a_rename_or_delete_is_refused_not_a_500(
        client_for, meanwhile, status, says):
    from fleetctl.fleet import services
    from tests.conftest import SYSTEM
    from tests.support.waiting import wait_until

    region = services.region_create(actor=SYSTEM, code="eu-north", name="EU North",
                                    jurisdiction="EU")
    admin = client_for("admin")
    admin.raise_request_exception = False
    holding, release = threading.Event(), threading.Event()
    change = ((lambda: services.region_update(actor=SYSTEM, region=region, code="eu-n"))
              if meanwhile == "rename" else
              (lambda: services.region_delete(actor=SYSTEM, region=region)))
    other = threading.Thread(target=_hold_open, args=(change, holding, release))
    other.start()
    assert holding.wait(30)
    answers = []

    def patch() -> None:
        try:  # finds the region by its old code, then waits for its row lock
            answers.append(admin.patch("/api/v1/regions/eu-north/", {"name": "North"},
                                       format="json"))
        finally:
            connection.close()

    patching = threading.Thread(target=patch)
    patching.start()
    wait_until(_waiting_on_a_lock, what="the PATCH to wait for the region's row lock")
    release.set()
    other.join()
    patching.join()

    answer = answers[0]
    assert answer.status_code == status, answer.content
    assert answer.json()["error"]["message"].startswith(says)
    assert not Region.objects.filter(name="North").exists()
