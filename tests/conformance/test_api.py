"""Conformance runs over REST: started by name (202, queued), bad input refused as a 400 or
409 that says what to do and stores nothing, reads with `read`, writes with `jobs`; the run
detail carries every case row. No worker here: runs stay queued (the commit never comes)."""

from __future__ import annotations

import pytest

from fleetctl.conformance.models import ConformanceCase, ConformanceRun
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from migrations_plan.models import Evidence
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db
RUNS = "/api/v1/conformance-runs/"


def fields(answer) -> dict:
    return answer.json()["error"]["fields"]


def test_a_run_is_started_from_a_plan_with_its_primary_and_model(world: World, client_for):  # noqa: F811
    plan = world.plan()
    oncall = client_for("on-call")
    answer = oncall.post(RUNS, {"pool": "mi300x-us", "plan": plan.name}, format="json")
    assert answer.status_code == 202, answer.json()
    body = answer.json()
    assert (body["pool"], body["primary"], body["plan"], body["model"]) == (
        "mi300x-us", "h200-us", plan.name, MODEL)
    assert body["status"] == "queued" and body["cases"] == []
    assert body["url"] == f"/conformance/runs/{body['id']}/"
    assert body["include_saturation"] is False
    # A second one while it is queued: 409, nothing stored.
    again = oncall.post(RUNS, {"pool": "mi300x-us", "plan": plan.name}, format="json")
    assert again.status_code == 409
    assert f"Conformance run {body['id']} of mi300x-us is still queued" in \
        again.json()["error"]["message"]
    assert ConformanceRun.objects.count() == 1


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"pool": "nope"}, "pool", "No pool named nope"),
    ({"pool": "mi300x-us", "plan": "nope"}, "plan", "No plan named nope"),
    ({"pool": "h200-us", "plan": "mi300x-llama"}, "pool",
     "Plan mi300x-llama migrates to mi300x-us, not h200-us"),
    ({"pool": "mi300x-us", "plan": "mi300x-llama", "primary": "other"}, "primary",
     "Plan mi300x-llama's primary is h200-us"),
    ({"pool": "mi300x-us", "primary": "mi300x-us"}, "primary", "another pool"),
    ({"pool": "mi300x-us", "model": "qwen-72b"}, "pool", "mi300x-us does not serve qwen-72b"),
    ({"pool": "mi300x-us", "primary": "other"}, "primary", "other does not serve"),
    ({"pool": "mi300x-us", "required": ["tools.nope"]}, "required", "No case tools.nope"),
    ({"pool": "mi300x-us", "required": ["errors.rate_limit"]}, "required",
     "runs only with include_saturation"),
    ({"pool": "mi300x-us", "include_saturation": "yes"}, "include_saturation",
     "true or false"),
    ({"pool": "mi300x-us", "model": 7}, "model", "Must be text"),
    ({"pool": "bare"}, "pool", "bare has no endpoints"),
    ({"pool": "modelless"}, "model", "modelless serves no model yet"),
])
def test_bad_requests_are_400s_that_say_what_to_do_and_store_nothing(
        world: World, client_for, make_pool, body, field, says):  # noqa: F811
    world.plan()
    make_pool(name="other")
    make_pool(name="modelless")
    bare = make_pool(name="bare")
    pool_model_create(actor=world.actor("admin"), pool=bare, model_id=MODEL,
                      max_context_tokens=4096)
    Pool.objects.filter(pk=bare.pk).update(base_urls=[])  # written before the rule existed
    answer = client_for("on-call").post(RUNS, body, format="json")
    assert answer.status_code == 400, answer.json()
    assert any(says in message for message in fields(answer)[field]), fields(answer)
    assert not ConformanceRun.objects.exists()


def test_reading_needs_read_and_starting_needs_jobs(world: World, client_for, token_client):  # noqa: F811
    viewer = client_for("viewer")
    refused = viewer.post(RUNS, {"pool": "mi300x-us"}, format="json")
    assert refused.status_code == 403
    assert not ConformanceRun.objects.exists()
    assert viewer.get(RUNS).status_code == 200
    assert client_for(username="nobody").get(RUNS).status_code == 403
    jobs = token_client(["jobs"], "on-call")
    assert jobs.post(RUNS, {"pool": "mi300x-us"}, format="json").status_code == 202
    assert jobs.get(RUNS).status_code == 403  # a token without `read` reads nothing


def test_list_filter_detail_and_cancel(world: World, client_for):  # noqa: F811
    oncall = client_for("on-call")
    run_id = oncall.post(RUNS, {"pool": "mi300x-us"}, format="json").json()["id"]
    run = ConformanceRun.objects.get(pk=run_id)
    ConformanceCase.objects.create(run=run, pool=world.candidate, role="pool",
                                   endpoint="http://127.0.0.1:9002", key="chat.basic",
                                   title="Chat", required=True, status="fail",
                                   expected="a chat.completion", got="HTTP 500",
                                   latency_ms=12.3)
    listed = oncall.get(RUNS, {"pool": "mi300x-us", "status": "queued"}).json()
    assert [r["id"] for r in listed["results"]] == [run_id]
    assert oncall.get(RUNS, {"pool": "h200-us"}).json()["results"] == []
    assert oncall.get(RUNS, {"status": "sideways"}).status_code == 400
    detail = oncall.get(f"{RUNS}{run_id}/").json()
    assert detail["cases"][0]["key"] == "chat.basic"
    assert detail["cases"][0]["got"] == "HTTP 500" and detail["cases"][0]["required"] is True
    assert oncall.get(f"{RUNS}999999/").status_code == 404
    assert oncall.get(f"{RUNS}abc/").status_code == 404
    suite = oncall.get(f"{RUNS}suite/").json()
    keys = [case["key"] for case in suite]
    assert "tools.required" in keys and "parity.prompt_tokens" in keys
    assert next(c for c in suite if c["key"] == "errors.rate_limit")["opt_in"] is True
    assert client_for("viewer").post(f"{RUNS}{run_id}/cancel/").status_code == 403
    cancelled = oncall.post(f"{RUNS}{run_id}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert oncall.post(f"{RUNS}{run_id}/cancel/").status_code == 409
    assert not Evidence.objects.filter(kind="conformance").exists()


def test_the_conformance_kind_names_its_producer(client_for):
    kinds = client_for("viewer").get("/api/v1/evidence-kinds/").json()
    rows = kinds["results"] if isinstance(kinds, dict) else kinds
    conformance = next(k for k in rows if k["name"] == "conformance")
    assert "conformance probe" in conformance["produced_by"]
