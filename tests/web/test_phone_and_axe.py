"""The key pages on a phone, and axe-core on them: an on-call engineer drains pools from a
390 px wide screen. Each page (home, the plans board, a plan, a route, a pool, a shadow run,
an eval run, a drain and the form that starts one) must fit the width (a wide table scrolls
inside its own container, not the page), the navigation must leave the screen to the page,
and axe-core may find nothing of serious or critical impact. At a laptop's width the top
bar keeps its row of links.

axe.min.js comes inside the `axe-playwright-python` package (the dev extras): nothing is
fetched at test time. One seeded demo, one live server, one browser context for every page.

Set FLEETCTL_SCREENSHOTS=1 to also write docs/screenshots/phone-drain.png.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.urls import reverse
from playwright.sync_api import Browser, Page, ViewportSize, expect

from fleetctl.evals.models import EvalRun
from fleetctl.shadow.models import ShadowRun
from fleetctl.traffic.models import Drain
from tests.browser import sign_in
from tests.support.demo_content import seed_demo
from tests.web.test_browser import Problems

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PASSWORD = "phone-and-axe"
PHONE = ViewportSize(width=390, height=844)
LAPTOP = ViewportSize(width=1366, height=768)
# The navigation may take at most this share of the phone screen's height.
NAV_SHARE = 0.12
SEVERE = {"serious", "critical"}
# The two rules these pages broke before they fitted a phone: never again, at any impact.
NEVER = {"nested-interactive", "scrollable-region-focusable"}
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"

# The elements that stick out past the right edge of the window from a parent that does not
# (and that no scrolling container clips), else the rightmost ones: what a failure names, so
# the fix can be found without opening a browser.
OVERFLOWING = """() => {
  const limit = window.innerWidth + 0.5;
  const right = element => element.getBoundingClientRect().right;
  const describe = element => {
    const classes = typeof element.className === 'string' ? element.className.trim() : '';
    return element.tagName.toLowerCase() + (element.id ? '#' + element.id : '') +
      (classes ? '.' + classes.split(/\\s+/).join('.') : '') +
      ' right=' + Math.round(right(element));
  };
  const all = [...document.body.querySelectorAll('*')];
  const culprits = all.filter(element => {
    if (right(element) <= limit || right(element.parentElement) > limit) return false;
    for (let up = element.parentElement; up && up !== document.body; up = up.parentElement) {
      if (getComputedStyle(up).overflowX !== 'visible') return false;
    }
    return true;
  });
  // None found: something escaped its scrolling container (an absolutely positioned child).
  const named = culprits.length ? culprits : all.sort((a, b) => right(b) - right(a));
  return named.slice(0, 8).map(describe);
}"""
# Every chart drawn (charts.js marks a drawn one .js-plotly-plot), so axe sees Plotly's DOM.
CHARTS_DRAWN = """() => [...document.querySelectorAll('[data-plotly-figure]')]
  .every(element => element.classList.contains('js-plotly-plot') || element.textContent)"""


@pytest.fixture
def key_pages(transactional_db: None, tmp_path: Path) -> dict[str, str]:
    """The demo as `make demo` seeds it plus what its workers add (tests/support), seeded
    before the browser starts; the paths of the pages an on-call engineer opens first."""
    seed_demo(password=PASSWORD, data_dir=tmp_path)
    shadow = ShadowRun.objects.filter(plan__name="mi300x-llama-8b").order_by("pk").first()
    assert shadow is not None, "the demo seed made no shadow run"
    return {
        "home": reverse("fleet:overview"),
        "plans": reverse("plans:board"),
        "a plan": reverse("plans:detail", args=["gaudi3-llama-8b"]),
        "a route": reverse("traffic:route-detail", args=["llama-8b"]),
        "a pool": reverse("fleet:pool-detail", args=["h200-us-east"]),
        "a shadow run": reverse("shadow:run-detail", args=[shadow.pk]),
        "an eval run": reverse("evals:run-detail", args=[EvalRun.objects.latest("pk").pk]),
        "a drain": reverse("traffic:drain-detail", args=[Drain.objects.earliest("pk").pk]),
        "draining a pool": reverse("traffic:pool-drain", args=["h200-us-east"]),
        "metric sources": reverse("metric_sources:list"),
        "a metric source": reverse("metric_sources:detail", args=["cluster-prometheus"]),
    }


def phone_problems(page: Page, axe: Axe) -> list[str]:
    """What is wrong with the page open in `page` at a phone's width."""
    problems = []
    page.wait_for_function(CHARTS_DRAWN)
    wide = page.evaluate("document.scrollingElement.scrollWidth")
    if wide > PHONE["width"]:
        problems.append(f"scrolls sideways ({wide} px wide): {page.evaluate(OVERFLOWING)}")
    nav = page.locator("header.topbar").bounding_box()
    assert nav is not None
    if nav["height"] > NAV_SHARE * PHONE["height"]:
        problems.append(f"the navigation takes {nav['height'] / PHONE['height']:.0%} of "
                        f"the screen's height")
    for violation in axe.run(page).response["violations"]:
        if violation["impact"] in SEVERE or violation["id"] in NEVER:
            targets = [node["target"] for node in violation["nodes"][:4]]
            problems.append(f"axe {violation['id']} ({violation['impact']}): "
                            f"{len(violation['nodes'])} × {targets}")
    return problems


def test_the_key_pages_fit_a_phone_and_axe_finds_nothing_serious(
    live_server: Any, key_pages: dict[str, str], browser: Browser
):
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    console = Problems(page)
    axe = Axe()
    sign_in(page, f"{live_server.url}/", "admin", PASSWORD)

    found = {}
    for name, path in key_pages.items():
        page.goto(f"{live_server.url}{path}")
        found[name] = phone_problems(page, axe)
        if name == "a drain" and os.environ.get("FLEETCTL_SCREENSHOTS") == "1":
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "phone-drain.png"), full_page=True)
    report = {name: items for name, items in found.items() if items}
    assert not report, "\n".join(f"{name} ({key_pages[name]}):\n  " + "\n  ".join(items)
                                 for name, items in report.items())

    # The folded menu opens from its button, shows every section and still fits the width.
    toggle = page.get_by_role("button", name="Menu", exact=True)
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(page.locator("nav.sections a").last).to_be_visible()
    assert page.evaluate("document.scrollingElement.scrollWidth") <= PHONE["width"]
    page.keyboard.press("Escape")
    expect(page.locator("nav.sections")).to_be_hidden()

    # At a laptop's width the sections are a row of links, as before: no menu to open.
    page.set_viewport_size(LAPTOP)
    expect(toggle).to_be_hidden()
    expect(page.locator("nav.sections a").last).to_be_visible()
    context.close()

    assert console.items == []
