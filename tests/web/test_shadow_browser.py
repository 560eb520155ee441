"""A shadow run's page in a real browser (Debian's Chromium through Playwright) against a live
server: an on-call engineer opens a running run with pairs and judgements, sees the
divergence chart drawn by charts.js (CSP: no inline script), the counters move through their
own htmx poll when the collector counts more, the first divergent token marked while the
`<script>` in the candidate's answer stays text, and stops the run with a reason in one
action. No console error or failed request anywhere.

Set FLEETCTL_SCREENSHOTS=1 to also write docs/shadow-run.png (1280 wide)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from fleetctl.shadow import live
from tests.browser import sign_in
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.shadow.test_pages import _clean_live_state, seeded_run  # noqa: F401 - autouse
from tests.web.test_browser import Problems

pytestmark = [pytest.mark.slow, pytest.mark.browser]
PASSWORD = "pw-for-tests-only"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "shadow-run.png"
PRIMARY = "The capital of France is Paris, a city on the Seine with about two million people."
PAIRS = [(0.41, "The capital of France is Lyon, a city on the Rhône with about half a million "
                "people."),
         (0.12, "The capital of France is Paris, a city on the Seine with roughly two million "
                "people."),
         (0.05, "The capital of France is Paris <script>window.__xss=1</script>, a city on the "
                "Seine with about two million people.")]


def series(points: int = 16) -> list[tuple[float, float, float, float, str]]:
    """A run converging: the band around +0.7 points narrows as pairs arrive, from
    insufficient data to a pass once its upper edge is below the 2-point margin."""
    out = []
    for i in range(1, points + 1):
        half = 0.05 / i ** 0.5
        est = 0.007 + 0.004 * (-1) ** i / i
        verdict = "insufficient" if i < 3 else ("pass" if est + half < 0.02 else "warn")
        out.append((0.011, 0.011 + est, est - half, est + half, verdict))
    return out


@pytest.fixture
def run_id(transactional_db: None, world: World) -> int:  # noqa: F811
    """Seeded before the browser starts (Playwright's loop would get its own connection)."""
    run = seeded_run(world, primary=PRIMARY, pairs=PAIRS, series=series(), step_s=15,
                     verdict="pass", summary="pass: divergence +0.7 points [−0.5, +1.9] over "
                                            "the noise floor 1.1 %, margin 2 points, 1600 pairs",
                     counters={"received": 4210, "sampled": 1644, "pairs": 1600,
                               "pair_errors": 3, "dropped_rate": 212})
    live.count(run.pk, received=4250, sampled=1650, dropped_rate=214, pairs=1604,
               pair_errors=3)
    live.add_tokens(run.pk, 912_400)
    return run.pk


def test_the_run_page_draws_the_chart_refreshes_the_counters_and_stops(
        live_server: Any, run_id: int, browser: Browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = Problems(page)
    url = f"{live_server.url}/shadow/runs/{run_id}/"
    sign_in(page, url, "olga", PASSWORD)

    chart = page.locator("#shadow-divergence-chart")
    expect(chart).to_have_class("chart chart-tall js-plotly-plot")
    expect(chart.locator(".main-svg").first).to_be_visible()
    expect(chart.locator(".legendtext", has_text="noise floor")).to_have_count(1)
    expect(chart.locator(".annotation-text", has_text="margin 2 points")).to_have_count(1)

    first = page.locator('article.shadow-pair >> nth=0 >> [data-side="candidate"] pre')
    expect(first.locator("mark")).to_have_text("Lyon")
    scripted = page.locator('article.shadow-pair >> nth=2 >> [data-side="candidate"] pre')
    expect(scripted).to_contain_text("Paris <script>window.__xss=1</script>, a city")
    assert page.evaluate("window.__xss") is None

    received = page.locator('#shadow-counters [data-counter="received"] .tile-value')
    expect(received).to_have_text("4,250")
    live.count(run_id, received=7)  # the collector counts more: the poll shows it
    expect(received).to_have_text("4,257")

    if os.environ.get("FLEETCTL_SCREENSHOTS") == "1":
        page.screenshot(path=str(SCREENSHOT), full_page=True)

    stop = page.locator("form.shadow-stop")
    stop.get_by_label("Reason").fill("candidate diverging on JSON answers")
    stop.get_by_role("button", name="Stop shadowing").click()
    expect(page.get_by_text(f"Stopped shadow run {run_id}")).to_be_visible()
    expect(page.locator("h1 .badge[data-status]")).to_have_attribute("data-status", "stopped")
    expect(page.locator(".last-error")).to_contain_text("candidate diverging on JSON answers")
    expect(page.locator("form.shadow-stop")).to_have_count(0)
    assert page.locator("#shadow-counters").get_attribute("hx-trigger") is None

    # The plan page's Shadow panel shows the stopped run and offers a new start.
    page.get_by_role("link", name="mi300x-llama").first.click()
    panel = page.locator("section.shadow-panel")
    expect(panel.locator(".badge[data-status]")).to_have_attribute("data-status", "stopped")
    expect(panel.get_by_role("link", name=f"Run {run_id}")).to_be_visible()
    panel.locator("summary", has_text="Start shadowing").click()
    expect(panel.get_by_label("Route")).to_have_value("llama")
    assert "llama" not in live.published()  # the collector stops sampling the route
    assert problems.items == []
