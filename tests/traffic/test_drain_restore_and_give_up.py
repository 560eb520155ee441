"""A drain restored once answers a second restore with who restored it and when (409), in
the API, the dashboard and the CLI; a drain that gives up — on any path — is `failed` with
its reason, never left `partial` or `verified`."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from fleetctl.traffic import push, services
from fleetctl.traffic.models import Drain, Route
from tests.conftest import SYSTEM

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("file_kind")]
MODEL = "llama-3.1-8b-instruct"


def _complete_drain(route: Route) -> Drain:
    drain = push.drain_push_now(
        services.drain_request(actor=SYSTEM, route=route, reason="incident"))
    assert push.drain_progress(drain_id=drain.pk)
    drain.refresh_from_db()
    assert drain.status == Drain.Status.COMPLETE
    return drain


def test_restoring_a_restored_drain_says_by_which_restore(route, gateway, client_for):
    drain = _complete_drain(route)
    oncall = client_for("on-call", username="olga")
    first = oncall.post(f"/api/v1/drains/{drain.pk}/restore/", {"reason": "over"},
                        format="json")
    assert first.status_code == 202, first.json()
    restore = Drain.objects.get(pk=first.json()["id"])
    revisions = route.revisions.count()

    again = oncall.post(f"/api/v1/drains/{drain.pk}/restore/", {"reason": "twice"},
                        format="json")
    assert again.status_code == 409
    error = again.json()["error"]
    assert error["code"] == "conflict"
    assert error["message"].startswith(
        f"Drain {drain.pk} was already restored: restore {restore.pk} by olga at "
        f"{restore.requested_at:%Y-%m-%d %H:%M:%S} UTC")
    assert "by hand" not in error["message"]
    assert error["fields"] == {"restored_by": [str(restore.pk)]}
    assert route.revisions.count() == revisions  # nothing stored
    assert Drain.objects.filter(restores=drain).count() == 1

    # The dashboard: the notice names the restore, and the form is not offered.
    page = oncall.get(f"/traffic/drains/{drain.pk}/restore/").content.decode()
    assert f"restore {restore.pk}</a> (olga," in page
    assert "cannot be restored again" in page
    assert "<fieldset disabled>" in page
    posted = oncall.post(f"/traffic/drains/{drain.pk}/restore/", {"reason": "twice"})
    assert posted.status_code == 409
    assert f"was already restored: restore {restore.pk} by olga" in posted.content.decode()


def test_a_drain_whose_in_flight_never_closes_fails_instead_of_waiting_for_ever(
    route, gateway, tmp_path: Path, settings
):
    (tmp_path / "in_flight.json").write_text(json.dumps({"cand": 3}))
    drain = push.drain_push_now(
        services.drain_request(actor=SYSTEM, route=route, reason="incident"))
    assert not push.drain_progress(drain_id=drain.pk)
    drain.refresh_from_db()
    assert drain.status == Drain.Status.VERIFIED  # still worth waiting for

    Drain.objects.filter(pk=drain.pk).update(
        requested_at=timezone.now() - timedelta(seconds=settings.DRAIN_WATCH_TIMEOUT_S + 1))
    assert push.drains_advance() == 1  # the converge task's look
    drain.refresh_from_db()
    assert drain.status == Drain.Status.FAILED
    assert drain.failure_reason.startswith(
        "verified on every gateway, but in-flight requests to cand did not reach zero")
    assert drain.verified_at is not None and drain.completed_at is None


def test_a_drain_that_cannot_be_followed_is_failed_past_its_deadline(
    route, gateway, tmp_path: Path, settings
):
    """Every look at it raises (here: its gateway's in-flight file is not JSON)."""
    (tmp_path / "in_flight.json").write_text("not json")
    drain = push.drain_push_now(
        services.drain_request(actor=SYSTEM, route=route, reason="incident"))
    assert push.drains_advance() == 0
    drain.refresh_from_db()
    assert drain.status == Drain.Status.VERIFIED
    Drain.objects.filter(pk=drain.pk).update(
        requested_at=timezone.now() - timedelta(seconds=settings.DRAIN_WATCH_TIMEOUT_S + 1))
    assert push.drains_advance() == 1
    drain.refresh_from_db()
    assert drain.status == Drain.Status.FAILED
    assert drain.failure_reason.startswith("its progress could not be followed within")
