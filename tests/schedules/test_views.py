"""The dashboard: the plan page's Schedules panel, the add and edit forms as a role with
`jobs`, 403 (and nothing saved) for a viewer, the list and a schedule's history."""

from __future__ import annotations

from datetime import timedelta

from django.test import Client

from fleetctl.schedules import services
from fleetctl.schedules.models import Schedule
from tests.schedules.conftest import T0, World, next_run


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


FORM = {"kind": "conformance", "cron": "*/5 * * * *", "timezone": "UTC",
        "window_minutes": "3", "enabled": "on", "note": "re-verify weekly"}


def test_a_lead_adds_and_edits_a_schedule_from_the_plan_page(world: World):
    plan = world.plan()
    lead = _client(world.lead)
    page = lead.get(f"/plans/{plan.name}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="schedules"' in text and f"/schedules/new/?plan={plan.name}" in text
    form = lead.get(f"/schedules/new/?plan={plan.name}")
    assert form.status_code == 200
    made = lead.post("/schedules/new/", {**FORM, "plan": plan.name})
    assert made.status_code == 302, made.content.decode()[:2000]
    schedule = Schedule.objects.get()
    assert (schedule.plan_id, schedule.created_by) == (plan.pk, world.lead.username)
    assert made["Location"] == f"/schedules/{schedule.pk}/"
    # A bad cron on the form: the field says why, nothing changes.
    bad = lead.post(f"/schedules/{schedule.pk}/edit/", {**FORM, "cron": "0 0 31 2 *"})
    assert bad.status_code == 400
    assert "never fires" in bad.content.decode()
    assert Schedule.objects.get().cron == "*/5 * * * *"
    edited = lead.post(f"/schedules/{schedule.pk}/edit/", {**FORM, "cron": "0 3 * * 6",
                                                           "window_minutes": "120"})
    assert edited.status_code == 302
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.window_minutes) == ("0 3 * * 6", 120)
    # Disable, then the plan page lists it with its state.
    assert lead.post(f"/schedules/{schedule.pk}/toggle/").status_code == 302
    assert Schedule.objects.get().enabled is False
    text = lead.get(f"/plans/{plan.name}/").content.decode()
    assert f"/schedules/{schedule.pk}/" in text and "0 3 * * 6" in text


def test_a_viewer_gets_403_and_nothing_is_saved(world: World):
    plan = world.plan()
    viewer = _client(world.viewer)
    response = viewer.post("/schedules/new/", {**FORM, "plan": plan.name})
    assert response.status_code == 403
    assert not Schedule.objects.exists()
    schedule = services.schedule_create(actor=world.actor("lead"), kind="conformance",
                                        plan=plan, cron="*/5 * * * *", window_minutes=3,
                                        now=T0)
    assert viewer.post(f"/schedules/{schedule.pk}/edit/",
                       {**FORM, "cron": "0 3 * * *"}).status_code == 403
    assert viewer.post(f"/schedules/{schedule.pk}/delete/",
                       {"confirm": "yes"}).status_code == 302  # refused: a message
    assert Schedule.objects.get().cron == "*/5 * * * *"
    # Reading is for everyone with a role: the list and the history.
    assert viewer.get("/schedules/").status_code == 200
    services.schedules_due(next_run(schedule) + timedelta(hours=1))
    history = viewer.get(f"/schedules/{schedule.pk}/").content.decode()
    assert "missed" in history and "12 occurrences" in history
