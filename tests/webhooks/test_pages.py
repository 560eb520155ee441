"""The webhook pages in a real browser: a platform lead adds a webhook, sends a test, and
reads the delivery with its attempt (the receiver is a real local HTTP server)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from tests.browser import sign_in
from tests.support.waiting import wait_until
from tests.web.factories import PASSWORD, make_user
from tests.webhooks.conftest import Receiver

pytestmark = pytest.mark.slow


def test_a_lead_adds_a_webhook_sends_a_test_and_sees_it_delivered(
    live_server: Any, celery_worker: Any, browser: Browser, receiver: Receiver
) -> None:
    make_user("lena-lead", "platform-lead")
    page = browser.new_page()
    sign_in(page, f"{live_server.url}/webhooks/", "lena-lead", PASSWORD)
    page.get_by_role("link", name="New webhook").first.click()
    page.fill("#id_name", "oncall")
    page.fill("#id_url", "not a url")
    page.get_by_role("button", name="Create webhook").click()
    expect(page.get_by_text("Give an http:// or https:// URL")).to_be_visible()

    page.fill("#id_url", receiver.url)
    page.get_by_label("drain.automatic").check()
    page.fill("#id_secret", "s3cret")
    page.get_by_role("button", name="Create webhook").click()
    page.wait_for_url(f"{live_server.url}/webhooks/oncall/")
    expect(page.locator("h1")).to_have_text("Webhook oncall")

    page.get_by_role("button", name="Send a test").click()
    expect(page.locator(".message-success")).to_contain_text("Test delivery")
    # The worker delivers (the delivery and its attempt are one transaction); then the page
    # shows it.
    from fleetctl.webhooks.models import Delivery, Webhook

    wait_until(lambda: Delivery.objects.filter(webhook__name="oncall",
                                               status=Delivery.Status.DELIVERED).exists(),
               timeout_s=10, what="the worker to deliver the test")
    page.reload()
    expect(page.locator(".deliveries")).to_contain_text("HTTP 200")
    assert receiver.requests[0].headers["X-Fleetctl-Event"] == "webhook.test"

    # Deleting asks for the box to be ticked (no inline script: the page's CSP forbids it).
    page.get_by_role("button", name="Delete").click()  # the browser refuses: box unticked
    assert page.url == f"{live_server.url}/webhooks/oncall/"
    assert Webhook.objects.filter(name="oncall").exists()
    page.get_by_label("delete oncall and its delivery records").check()
    page.get_by_role("button", name="Delete").click()
    page.wait_for_url(f"{live_server.url}/webhooks/")
    expect(page.locator(".message-success")).to_contain_text("Deleted webhook oncall")
    assert not Webhook.objects.filter(name="oncall").exists()
