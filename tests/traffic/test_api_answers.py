"""Small honesty of the API's answers: a path without its trailing slash is the endpoint
(never a redirect that drops the body, nor a debug page), a base revision the route never
had is a 400 saying so (409 stays for a stale one), and durations carry no float noise."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleetctl.traffic import push, services
from fleetctl.traffic.models import Drain, Gateway, GatewayPushAttempt
from tests.conftest import SYSTEM

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("file_kind")]
MODEL = "llama-3.1-8b-instruct"


@pytest.mark.parametrize("debug", [False, True])
def test_api_paths_without_the_trailing_slash_are_the_endpoint(route, gateway, client_for,
                                                               settings, debug, tmp_path):
    settings.DEBUG = debug
    lead = client_for("platform-lead")

    listed = lead.get("/api/v1/routes")
    assert listed.status_code == 200, listed.content[:200]
    assert [r["name"] for r in listed.json()["results"]] == ["llama"]

    ramp = lead.post("/api/v1/routes/llama/revisions", {
        "weights": {"primary": 90, "cand": 10}, "base_revision": 1, "reason": "step"},
        format="json")
    assert ramp.status_code == 201, ramp.content[:300]
    assert ramp.json()["number"] == 2

    changed = lead.patch("/api/v1/gateways/gw-1", {"options": {"file_name": "w2.json"}},
                         format="json")
    assert changed.status_code == 200, changed.content[:300]
    assert Gateway.objects.get(name="gw-1").options == {"file_name": "w2.json"}

    drained = lead.post("/api/v1/drains", {"route": "llama", "reason": "incident"},
                        format="json")
    assert drained.status_code == 202, drained.content[:300]
    assert drained.json()["action"] == "drain"
    restored = lead.post(f"/api/v1/drains/{drained.json()['id']}/restore", {}, format="json")
    assert restored.status_code in (202, 409), restored.content[:300]
    assert restored["Content-Type"] == "application/json"

    services.gateway_create(actor=SYSTEM, name="gw-spare", kind="file",
                            admin_address=str(tmp_path), options={"file_name": "s.json"})
    assert lead.delete("/api/v1/gateways/gw-spare").status_code == 204
    assert not Gateway.objects.filter(name="gw-spare").exists()

    nowhere = lead.post("/api/v1/no-such-thing", {}, format="json")
    assert nowhere.status_code == 404
    assert nowhere.json()["error"]["code"] == "not_found"


def test_a_base_revision_from_the_future_is_a_400_naming_the_current_one(route, gateway,
                                                                          client_for):
    lead = client_for("platform-lead")
    url = "/api/v1/routes/llama/revisions/"
    future = lead.post(url, {"weights": {"primary": 90, "cand": 10}, "base_revision": 7,
                             "reason": "step"}, format="json")
    assert future.status_code == 400
    assert future.json()["error"]["fields"]["base_revision"] == [
        "Route llama's current revision is 1; revision 7 does not exist. Send the revision "
        "you read (the route's revision_number)."]
    assert route.revisions.count() == 1

    assert lead.post(url, {"weights": {"primary": 90, "cand": 10}, "base_revision": 1,
                           "reason": "step"}, format="json").status_code == 201
    stale = lead.post(url, {"weights": {"primary": 95, "cand": 5}, "base_revision": 1,
                            "reason": "step"}, format="json")
    assert stale.status_code == 409
    assert "someone changed it" in stale.json()["error"]["message"]


def test_durations_are_answered_to_a_tenth_of_a_millisecond(route, gateway, client_for):
    drain = push.drain_push_now(
        services.drain_request(actor=SYSTEM, route=route, reason="incident"))
    assert push.drain_progress(drain_id=drain.pk)
    drain.refresh_from_db()
    # Timestamps whose difference is binary noise as a float: 41.223000000000006 ms.
    Drain.objects.filter(pk=drain.pk).update(
        verified_at=drain.requested_at + timedelta(microseconds=41223),
        completed_at=drain.requested_at + timedelta(microseconds=98765))
    GatewayPushAttempt.objects.filter(push__revision__drains=drain).update(
        duration_ms=41.223000000000006)
    viewer = client_for("viewer")

    answer = viewer.get(f"/api/v1/drains/{drain.pk}/").json()
    assert (answer["verified_ms"], answer["duration_ms"]) == (41.2, 98.8)
    listed = viewer.get("/api/v1/drains/").json()["results"][0]
    assert (listed["verified_ms"], listed["duration_ms"]) == (41.2, 98.8)
    pushes = viewer.get("/api/v1/pushes/").json()["results"]
    durations = [a["duration_ms"] for p in pushes for a in p["attempt_rows"]]
    assert 41.2 in durations
    assert all(d is None or d == round(d, 1) for d in durations)
