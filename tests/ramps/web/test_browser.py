"""A ramp's page in a real browser (Debian's Chromium through Playwright) against a live
server: a ramp at step 2 of 3 with telemetry for its two pools; the timeline and the
pools' chart draw (plotly, from json_script data: the CSP forbids inline script), the
decisions table holds the guard's numbers, and an on-call engineer pauses the ramp with a
reason. No console error or failed request anywhere.

Set FLEETCTL_SCREENSHOTS=1 to also write docs/screenshots/ramp.png (1280 wide)."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, expect

from fleetctl.ramps.models import Ramp, RampEvent
from fleetctl.telemetry import histogram
from fleetctl.telemetry.models import Window
from fleetctl.traffic.models import Route
from tests.browser import sign_in
from tests.ramps.web.conftest import STEPS, make_ramp
from tests.traffic.web.test_browser import seed_traffic
from tests.web.factories import PASSWORD
from tests.web.test_browser import Problems, shoot

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def seed_windows(*, minutes: int, pools: dict[str, tuple[float, float, float, int]]) -> None:
    """10 s windows over the last `minutes` per pool: (TTFT median ms, TPOT median ms, error
    rate, requests per window), with a log-normal spread, as the ingester would write."""
    rng = random.Random(15)
    now = timezone.now().replace(microsecond=0)
    now = now - timedelta(seconds=now.second % 10)
    for pool, (ttft, tpot, error_rate, per_window) in pools.items():
        for i in range(minutes * 6):
            start = now - timedelta(seconds=10 * (i + 1))
            t: dict[str, int] = {}
            p: dict[str, int] = {}
            for _ in range(per_window):
                histogram.add(t, ttft * rng.lognormvariate(0, 0.25))
                histogram.add(p, tpot * rng.lognormvariate(0, 0.15))
            errors = sum(rng.random() < error_rate for _ in range(per_window))
            Window.objects.create(source="gateway", source_name="envoy-demo", route="llama",
                                  pool=pool, resolution_s=10, start=start, requests=per_window,
                                  errors=errors, streamed=per_window, ttft=t, updated_at=now)
            Window.objects.create(source="pool", source_name=pool, route="", pool=pool,
                                  resolution_s=10, start=start, tpot=p, updated_at=now)


@pytest.fixture
def ramp(live_server: Any) -> Ramp:
    """Seeded before the browser starts (Playwright's loop would give the ORM a connection
    of its own)."""
    seed_traffic()
    route = Route.objects.get(name="llama")
    started = timezone.now() - timedelta(minutes=4, seconds=30)
    events: list[dict[str, Any]] = [
        {"kind": "start", "step_index": -1, "at": started, "actor": "olga",
         "message": "olga started a ramp of mi300x-us on llama: 1:60, 5:60, 10:120"}]
    for index, at_s in ((0, 2), (1, 124)):
        events.append({"kind": "step", "step_index": index, "percent": STEPS[index]["percent"],
                       "at": started + timedelta(seconds=at_s),
                       "message": f"step {index + 1}/3 → {STEPS[index]['percent']} %"})
    made = make_ramp(route, step_index=1, started=started, events=events)
    Ramp.objects.filter(pk=made.pk).update(
        step_started_at=started + timedelta(seconds=124), base_weights={"h200-us": 100})
    figure = {"value": 612.0, "low": 570.0, "high": 655.0, "n": 212,
              "source": "gateway envoy-demo access log (first body byte of streamed answers)"}
    RampEvent.objects.create(
        ramp=made, kind="pass", step_index=0, percent=1, actor=f"ramp-{made.pk}",
        at=started + timedelta(seconds=122),
        message="hold passed: mi300x-us TTFT p95 612 ms ≤ 800 ms, errors 0.0 % ≤ 1 %",
        numbers={"candidate": {"pool": "mi300x-us", "requests": 212,
                               "sources": ["envoy-demo", "pool /metrics"],
                               "ttft_p95": figure,
                               "error_rate": {"value": 0.0, "low": 0.0, "high": 0.024,
                                              "n": 212, "source": "gateway envoy-demo"}},
                 "thresholds": {"slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 60,
                                "slo_error_rate": 0.01, "latency_margin_pct": 10}})
    seed_windows(minutes=5, pools={"mi300x-us": (520, 38, 0.002, 12),
                                   "h200-us": (430, 31, 0.001, 60)})
    return made


def test_the_ramp_page_draws_its_charts_and_pauses_the_ramp(
        live_server: Any, ramp: Ramp, browser: Browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = Problems(page)
    url = f"{live_server.url}/ramps/{ramp.pk}/"
    sign_in(page, url, "olga", PASSWORD)
    expect(page.locator("h1 .ramp-state")).to_have_attribute("data-state", "running")
    expect(page.locator("#ramp-timeline-chart.js-plotly-plot")).to_be_visible()
    expect(page.locator("#ramp-pools-chart.js-plotly-plot")).to_be_visible()
    # The pools' chart: candidate and primary in each of the three panels.
    expect(page.locator("#ramp-pools-chart .scatterlayer .trace")).to_have_count(6)
    expect(page.locator(".ramp-decisions tr[data-kind=pass]")).to_contain_text("612 ms")
    # What the guard reads now: both pools (their figures depend on how long ago the
    # windows were written, so only the rows are checked).
    expect(page.locator(".ramp-now tbody tr")).to_have_count(2)
    # The live block polls (every 2 s) and keeps the page whole.
    with page.expect_response(lambda r: f"/ramps/{ramp.pk}/?seen=running" in r.url):
        pass
    expect(page.locator("#ramp-live")).to_have_attribute("data-state", "running")
    shoot(page, "ramp.png")

    page.fill("#ramp-action-reason", "TTFT tail creeping up; looking at a trace first")
    page.get_by_role("button", name="Pause").click()
    page.wait_for_url(url)
    expect(page.get_by_text(f"Paused ramp {ramp.pk}.")).to_be_visible()
    expect(page.locator("h1 .ramp-state")).to_have_attribute("data-state", "paused")
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
    expect(page.locator(".ramp-decisions tr[data-kind=pause]")).to_contain_text(
        "looking at a trace first")
    assert problems.items == [], problems.items
