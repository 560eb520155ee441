"""Draining from the dashboard: type the name to confirm, then follow the drain; restore it.
Routes here have no gateway, so a drain completes at the watcher's first look (called
directly, as the task would)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool
from fleetctl.traffic import push, selectors, services
from fleetctl.traffic.models import Drain, Route, SplitRevision
from tests.traffic.web.conftest import SYSTEM, make_route, ramp

pytestmark = pytest.mark.django_db


def drain_url(route: Route) -> str:
    return reverse("traffic:route-drain", args=[route.name])


def test_the_confirm_page_says_what_will_move_before_anything_does(
    oncall: Client, route: Route
):
    html = oncall.get(drain_url(route)).content.decode()
    assert "Drain route llama?" in html
    assert '<span class="chip removed">mi300x-us 5 %</span>' in html
    assert "r2 → r3" in html and '<span class="chip">h200-us 100 %</span>' in html
    assert "Type the route name, llama, to confirm" in html
    assert not Drain.objects.exists()


def test_an_on_call_engineer_drains_a_route_by_typing_its_name(oncall: Client, route: Route):
    response = oncall.post(drain_url(route), {"confirm_name": "llama",
                                              "reason": "canary 5xx"})
    drain = Drain.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("traffic:drain-detail", args=[drain.pk])
    assert (drain.route, drain.requested_by, drain.reason) == (route, "olga", "canary 5xx")
    assert drain.drained_pools == ["mi300x-us"]
    assert SplitRevision.objects.get(route=route, number=3).weights == {"h200-us": 10_000}
    assert AuditEvent.objects.filter(action="drain.request", actor="olga").exists()

    push.drain_progress(drain_id=drain.pk)  # what the watcher task does
    html = oncall.get(response["Location"]).content.decode()
    assert f"Drain {drain.pk} of route llama requested." in html
    assert "complete" in html and "+0 ms" in html
    assert reverse("traffic:route-detail", args=["llama"]) + "#revision-3" in html
    assert '<span class="chip">mi300x-us</span>' in html


def test_a_wrong_name_is_a_form_error_and_nothing_is_drained(oncall: Client, route: Route):
    response = oncall.post(drain_url(route), {"confirm_name": "llam", "reason": "x"})
    assert response.status_code == 200
    assert response.context["form"].errors["confirm_name"] == [
        "That is not llama; type the route name exactly. Nothing was drained."]
    assert not Drain.objects.exists()
    assert Route.objects.get(pk=route.pk).revision_number == 2


def test_a_drain_needs_a_reason(oncall: Client, route: Route):
    response = oncall.post(drain_url(route), {"confirm_name": "llama", "reason": " "})
    assert response.status_code == 200
    assert response.context["form"].errors["reason"]
    assert not Drain.objects.exists()


def test_a_viewer_posting_a_drain_is_refused_and_nothing_changes(viewer: Client, route: Route):
    response = viewer.post(drain_url(route), {"confirm_name": "llama", "reason": "x"})
    assert response.status_code == 403
    assert "&#x27;drain&#x27; needs a role that grants it; you have viewer." in (
        response.content.decode())
    assert not Drain.objects.exists()
    assert Route.objects.get(pk=route.pk).revision_number == 2
    denied = AuditEvent.objects.get(action="drain.request", outcome="denied")
    assert denied.actor == "vera"


def test_a_pool_drain_takes_the_pool_off_every_route(oncall: Client, route: Route,
                                                     pools: dict[str, Pool]):
    other = make_route("llama-batch", latency_class="batch", primary="mi300x-us")
    ramp(other, {"mi300x-us": 60, "h200-us": 40})
    url = reverse("traffic:pool-drain", args=["mi300x-us"])
    confirm = oncall.get(url).content.decode()
    assert "llama-batch" in confirm and "llama" in confirm
    assert "Type the pool name, mi300x-us, to confirm" in confirm
    response = oncall.post(url, {"confirm_name": "mi300x-us", "reason": "driver bug"})
    assert response.status_code == 302
    drain = Drain.objects.get()
    assert drain.pool == pools["cand"] and drain.route is None
    assert sorted(rev.route.name for rev in drain.revisions.all()) == ["llama", "llama-batch"]
    # The primary itself was drained on llama-batch: its share went to the other pool.
    other.refresh_from_db()
    assert selectors.revision_current(route=other).weights == {"h200-us": 10_000}


def test_draining_a_route_already_on_its_primary_says_there_is_nothing_to_drain(
    oncall: Client, pools: object
):
    route = make_route("llama-eu", primary="h200-eu", residency="EU")
    assert "Nothing to drain" in oncall.get(drain_url(route)).content.decode()
    response = oncall.post(drain_url(route), {"confirm_name": "llama-eu", "reason": "x"})
    assert response.status_code == 409
    assert "Nothing to drain: route llama-eu already sends everything to its primary" in \
        response.content.decode()
    assert not Drain.objects.exists()


def test_a_completed_drain_is_restored_to_the_split_from_before(oncall: Client, route: Route):
    oncall.post(drain_url(route), {"confirm_name": "llama", "reason": "canary 5xx"})
    drain = Drain.objects.get()
    push.drain_progress(drain_id=drain.pk)
    restore_url = reverse("traffic:drain-restore", args=[drain.pk])
    confirm = oncall.get(restore_url).content.decode()
    assert "as r2" in confirm and "mi300x-us 5 %" in confirm
    response = oncall.post(restore_url, {"reason": "fixed the driver"})
    restore = Drain.objects.get(action=Drain.Action.RESTORE)
    assert response["Location"] == reverse("traffic:drain-detail", args=[restore.pk])
    assert restore.restores == drain and restore.reason == "fixed the driver"
    assert selectors.revision_current(route=route).weights == {
        "h200-us": 9500, "mi300x-us": 500}
    # Restored once: the drain page no longer offers it.
    html = oncall.get(reverse("traffic:drain-detail", args=[drain.pk])).content.decode()
    assert restore_url not in html and f"restore {restore.pk}" in html


def test_a_restore_after_someone_changed_the_route_is_a_409(oncall: Client, route: Route):
    drain = services.drain_request(actor=SYSTEM, route=route, reason="x")
    push.drain_progress(drain_id=drain.pk)
    ramp(route, {"h200-us": 99, "mi300x-us": 1}, reason="moved on")
    response = oncall.post(reverse("traffic:drain-restore", args=[drain.pk]), {"reason": ""})
    assert response.status_code == 409
    assert "Route llama changed after this drain" in response.content.decode()
    assert not Drain.objects.filter(action=Drain.Action.RESTORE).exists()


def test_a_restore_cannot_itself_be_restored(oncall: Client, route: Route):
    drain = services.drain_request(actor=SYSTEM, route=route, reason="x")
    push.drain_progress(drain_id=drain.pk)
    restore = services.drain_restore(actor=SYSTEM, drain=drain, reason="back")
    url = reverse("traffic:drain-restore", args=[restore.pk])
    page = oncall.get(url).content.decode()
    assert "only a drain can be restored" in page and "<fieldset disabled>" in page
    response = oncall.post(url, {"reason": "again"})
    assert response.status_code == 200
    assert "Only a drain can be restored." in response.content.decode()
    assert Drain.objects.count() == 2


def test_the_drain_page_says_draining_while_open_and_its_final_state_once_complete(
        oncall: Client, route: Route):
    """The page polls its progress block; the block, and only it, says how the drain
    stands, so nothing on the page still says "Draining…" once it completed."""
    oncall.post(drain_url(route), {"confirm_name": "llama", "reason": "canary 5xx"})
    drain = Drain.objects.get()
    url = reverse("traffic:drain-detail", args=[drain.pk])
    poll = {"HX-Request": "true", "HX-Target": "drain-progress"}

    open_ = oncall.get(url).content.decode()
    assert "Draining…" in open_ and 'hx-trigger="every 500ms"' in open_

    push.drain_progress(drain_id=drain.pk)
    block = oncall.get(url, headers=poll).content.decode()
    page = oncall.get(url).content.decode()

    assert "<html" not in block
    assert "Drain complete</strong> in " in block and "hx-trigger" not in block
    assert "Draining" not in block and "Draining" not in page
    assert "Finished; no longer refreshing." in block
