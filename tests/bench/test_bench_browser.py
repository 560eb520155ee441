"""A benchmark started from the dashboard in a real browser (Debian's Chromium through
Playwright), measured by a real Celery worker against the simulator: an on-call engineer
fills in the new-run form for two pools, lands on the run page, watches it progress through
the page's own htmx poll, and sees the result cards and the four charts fill with one trace
per pool. No console error or failed request anywhere.

Set FLEETCTL_SCREENSHOTS=1 to also write docs/bench-run.png (1280 wide).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from tests.bench.helpers import MODEL, serving, small_trace
from tests.web.test_browser import Problems

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PASSWORD = "pw-for-tests-only"  # make_user's default (tests/conftest.py)
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "bench-run.png"
CHARTS = ("throughput-chart", "ttft-chart", "tpot-chart", "cost-chart")


@pytest.fixture
def bench_world(celery_worker: Any, bench_sim: Any, make_pool: Any, make_user: Any) -> None:
    """Two simulated pools serving the model, a short trace and an on-call engineer, seeded
    before the browser starts (the worker must see them: celery_worker is transactional)."""
    for name, rate in (("paced", "39.80"), ("faulty", "31.20")):
        serving(make_pool, name, rate, base_urls=[bench_sim.url(name)])
    small_trace(n=200)
    make_user("olga", "on-call")


def test_a_benchmark_started_from_the_ui_fills_its_charts(
    live_server: Any, bench_world: None, browser: Browser
):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = Problems(page)
    new_run = f"{live_server.url}/bench/runs/new/"
    page.goto(new_run)
    page.wait_for_url("**/login/**")
    page.fill("#id_username", "olga")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(new_run)

    page.select_option("#id_trace", "short-chat")
    page.fill("#id_model_id", MODEL)
    page.fill("#id_name", "paced-vs-faulty")
    page.get_by_label("paced —").check()
    page.get_by_label("faulty —").check()
    page.fill("#id_slo_ttft_p95_ms", "2000")
    page.fill("#id_slo_tpot_p95_ms", "200")
    page.fill("#id_slo_error_rate", "0.05")
    page.get_by_label("fixed list of concurrency levels").check()
    page.fill("#id_levels", "1, 4")
    page.fill("#id_warmup_s", "0.5")
    page.fill("#id_window_s", "2")
    page.fill("#id_min_samples", "8")
    page.fill("#id_lag_limit_ms", "500")
    page.get_by_role("button", name="Start run").click()
    page.wait_for_url("**/bench/runs/*/")
    expect(page.get_by_text("Started run")).to_be_visible()

    live = page.locator("#run-live")
    # The poll shows the run moving before it ends (it measures four levels, ~3 s each).
    expect(live.locator(".run-doing")).to_contain_text("at concurrency", timeout=60_000)
    expect(live).to_have_attribute("data-status", "complete", timeout=240_000)

    for pool in ("faulty", "paced"):
        card = live.locator(f'article.pool-result[data-pool="{pool}"]')
        expect(card.locator(".best-concurrency")).to_have_text("4")
        expect(card.locator(".cost")).to_contain_text("USD")
    expect(live.locator(".levels-done")).to_have_text("4 of 4")
    expect(live.locator("tr.level-row")).to_have_count(4)
    for chart in CHARTS:
        # Plotly puts the figure's traces on the element once it has drawn it.
        page.wait_for_function(
            f"() => {{ const e = document.getElementById('{chart}');"
            " return e && e.data && e.data.length === 2 && e.querySelector('svg.main-svg'); }")
        names = page.evaluate(f"document.getElementById('{chart}').data.map(t => t.name)")
        assert names == ["faulty", "paced"], (chart, names)
        xs = page.evaluate(f"document.getElementById('{chart}').data.map(t => t.x)")
        assert xs == [[1, 4], [1, 4]], (chart, xs)
    assert "hx-trigger" not in (live.get_attribute("outerHTML") or "")
    expect(page.get_by_role("heading", name="Metric definitions")).to_be_visible()

    if os.environ.get("FLEETCTL_SCREENSHOTS") == "1":
        page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert problems.items == []
