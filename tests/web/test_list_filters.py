"""A dashboard list whose filter cannot read a value says which, on its filter form, and lists
nothing: not a 500, and not everything as if no filter had been given."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from fleetctl.fleet.models import Pool

pytestmark = pytest.mark.django_db

LoginAs = Callable[[User], Client]


@pytest.mark.parametrize(("url", "query", "says"), [
    ("/", {"runtime": "cuda12"}, "“cuda12” is not a valid runtime; allowed: cuda, rocm, tpu"),
    ("/", {"jurisdiction": "XX"}, "“XX” is not a valid jurisdiction; allowed: AE, AU"),
    ("/audit/", {"outcome": "maybe"}, "“maybe” is not a valid outcome; allowed: ok, denied, "
                                      "failed."),
    ("/audit/", {"since": "yesterday"}, "“yesterday” is not a valid since; allowed: a "
                                        "date-time in ISO 8601"),
    ("/bench/", {"status": "bogus"}, "“bogus” is not a valid status; allowed: "),
    ("/conformance/", {"verdict": "bogus"}, "“bogus” is not a valid verdict; allowed: "),
    ("/shadow/", {"status": "bogus"}, "“bogus” is not a valid status; allowed: "),
])
def test_a_filter_value_a_list_page_cannot_read_is_shown_on_its_form_and_lists_nothing(
        login_as: LoginAs, viewer: User, pool: Pool, url, query, says):
    response = login_as(viewer).get(url, query)

    assert response.status_code == 200
    html = response.content.decode()
    assert says in html and "Nothing is listed until the filter is corrected." in html


def test_the_overview_lists_no_pool_for_a_filter_it_cannot_read(
        login_as: LoginAs, viewer: User, pool: Pool):
    client = login_as(viewer)

    bad = client.get("/", {"runtime": "cuda12"})
    good = client.get("/", {"runtime": pool.runtime})

    def listed(response):
        return [p.name for _, regions in response.context["groups"]
                for _, pools in regions for p in pools]

    assert listed(good) == [pool.name]
    assert listed(bad) == [] and bad.context["shown"] == 0


def test_the_audit_page_and_its_export_list_nothing_for_a_filter_they_cannot_read(
        login_as: LoginAs, viewer: User, pool: Pool):
    client = login_as(viewer)

    page = client.get("/audit/", {"outcome": "maybe"})
    export = client.get("/audit/export.csv", {"outcome": "maybe"})

    assert page.context["rows"] == []
    rows = b"".join(export.streaming_content).decode().strip().splitlines()
    assert len(rows) == 1  # the header only
