"""The contract of the POSTs that change traffic: Idempotency-Key (a retry gets the first
answer, never a second change), an identical split is no change, a stale base revision's
409 says what the route holds now, and ?wait=verified answers once the gateways hold it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from fleetctl.core.models import IdempotentRequest
from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import services
from fleetctl.traffic.models import Drain, GatewayPush, Route, SplitRevision
from tests.conftest import SYSTEM

MODEL = "llama-3.1-8b-instruct"
URL = "/api/v1/routes/llama/revisions/"


def _pools(make_pool, **urls: str) -> list[Pool]:
    made = [make_pool(name=name, **({"base_urls": [url]} if url else {}))
            for name, url in (("primary", urls.get("primary", "")),
                              ("cand", urls.get("cand", "")))]
    for pool in made:
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    return made


@pytest.fixture
def route(db, make_pool) -> Route:
    """`llama`: 80 % on `primary`, 20 % on `cand`, revision 1, no gateway."""
    primary, _ = _pools(make_pool)
    return services.route_create(actor=SYSTEM, name="llama", model_id=MODEL,
                                 primary_pool=primary, weights={"primary": 80, "cand": 20})


@pytest.fixture
def file_gateway(route, tmp_path: Path, settings):
    settings.FLEETCTL_GATEWAY_KINDS = ["tests.traffic.fake_kind"]
    return services.gateway_create(actor=SYSTEM, name="gw-1", kind="file",
                                   admin_address=str(tmp_path),
                                   options={"file_name": "weights.json"}, routes=[route])


def _change(percent: int, base: int = 1, reason: str = "step") -> dict:
    return {"weights": {"primary": 100 - percent, "cand": percent}, "base_revision": base,
            "reason": reason}


# --- Idempotency-Key -----------------------------------------------------------------------------

def test_a_retry_with_the_same_key_gets_the_first_answer_and_changes_nothing(route, client_for):
    oncall = client_for("on-call")
    first = oncall.post(URL, _change(30), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    again = oncall.post(URL, _change(30), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert SplitRevision.objects.filter(route=route).count() == 2
    # Without the key the same body is a new request: its base is stale now.
    assert oncall.post(URL, _change(30), format="json").status_code == 409
    stored = IdempotentRequest.objects.get()
    assert (stored.state, stored.status_code, stored.method) == ("done", 201, "POST")
    assert stored.principal == f"user:{oncall.user.pk}"


def test_the_same_key_with_another_body_is_a_422_and_changes_nothing(route, client_for):
    oncall = client_for("on-call")
    assert oncall.post(URL, _change(30), format="json",
                       HTTP_IDEMPOTENCY_KEY="k-1").status_code == 201
    other = oncall.post(URL, _change(40, base=2), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert "Use a new key for a new request" in other.json()["error"]["message"]
    elsewhere = oncall.post("/api/v1/drains/", {"route": "llama", "reason": "x"},
                            format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert elsewhere.status_code == 422
    assert Route.objects.get().revision_number == 2 and not Drain.objects.exists()


def test_a_refusal_is_kept_and_a_retry_gets_the_same_refusal(route, client_for):
    oncall = client_for("on-call")
    bad = {"weights": {"primary": 90, "cand": 20}, "base_revision": 1, "reason": "x"}
    refused = oncall.post(URL, bad, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert refused.status_code == 400
    again = oncall.post(URL, bad, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert again.status_code == 400 and again["Idempotent-Replayed"] == "true"
    assert again.json() == refused.json()
    assert IdempotentRequest.objects.get().status_code == 400


def test_a_refusal_replayed_with_its_key_is_audited_again_as_a_replay(route, client_for):
    from fleetctl.audit.models import AuditEvent

    viewer = client_for("viewer")
    body = {"route": "llama", "reason": "incident"}

    first = viewer.post("/api/v1/drains/", body, format="json", HTTP_IDEMPOTENCY_KEY="d-9")
    again = viewer.post("/api/v1/drains/", body, format="json", HTTP_IDEMPOTENCY_KEY="d-9")
    resent = viewer.post("/api/v1/drains/", body, format="json")

    assert first.status_code == again.status_code == resent.status_code == 403
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    refusals = list(AuditEvent.objects.filter(action="drain.request", outcome="denied")
                    .order_by("id"))
    assert len(refusals) == 3, [e.message for e in refusals]
    original, replay, _ = refusals
    assert replay.actor == original.actor == "viewer"
    assert (replay.object_type, replay.object_id) == (original.object_type,
                                                      original.object_id)
    assert replay.after == {"replay_of": original.pk, "idempotency_key": "d-9"}
    assert replay.message.startswith(original.message + " (replayed: answered again from the "
                                                        "refusal stored for its Idempotency-Key")
    assert replay.request_id != original.request_id
    assert not Drain.objects.exists()


def test_a_success_replayed_with_its_key_records_nothing_more(route, client_for):
    from fleetctl.audit.models import AuditEvent

    oncall = client_for("on-call")
    for _ in range(2):
        oncall.post(URL, _change(30), format="json", HTTP_IDEMPOTENCY_KEY="k-8")

    assert AuditEvent.objects.filter(action="revision.change").count() == 1
    assert not AuditEvent.objects.filter(outcome="denied").exists()


def test_a_server_error_is_not_kept_so_a_retry_runs_again(route, client_for, monkeypatch):
    oncall = client_for("on-call")
    oncall.raise_request_exception = False
    real = services.revision_create
    calls = []

    def broken_once(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the database went away")
        return real(**kwargs)

    monkeypatch.setattr(services, "revision_create", broken_once)
    failed = oncall.post(URL, _change(30), format="json", HTTP_IDEMPOTENCY_KEY="k-3")
    assert failed.status_code == 500
    assert not IdempotentRequest.objects.exists()
    retried = oncall.post(URL, _change(30), format="json", HTTP_IDEMPOTENCY_KEY="k-3")
    assert retried.status_code == 201 and "Idempotent-Replayed" not in retried
    assert len(calls) == 2 and Route.objects.get().revision_number == 2


def test_a_drain_and_its_restore_sent_twice_with_their_keys_happen_once(route, client_for):
    oncall = client_for("on-call")
    body = {"route": "llama", "reason": "incident"}
    drain = oncall.post("/api/v1/drains/", body, format="json", HTTP_IDEMPOTENCY_KEY="d-1")
    again = oncall.post("/api/v1/drains/", body, format="json", HTTP_IDEMPOTENCY_KEY="d-1")
    assert drain.status_code == again.status_code == 202
    assert again["Idempotent-Replayed"] == "true" and again.json() == drain.json()
    assert Drain.objects.count() == 1
    url = f"/api/v1/drains/{drain.json()['id']}/restore/"
    restore = oncall.post(url, {"reason": "over"}, format="json", HTTP_IDEMPOTENCY_KEY="r-1")
    replay = oncall.post(url, {"reason": "over"}, format="json", HTTP_IDEMPOTENCY_KEY="r-1")
    assert restore.status_code == replay.status_code == 202
    assert replay.json()["id"] == restore.json()["id"] and replay["Idempotent-Replayed"]
    # Without the key, a second restore is refused: it was restored already.
    assert oncall.post(url, {"reason": "over"}, format="json").status_code == 409
    assert Drain.objects.count() == 2 and Route.objects.get().revision_number == 3


@pytest.mark.parametrize("key", ["", "x" * 256, "clé-unicode", "tab\there"])
def test_a_key_that_is_not_1_to_255_printable_ascii_is_a_400(route, token_client, key):
    client = token_client(["ramp"], "on-call")
    response = client.post(URL, _change(30), format="json",
                           HTTP_IDEMPOTENCY_KEY=key.encode().decode("latin-1"))
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["error"]["fields"]
    assert Route.objects.get().revision_number == 1 and not IdempotentRequest.objects.exists()


def test_keys_belong_to_their_caller(route, token_client):
    one, two = token_client(["ramp"], "on-call"), token_client(["ramp"], "on-call")
    assert one.post(URL, _change(30), format="json",
                    HTTP_IDEMPOTENCY_KEY="same").status_code == 201
    # Another token's identical key is its own request (here: a stale base, 409).
    other = two.post(URL, _change(30), format="json", HTTP_IDEMPOTENCY_KEY="same")
    assert other.status_code == 409 and "Idempotent-Replayed" not in other
    assert sorted(IdempotentRequest.objects.values_list("principal", flat=True)) == sorted(
        [f"token:{one.token.pk}", f"token:{two.token.pk}"])


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_make_one_revision(make_pool, client_for):
    primary, _ = _pools(make_pool)
    services.route_create(actor=SYSTEM, name="llama", model_id=MODEL, primary_pool=primary,
                          weights={"primary": 80, "cand": 20})
    oncall = client_for("on-call", username="olga")
    key = str(uuid.uuid4())
    answers: list[tuple[int, str]] = []
    start = threading.Barrier(4)

    def send() -> None:
        try:
            start.wait()
            response = oncall.post(URL, _change(30), format="json", HTTP_IDEMPOTENCY_KEY=key)
            answers.append((response.status_code, response.get("Idempotent-Replayed", "")))
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # One ran; each other one either found it running (409) or got its answer replayed.
    assert [a for a in answers if a == (201, "")] == [(201, "")], answers
    assert all(a in ((201, "true"), (409, "")) for a in answers if a != (201, "")), answers
    assert SplitRevision.objects.count() == 2 and Route.objects.get().revision_number == 2


def test_prune_forgets_keys_older_than_the_ttl(route, client_for, settings):
    from fleetctl.core.tasks import idempotency_prune

    settings.IDEMPOTENCY_TTL_HOURS = 24
    oncall = client_for("on-call")
    assert oncall.post(URL, _change(30), format="json",
                       HTTP_IDEMPOTENCY_KEY="old").status_code == 201
    assert oncall.post(URL, _change(40, base=2), format="json",
                       HTTP_IDEMPOTENCY_KEY="new").status_code == 201
    IdempotentRequest.objects.filter(key="old").update(
        created_at=timezone.now() - timedelta(hours=25))
    assert idempotency_prune() == 1
    assert list(IdempotentRequest.objects.values_list("key", flat=True)) == ["new"]
    # A forgotten key is a new request again (its base is stale by now).
    assert oncall.post(URL, _change(30), format="json",
                       HTTP_IDEMPOTENCY_KEY="old").status_code == 409


def test_the_keyed_operations_document_the_header_and_its_answers(client_for):
    schema = client_for("viewer").get(
        "/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    keyed = [("/api/v1/routes/{name}/revisions/", "post"), ("/api/v1/drains/", "post"),
             ("/api/v1/drains/{id}/restore/", "post"), ("/api/v1/ramps/", "post"),
             *((f"/api/v1/ramps/{{id}}/{name}/", "post")
               for name in ("pause", "resume", "skip", "abort"))]
    for path, method in keyed:
        operation = schema["paths"][path][method]
        headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
        assert "Idempotency-Key" in headers, path
        assert {"400", "409", "422"} <= set(operation["responses"]), path
    revision = schema["paths"]["/api/v1/routes/{name}/revisions/"]["post"]
    assert {"wait", "timeout"} <= {p["name"] for p in revision["parameters"]}
    assert {"200", "201"} <= set(revision["responses"])
    assert "Idempotency-Key" not in str(schema["paths"]["/api/v1/routes/{name}/revisions/"]
                                        ["get"].get("parameters"))


# --- identical split, stale base ------------------------------------------------------------------

def test_the_split_in_force_is_answered_200_unchanged_and_nothing_is_pushed(
        route, file_gateway, client_for):
    oncall = client_for("on-call")
    pushes = GatewayPush.objects.count()
    same = oncall.post(URL, _change(20), format="json")
    assert same.status_code == 200, same.json()
    body = same.json()
    assert body["unchanged"] is True and body["number"] == 1
    assert body["weights"] == {"cand": 20.0, "primary": 80.0}
    assert "verified" not in body and "gateways" not in body
    assert SplitRevision.objects.count() == 1 and GatewayPush.objects.count() == pushes
    changed = oncall.post(URL, _change(25), format="json")
    assert changed.status_code == 201 and changed.json()["unchanged"] is False
    assert GatewayPush.objects.count() == pushes + 1


def test_a_stale_base_revision_409_carries_the_current_revision_weights_and_author(
        route, client_for):
    olga = client_for("on-call", username="olga")
    assert olga.post(URL, _change(30, reason="first"), format="json").status_code == 201
    stale = client_for("on-call", username="omar").post(URL, _change(40), format="json")
    assert stale.status_code == 409
    body = stale.json()
    assert body["current_revision"] == 2
    assert body["current_weights"] == {"cand": 30.0, "primary": 70.0}
    assert body["current_author"] == "olga"
    assert body["error"]["code"] == "conflict"
    assert body["error"]["fields"]["current_revision"] == ["2"]  # as it always was


# --- ?wait=verified ---------------------------------------------------------------------------

@pytest.mark.parametrize("query", ["wait=yes", "wait=verified&timeout=61",
                                   "wait=verified&timeout=-1", "wait=verified&timeout=soon",
                                   "timeout=5"])
def test_bad_wait_or_timeout_is_a_400_and_nothing_changes(route, client_for, query):
    oncall = client_for("on-call")
    response = oncall.post(f"{URL}?{query}", _change(30), format="json")
    assert response.status_code == 400, response.json()
    assert set(response.json()["error"]["fields"]) & {"wait", "timeout"}
    drained = oncall.post(f"/api/v1/drains/?{query}", {"route": "llama", "reason": "x"},
                          format="json")
    assert drained.status_code == 400
    assert Route.objects.get().revision_number == 1 and not Drain.objects.exists()


@pytest.fixture
def envoy(tmp_path: Path) -> Iterator[EnvoyProcess]:
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    yield process
    process.stop()


@pytest.fixture
def envoy_route(celery_worker, envoy, make_pool) -> Route:
    """`llama` on a real Envoy (the pools behind it need not answer: verifying reads back
    Envoy's own configuration) and a second gateway whose admin port nobody listens on."""
    primary, _ = _pools(make_pool, primary="http://127.0.0.1:9", cand="http://127.0.0.1:9")
    route = services.route_create(actor=SYSTEM, name="llama", model_id=MODEL,
                                  primary_pool=primary, weights={"primary": 80, "cand": 20})
    services.gateway_create(actor=SYSTEM, name="envoy-a", kind="envoy",
                            admin_address=envoy.admin_url,
                            options={"config_dir": str(envoy.workdir), "load_timeout_s": 30},
                            routes=[route])
    return route


@pytest.mark.slow
def test_wait_verified_answers_once_envoy_holds_the_split(envoy_route, client_for):
    oncall = client_for("on-call")
    answer = oncall.post(f"{URL}?wait=verified&timeout=30", _change(30), format="json")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert body["verified"] is True, body
    [gateway] = body["gateways"]
    assert (gateway["name"], gateway["status"], gateway["error"]) == ("envoy-a", "verified", "")
    assert gateway["verified_at"] and gateway["attempts"] >= 1
    drained = oncall.post("/api/v1/drains/?wait=verified&timeout=30",
                          {"route": "llama", "reason": "incident"}, format="json")
    assert drained.status_code == 202 and drained.json()["verified"] is True
    assert [g["status"] for g in drained.json()["gateways"]] == ["verified"]
    assert drained.json()["status"] in ("verified", "complete")


@pytest.mark.slow
def test_wait_verified_with_a_gateway_down_answers_false_after_the_timeout(
        envoy_route, client_for, tmp_path):
    (tmp_path / "down").mkdir()  # nothing listens on its admin port: it keeps retrying
    down = services.gateway_create(actor=SYSTEM, name="envoy-down", kind="envoy",
                                   admin_address=f"http://127.0.0.1:{free_port()}",
                                   options={"config_dir": str(tmp_path / "down")},
                                   routes=[envoy_route])
    oncall = client_for("on-call")
    # Long enough for the worker to verify envoy-a on a loaded machine; the other one
    # never answers, so the wait runs out whatever the timeout.
    answer = oncall.post(f"{URL}?wait=verified&timeout=10", _change(30), format="json")
    assert answer.status_code == 201
    body = answer.json()
    assert body["verified"] is False
    by_name = {g["name"]: g for g in body["gateways"]}
    assert by_name["envoy-a"]["status"] == "verified"
    assert by_name[down.name]["status"] in ("pending", "retrying")
    assert by_name[down.name]["verified_at"] is None
