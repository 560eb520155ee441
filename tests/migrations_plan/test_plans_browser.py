"""The plan page in a real browser (Debian's Chromium through Playwright), against a live
server: a platform lead who did not open the plan approves its gate with a justification and
sees the approval and the timeline entry; evidence that arrives afterwards turns its check
green through the page's own poll (and the approval, which saw the old evidence, says why it
no longer counts); a viewer sees no approve button. No console error or failed request.

Set FLEETCTL_SCREENSHOTS=1 to also write docs/plan-page.png (1280 wide).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from playwright.sync_api import Browser, expect

from fleetctl.accounts.actor import Actor
from fleetctl.fleet.models import Pool
from migrations_plan import services
from tests.browser import sign_in
from tests.web.test_browser import Problems

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PASSWORD = "pw-for-tests-only"  # make_user's default (tests/conftest.py)
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "plan-page.png"
JUSTIFICATION = "conformance and cost signed off by hand; routing holds"


@pytest.fixture
def plan_in_stage_1(transactional_db: None, world: Any) -> str:
    """alice opens the plan; bob (another platform lead) will approve it. Seeded before the
    browser starts."""
    return world.plan(name="mi300x-llama", target_date="2030-01-31").name


def evidence_arrives(pool_name: str) -> None:
    """A conformance job reports a pass, written from its own thread and connection, as a
    worker would."""

    def record() -> None:
        try:
            services.evidence_record(
                actor=Actor.for_system("conformance-probe"),
                pool=Pool.objects.get(name=pool_name), kind="conformance", verdict="pass",
                summary="OpenAI contract: 42 of 42 probes pass", url="/pools/mi300x-us/")
        finally:
            connection.close()

    worker = threading.Thread(target=record)
    worker.start()
    worker.join()


def test_a_platform_lead_approves_a_gate_and_a_viewer_sees_no_button(
    live_server: Any, plan_in_stage_1: str, browser: Browser
):
    url = f"{live_server.url}/plans/{plan_in_stage_1}/"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = Problems(page)

    sign_in(page, f"{live_server.url}/plans/", "bob", PASSWORD)
    card = page.locator(f'article[data-plan="{plan_in_stage_1}"]')
    expect(card).to_contain_text("1 of 5 checks pass")
    card.get_by_role("link", name=plan_in_stage_1).click()
    page.wait_for_url(url)

    gate = page.locator("#plan-gate")
    expect(gate.locator('tr[data-check="conformance"] .badge')).to_have_text(
        "○ insufficient data")
    expect(page.locator("#advance-why")).to_contain_text(
        "Needs 1 approval on the current evidence, has 0.")
    page.fill("#id_approve-justification", JUSTIFICATION)
    page.get_by_role("button", name="Approve", exact=True).click()
    page.wait_for_url(f"{url}#approvals")

    expect(page.get_by_text("You approved the stage 1 (abstraction) gate")).to_be_visible()
    approvals = page.locator("table.approvals")
    expect(approvals).to_contain_text("bob")
    expect(approvals).to_contain_text(JUSTIFICATION)
    expect(approvals).to_contain_text("● counts")
    expect(page.locator("#approve-why")).to_contain_text("You already approved this gate")
    expect(page.get_by_role("button", name="Advance")).to_be_enabled()
    first_event = page.locator("table.plan-timeline tbody tr").first
    expect(first_event).to_contain_text("approved the gate")
    expect(first_event).to_contain_text("bob")
    expect(first_event).to_contain_text(JUSTIFICATION)

    # Evidence arrives; the gate block's own 10 s poll turns the check green, and the
    # approval that saw "insufficient data" says why it no longer counts.
    assert page.evaluate("planGateIdle()") is True
    evidence_arrives("mi300x-us")
    expect(gate.locator('tr[data-check="conformance"] .badge')).to_have_text(
        "● pass", timeout=60_000)
    expect(approvals).to_contain_text("✕ stale")
    expect(approvals).to_contain_text("went from insufficient data to pass")
    expect(page.locator("#advance-why")).to_contain_text("has 0")
    if os.environ.get("FLEETCTL_SCREENSHOTS") == "1":
        page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert problems.items == []

    viewer = browser.new_page(viewport={"width": 1280, "height": 900})
    viewer_problems = Problems(viewer)
    sign_in(viewer, url, "vic", PASSWORD)
    expect(viewer.locator("#plan-gate")).to_contain_text("Stage 1 · abstraction gate")
    expect(viewer.locator("table.approvals")).to_contain_text("bob")
    expect(viewer.get_by_role("button", name="Approve")).to_have_count(0)
    expect(viewer.get_by_role("button", name="Advance")).to_have_count(0)
    expect(viewer.get_by_text("Approving and advancing need the platform-lead role")
           ).to_be_visible()
    assert viewer_problems.items == []


@pytest.fixture
def plan_with_every_source(transactional_db: None, world: Any) -> str:
    """A stage-1 gate with evidence of each origin: the health probe's record (measured), a CI
    system's report about conformance (reported), and an on-call's attestation."""
    plan = world.plan(name="mi300x-llama")
    services.evidence_report(
        actor=Actor.for_system("ci"), pool=world.candidate, reported_by="ci-contract-suite",
        about="conformance", verdict="pass", summary="42/42 contract cases",
        url="https://ci.example/runs/7")
    check = services.check_add(actor=world.actor("lead"), plan=plan, stage=1,
                               title="Runbook reviewed", attest_role="on-call")
    services.attest(actor=world.actor("oncall"), check=check, note="walked through it")
    return plan.name


def test_the_gate_page_says_where_each_piece_of_evidence_comes_from(
    live_server: Any, plan_with_every_source: str, browser: Browser
):
    url = f"{live_server.url}/plans/{plan_with_every_source}/"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = Problems(page)
    sign_in(page, url, "vic", PASSWORD)
    gate = page.locator("#plan-gate")

    conformance = gate.locator('tr[data-check="conformance"]')
    expect(conformance.locator(".badge")).to_have_text("○ insufficient data")
    expect(conformance.locator(".summary")).to_contain_text(
        "Reported by ci-contract-suite: pass — not measured by fleetctl")
    reported = conformance.locator('li[data-origin="reported"]')
    expect(reported.locator(".evidence-source")).to_have_text("Reported by ci-contract-suite")
    expect(reported.get_by_role("link", name="42/42 contract cases")).to_have_attribute(
        "href", "https://ci.example/runs/7")

    healthy = gate.locator('tr[data-check="healthy"] li[data-origin="measured"]')
    expect(healthy.locator(".evidence-source")).to_have_text("Measured by the health probe")

    attested = gate.locator('tr[data-check="runbook-reviewed"]')
    expect(attested.locator(".badge")).to_have_text("● pass")
    expect(attested.locator('li[data-origin="attested"] .evidence-source')).to_have_text(
        "Attested by olga")

    # The measured result arrives: it decides, and says which job measured it.
    evidence_arrives("mi300x-us")
    expect(conformance.locator(".badge")).to_have_text("● pass", timeout=60_000)
    measured = conformance.locator('li[data-origin="measured"]')
    expect(measured.locator(".evidence-source")).to_have_text("Measured by conformance-probe")
    expect(measured.get_by_role("link")).to_have_attribute("href", "/pools/mi300x-us/")
    expect(conformance.locator('li[data-origin="reported"]')).to_have_count(0)
    assert problems.items == []
