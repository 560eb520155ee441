"""The People page in a real browser (Chromium through Playwright): an admin invites someone,
the invited person sets a password with the one-time link and signs in, the admin disables
them and their open session ends; no console error (CSP included) or failed request.

Set FLEETCTL_SCREENSHOTS=1 to also write docs/screenshots/people.png and person.png."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.web.factories import PASSWORD, make_user
from tests.web.test_browser import Problems

pytestmark = [pytest.mark.slow, pytest.mark.browser]

NEW_PASSWORD = "plum-orchard-lantern-907"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def shoot(page: Page, name: str) -> None:
    if os.environ.get("FLEETCTL_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


@pytest.fixture
def people(transactional_db: None) -> None:
    make_user("ada", "admin")
    make_user("vera", "viewer")


def sign_in(page: Page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def test_invite_set_password_sign_in_then_disable(live_server: Any, people: None,
                                                  browser: Browser):
    base = live_server.url
    admin = browser.new_context(viewport={"width": 1366, "height": 768}).new_page()
    admin_problems = Problems(admin)
    sign_in(admin, base, "ada", PASSWORD)
    admin.get_by_role("link", name="People").click()
    admin.wait_for_url(f"{base}/people/")
    expect(admin.locator("tr[data-person=vera]")).to_contain_text("viewer")

    admin.fill("#id_username", "bo")
    admin.fill("#id_email", "bo@example.org")
    admin.get_by_label("viewer — reads everything").uncheck()
    admin.get_by_label("on-call — also drains, restores, ramps and starts jobs").check()
    admin.get_by_role("button", name="Invite").click()
    expect(admin.locator("#invite-title")).to_contain_text("bo is invited")
    link = admin.locator("#invite-link").input_value()
    assert link.startswith(f"{base}/account/set-password/")
    expect(admin.locator("tr[data-person=bo]")).to_contain_text("on-call")
    expect(admin.locator("tr[data-person=bo]")).to_contain_text("invited, no password yet")
    shoot(admin, "people.png")

    invited = browser.new_context().new_page()
    invited_problems = Problems(invited)
    invited.goto(link)
    invited.fill("#id_new_password1", NEW_PASSWORD)
    invited.fill("#id_new_password2", NEW_PASSWORD)
    invited.get_by_role("button", name="Set password").click()
    invited.wait_for_url(f"{base}/login/")
    expect(invited.get_by_text("Your password is set.")).to_be_visible()
    sign_in(invited, base, "bo", NEW_PASSWORD)
    expect(invited.locator(".session .roles")).to_have_text("on-call")
    expect(invited.get_by_role("link", name="People")).to_have_count(0)

    admin.locator("tr[data-person=bo] a").click()
    admin.wait_for_url(f"{base}/people/bo/")
    admin.get_by_role("button", name="Disable bo").click()
    expect(admin.get_by_role("status")).to_contain_text("bo is disabled")
    expect(admin.get_by_role("button", name="Enable bo")).to_be_visible()
    shoot(admin, "person.png")

    invited.goto(f"{base}/")
    invited.wait_for_url(f"{base}/login/?next=/")

    assert admin_problems.items == []
    assert invited_problems.items == []
