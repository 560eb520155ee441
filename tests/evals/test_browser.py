"""The stage's eval from the plan page in a real browser (Chromium through Playwright), run by
a real Celery worker against simulated pools of known task accuracy: a platform lead presses
"Run the stage's eval" on the plan, finds the form filled with the plan's candidate, primary
and the bundled fleetctl-core suite, starts it, watches the run page fill through its own
htmx poll, reads the verdict with its interval and the items that changed side by side, and
goes back to a stage-2 eval check that now links this run. No console error or failed
request anywhere (CSP forbids inline script).

Set FLEETCTL_SCREENSHOTS=1 to also write docs/eval-run.png (1280 wide)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from fleetctl.accounts.actor import Actor
from fleetctl.evals import bundled, services
from fleetctl.evals.models import EvalRun
from fleetctl.fleet.models import Pool
from tests.browser import sign_in
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.web.test_browser import Problems

pytestmark = [pytest.mark.slow, pytest.mark.browser]
PASSWORD = "pw-for-tests-only"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "eval-run.png"
# The primary at the built-in H200 accuracy, the candidate five points lower.
SIM_POOLS = {"prim": "quick:task_accuracy=0.92", "low": "quick:task_accuracy=0.87"}


@pytest.fixture(scope="module")
def eval_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("evals-browser"), TEST_PROFILES, SIM_POOLS)
    yield sim
    sim.stop()


@pytest.fixture
def eval_plan(celery_worker: Any, world: World, eval_sim: SimProcess) -> str:  # noqa: F811
    """Seeded before the browser starts (Playwright's loop would give the ORM a connection
    of its own)."""
    Pool.objects.filter(pk=world.candidate.pk).update(base_urls=[eval_sim.url("low")])
    Pool.objects.filter(pk=world.primary.pk).update(base_urls=[eval_sim.url("prim")])
    services.suite_install_bundled(actor=Actor.for_system("test"), names=[bundled.MIX])
    return world.plan().name


def test_the_plan_page_runs_the_stages_eval_to_a_verdict(
        live_server: Any, eval_plan: str, world: World, browser: Browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = Problems(page)
    plan_url = f"{live_server.url}/plans/{eval_plan}/"
    sign_in(page, plan_url, "bob", PASSWORD)
    panel = page.locator("#evals")
    expect(panel).to_contain_text("No eval run for this plan yet")
    panel.get_by_role("link", name="Run the stage's eval").click()
    page.wait_for_url("**/evals/runs/new/**")
    expect(page.locator("#id_plan")).to_have_value(eval_plan)
    expect(page.locator("#id_candidate")).to_have_value(world.candidate.name)
    expect(page.locator("#id_primary")).to_have_value(world.primary.name)
    expect(page.locator("#id_suite option:checked")).to_contain_text("fleetctl-core v1")
    page.fill("#id_concurrency", "64")
    page.get_by_role("button", name="Start the run").click()
    page.wait_for_url("**/evals/runs/*/")
    expect(page.get_by_text("Started eval run")).to_be_visible()
    run_url = page.url

    live = page.locator("#eval-live")
    expect(live).to_have_attribute("data-status", "complete", timeout=600_000)
    verdict = live.get_attribute("data-verdict")
    assert verdict in ("pass", "warn", "fail"), verdict
    expect(live.locator("h2 .verdict")).to_be_visible()
    expect(live.locator(".eval-summary")).not_to_be_empty()
    expect(live.locator(".eval-interval")).to_contain_text("[")
    expect(live.locator("#eval-scores-chart.js-plotly-plot")).to_be_visible()
    expect(live.locator("#eval-difference-chart.js-plotly-plot")).to_be_visible()
    expect(live.locator("table.eval-tags tbody tr").first).to_be_visible()
    assert "hx-trigger" not in (live.get_attribute("outerHTML") or "")
    # The candidate is wrong on a superset of the primary's misses: the diff has regressions.
    first = page.locator("article.eval-diff-item").first
    expect(first).to_have_attribute("data-direction", "regressed")
    expect(first.locator('[data-side="candidate"] .eval-answer')).not_to_be_empty()
    expect(first.locator('[data-side="primary"] .eval-answer')).not_to_be_empty()
    if os.environ.get("FLEETCTL_SCREENSHOTS") == "1":
        page.screenshot(path=str(SCREENSHOT), full_page=True)

    run = EvalRun.objects.get()
    assert run.verdict == verdict and run.evidence_id
    page.goto(f"{plan_url}?stage=2")
    check = page.locator('tr[data-check="eval"]')
    expect(check.locator(".eval-action a.eval-fed")).to_have_attribute(
        "href", f"/evals/runs/{run.pk}/")
    expect(check.locator(".evidence-refs a").first).to_have_attribute(
        "href", f"/evals/runs/{run.pk}/")
    assert run_url.endswith(f"/evals/runs/{run.pk}/")
    assert problems.items == []
