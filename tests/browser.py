"""The real browser the dashboard tests drive: Debian's Chromium through Playwright."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
# How long an `expect(...)` keeps retrying before it fails (Playwright's default is 5 s).
# The pages answer in milliseconds, but on a loaded machine a live server, a Celery worker
# and Chromium share two cores; retrying longer costs nothing when the condition holds.
EXPECT_TIMEOUT_MS = 20_000


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    # Playwright's sync API runs an asyncio loop in this thread and Django refuses ORM calls
    # from such a thread. Tests seed before the browser starts (or write from a thread of
    # their own); this only keeps a check added later from failing for the wrong reason.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    if not CHROMIUM.exists():
        pytest.fail(f"Chromium is not installed at {CHROMIUM}; `apt-get install chromium`.")
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def sign_in(page: Page, url: str, username: str, password: str) -> None:
    """Open `url`, sign in on the login page it sends an anonymous visitor to, and land on it."""
    page.goto(url)
    page.wait_for_url("**/login/**")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(url)
