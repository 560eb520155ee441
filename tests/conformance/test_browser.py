"""The stage-1 gate's button in a real browser (Chromium through Playwright), run by a real
Celery worker against simulated pools: an on-call engineer presses "Run the conformance
probe" on a plan whose candidate cannot call tools and counts prompt tokens differently,
watches the run page fill through its own htmx poll, reads what failed and why side by side
with the primary, and goes back to a gate that now reads fail. No console error or failed
request anywhere (CSP forbids inline script).

Set FLEETCTL_SCREENSHOTS=1 to also write docs/conformance-run.png (1280 wide)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from fleetctl.fleet.models import Pool
from tests.browser import sign_in
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.web.test_browser import Problems

pytestmark = [pytest.mark.slow, pytest.mark.browser]
PASSWORD = "pw-for-tests-only"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "conformance-run.png"


@pytest.fixture
def legacy_plan(celery_worker: Any, world: World, conformance_sim: Any) -> str:  # noqa: F811
    Pool.objects.filter(pk=world.candidate.pk).update(
        base_urls=[conformance_sim.url("legacy")])
    Pool.objects.filter(pk=world.primary.pk).update(base_urls=[conformance_sim.url("good")])
    return world.plan().name


def test_the_gate_button_runs_the_probe_and_the_gate_reads_its_verdict(
        live_server: Any, legacy_plan: str, browser: Browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = Problems(page)
    plan_url = f"{live_server.url}/plans/{legacy_plan}/"
    sign_in(page, plan_url, "olga", PASSWORD)
    check = page.locator('tr[data-check="conformance"]')
    expect(check.locator(".badge").first).to_contain_text("insufficient")
    check.get_by_role("button", name="Run the conformance probe").click()
    page.wait_for_url("**/conformance/runs/*/")
    expect(page.get_by_text("Started conformance run")).to_be_visible()

    live = page.locator("#conformance-live")
    expect(live).to_have_attribute("data-status", "complete", timeout=120_000)
    expect(live.locator(".verdict")).to_contain_text("fail")
    expect(live.locator(".conformance-summary")).to_contain_text(
        "required failing: tools, tool_choice required (no tool_calls)")
    tools = live.locator('tr[data-case="tools.required"] td.case-cell')
    expect(tools.nth(0)).to_contain_text("no tool_calls")
    expect(tools.nth(1).locator(".badge")).to_have_text("● pass")  # the primary, side by side
    parity = live.locator('tr[data-case="parity.prompt_tokens"]')
    expect(parity).to_contain_text("required")
    expect(parity.locator("td.case-cell").nth(0)).to_contain_text("prompt tokens")
    assert "hx-trigger" not in (live.get_attribute("outerHTML") or "")
    if os.environ.get("FLEETCTL_SCREENSHOTS") == "1":
        page.screenshot(path=str(SCREENSHOT), full_page=True)

    page.goto(plan_url)
    check = page.locator('tr[data-check="conformance"]')
    expect(check.locator(".badge").first).to_contain_text("fail")
    expect(check.locator(".conformance-action")).to_contain_text("Latest probe: run")
    run_page = check.locator(".conformance-action a").get_attribute("href")
    # The evidence the check cites links to the same run page.
    expect(check.locator(".evidence-refs a").first).to_have_attribute("href", run_page or "")
    assert problems.items == []


def test_a_viewer_sees_the_runs_but_no_button(live_server: Any, world: World,  # noqa: F811
                                              browser: Browser, transactional_db: Any):
    plan = world.plan()
    page = browser.new_page()
    problems = Problems(page)
    plan_url = f"{live_server.url}/plans/{plan.name}/"
    sign_in(page, plan_url, "vic", PASSWORD)
    check = page.locator('tr[data-check="conformance"]')
    expect(check).to_be_visible()
    expect(check.get_by_role("button", name="Run the conformance probe")).to_have_count(0)
    page.goto(f"{live_server.url}/conformance/")
    expect(page.get_by_role("heading", name="Conformance", exact=True)).to_be_visible()
    expect(page.locator("table.conformance-suite")).to_contain_text("tools.required")
    expect(page.get_by_role("link", name="New run")).to_have_count(0)
    assert problems.items == []
