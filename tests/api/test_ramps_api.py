"""/api/v1/ramps/: start a guarded ramp, read it with its timeline, pause, resume, skip and
abort it — each with a reason, each under its token scope, refusals in the one error shape."""

from __future__ import annotations

import pytest

from fleetctl.core.models import IdempotentRequest
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.ramps.models import Ramp, RampEvent
from fleetctl.ramps.services import ramps_tick
from fleetctl.traffic import services
from fleetctl.traffic.models import Drain, Route
from tests.conftest import SYSTEM

pytestmark = pytest.mark.django_db
MODEL = "llama-3.1-8b-instruct"
SLO = {"slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 60, "slo_error_rate": 0.01}
STEPS = [{"percent": 5, "hold_s": 60}, {"percent": 25, "hold_s": 120}]


@pytest.fixture
def route(make_pool) -> Route:
    pools = [make_pool(name="h200"), make_pool(name="mi300x", runtime="rocm"),
             make_pool(name="a100")]
    for pool in pools:
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    return services.route_create(actor=SYSTEM, name="llama", model_id=MODEL,
                                 primary_pool=pools[0])


@pytest.fixture
def oncall(token_client):
    return token_client(["read", "ramp", "drain"], "on-call")


def _start(client, **extra):
    body = {"route": "llama", "pool": "mi300x", "steps": STEPS, "reason": "canary", **SLO,
            **extra}
    return client.post("/api/v1/ramps/", body, format="json")


def test_a_ramp_is_started_listed_and_read_with_its_timeline(route, oncall):
    created = _start(oncall, min_samples=20)
    assert created.status_code == 201, created.json()
    ramp = created.json()
    assert (ramp["route"], ramp["pool"], ramp["plan"], ramp["state"]) == (
        "llama", "mi300x", None, "running")
    assert ramp["steps"] == STEPS and ramp["min_samples"] == 20 and ramp["step_index"] == -1
    assert ramp["current_percent"] is None and ramp["numbers"] is None
    assert [e["kind"] for e in ramp["events"]] == ["start"]
    assert "canary" in ramp["events"][0]["message"]

    listed = oncall.get("/api/v1/ramps/").json()["results"]
    assert [r["id"] for r in listed] == [ramp["id"]] and "events" not in listed[0]
    for query, ids in (("route=llama", [ramp["id"]]), ("route=other", []),
                       ("pool=mi300x", [ramp["id"]]), ("state=running", [ramp["id"]]),
                       ("state=paused", []), ("plan=nope", [])):
        found = oncall.get(f"/api/v1/ramps/?{query}").json()["results"]
        assert [r["id"] for r in found] == ids, query
    assert oncall.get("/api/v1/ramps/?state=sideways").status_code == 400

    ramps_tick(only=ramp["id"])  # the controller's first tick sets step 1
    detail = oncall.get(f"/api/v1/ramps/{ramp['id']}/").json()
    assert detail["step_index"] == 0 and detail["current_percent"] == 5
    assert [e["kind"] for e in detail["events"]] == ["start", "step"]
    assert [(s["step"], s["percent"], s["outcome"]) for s in detail["spans"]] == [
        (0, 5, "holding")]
    # The guard's view right now: no telemetry here, so it waits and says why.
    assert detail["numbers"]["decision"] == "wait" and detail["numbers"]["reasons"]
    assert oncall.get("/api/v1/ramps/999999/").status_code == 404


def test_pause_resume_skip_and_abort_each_with_a_reason(route, oncall):
    ramp_id = _start(oncall).json()["id"]
    ramps_tick(only=ramp_id)
    base = f"/api/v1/ramps/{ramp_id}"
    no_reason = oncall.post(f"{base}/pause/", {}, format="json")
    assert no_reason.status_code == 400 and "reason" in no_reason.json()["error"]["fields"]

    paused = oncall.post(f"{base}/pause/", {"reason": "look at the p95"}, format="json")
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    again = oncall.post(f"{base}/pause/", {"reason": "twice"}, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert oncall.post(f"{base}/skip/", {"reason": "x"}, format="json").status_code == 409

    resumed = oncall.post(f"{base}/resume/", {"reason": "fine"}, format="json")
    assert resumed.status_code == 200 and resumed.json()["state"] == "running"
    skipped = oncall.post(f"{base}/skip/", {"reason": "enough seen"}, format="json")
    assert skipped.status_code == 200
    aborted = oncall.post(f"{base}/abort/", {"reason": "stop"}, format="json")
    assert aborted.status_code == 200, aborted.json()
    body = aborted.json()
    assert body["state"] == "aborted" and body["drain"] is not None
    assert Drain.objects.get(pk=body["drain"]).pool.name == "mi300x"
    kinds = [e["kind"] for e in body["events"]]
    assert kinds[:2] == ["start", "step"] and {"pause", "resume", "skip", "abort"} <= set(kinds)
    messages = " ".join(e["message"] for e in body["events"])
    assert all(r in messages for r in ("look at the p95", "fine", "enough seen", "stop"))
    assert oncall.post(f"{base}/abort/", {"reason": "again"}, format="json").status_code == 409


@pytest.mark.parametrize(("scopes", "roles", "create", "abort"), [
    (["read", "ramp"], ("on-call",), 201, 403),
    (["read", "drain"], ("on-call",), 403, 200),
    (["read"], ("platform-lead",), 403, 403),
])
def test_scopes_ramp_to_start_and_steer_drain_to_abort(route, token_client, oncall, scopes,
                                                        roles, create, abort):
    client = token_client(scopes, *roles)
    assert _start(client).status_code == create
    ramp = Ramp.objects.first() or Ramp.objects.get(pk=_start(oncall).json()["id"])
    assert client.post(f"/api/v1/ramps/{ramp.pk}/abort/", {"reason": "x"},
                       format="json").status_code == abort
    paused = client.post(f"/api/v1/ramps/{ramp.pk}/pause/", {"reason": "x"}, format="json")
    assert paused.status_code in ((200, 409) if "ramp" in scopes else (403,))


@pytest.mark.parametrize(("body", "field"), [
    ({"steps": [{"percent": 10, "hold_s": 60}, {"percent": 5, "hold_s": 60}]}, "steps"),
    ({"steps": [{"percent": 5, "hold_s": 1}]}, "steps"),
    ({"steps": []}, "steps"),
    ({"pool": "h200"}, "pool"),
    ({"pool": "nope"}, "pool"),
    ({"route": "nope"}, "route"),
    ({"slo_error_rate": 2}, "slo_error_rate"),
    ({"slo_ttft_p95_ms": None}, "slo_ttft_p95_ms"),
])
def test_bad_ramps_are_a_400_naming_the_field_and_nothing_is_stored(route, oncall, body,
                                                                      field):
    response = _start(oncall, **body)
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert field in error["fields"] or field in error["message"], error
    assert not Ramp.objects.exists() and not RampEvent.objects.exists()


def test_a_second_active_ramp_on_the_route_is_a_409_naming_the_first(route, oncall):
    first = _start(oncall).json()["id"]
    second = _start(oncall, pool="a100")
    assert second.status_code == 409
    assert f"ramp {first}" in second.json()["error"]["message"]
    assert Ramp.objects.count() == 1


def test_starting_a_ramp_twice_with_one_key_starts_one(route, oncall):
    body = {"route": "llama", "pool": "mi300x", "steps": STEPS, **SLO}
    first = oncall.post("/api/v1/ramps/", body, format="json", HTTP_IDEMPOTENCY_KEY="r-1")
    again = oncall.post("/api/v1/ramps/", body, format="json", HTTP_IDEMPOTENCY_KEY="r-1")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true" and again.json()["id"] == first.json()["id"]
    assert Ramp.objects.count() == 1 and IdempotentRequest.objects.count() == 1
