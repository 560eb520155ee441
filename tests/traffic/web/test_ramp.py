"""Changing a route's split with the ramp form: the service decides, the form shows its
answer on the split, and nothing half-valid is stored."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool, Region
from fleetctl.fleet.services import pool_health_record
from fleetctl.traffic.models import Route, SplitRevision
from tests.traffic.web.conftest import make_route, ramp

pytestmark = pytest.mark.django_db


def ramp_form(route: Route, weights: dict[str, Any], **extra: Any) -> dict[str, Any]:
    data = {f"weights-{pool}": value for pool, value in weights.items()}
    data.update({"base_revision": route.revision_number, "reason": "next step"})
    data.update(extra)
    return data


def post_ramp(client: Client, route: Route, weights: dict[str, Any], **extra: Any) -> Any:
    return client.post(reverse("traffic:route-ramp", args=[route.name]),
                       ramp_form(route, weights, **extra))


def test_the_ramp_form_offers_every_eligible_pool_with_the_current_split(
    oncall: Client, route: Route
):
    html = oncall.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    assert 'name="weights-h200-us"' in html and 'value="95"' in html
    assert 'name="weights-mi300x-us"' in html and 'value="5"' in html
    # EU pools serve the model too, but this route is not pinned: they are offered at 0.
    assert 'name="weights-h200-eu"' in html
    assert 'name="base_revision" value="2"' in html
    assert "Create revision 3" in html


def test_a_pinned_route_offers_only_the_pools_inside_its_pin(oncall: Client, pools: object):
    make_route("llama-eu", primary="h200-eu", residency="EU")
    html = oncall.get(reverse("traffic:route-detail", args=["llama-eu"])).content.decode()
    assert 'name="weights-h200-eu"' in html and 'name="weights-mi300x-eu"' in html
    assert 'name="weights-h200-us"' not in html
    assert "Not offered, outside the EU pin: h200-us (US), mi300x-us (US)." in html


def test_a_valid_change_creates_a_revision_with_who_and_why(oncall: Client, route: Route):
    response = post_ramp(oncall, route, {"h200-us": "90", "mi300x-us": "10", "h200-eu": ""})
    assert response.status_code == 302
    assert response["Location"] == reverse("traffic:route-detail", args=[route.name])
    revision = SplitRevision.objects.get(route=route, number=3)
    assert revision.weights == {"h200-us": 9000, "mi300x-us": 1000}
    assert (revision.created_by, revision.reason, revision.forced) == ("olga", "next step", False)
    assert AuditEvent.objects.filter(action="revision.change", actor="olga").exists()
    page = oncall.get(response["Location"]).content.decode()
    assert "is now at revision 3" in page


@pytest.mark.parametrize(("weights", "words"), [
    ({"h200-us": "90", "mi300x-us": "20"}, "Weights add up to 110 %, not 100 %."),
    ({"h200-us": "", "mi300x-us": "0"}, "All weights are zero"),
    ({"h200-us": "99.999", "mi300x-us": "0.001"}, "finer than the 0.01 % step"),
    ({"h200-us": "lots", "mi300x-us": "5"}, "'lots' is not a number"),
    ({"h200-us": "120", "mi300x-us": "-20"}, "outside 0–100 %"),
])
def test_a_bad_split_shows_an_error_on_the_split_and_stores_nothing(
    oncall: Client, route: Route, weights: dict[str, str], words: str
):
    response = post_ramp(oncall, route, weights)
    assert response.status_code == 200
    errors = response.context["form"].errors["weights"]
    assert any(words in message for message in errors), errors
    assert 'id="split-errors"' in response.content.decode()
    assert SplitRevision.objects.filter(route=route).count() == 2
    assert Route.objects.get(pk=route.pk).revision_number == 2
    assert not AuditEvent.objects.filter(action="revision.change", actor="olga").exists()


def test_a_ramp_needs_a_reason(oncall: Client, route: Route):
    response = post_ramp(oncall, route, {"h200-us": "90", "mi300x-us": "10"}, reason="")
    assert response.status_code == 200
    assert "This field is required." in response.context["form"].errors["reason"]
    assert SplitRevision.objects.filter(route=route).count() == 2


def test_a_change_that_lost_a_race_is_a_409_with_the_fresh_split_and_the_typed_numbers(
    oncall: Client, route: Route
):
    stale_base = route.revision_number
    ramp(route, {"h200-us": 80, "mi300x-us": 20}, reason="someone else, meanwhile")
    response = oncall.post(reverse("traffic:route-ramp", args=[route.name]), ramp_form(
        route, {"h200-us": "90", "mi300x-us": "10"}, base_revision=stale_base))
    html = response.content.decode()
    assert response.status_code == 409
    assert "Route llama is at revision 3, not 2: someone changed it since you looked." in html
    assert "The split changed while you were editing" in html
    # The fresh split is what the page shows now; the inputs keep what was typed, rebased.
    assert "mi300x-us <strong>20 %</strong>" in html
    assert 'name="weights-mi300x-us" id="id_weights-mi300x-us" value="10"' in html
    assert 'name="base_revision" value="3"' in html
    assert SplitRevision.objects.filter(route=route).count() == 3


def test_a_pool_moved_out_of_the_pin_is_refused_with_the_residency_message(
    oncall: Client, pools: dict[str, Pool]
):
    route = make_route("llama-eu", primary="h200-eu", residency="EU")
    ramp(route, {"h200-eu": 90, "mi300x-eu": 10})
    route.refresh_from_db()
    # The candidate's region was re-registered in the US while it still carried EU traffic:
    # the registry refuses that now (409), so only data from before could hold it.
    Pool.objects.filter(pk=pools["eu2"].pk).update(region=Region.objects.get(code="us-east"))
    page = oncall.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    assert "not eligible any more: set to 0" in page
    response = post_ramp(oncall, route, {"h200-eu": "85", "mi300x-eu": "15"})
    assert response.status_code == 200
    assert ("Residency: pool mi300x-eu is in jurisdiction US, but route llama-eu is pinned to "
            "EU. Refused.") in response.context["form"].errors["weights"]
    assert "pinned to EU. Refused." in response.content.decode()
    assert SplitRevision.objects.filter(route=route).count() == 2
    # Taking the weight off it is always allowed: that is how the mistake is undone.
    assert post_ramp(oncall, route, {"h200-eu": "100", "mi300x-eu": "0"}).status_code == 302


def test_an_unhealthy_pool_needs_force_and_a_forced_revision_says_so(
    oncall: Client, route: Route, pools: dict[str, Pool]
):
    for _ in range(3):
        pool_health_record(pool_id=pools["cand"].pk, ok=False, status_code=500,
                           latency_ms=1.0, error="down")
    response = post_ramp(oncall, route, {"h200-us": "90", "mi300x-us": "10"})
    assert response.status_code == 200
    assert "Pool mi300x-us is unhealthy (force to override)." in (
        response.context["form"].errors["weights"])
    assert post_ramp(oncall, route, {"h200-us": "90", "mi300x-us": "10"},
                     force="on").status_code == 302
    assert SplitRevision.objects.get(route=route, number=3).forced
    html = oncall.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    assert 'class="badge forced"' in html


def test_a_viewer_posting_the_ramp_form_is_refused_and_nothing_changes(
    viewer: Client, route: Route
):
    response = post_ramp(viewer, route, {"h200-us": "50", "mi300x-us": "50"})
    assert response.status_code == 403
    assert "&#x27;ramp&#x27; needs a role that grants it; you have viewer." in (
        response.content.decode())
    assert Route.objects.get(pk=route.pk).revision_number == 2
    assert AuditEvent.objects.filter(action="revision.create", outcome="denied",
                                     actor="vera").exists()


def test_the_history_diffs_each_revision_against_its_parent(viewer: Client, route: Route):
    ramp(route, {"h200-us": 50, "mi300x-us": 50}, reason="half and half")
    html = viewer.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    history = html[html.index('id="history-title"'):]
    r3 = history[history.index('id="revision-3"'):history.index('id="revision-2"')]
    assert "← r2" in r3 and "half and half" in r3 and "system:test" in r3
    assert 'class="delta-down">\n                  <span class="pool">h200-us</span>' in r3
    assert "95 % → <strong>50 %</strong>" in r3
    assert "5 % → <strong>50 %</strong>" in r3 and "▲" in r3 and "▼" in r3
    r1 = history[history.index('id="revision-1"'):]
    assert "0 % → <strong>100 %</strong>" in r1 and "route created" in r1
