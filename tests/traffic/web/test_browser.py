"""The drain flow in a real browser (Debian's Chromium through Playwright), against a live
server and a real Celery worker: routes page → Drain… → type the name → confirm → the drain
page follows the drain to "complete" by itself, with no console error or failed request.

The second test runs the same flow with a real Envoy (the worker pushes to it) in front of
simulated pools, so the drain page shows the gateway applying and verifying the drain.

Set FLEETCTL_SCREENSHOTS=1 to also write docs/screenshots/traffic.png and drain.png.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from playwright.sync_api import Browser, Page, expect

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.services import pool_create
from fleetctl.traffic import sampling, selectors, services
from fleetctl.traffic.gateways.base import adapter_for
from fleetctl.traffic.models import Gateway, Route
from tests.browser import sign_in
from tests.sim.simproc import sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until
from tests.traffic.web.conftest import MODEL, SYSTEM, healthy, make_route, ramp
from tests.web.factories import PASSWORD, make_region, make_user
from tests.web.test_browser import Problems, shoot

pytestmark = [pytest.mark.slow, pytest.mark.browser]
POLLING = "every 500ms"


@pytest.fixture
def traffic(celery_worker: subprocess.Popen[bytes]) -> None:
    """Seeded before the browser starts: once Playwright's event loop runs in this thread,
    Django would hand the ORM a separate connection that nothing closes afterwards."""
    seed_traffic()


def seed_traffic(base_urls: dict[str, str] | None = None) -> None:
    """Three routes over four pools in two jurisdictions, and an on-call engineer. Without
    `base_urls` the pools point nowhere: nothing sends them requests then."""
    make_user("olga", "on-call")
    us = make_region("us-east", "US", "Virginia")
    eu = make_region("eu-west", "EU", "Frankfurt")
    pools = (("h200-us", us, "cuda"), ("mi300x-us", us, "rocm"), ("h200-eu", eu, "cuda"),
             ("mi300x-eu", eu, "rocm"))
    for port, (name, region, runtime) in enumerate(pools, start=9):
        # A port each: one server cannot sit in two jurisdictions, whatever its paths.
        nowhere = f"http://127.0.0.1:{port}/{name}"
        fields = {"runtime": runtime, "accelerator": "MI300X" if runtime == "rocm" else "H200",
                  "region": region, "base_urls": [(base_urls or {}).get(name, nowhere)],
                  "max_context_tokens": 32768, "node_hourly_rate": "9.50"}
        healthy(pool_create(actor=SYSTEM, name=name, **fields))
    ramp(make_route("llama", primary="h200-us"), {"h200-us": 95, "mi300x-us": 5},
         reason="canary 5 %")
    ramp(make_route("llama-eu", primary="h200-eu", residency="EU", latency_class="interactive"),
         {"h200-eu": 90, "mi300x-eu": 10}, reason="EU canary")
    make_route("llama-batch", primary="mi300x-us", latency_class="batch")


def drain_llama_through_the_dashboard(page: Page, base_url: str) -> None:
    page.goto(f"{base_url}/traffic/")
    expect(page.locator("a.route-link", has_text="llama-eu")).to_be_visible()
    shoot(page, "traffic.png")

    page.locator('a[href="/traffic/routes/llama/drain/"]').click()
    page.wait_for_url("**/traffic/routes/llama/drain/")
    expect(page.get_by_text("mi300x-us 5 %")).to_be_visible()

    # A slip of the keyboard drains nothing.
    page.fill("#id_confirm_name", "llama-eu")
    page.fill("#id_reason", "canary 5xx on mi300x-us")
    page.get_by_role("button", name="Drain route llama now").click()
    expect(page.get_by_text("That is not llama; type the route name exactly.")).to_be_visible()

    page.fill("#id_confirm_name", "llama")
    page.get_by_role("button", name="Drain route llama now").click()
    page.wait_for_url("**/traffic/drains/*/")
    expect(page.get_by_text(re.compile(r"^Drain \d+ of route llama requested\.$"))
           ).to_be_visible()

    # The progress block polls every 500 ms and stops once the drain is complete; then
    # nothing on the page says it is still draining.
    progress = page.locator("#drain-progress")
    expect(progress.locator("h2 .badge")).to_have_text("● complete", timeout=60_000)
    expect(progress).not_to_have_attribute("hx-trigger", POLLING)
    expect(progress.get_by_text("Finished; no longer refreshing.")).to_be_visible()
    expect(progress.locator(".drain-outcome")).to_contain_text("Drain complete")
    expect(page.get_by_text("Draining")).to_have_count(0)
    expect(page.get_by_role("link", name="Restore…")).to_be_visible()


def test_an_on_call_engineer_drains_a_route_in_the_browser(
    live_server: Any, traffic: None, browser: Browser
):
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    problems = Problems(page)
    sign_in(page, f"{live_server.url}/traffic/", "olga", PASSWORD)

    drain_llama_through_the_dashboard(page, live_server.url)
    progress = page.locator("#drain-progress")
    expect(progress.get_by_text("no gateway carries these routes")).to_be_visible()
    shoot(page, "drain.png")

    assert problems.items == []


# --- the same flow with a real Envoy in front of simulated pools -----------------------------

POOLS = ("h200-us", "mi300x-us", "h200-eu", "mi300x-eu")


@pytest.fixture
def envoy_traffic(celery_worker: subprocess.Popen[bytes], tmp_path: Path) -> Iterator[str]:
    """Simulated pools, an Envoy the worker pushes to, and some requests through it so the
    route page has per-pool rates. All seeded before the browser starts. Yields Envoy's
    listener URL."""
    sims = sim_with_profiles(tmp_path / "sims", TEST_PROFILES, dict.fromkeys(POOLS, "quick"),
                             models=[MODEL])
    try:
        envoy = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
        try:
            seed_traffic({pool: sims.url(pool) for pool in POOLS})
            gateway = services.gateway_create(
                actor=SYSTEM, name="edge-envoy", kind="envoy", admin_address=envoy.admin_url,
                options={"config_dir": str(envoy.workdir)},
                routes=list(Route.objects.filter(name__in=["llama", "llama-eu"])),
            )
            wait_until(
                lambda: Gateway.objects.get(pk=gateway.pk).state == Gateway.State.IN_SYNC,
                what="the worker's first push to Envoy", timeout_s=60,
            )
            send_requests(envoy.listen_url, gateway, count=60)
            yield envoy.listen_url
        finally:
            envoy.stop()
    finally:
        sims.stop()


def send_requests(url: str, gateway: Gateway, *, count: int) -> None:
    """Requests for the unpinned route, with a traffic sample before and after them (two
    readings make one rate per pool), the second once the gateway has counted them all."""
    adapter = adapter_for(selectors.gateway_spec(gateway))

    def counted() -> tuple[int, int]:
        counters = adapter.pool_counters().values()
        return sum(c.requests_total for c in counters), sum(c.active for c in counters)

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="test", max_retries=0, timeout=30)
    before, _ = counted()
    sampling.traffic_sample(gateway=gateway)
    for _ in range(count):
        client.chat.completions.create(model=MODEL, max_tokens=4,
                                       messages=[{"role": "user", "content": "hello"}])

    def all_counted() -> bool:
        requests, active = counted()
        return requests >= before + count and active == 0

    wait_until(all_counted, what=f"Envoy to count the {count} requests",
               explain=lambda: f"(requests, active): {counted()}, requests before: {before}")
    sampling.traffic_sample(gateway=gateway)


def test_an_on_call_engineer_drains_a_route_behind_a_real_envoy_in_the_browser(
    live_server: Any, envoy_traffic: str, browser: Browser
):
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    problems = Problems(page)
    sign_in(page, f"{live_server.url}/traffic/routes/llama/", "olga", PASSWORD)
    page.wait_for_selector("#rates-chart .main-svg", timeout=30_000)
    expect(page.locator("#gw-title + .table-wrap")).to_contain_text("in sync")

    drain_llama_through_the_dashboard(page, live_server.url)
    progress = page.locator("#drain-progress")
    expect(progress.locator("tr.push-row-verified")).to_contain_text("edge-envoy")
    expect(progress.get_by_text("edge-envoy · llama r3: verified")).to_be_visible()
    shoot(page, "drain.png")

    assert problems.items == []


# --- the capacity split, one click -----------------------------------------------------------

@pytest.fixture
def benchmarked(traffic: None) -> None:
    """`traffic`, and benchmark evidence of the two US pools (as a benchmark run records
    it): h200-us 3,000 tok/s at 24 streams, mi300x-us 1,000 at 8. Before the browser starts."""
    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet.models import Pool
    from migrations_plan.services import evidence_record

    for name, run, streams, tokens in (("h200-us", 41, 24, 3000.0), ("mi300x-us", 42, 8,
                                                                     1000.0)):
        evidence_record(actor=Actor.for_system("benchmark"), pool=Pool.objects.get(name=name),
                        kind="benchmark", verdict="pass", summary=f"run {run}", model_id=MODEL,
                        source=f"benchmark run {run}",
                        data={"run": run, "timing": "concurrency", "best_concurrency": streams,
                              "output_tokens_per_s": tokens, "cost_per_1m": None,
                              "measured_on": "2026-12-01", "endpoints": 1,
                              "slo": {"ttft_p95_ms": 800, "tpot_p95_ms": 60,
                                      "error_rate": 0.01}})


def test_an_on_call_engineer_applies_the_capacity_split_with_one_click(
    live_server: Any, benchmarked: None, browser: Browser
):
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    problems = Problems(page)
    sign_in(page, f"{live_server.url}/traffic/routes/llama/", "olga", PASSWORD)
    card = page.locator("#capacity")
    # Loaded after the page by htmx: the figures, their runs and the suggested split.
    expect(card.get_by_role("cell", name="benchmark run 41 on 2026-12-01")).to_be_visible()
    expect(card.get_by_role("button", name="Apply capacity split")).to_be_visible()
    card.get_by_role("button", name="Apply capacity split").click()
    page.wait_for_url("**/traffic/routes/llama/?capacity#capacity")
    expect(page.get_by_text("The capacity split is the split in force.")).to_be_visible()
    expect(page.locator("#revision-3 .kind-capacity")).to_be_visible()
    route = Route.objects.get(name="llama")
    current = route.revisions.get(number=route.revision_number)
    assert current.weights == {"h200-us": 7500, "mi300x-us": 2500}
    assert problems.items == []
