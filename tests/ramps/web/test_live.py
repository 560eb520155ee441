"""Live telemetry on the fleet overview, a pool's page and a route's page, read from Window
rows written directly (as the ingester would): the right figures with their sources, and a
dash, never a zero, where there is no data."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from fleetctl.telemetry import histogram
from fleetctl.traffic.models import Route
from tests.ramps.web.conftest import add_window, ms_text

pytestmark = pytest.mark.django_db


def p95_of(ms: float, n: int = 100) -> str:
    h: dict[str, int] = {}
    histogram.add(h, ms, n)
    value = histogram.quantile(h, 0.95)
    assert value is not None
    return ms_text(value)


def cells(html: str, marker: str, css: str) -> list[str]:
    """The text of each `css` cell in the row (or block) that holds `marker`."""
    row = html[html.index(marker):]
    row = row[:row.index("</tr>")] if "</tr>" in row[:4000] else row[:4000]
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(
        rf'class="[^"]*{css}[^"]*"[^>]*>(.*?)</(?:t[dh]|span)>', row, re.S)]


def test_the_overview_shows_each_pools_last_minute_and_a_dash_without_data(
        oncall: Client, route: Route):
    add_window(pool="mi300x-us", requests=200, errors=3, ttft_ms=420)
    html = oncall.get(reverse("fleet:overview")).content.decode()
    assert cells(html, ">mi300x-us</a>", "live-ttft") == [p95_of(420, 200)]
    assert cells(html, ">mi300x-us</a>", "live-errors") == ["1.50 %"]
    rps = cells(html, ">mi300x-us</a>", "live-rps")[0]
    assert rps.endswith("/s") and float(rps[:-2]) > 0
    assert "gateway envoy-a access log" in html  # the source, in the tooltip
    # h200-eu has no window: dashes, not zeros.
    for css in ("live-ttft", "live-errors", "live-rps"):
        assert cells(html, ">h200-eu</a>", css) == ["—"], css
    # The htmx refresh of the pool table carries the same figures.
    partial = oncall.get(reverse("fleet:overview"),
                         headers={"HX-Request": "true", "HX-Target": "pool-groups"})
    assert p95_of(420, 200) in partial.content.decode()


def test_a_window_older_than_a_minute_is_not_live(oncall: Client, route: Route):
    add_window(pool="mi300x-us", ago_s=300, ttft_ms=420)
    html = oncall.get(reverse("fleet:overview")).content.decode()
    assert cells(html, ">mi300x-us</a>", "live-ttft") == ["—"]


def test_the_pool_page_shows_live_figures_tpot_chart_routes_and_plans(
        oncall: Client, route: Route):
    add_window(pool="mi300x-us", requests=120, ttft_ms=300)
    add_window(pool="mi300x-us", source="pool", requests=120, ttft_ms=None, tpot_ms=35)
    html = oncall.get(reverse("fleet:pool-detail", args=["mi300x-us"])).content.decode()
    block = html[html.index('class="card pool-live"'):]
    assert re.search(rf'class="live-ttft"[^>]*>{re.escape(p95_of(300, 120))}<', block)
    assert re.search(rf'class="live-tpot" title="pool /metrics[^"]*">'
                     rf'{re.escape(p95_of(35, 120))}<', block)
    assert re.search(r'class="live-errors"[^>]*>0.00 %<', block)
    assert 'data-plotly-figure="pool-live-data"' in block and "plotly.min.js" in html
    # It carries route llama at 5 %, and is in no plan.
    assert re.search(r'data-route="llama">.*?5 %</td>', block, re.S)
    assert "In no migration plan." in block


def test_a_pool_without_telemetry_shows_dashes_and_no_chart(oncall: Client, route: Route):
    html = oncall.get(reverse("fleet:pool-detail", args=["h200-eu"])).content.decode()
    block = html[html.index('class="card pool-live"'):]
    for css in ("live-ttft", "live-tpot", "live-errors", "live-rps"):
        assert re.search(rf'class="{css}"[^>]*>—<', block), css
    assert "No telemetry for this pool in the last 30 minutes." in block
    assert "No route gives this pool weight now." in block


def test_the_route_page_shows_each_weighted_pool_on_this_route_only(
        oncall: Client, route: Route):
    add_window(pool="h200-us", requests=400, errors=0, ttft_ms=250)
    add_window(pool="mi300x-us", requests=40, errors=2, ttft_ms=600)
    # Another route's traffic to the same pool does not count on this page.
    add_window(pool="mi300x-us", route_name="other", requests=1000, errors=500, ttft_ms=5000)
    html = oncall.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    assert cells(html, 'data-pool="h200-us"', "live-ttft") == [p95_of(250, 400)]
    assert cells(html, 'data-pool="mi300x-us"', "live-ttft") == [p95_of(600, 40)]
    assert cells(html, 'data-pool="mi300x-us"', "live-errors") == ["5.00 %"]
    assert cells(html, 'data-pool="h200-us"', "live-errors") == ["0.00 %"]


def test_the_route_page_shows_dashes_without_data(oncall: Client, route: Route):
    html = oncall.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    for pool in ("h200-us", "mi300x-us"):
        for css in ("live-ttft", "live-errors", "live-rps"):
            assert cells(html, f'data-pool="{pool}"', css) == ["—"], (pool, css)


def test_client_disconnects_are_shown_beside_the_error_rate_and_never_in_it(
        oncall: Client, route: Route):
    from tests.ramps.web.conftest import make_ramp

    # Recent windows (12-22 s old): the ramp page below reads its last 30 s, and a loaded
    # machine takes seconds to render the pages before it.
    add_window(pool="h200-us", requests=400, errors=0, ttft_ms=250, ago_s=12)
    # 40 answered (2 of them errors) and 60 abandoned by their clients.
    window = add_window(pool="mi300x-us", requests=40, errors=2, ttft_ms=600, ago_s=12)
    window.client_disconnects = 60
    window.save(update_fields=["client_disconnects"])
    html = oncall.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    assert cells(html, 'data-pool="mi300x-us"', "live-errors") == ["5.00 %"]
    assert cells(html, 'data-pool="mi300x-us"', "live-disconnects") == ["60 (60.00 %)"]
    assert cells(html, 'data-pool="h200-us"', "live-disconnects") == ["0"]
    assert "Client disconnects" in html
    pool = oncall.get(reverse("fleet:pool-detail", args=["mi300x-us"])).content.decode()
    block = pool[pool.index('class="card pool-live"'):]
    assert re.search(r'class="live-errors"[^>]*>5.00 %<', block)
    assert re.search(r'class="live-disconnects"[^>]*>60 \(60.00 %\)<', block)
    overview = oncall.get(reverse("fleet:overview")).content.decode()
    assert cells(overview, ">mi300x-us</a>", "live-errors") == ["5.00 %"]
    assert cells(overview, ">mi300x-us</a>", "live-disconnects") == ["+60 (60.00 %) abandoned"]
    assert cells(overview, ">h200-us</a>", "live-disconnects") == []  # none: nothing said
    # The ramp page's "what the guard reads now" has them in a column of their own.
    ramp = make_ramp(route)
    live = oncall.get(reverse("ramps:detail", args=[ramp.pk])).content.decode()
    now = live[live.index('class="compact ramp-now"'):]
    assert cells(now, 'data-pool="mi300x-us"', "ramp-now-disconnects") == ["60 60.00 %"]
    assert "Client disconnects" in now
    # A pool without data: a dash, not a zero.
    empty = oncall.get(reverse("fleet:pool-detail", args=["h200-eu"])).content.decode()
    assert re.search(r'class="live-disconnects"[^>]*>—<', empty)


def test_a_prometheus_telemetry_source_is_shown_beside_the_guard_and_never_in_it(
        oncall: Client, route: Route):
    """A Prometheus's windows (source "prometheus", pool-wide) are listed under what the
    guard reads, labelled by source; the guard's own figures stay the gateways'."""
    from fleetctl.telemetry.models import Cursor, Window
    from tests.ramps.web.conftest import make_ramp

    add_window(pool="h200-us", requests=400, ttft_ms=250, ago_s=12)
    add_window(pool="mi300x-us", requests=40, ttft_ms=600, ago_s=12)
    gateway = Window.objects.get(pool="mi300x-us")
    ttft: dict[str, int] = {}
    histogram.add(ttft, 90.0, 500)
    Window.objects.create(source="prometheus", source_name="prom", route="", pool="mi300x-us",
                          resolution_s=10, start=gateway.start, requests=500, ttft=ttft,
                          duration=ttft, updated_at=gateway.updated_at)
    for pool in ("mi300x-us", "h200-us"):
        Cursor.objects.create(source_name="prom", path=f"prometheus:{pool}",
                              last_read_at=gateway.updated_at,
                              last_error="" if pool == "mi300x-us" else "no series: …")
    ramp = make_ramp(route)
    live = oncall.get(reverse("ramps:detail", args=[ramp.pk])).content.decode()
    now = live[live.index('class="compact ramp-now"'):]
    # The guard's row: the gateway's 40 requests at 600 ms, not Prometheus's 500 at 90 ms.
    row = now[now.index('data-pool="mi300x-us"'):]
    assert ">40<" in row[:row.index("</tr>")] and p95_of(600, 40) in row[:row.index("</tr>")]
    beside = now[now.index('class="small muted ramp-reported"'):]
    line = beside[beside.index('data-pool="mi300x-us"'):]
    line = re.sub(r"<[^>]+>", "", line[:line.index("</li>")])
    assert "from Prometheus prom, pool-wide (every route), not judged" in line
    assert f"TTFT p95 {p95_of(90, 500)}" in line
    assert "no series" in beside[beside.index('data-pool="h200-us"'):]
    pool = oncall.get(reverse("fleet:pool-detail", args=["mi300x-us"])).content.decode()
    block = pool[pool.index('class="pool-reported" data-source="prom"'):]
    assert re.search(rf'class="reported-ttft"[^>]*>{p95_of(90, 500)}<', block)
    assert re.search(r'class="live-ttft"[^>]*>' + p95_of(600, 40) + "<", pool)
