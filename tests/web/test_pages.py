"""Who may see which dashboard page, and what each page shows."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool, Region
from tests.web.factories import PASSWORD, make_pool, seed_probe_history

pytestmark = pytest.mark.django_db

LoginAs = Callable[[User], Client]


def page_urls(pool: Pool) -> list[str]:
    return [
        reverse("fleet:overview"),
        reverse("fleet:pool-detail", args=[pool.name]),
        reverse("fleet:pool-create"),
        reverse("fleet:pool-edit", args=[pool.name]),
        reverse("fleet:pool-delete", args=[pool.name]),
        reverse("fleet:region-list"),
        reverse("fleet:region-create"),
        reverse("audit:list"),
        reverse("audit:export"),
        reverse("accounts:tokens"),
    ]


def test_every_page_sends_an_anonymous_visitor_to_the_login_page(client: Client, pool: Pool):
    for url in page_urls(pool):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(f"{reverse('login')}?next="), url


def test_an_htmx_poll_from_an_expired_session_redirects_the_whole_page_to_login(client: Client):
    response = client.get(
        reverse("fleet:overview"), headers={"HX-Request": "true", "HX-Target": "summary-tiles",
                                            "HX-Current-URL": "http://testserver/?q=h200"},
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"{reverse('login')}?next=/%3Fq%3Dh200"


def test_login_says_clearly_when_the_password_is_wrong(client: Client, viewer: User):
    response = client.post(reverse("login"), {"username": viewer.username, "password": "nope"})
    assert response.status_code == 200
    assert "Wrong username or password" in response.content.decode()


def test_login_with_the_right_password_lands_on_the_fleet_overview(client: Client, viewer: User):
    response = client.post(reverse("login"), {"username": viewer.username, "password": PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == reverse("fleet:overview")


def test_a_person_without_a_role_gets_a_403_page_that_says_they_need_one(
    login_as: LoginAs, no_role_user: User, pool: Pool
):
    client = login_as(no_role_user)
    for url in page_urls(pool):
        response = client.get(url)
        assert response.status_code == 403, url
        assert "no fleetctl role" in response.content.decode(), url
    assert AuditEvent.objects.filter(actor=no_role_user.username, outcome="denied").exists()


def test_every_page_renders_for_a_viewer(login_as: LoginAs, viewer: User, pool: Pool):
    client = login_as(viewer)
    for url in page_urls(pool):
        response = client.get(url)
        assert response.status_code == 200, url


def test_no_page_prints_template_comment_text(login_as: LoginAs, viewer: User, pool: Pool):
    """A `{# … #}` comment spanning lines is not a comment to Django: its text is printed."""
    client = login_as(viewer)
    for url in [u for u in page_urls(pool) if u != reverse("audit:export")]:
        body = client.get(url).content.decode()
        assert "{#" not in body and "#}" not in body, url


def test_the_navigation_links_every_section(login_as: LoginAs, viewer: User):
    html = login_as(viewer).get(reverse("fleet:overview")).content.decode()
    assert 'href="/shadow/"' in html and "nav-disabled" not in html
    assert 'href="/plans/"' in html and 'href="/bench/"' in html
    assert 'href="/api/docs/"' in html
    assert 'href="/audit/"' in html
    assert "vera-viewer" in html and "viewer" in html
    assert f'action="{reverse("logout")}"' in html


def test_a_viewer_sees_no_buttons_that_change_the_fleet(
    login_as: LoginAs, viewer: User, pool: Pool
):
    client = login_as(viewer)
    overview = client.get(reverse("fleet:overview")).content.decode()
    detail = client.get(reverse("fleet:pool-detail", args=[pool.name])).content.decode()
    regions = client.get(reverse("fleet:region-list")).content.decode()
    assert reverse("fleet:pool-create") not in overview
    assert reverse("fleet:pool-edit", args=[pool.name]) not in detail
    assert reverse("fleet:pool-delete", args=[pool.name]) not in detail
    assert "Add model" not in detail and "Remove" not in detail
    assert reverse("fleet:region-create") not in regions
    form_page = client.get(reverse("fleet:pool-create")).content.decode()
    assert "fieldset" in form_page and " disabled" in form_page
    assert "needs the <code>platform-lead</code>" in form_page


def test_a_platform_lead_sees_the_buttons(login_as: LoginAs, lead: User, pool: Pool):
    client = login_as(lead)
    overview = client.get(reverse("fleet:overview")).content.decode()
    detail = client.get(reverse("fleet:pool-detail", args=[pool.name])).content.decode()
    assert reverse("fleet:pool-create") in overview
    assert reverse("fleet:pool-edit", args=[pool.name]) in detail
    assert reverse("fleet:pool-delete", args=[pool.name]) in detail
    assert "Add model" in detail and "Remove" in detail


def test_the_overview_shows_each_pool_with_what_people_compare(
    login_as: LoginAs, viewer: User, pool: Pool
):
    html = login_as(viewer).get(reverse("fleet:overview")).content.decode()
    assert reverse("fleet:pool-detail", args=[pool.name]) in html
    assert "NVIDIA CUDA" in html and "eu-west-1" in html and ">EU<" in html
    assert "llama-3.1-70b-instruct" in html and "fp8" in html
    assert "9.50 USD" in html
    assert "—, no benchmark yet" in html
    assert "never probed" in html
    assert 'id="summary-tiles"' in html and 'id="pool-groups"' in html
    assert 'hx-trigger="every 10s"' in html
    assert "every 15s" in html


def test_the_overview_says_what_to_do_when_there_are_no_pools(login_as: LoginAs, lead: User):
    html = login_as(lead).get(reverse("fleet:overview")).content.decode()
    assert "No pools registered yet" in html
    assert reverse("fleet:region-create") in html


def test_the_overview_filter_narrows_the_pools(login_as: LoginAs, viewer: User, region: Region):
    make_pool("h200-a", region, runtime="cuda")
    make_pool("mi300x-a", region, runtime="rocm")
    client = login_as(viewer)
    html = client.get(reverse("fleet:overview"), {"runtime": "rocm"}).content.decode()
    assert "mi300x-a" in html and "h200-a" not in html
    html = client.get(reverse("fleet:overview"), {"q": "h200"}).content.decode()
    assert "h200-a" in html and "mi300x-a" not in html
    html = client.get(
        reverse("fleet:overview"), {"model": "llama-3.1-70b-instruct", "jurisdiction": "EU"}
    ).content.decode()
    assert "h200-a" in html and "mi300x-a" in html
    html = client.get(reverse("fleet:overview"), {"health_state": "unhealthy"}).content.decode()
    assert "No pool matches these filters" in html


def test_the_tile_partial_is_only_the_tiles(login_as: LoginAs, viewer: User, pool: Pool):
    response = login_as(viewer).get(
        reverse("fleet:overview"), headers={"HX-Request": "true", "HX-Target": "summary-tiles"}
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert "unhealthy" in html and "jurisdictions" in html
    assert "<html" not in html and pool.name not in html


def test_the_pool_partial_keeps_the_filters(login_as: LoginAs, viewer: User, region: Region):
    make_pool("h200-a", region, runtime="cuda")
    make_pool("mi300x-a", region, runtime="rocm")
    response = login_as(viewer).get(
        reverse("fleet:overview"), {"runtime": "rocm"},
        headers={"HX-Request": "true", "HX-Target": "pool-groups"},
    )
    html = response.content.decode()
    assert "<html" not in html and "summary-tiles" not in html
    assert "mi300x-a" in html and "h200-a" not in html


def test_the_pool_page_draws_probe_latency_with_the_numbers_one_click_away(
    login_as: LoginAs, viewer: User, pool: Pool
):
    seed_probe_history(pool)
    html = login_as(viewer).get(reverse("fleet:pool-detail", args=[pool.name])).content.decode()
    assert html.count("plotly.min.js") == 1
    assert 'id="health-chart"' in html and 'id="health-chart-data"' in html
    assert "failed probe" in html  # the red trace's name, inside the figure JSON
    assert "<details" in html and "connect timeout after 5 s" in html
    assert f"/api/v1/health-checks/?pool={pool.name}" in html
    assert f"/audit/?object_type=fleet.pool&amp;object_id={pool.pk}" in html
    assert "unknown</span> →" in html  # the transition to healthy
    assert "team</strong>=serving" in html


def test_a_pool_page_without_probes_says_so_and_loads_no_chart_library(
    login_as: LoginAs, viewer: User, pool: Pool
):
    html = login_as(viewer).get(reverse("fleet:pool-detail", args=[pool.name])).content.decode()
    assert "No probes in the last 24 h" in html
    assert "plotly.min.js" not in html


def test_an_unknown_pool_is_a_404(login_as: LoginAs, viewer: User):
    response = login_as(viewer).get(reverse("fleet:pool-detail", args=["nope"]))
    assert response.status_code == 404
