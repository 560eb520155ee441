"""Routes and revisions through the REST API: validation before anything is stored,
residency that fails closed, one winner among concurrent changes."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create, region_create
from fleetctl.traffic import policy
from fleetctl.traffic.models import Route, SplitRevision

MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
def pools(make_pool, system) -> dict[str, Pool]:
    eu = region_create(actor=system, code="eu-west", name="EU West", jurisdiction="EU")
    made = {
        "primary": make_pool(name="h200-us"),
        "cand": make_pool(name="mi300x-us", runtime="rocm"),
        "eu": make_pool(name="h200-eu", region=eu),
        "eu2": make_pool(name="mi300x-eu", runtime="rocm", region=eu),
    }
    for pool in made.values():
        pool_model_create(actor=system, pool=pool, model_id=MODEL, max_context_tokens=8192)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    return made


def _create_route(client, **extra):
    body = {"name": "llama", "model_id": MODEL, "primary_pool": "h200-us", **extra}
    return client.post("/api/v1/routes/", body, format="json")


def test_a_route_starts_with_everything_on_its_primary(client_for, pools):
    lead = client_for("platform-lead")
    response = _create_route(lead)
    assert response.status_code == 201, response.json()
    assert response.json()["current"]["weights"] == {"h200-us": 100.0}
    assert response.json()["revision_number"] == 1


def test_a_ramp_creates_a_numbered_revision_with_who_why_and_parent(client_for, pools):
    _create_route(client_for("platform-lead"))
    oncall = client_for("on-call", username="olga")
    response = oncall.post("/api/v1/routes/llama/revisions/", {
        "weights": {"h200-us": 99.9, "mi300x-us": 0.1}, "base_revision": 1,
        "reason": "first 0.1 %"}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["number"], body["parent"], body["created_by"]) == (2, 1, "olga")
    assert body["weights"] == {"h200-us": 99.9, "mi300x-us": 0.1}
    history = oncall.get("/api/v1/routes/llama/revisions/").json()["results"]
    assert [r["number"] for r in history] == [2, 1]
    assert AuditEvent.objects.filter(action="revision.change", actor="olga").exists()


@pytest.mark.parametrize(("weights", "message"), [
    ({"h200-us": 90, "nope": 10}, "Unknown pool(s): nope"),
    ({"h200-us": 90, "mi300x-us": 20}, "add up to 110"),
    ({"h200-us": 0, "mi300x-us": 0}, "All weights are zero"),
    ({"h200-us": -10, "mi300x-us": 110}, "outside 0–100"),
    ({"h200-us": "x"}, "not a number"),
])
def test_bad_splits_are_refused_and_nothing_is_stored(client_for, pools, weights, message):
    _create_route(client_for("platform-lead"))
    oncall = client_for("on-call")
    response = oncall.post("/api/v1/routes/llama/revisions/", {
        "weights": weights, "base_revision": 1, "reason": "x"}, format="json")
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert SplitRevision.objects.count() == 1
    assert Route.objects.get().revision_number == 1


def test_a_pool_that_does_not_serve_the_model_or_is_unhealthy_is_refused(client_for, pools,
                                                                        make_pool):
    _create_route(client_for("platform-lead"))
    make_pool(name="bare")  # serves nothing
    for _ in range(3):
        pool_health_record(pool_id=pools["cand"].pk, ok=False, status_code=500, latency_ms=1.0,
                           error="down")
    oncall = client_for("on-call")
    response = oncall.post("/api/v1/routes/llama/revisions/", {
        "weights": {"h200-us": 80, "mi300x-us": 10, "bare": 10}, "base_revision": 1,
        "reason": "x"}, format="json")
    message = response.json()["error"]["message"]
    assert response.status_code == 400
    assert "bare does not serve model" in message and "mi300x-us is unhealthy" in message
    forced = oncall.post("/api/v1/routes/llama/revisions/", {
        "weights": {"h200-us": 90, "mi300x-us": 10}, "base_revision": 1, "reason": "x",
        "force": True}, format="json")
    assert forced.status_code == 201 and forced.json()["forced"] is True


def test_residency_refusal_names_the_pool_its_jurisdiction_and_the_pin(client_for, pools):
    lead = client_for("platform-lead")
    assert _create_route(lead, name="llama-eu", residency="EU",
                         primary_pool="h200-eu").status_code == 201
    for force in (False, True):
        response = lead.post("/api/v1/routes/llama-eu/revisions/", {
            "weights": {"h200-eu": 50, "h200-us": 50}, "base_revision": 1, "reason": "x",
            "force": force}, format="json")
        assert response.status_code == 400
        assert ("pool h200-us is in jurisdiction US, but route llama-eu is pinned to EU"
                in response.json()["error"]["message"])
    abroad = _create_route(lead, name="llama-eu2", residency="EU", primary_pool="h200-us",
                           model_id=MODEL, latency_class="batch")
    assert abroad.status_code == 400 and "primary h200-us is in US" in abroad.json()[
        "error"]["message"]


def test_a_stale_base_revision_is_a_409_with_the_current_revision(client_for, pools):
    _create_route(client_for("platform-lead"))
    oncall = client_for("on-call")
    body = {"weights": {"h200-us": 95, "mi300x-us": 5}, "base_revision": 1, "reason": "x"}
    assert oncall.post("/api/v1/routes/llama/revisions/", body, format="json").status_code == 201
    stale = oncall.post("/api/v1/routes/llama/revisions/", body, format="json")
    assert stale.status_code == 409
    assert stale.json()["error"]["fields"]["current_revision"] == ["2"]


@pytest.mark.django_db(transaction=True)
def test_of_two_concurrent_changes_exactly_one_wins(client_for, pools):
    _create_route(client_for("platform-lead"))
    results: list[int] = []

    def change(percent: int) -> None:
        client = client_for("on-call", username=f"oncall-{percent}")
        try:
            response = client.post("/api/v1/routes/llama/revisions/", {
                "weights": {"h200-us": 100 - percent, "mi300x-us": percent},
                "base_revision": 1, "reason": "race"}, format="json")
            results.append(response.status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=change, args=(p,)) for p in (5, 10, 15, 20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [201, 409, 409, 409]
    assert Route.objects.get().revision_number == 2
    assert SplitRevision.objects.count() == 2


def test_revisions_cannot_be_edited_or_deleted(client_for, pools):
    from fleetctl.traffic.models import ImmutableError

    _create_route(client_for("platform-lead"))
    revision = SplitRevision.objects.get()
    revision.reason = "rewritten"
    with pytest.raises(ImmutableError):
        revision.save()
    with pytest.raises(ImmutableError):
        revision.delete()


def test_the_live_weight_hook_can_refuse_a_candidate(client_for, pools):
    _create_route(client_for("platform-lead"))

    def candidate_not_live(pool, route):
        return "candidate is in stage 2; live weight needs stage 4" if pool.runtime == "rocm" \
            else None

    policy.register_live_weight_guard(candidate_not_live)
    try:
        response = client_for("on-call").post("/api/v1/routes/llama/revisions/", {
            "weights": {"h200-us": 99, "mi300x-us": 1}, "base_revision": 1, "reason": "x"},
            format="json")
    finally:
        policy.LIVE_WEIGHT_GUARDS.remove(candidate_not_live)
    assert response.status_code == 400
    assert "live weight needs stage 4" in response.json()["error"]["message"]


@pytest.mark.parametrize(("roles", "scopes", "expected"), [
    (("viewer",), None, 403),
    (("on-call",), ["ramp"], 201),
    (("on-call",), ["read", "drain"], 403),
])
def test_ramping_needs_the_ramp_permission(client_for, token_client, pools, roles, scopes,
                                           expected):
    _create_route(client_for("platform-lead"))
    client = token_client(scopes, *roles) if scopes else client_for(*roles)
    response = client.post("/api/v1/routes/llama/revisions/", {
        "weights": {"h200-us": 99, "mi300x-us": 1}, "base_revision": 1, "reason": "x"},
        format="json")
    assert response.status_code == expected
