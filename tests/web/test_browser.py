"""The dashboard in a real browser (Debian's Chromium through Playwright): sign in, read the
overview, open a pool, see its chart drawn, with no console error or failed request anywhere.

Set FLEETCTL_SCREENSHOTS=1 to also write docs/screenshots/overview.png and pool-detail.png.
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, ConsoleMessage, Page, Response, expect

from fleetctl.fleet import services
from fleetctl.fleet.models import Pool
from tests.web.factories import (
    PASSWORD,
    SYSTEM,
    make_pool,
    make_region,
    make_user,
    seed_probe_history,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@pytest.fixture
def demo_fleet(transactional_db: None) -> None:
    """Seeded before the browser starts: once Playwright's event loop runs in this thread,
    Django would hand the ORM a separate connection that nothing closes afterwards."""
    make_user("lena", "platform-lead")
    eu = make_region("eu-west-1", "EU", "Frankfurt")
    india = make_region("ap-south-1", "IN", "Mumbai")
    uk = make_region("uk-south-1", "UK", "London")
    layout = [
        ("h200-fra-a", eu, "cuda"), ("h100-bom-a", india, "cuda"),
        ("mi300x-fra-a", eu, "rocm"), ("mi300x-bom-a", india, "rocm"),
        ("v5e-lon-a", uk, "tpu"), ("mi250-lon-a", uk, "rocm"),
    ]
    for name, region, runtime in layout:
        seed_probe_history(make_pool(name, region, runtime=runtime))
    services.pool_set_cost(actor=SYSTEM, pool=Pool.objects.get(name="h200-fra-a"),
                           cost_per_1m=Decimal("1.8421"), measured_at=timezone.now())
    unhealthy = Pool.objects.get(name="mi250-lon-a")
    for _ in range(3):
        services.pool_health_record(
            pool_id=unhealthy.pk, ok=False, status_code=503, latency_ms=12.0,
            error="HTTP 503 from /v1/models: upstream overloaded",
        )


class Problems:
    """Everything that went wrong in the page, across the whole flow."""

    def __init__(self, page: Page) -> None:
        self.items: list[str] = []
        page.on("console", self.on_console)
        page.on("pageerror", lambda error: self.items.append(f"page error: {error}"))
        page.on("response", self.on_response)

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.items.append(f"console error: {message.text} at {message.location}")

    def on_response(self, response: Response) -> None:
        if response.status >= 400:
            self.items.append(f"HTTP {response.status} for {response.url}")


def shoot(page: Page, name: str) -> None:
    if os.environ.get("FLEETCTL_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def test_sign_in_read_the_fleet_and_a_pools_chart_without_a_console_error(
    live_server: Any, demo_fleet: None, browser: Browser
):
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    problems = Problems(page)

    page.goto(f"{live_server.url}/")
    page.wait_for_url("**/login/?next=/")
    page.fill("#id_username", "lena")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    for name in ("h200-fra-a", "mi300x-bom-a", "v5e-lon-a", "mi250-lon-a"):
        assert page.locator("a.pool-link", has_text=name).is_visible()
    assert page.locator(".tile-unhealthy .tile-value").inner_text() == "1"
    assert page.get_by_text("—, no benchmark yet").first.is_visible()

    # The tile strip's htmx refresh, asked for now instead of in 10 s: only the tiles swap.
    # Checked once htmx has settled the swap, so the counts see the new tiles, not the old.
    page.evaluate("() => { window.tilesSettled = new Promise(done => document.body"
                  ".addEventListener('htmx:afterSettle', () => done(true), {once: true})); }")
    with page.expect_response(lambda r: r.request.headers.get("hx-target") == "summary-tiles"):
        page.evaluate(
            "htmx.ajax('GET', '/', {target: '#summary-tiles', swap: 'innerHTML'})"
        )
    assert page.evaluate("window.tilesSettled") is True
    assert page.locator("#summary-tiles .tile").count() == 6
    assert page.locator("#summary-tiles header").count() == 0
    shoot(page, "overview.png")

    page.locator("a.pool-link", has_text="mi250-lon-a").click()
    page.wait_for_url("**/pools/mi250-lon-a/")
    page.wait_for_selector("#health-chart .main-svg", timeout=30_000)
    # Plotly may add the traces just after the frame: wait for them, don't count at once.
    expect(page.locator("#health-chart .scatterlayer .trace")).to_have_count(2)
    assert page.locator("h1 .badge", has_text="unhealthy").is_visible()
    page.get_by_text("The numbers:").click()
    assert page.locator("details.numbers table tbody tr").count() >= 10
    shoot(page, "pool-detail.png")

    assert problems.items == []
