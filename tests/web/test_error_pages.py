"""The error pages a person can meet: each fits a phone's screen, and the 500 page prints the
request's id (the id the log keeps beside the traceback) instead of pointing at a response
header that a browser does not show."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.web.failing_urls")]

VIEWPORT = '<meta name="viewport" content="width=device-width, initial-scale=1">'


def browser() -> Client:
    return Client(raise_request_exception=False)


def test_a_view_that_raises_answers_a_500_page_that_prints_the_request_id():
    response = browser().get("/breaks/")

    html = response.content.decode()
    assert response.status_code == 500
    request_id = response["X-Request-ID"]
    assert len(request_id) == 32
    assert f'<code class="request-id">{request_id}</code>' in html
    assert VIEWPORT in html
    assert "X-Request-ID" not in html and "a bug in a view" not in html


def test_the_500_page_prints_the_callers_own_request_id_when_it_sent_a_plain_one():
    response = browser().get("/breaks/", headers={"X-Request-ID": "ci-42"})

    assert response.status_code == 500
    assert '<code class="request-id">ci-42</code>' in response.content.decode()


def test_an_api_call_that_breaks_answers_the_apis_error_shape_with_the_request_id():
    response = browser().get("/api/v1/breaks/")

    assert response.status_code == 500
    error = json.loads(response.content)["error"]
    assert error["code"] == "server_error"
    assert response["X-Request-ID"] in error["message"]


def test_the_not_found_page_fits_a_phone(viewer: User):
    client = browser()
    client.force_login(viewer)

    response = client.get("/pools/no-such-pool/")

    assert response.status_code == 404
    assert VIEWPORT in response.content.decode()


def test_an_expired_form_answers_a_403_page_that_fits_a_phone_and_says_what_to_do():
    client = Client(enforce_csrf_checks=True)

    response = client.post("/login/", {"username": "someone", "password": "x"})

    html = response.content.decode()
    assert response.status_code == 403
    assert VIEWPORT in html and "This form has expired" in html


def test_a_request_for_a_host_fleetctl_does_not_serve_answers_a_400_page_that_fits_a_phone():
    response = browser().get("/login/", HTTP_HOST="fleetctl.attacker.example")

    assert response.status_code == 400
    assert VIEWPORT in response.content.decode()
