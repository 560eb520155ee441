"""Bad input over REST: a 400 naming the field, and nothing saved (nor audited as a change)."""

from __future__ import annotations

import pytest

from fleetctl.audit.models import AuditEvent
from fleetctl.schedules.models import Schedule
from tests.schedules.conftest import World, next_run

URL = "/api/v1/schedules/"


def _body(world: World, plan_name: str, **overrides: object) -> dict[str, object]:
    return {"kind": "conformance", "plan": plan_name, "cron": "*/5 * * * *",
            "timezone": "UTC", "window_minutes": 3, **overrides}


@pytest.mark.parametrize(("overrides", "field", "says"), [
    ({"cron": "*/5 * * *"}, "cron", "has 4 fields"),
    ({"cron": "0 0 * * * *"}, "cron", "has 6 fields"),
    ({"cron": "61 * * * *"}, "cron", "not a valid cron"),
    ({"cron": "0 0 31 2 *"}, "cron", "never fires"),
    ({"cron": "0 0 30 2 *"}, "cron", "never fires"),
    ({"cron": ""}, "cron", ""),
    ({"timezone": "Mars/Olympus"}, "timezone", "not an IANA time zone"),
    ({"timezone": ""}, "timezone", ""),
    ({"window_minutes": -5}, "window_minutes", "from 1 to 10080"),
    ({"window_minutes": 0}, "window_minutes", "from 1 to 10080"),
    ({"window_minutes": 20000}, "window_minutes", "from 1 to 10080"),
    ({"window_minutes": "soon"}, "window_minutes", ""),
    ({"kind": "rehearsal", "plan": None}, "plan", "name the plan"),
    ({"kind": "eval"}, "eval_suite", "no eval run yet"),
    ({"kind": "reboot"}, "kind", ""),
])
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_saved(
        world: World, client_for, overrides, field, says):
    plan = world.plan()
    client = client_for("platform-lead")
    audits = AuditEvent.objects.count()
    response = client.post(URL, _body(world, plan.name, **overrides), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert field in body["error"]["fields"], body
    assert says in str(body["error"]["fields"][field]), body
    assert not Schedule.objects.exists()
    assert AuditEvent.objects.count() == audits


def test_a_good_schedule_is_created_and_its_next_run_is_the_next_occurrence(
        world: World, client_for):
    plan = world.plan()
    client = client_for("on-call")
    response = client.post(URL, _body(world, plan.name, timezone="Europe/Paris",
                                      cron="30 2 * * 6"), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["pool"] == world.candidate.name and data["plan"] == plan.name
    assert data["next_run_at"] and data["last_outcome"] is None
    schedule = Schedule.objects.get(pk=data["id"])
    local = next_run(schedule).astimezone(__import__("zoneinfo").ZoneInfo("Europe/Paris"))
    assert (local.weekday(), local.hour, local.minute) == (5, 2, 30)
    assert schedule.created_by == client.user.username
    # Retrieve, runs, edit (a bad cron on edit: 400 naming it, nothing changed), delete.
    assert client.get(f"{URL}{schedule.pk}/").json()["cron"] == "30 2 * * 6"
    assert client.get(f"{URL}{schedule.pk}/runs/").json()["results"] == []
    bad = client.patch(f"{URL}{schedule.pk}/", {"cron": "0 0 31 2 *"}, format="json")
    assert bad.status_code == 400 and "cron" in bad.json()["error"]["fields"], bad.content
    assert Schedule.objects.get(pk=schedule.pk).cron == "30 2 * * 6"
    bad = client.patch(f"{URL}{schedule.pk}/", {"kind": "eval"}, format="json")
    assert bad.status_code == 400 and "kind" in str(bad.json()), bad.content
    ok = client.patch(f"{URL}{schedule.pk}/", {"enabled": False}, format="json")
    assert ok.status_code == 200 and ok.json()["next_run_at"] is None, ok.content
    assert client.delete(f"{URL}{schedule.pk}/").status_code == 204
    assert not Schedule.objects.exists()


def test_a_viewer_may_read_but_not_write(world: World, client_for):
    plan = world.plan()
    viewer = client_for("viewer")
    response = viewer.post(URL, _body(world, plan.name), format="json")
    assert response.status_code == 403, response.content
    assert not Schedule.objects.exists()
    assert viewer.get(URL).status_code == 200


def test_a_retried_create_with_the_same_idempotency_key_makes_one_schedule(
        world: World, client_for):
    plan = world.plan()
    client = client_for("platform-lead")
    first = client.post(URL, _body(world, plan.name), format="json",
                        HTTP_IDEMPOTENCY_KEY="k-1")
    again = client.post(URL, _body(world, plan.name), format="json",
                        HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert Schedule.objects.count() == 1
