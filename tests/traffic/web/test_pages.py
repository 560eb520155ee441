"""Who sees which traffic page, and what each page shows."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from fleetctl.traffic import push, services
from fleetctl.traffic.models import Drain, Gateway, Route
from tests.traffic.web.conftest import SYSTEM, make_route

# These gateways are never reached (no worker runs here); Envoy rows need a config dir.
NO_ENVOY = {"config_dir": "/nonexistent/fleetctl-test"}

pytestmark = pytest.mark.django_db


def drained(route: Route) -> Drain:
    """A route drain, taken to the end the way the watcher task would (no gateway here)."""
    drain = services.drain_request(actor=SYSTEM, route=route, reason="canary errors")
    push.drain_progress(drain_id=drain.pk)
    drain.refresh_from_db()
    return drain


def page_urls(route: Route, drain: Drain) -> list[str]:
    return [
        reverse("traffic:routes"),
        reverse("traffic:route-detail", args=[route.name]),
        reverse("traffic:route-drain", args=[route.name]),
        reverse("traffic:pool-drain", args=["mi300x-us"]),
        reverse("traffic:drains"),
        reverse("traffic:drain-detail", args=[drain.pk]),
        reverse("traffic:drain-restore", args=[drain.pk]),
    ]


def test_every_traffic_page_sends_an_anonymous_visitor_to_the_login_page(
    client: Client, route: Route
):
    for url in page_urls(route, drained(route)):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(f"{reverse('login')}?next="), url


def test_every_traffic_page_renders_for_a_viewer_without_drain_or_ramp_buttons(
    viewer: Client, route: Route
):
    drain = drained(route)
    for url in page_urls(route, drain):
        assert viewer.get(url).status_code == 200, url
    routes = viewer.get(reverse("traffic:routes")).content.decode()
    assert reverse("traffic:route-drain", args=[route.name]) not in routes
    assert reverse("traffic:pool-drain", args=["mi300x-us"]) not in routes
    detail = viewer.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    assert reverse("traffic:route-ramp", args=[route.name]) not in detail
    assert reverse("traffic:route-drain", args=[route.name]) not in detail
    assert "Changing the split needs the <code>on-call</code>" in detail
    progress = viewer.get(reverse("traffic:drain-detail", args=[drain.pk])).content.decode()
    assert reverse("traffic:drain-restore", args=[drain.pk]) not in progress
    confirm = viewer.get(reverse("traffic:route-drain", args=[route.name])).content.decode()
    assert "<fieldset disabled>" in confirm and "Draining needs the <code>on-call</code>" in confirm


def test_the_navigation_links_the_traffic_section_and_marks_it_current(
    viewer: Client, route: Route
):
    html = viewer.get(reverse("traffic:routes")).content.decode()
    assert f'<a href="{reverse("traffic:routes")}" aria-current="page">Traffic</a>' in html


def test_the_routes_page_shows_each_route_its_split_and_its_gateways(
    oncall: Client, route: Route
):
    make_route("llama-eu", primary="h200-eu", residency="EU", latency_class="interactive")
    gateway = services.gateway_create(actor=SYSTEM, name="edge-1", kind="envoy",
                                      admin_address="http://127.0.0.1:9901",
        options=NO_ENVOY, routes=[route])
    Gateway.objects.filter(pk=gateway.pk).update(
        state=Gateway.State.FAILING, last_error="connection refused by 127.0.0.1:9901")
    html = oncall.get(reverse("traffic:routes")).content.decode()
    assert reverse("traffic:route-detail", args=["llama"]) in html
    assert "llama-3.1-8b-instruct" in html and "interactive" in html
    assert 'class="jurisdiction" title="pinned: only pools in European Union">EU<' in html
    assert "h200-us <strong>95 %</strong>" in html and "mi300x-us <strong>5 %</strong>" in html
    assert "h200-eu <strong>100 %</strong>" in html
    assert "r2" in html and "r1" in html
    # State is a word as well as a colour, and a failing gateway says why.
    assert "▲</span> failing" in html and "connection refused by 127.0.0.1:9901" in html
    assert reverse("traffic:route-drain", args=["llama"]) in html
    # llama-eu has everything on its primary: no route drain to offer, but its pool can go.
    assert reverse("traffic:route-drain", args=["llama-eu"]) not in html
    assert reverse("traffic:pool-drain", args=["h200-eu"]) in html
    assert html.count('hx-trigger="every 5s"') == 2


def test_the_gateway_and_drain_blocks_refresh_alone(oncall: Client, route: Route):
    services.gateway_create(actor=SYSTEM, name="edge-1", kind="haproxy",
                            admin_address="/run/haproxy.sock", routes=[route],
                            options={"bind": "127.0.0.1:1", "config_path": "/nonexistent",
                                     "master_socket": "/nonexistent"})
    drain = drained(route)
    gateways = oncall.get(reverse("traffic:routes"),
                          headers={"HX-Request": "true", "HX-Target": "gateways"})
    html = gateways.content.decode()
    assert "<html" not in html and "edge-1" in html and "HAProxy" in html
    assert "? unknown" in html.replace("</span>", "") and "llama" in html
    drains = oncall.get(reverse("traffic:routes"),
                        headers={"HX-Request": "true", "HX-Target": "recent-drains"})
    html = drains.content.decode()
    assert "<html" not in html and "edge-1" not in html
    assert reverse("traffic:drain-detail", args=[drain.pk]) in html


def test_the_routes_page_says_what_to_do_when_there_are_no_routes(viewer: Client):
    html = viewer.get(reverse("traffic:routes")).content.decode()
    assert "No routes yet" in html and "No gateway registered yet" in html
    assert "No drain yet" in html


def test_the_route_page_draws_the_split_and_lists_gateways_with_their_latest_push(
    viewer: Client, route: Route
):
    services.gateway_create(actor=SYSTEM, name="edge-1", kind="envoy",
                            admin_address="http://127.0.0.1:9901",
        options=NO_ENVOY, routes=[route])
    html = viewer.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    assert html.count("plotly.min.js") == 1
    assert 'id="split-chart-data"' in html and "Current split (revision 2)" in html
    assert "edge-1" in html and "r2 <span class=\"push-pending\">pending</span>" in html
    assert "No traffic samples for this route" in html


def test_an_unknown_route_pool_or_drain_is_a_404(viewer: Client, pools: object):
    for url in (reverse("traffic:route-detail", args=["nope"]),
                reverse("traffic:route-drain", args=["nope"]),
                reverse("traffic:pool-drain", args=["nope"]),
                reverse("traffic:drain-detail", args=[999])):
        assert viewer.get(url).status_code == 404, url


def test_a_drain_page_polls_every_half_second_until_the_drain_is_complete(
    oncall: Client, route: Route
):
    drain = services.drain_request(actor=SYSTEM, route=route, reason="canary errors")
    url = reverse("traffic:drain-detail", args=[drain.pk])
    html = oncall.get(url).content.decode()
    assert 'hx-trigger="every 500ms"' in html
    assert "pushing" in html and "Restore…" not in html

    push.drain_progress(drain_id=drain.pk)  # what the watcher task does
    block = oncall.get(url, headers={"HX-Request": "true", "HX-Target": "drain-progress"})
    html = block.content.decode()
    assert "<html" not in html and 'id="drain-progress"' in html
    assert "hx-trigger" not in html and "complete" in html
    assert "no gateway carries these routes" in html
    assert reverse("traffic:drain-restore", args=[drain.pk]) in html
    assert "Finished; no longer refreshing." in html


def test_the_drain_list_shows_drains_and_restores_newest_first_with_their_times(
    viewer: Client, route: Route
):
    first = drained(route)
    restore = services.drain_restore(actor=SYSTEM, drain=first, reason="fixed")
    push.drain_progress(drain_id=restore.pk)
    html = viewer.get(reverse("traffic:drains")).content.decode()
    assert html.index(f">{restore.pk}</a>") < html.index(f">{first.pk}</a>")
    assert "restored by" in html and " ms</td>" in html
    assert "llama r3" in html and "llama r4" in html


def test_the_drain_list_pages_fifty_at_a_time(viewer: Client, route: Route):
    for i in range(26):
        drain = drained(route)
        restore = services.drain_restore(actor=SYSTEM, drain=drain, reason=f"r{i}")
        push.drain_progress(drain_id=restore.pk)
    first = viewer.get(reverse("traffic:drains")).content.decode()
    assert "page 1 of 2" in first and first.count('class="badge drain-') == 50
    second = viewer.get(reverse("traffic:drains"), {"page": 2}).content.decode()
    assert second.count('class="badge drain-') == 2


def test_the_route_page_says_what_share_is_mirrored_and_for_whom(oncall: Client, route: Route):
    url = reverse("traffic:route-detail", args=[route.name])
    assert "not mirrored" in oncall.get(url).content.decode()
    Route.objects.filter(pk=route.pk).update(mirror_percent=12.5, mirror_owner="shadow run 7")
    html = oncall.get(url).content.decode()
    assert "12.5 % of requests copied to the shadow collector" in html
    assert "for shadow run 7" in html and "not mirrored" not in html


def test_the_gateways_table_says_haproxy_cannot_mirror(oncall: Client, route: Route):
    services.gateway_create(actor=SYSTEM, name="edge-envoy", kind="envoy",
                            admin_address="http://127.0.0.1:9901", options=NO_ENVOY,
                            routes=[route])
    services.gateway_create(actor=SYSTEM, name="edge-haproxy", kind="haproxy",
                            admin_address="/run/haproxy.sock", routes=[route],
                            options={"bind": "127.0.0.1:1", "config_path": "/nonexistent",
                                     "master_socket": "/nonexistent"})
    html = oncall.get(reverse("traffic:routes")).content.decode()
    assert html.count("cannot mirror: shadow runs replay a trace instead") == 1
    row = html[html.index("<strong>edge-haproxy</strong>"):]
    assert "cannot mirror" in row[:row.index("</tr>")]
