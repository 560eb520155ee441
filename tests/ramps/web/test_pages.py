"""The ramp pages: the list and a ramp's page render in every state, the htmx live block
polls only while the ramp is active, the buttons follow the roles (a viewer sees none and is
refused when posting anyway), every action needs a reason (abort also a confirmation), the
route page's start form shows the service's refusals, and free text is escaped."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from fleetctl.fleet.models import Pool
from fleetctl.ramps.models import Ramp, RampEvent
from fleetctl.traffic import services as traffic_services
from fleetctl.traffic.models import Drain, Route
from migrations_plan.models import Plan
from tests.ramps.web.conftest import make_ramp
from tests.traffic.web.conftest import SYSTEM

pytestmark = pytest.mark.django_db
LIVE = {"HX-Request": "true", "HX-Target": "ramp-live"}
CHARTS = {"HX-Request": "true", "HX-Target": "ramp-charts"}
DECISIONS = {"HX-Request": "true", "HX-Target": "ramp-decisions"}
XSS = "<script>alert('ramp')</script>"


def page(client: Client, ramp: Ramp, **headers: str) -> str:
    response = client.get(reverse("ramps:detail", args=[ramp.pk]), headers=headers)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


@pytest.mark.parametrize("state", [s.value for s in Ramp.State])
def test_every_state_renders_on_the_list_and_the_ramp_page(oncall: Client, route: Route,
                                                           state: str):
    ramp = make_ramp(route, state=state, reason=f"why it is {state}")
    html = page(oncall, ramp)
    assert f'data-state="{state}"' in html
    assert f"why it is {state}" in html
    assert 'id="ramp-timeline-chart"' in html and "ramp-timeline-data" in html
    polling = state in ("running", "paused")
    assert ('hx-trigger="every 2s"' in html) is polling
    live = page(oncall, ramp, **LIVE)
    assert live.lstrip().startswith('<div id="ramp-live"')
    assert ('hx-trigger="every 2s"' in live) is polling
    assert "ramp-timeline-data" in page(oncall, ramp, **CHARTS)
    decisions = page(oncall, ramp, **DECISIONS)
    assert decisions.lstrip().startswith('<div id="ramp-decisions"')
    assert ('hx-trigger="every 2s"' in decisions) is polling
    assert 'data-kind="step"' in decisions
    listed = oncall.get(reverse("ramps:list"), {"state": state}).content.decode()
    assert f'data-ramp="{ramp.pk}"' in listed
    assert "2/3 at 5 %" in listed


def test_the_list_filters_by_state_route_and_pool(oncall: Client, route: Route):
    done = make_ramp(route, state="complete", step_index=2)
    live = make_ramp(route, state="running")
    html = oncall.get(reverse("ramps:list"), {"state": "active"}).content.decode()
    assert f'data-ramp="{live.pk}"' in html and f'data-ramp="{done.pk}"' not in html
    html = oncall.get(reverse("ramps:list"), {"pool": "h200-eu"}).content.decode()
    assert "No ramp matches this filter" in html
    html = oncall.get(reverse("ramps:list"), {"route": "llama"}).content.decode()
    assert f'data-ramp="{live.pk}"' in html and f'data-ramp="{done.pk}"' in html
    assert oncall.get(reverse("ramps:detail", args=[99999])).status_code == 404


def test_a_poll_that_sees_another_state_reloads_the_page(oncall: Client, route: Route):
    ramp = make_ramp(route, state="paused")
    url = reverse("ramps:detail", args=[ramp.pk])
    assert "HX-Refresh" not in oncall.get(url, {"seen": "paused"}, headers=LIVE)
    assert oncall.get(url, {"seen": "running"}, headers=LIVE)["HX-Refresh"] == "true"


def test_the_decisions_show_their_numbers_and_each_figures_source(oncall: Client,
                                                                  route: Route):
    ramp = make_ramp(route)
    figure = {"value": 912.0, "low": 850.0, "high": 990.0, "n": 240,
              "source": "gateway envoy-a access log (first body byte of streamed answers)"}
    none = {"value": None, "low": None, "high": None, "n": 0, "source": "pool /metrics"}
    RampEvent.objects.create(
        ramp=ramp, kind="fail", step_index=1, percent=5, actor=f"ramp-{ramp.pk}",
        message="mi300x-us TTFT p95 912 ms is over the SLO 800 ms",
        numbers={"candidate": {"pool": "mi300x-us", "requests": 240, "sources": ["envoy-a"],
                               "ttft_p95": figure, "tpot_p95": none,
                               "error_rate": {"value": 0.004, "low": 0.001, "high": 0.02,
                                              "n": 240, "source": "gateway envoy-a"}},
                 "thresholds": {"slo_ttft_p95_ms": 800, "slo_error_rate": 0.01,
                                "latency_margin_pct": 10}})
    html = page(oncall, ramp)
    assert 'data-kind="fail"' in html
    assert "912 ms" in html and "[850 ms, 990 ms]" in html and "n 240" in html
    assert "first body byte of streamed answers" in html
    assert "0.40 %" in html  # the error rate, in percent
    assert "800 ms" in html and "10 %" in html  # the thresholds


def test_the_rollback_drain_is_linked_with_its_times(oncall: Client, route: Route):
    drain = traffic_services.drain_request(actor=SYSTEM, pool=Pool.objects.get(name="mi300x-us"),
                                           routes=[route], reason="ramp 1: rollback")
    now = timezone.now()
    Drain.objects.filter(pk=drain.pk).update(
        verified_at=drain.requested_at + timedelta(milliseconds=420),
        completed_at=drain.requested_at + timedelta(seconds=3), status="complete")
    ramp = make_ramp(route, state="rolled-back", drain=drain,
                     reason="mi300x-us failed 2 checks in a row")
    RampEvent.objects.create(ramp=ramp, kind="rollback", step_index=1, at=now,
                             message="rolled back", actor=f"ramp-{ramp.pk}", drain=drain)
    html = page(oncall, ramp)
    assert reverse("traffic:drain-detail", args=[drain.pk]) in html
    assert "0.42 s after the request" in html and "(3.00 s)" in html


def test_a_viewer_sees_no_button_and_is_refused_when_posting(viewer: Client, route: Route):
    ramp = make_ramp(route)
    html = page(viewer, ramp)
    assert "ramp-action-form" not in html and "ramp-abort-form" not in html
    assert "needs the <code>ramp</code> permission" in html
    response = viewer.post(reverse("ramps:action", args=[ramp.pk]),
                           {"action": "pause", "reason": "try"})
    assert response.status_code == 403
    ramp.refresh_from_db()
    assert ramp.state == "running"


def test_buttons_follow_the_state(oncall: Client, route: Route):
    running = make_ramp(route)
    html = page(oncall, running)
    assert 'value="pause"' in html and 'value="skip"' in html and 'value="resume"' not in html
    assert "ramp-abort-form" in html
    Ramp.objects.filter(pk=running.pk).update(state="paused")
    html = page(oncall, running)
    assert 'value="resume"' in html and 'value="pause"' not in html
    Ramp.objects.filter(pk=running.pk).update(state="complete")
    html = page(oncall, running)
    assert "ramp-actions" not in html


def test_pause_needs_a_reason_and_then_pauses(oncall: Client, route: Route):
    ramp = make_ramp(route)
    url = reverse("ramps:action", args=[ramp.pk])
    response = oncall.post(url, {"action": "pause", "reason": ""})
    assert response.status_code == 400
    assert "Say why" in response.content.decode()
    ramp.refresh_from_db()
    assert ramp.state == "running"
    response = oncall.post(url, {"action": "pause", "reason": "looking at a trace"})
    assert response.status_code == 302
    ramp.refresh_from_db()
    assert ramp.state == "paused"
    event = ramp.events.order_by("-at", "-id").first()
    assert event is not None and event.kind == "pause" and "olga" in event.actor
    # Pausing a paused ramp: the service refuses, the page says why with its status.
    response = oncall.post(url, {"action": "pause", "reason": "again"})
    assert response.status_code == 409
    assert "only a running ramp" in response.content.decode()


def test_abort_needs_the_confirmation(oncall: Client, route: Route):
    ramp = make_ramp(route)
    url = reverse("ramps:action", args=[ramp.pk])
    response = oncall.post(url, {"action": "abort", "reason": "bad canary"})
    assert response.status_code == 400
    assert "Tick the box to confirm" in response.content.decode()
    ramp.refresh_from_db()
    assert ramp.state == "running" and ramp.drain is None


def test_free_text_is_escaped_everywhere(oncall: Client, route: Route):
    ramp = make_ramp(route, reason=XSS)
    RampEvent.objects.create(ramp=ramp, kind="pause", step_index=1, message=XSS,
                             actor=XSS, numbers={"note": XSS})
    for html in (page(oncall, ramp), page(oncall, ramp, **LIVE), page(oncall, ramp, **CHARTS),
                 page(oncall, ramp, **DECISIONS),
                 oncall.get(reverse("traffic:route-detail", args=[route.name])).content
                 .decode()):
        assert XSS not in html
        assert "<script>alert" not in html
    assert "&lt;script&gt;alert(" in page(oncall, ramp)


# ---- the route page's Ramps panel and the start form -----------------------------------------

def start(client: Client, route: Route, **fields: str) -> tuple[int, str]:
    data = {"pool": "mi300x-us", "steps": "10:60, 25:60", "min_samples": "50", "window_s": "30",
            "failure_threshold": "2", "slo_ttft_p95_ms": "800", "slo_tpot_p95_ms": "60",
            "slo_error_pct": "1", "latency_margin_pct": "10", "reason": "canary", **fields}
    response = client.post(reverse("ramps:start", args=[route.name]), data)
    return response.status_code, response.content.decode()


def test_the_route_page_offers_the_start_form_to_the_ramp_role_only(
        oncall: Client, viewer: Client, route: Route):
    url = reverse("traffic:route-detail", args=[route.name])
    html = oncall.get(url).content.decode()
    assert "ramp-start-form" in html and 'id="ramps"' in html
    assert '<option value="mi300x-us"' in html and '<option value="h200-us"' not in html
    html = viewer.get(url).content.decode()
    assert "ramp-start-form" not in html and "No active ramp" in html


def test_the_start_form_shows_its_own_and_the_services_errors(oncall: Client, route: Route):
    status, html = start(oncall, route, steps="1:60, five")
    assert status == 400 and "is not a step: write percent:seconds" in html
    status, html = start(oncall, route, steps="5:60, 1:60")
    assert status == 400 and "ramp-start-form" in html and "is not above the step before" in html
    status, html = start(oncall, route, slo_ttft_p95_ms="", slo_tpot_p95_ms="")
    assert status == 400
    assert "give the guard&#x27;s thresholds: slo_ttft_p95_ms, slo_tpot_p95_ms" in html
    assert not Ramp.objects.exists()


def test_a_started_ramp_shows_on_the_route_page_and_a_second_is_refused(
        oncall: Client, route: Route):
    status, _ = start(oncall, route)
    assert status == 302
    ramp = Ramp.objects.get()
    assert ramp.state == "running" and ramp.steps[0]["percent"] == 10
    html = oncall.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    assert "ramp-active" in html and reverse("ramps:detail", args=[ramp.pk]) in html
    assert "ramp-start-form" not in html
    status, html = start(oncall, route)
    assert status == 409 and "already has an active ramp" in html
    assert Ramp.objects.count() == 1


def test_a_viewer_cannot_start_a_ramp(viewer: Client, route: Route):
    html = viewer.get(reverse("ramps:start", args=[route.name])).content.decode()
    assert "ramp-start-form" not in html and "Starting a ramp needs" in html
    status, _ = start(viewer, route)
    assert status == 403
    assert not Ramp.objects.exists()


def test_the_traffic_page_links_the_ramps(viewer: Client, route: Route):
    html = viewer.get(reverse("traffic:routes")).content.decode()
    assert f'href="{reverse("ramps:list")}"' in html


def test_the_start_form_offers_the_pool_holding_weight_with_steps_above_it(
        oncall: Client, route: Route):
    html = oncall.get(reverse("ramps:start", args=[route.name])).content.decode()
    assert '<option value="mi300x-us" selected>' in html
    assert 'value="10:120, 25:300, 50:300"' in html


def test_the_start_form_takes_a_stage_4_plans_candidate_and_thresholds(
        oncall: Client, route: Route, make_user: Any):
    lead = make_user("pat", "platform-lead")
    plan = Plan.objects.create(
        name="mi300x-llama", candidate_pool=Pool.objects.get(name="mi300x-eu"),
        primary_pool=route.primary_pool, slo_ttft_p95_ms=750, slo_tpot_p95_ms=45,
        slo_error_rate=0.005, latency_margin_pct=15, owner=lead, created_by=lead,
        state=Plan.State.STAGE_4, stage=4)
    plan.routes.add(route)
    html = oncall.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    form = html[html.index('class="ramp-start-form"'):]
    assert reverse("plans:detail", args=[plan.name]) in form
    assert '<option value="mi300x-eu" selected>' in form
    for name, value in (("slo_ttft_p95_ms", "750.0"), ("slo_tpot_p95_ms", "45.0"),
                        ("slo_error_pct", "0.5"), ("latency_margin_pct", "15.0")):
        assert re.search(rf'name="{name}" value="{re.escape(value)}"', form), name
    assert 'value="1:60, 5:60, 10:120, 25:300, 50:300"' in form


def test_a_ramp_before_its_first_step(oncall: Client, route: Route):
    ramp = make_ramp(route, step_index=-1)
    html = page(oncall, ramp)
    assert "0/3: no step set yet" in html
    assert "ramp-now" not in html  # nothing holding: nothing to judge yet
    listed = oncall.get(reverse("ramps:list")).content.decode()
    assert "0/3" in listed


def test_a_decision_shows_the_client_disconnects_it_set_apart(oncall: Client, route: Route):
    ramp = make_ramp(route)
    rate = {"value": 0.0, "low": 0.0, "high": 0.03, "n": 240, "source": "gateway envoy-a"}
    RampEvent.objects.create(
        ramp=ramp, kind="pass", step_index=1, percent=5, actor=f"ramp-{ramp.pk}",
        message="Hold at 5 % passed",
        numbers={"candidate": {"pool": "mi300x-us", "requests": 240, "error_rate": rate,
                               "client_disconnects": 1200,
                               "disconnect_rate": {"value": 1200 / 1440, "low": 0.8,
                                                   "high": 0.86, "n": 1440,
                                                   "source": "gateway envoy-a"}}})
    html = page(oncall, ramp)
    row = html[html.index(">client disconnects<"):]
    assert "1,200 (83.33 %)" in row[:400]
    assert "not counted against the pool" in row[:600]
