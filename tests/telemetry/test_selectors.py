"""pool_stats, pool_series, live_summary and ingest_status on windows written directly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from django.utils import timezone

from fleetctl.inference.confidence import wilson_interval
from fleetctl.telemetry import histogram, selectors
from fleetctl.telemetry.models import Cursor
from fleetctl.telemetry.services import window_add, window_start

pytestmark = pytest.mark.django_db


def _h(values: Any) -> dict[str, int]:
    h: dict[str, int] = {}
    for value in values:
        histogram.add(h, float(value))
    return h


def _window(start: datetime, *, gateway: str = "gw-a", route: str = "chat",
            pool: str = "pa", requests: int = 0, errors: int = 0, streamed: int = 0,
            ttft: dict[str, int] | None = None, source: str = "gateway",
            tpot: dict[str, int] | None = None) -> None:
    window_add(source=source, source_name=gateway, route=route, pool=pool, resolution_s=10,
               start=start, counts={"requests": requests, "errors": errors,
                                    "streamed": streamed},
               histograms={"ttft": ttft or {}, "tpot": tpot or {}, "duration": ttft or {}})


def test_pool_stats_merges_gateways_and_windows_with_bounds() -> None:
    now = timezone.now()
    t0 = window_start(now.timestamp(), 10) - timedelta(seconds=30)
    rng = np.random.default_rng(3)
    a, b = rng.lognormal(5, 0.5, 300), rng.lognormal(5, 0.5, 200)
    _window(t0, requests=300, errors=6, streamed=300, ttft=_h(a))
    _window(t0 + timedelta(seconds=10), gateway="gw-b", requests=200, errors=4,
            streamed=200, ttft=_h(b))
    _window(t0, route="other", requests=1000, errors=500)  # another route
    _window(t0, pool="pb", requests=50)  # another pool
    _window(t0, source="pool", gateway="pa", route="", tpot=_h(rng.lognormal(3, 0.3, 80)))
    _window(t0 - timedelta(minutes=10), requests=99)  # before `since`
    stats = selectors.pool_stats(pool="pa", route="chat", since=t0, until=t0 +
                                 timedelta(seconds=20))
    assert (stats.requests, stats.errors, stats.streamed) == (500, 10, 500)
    expected = wilson_interval(10, 500, 0.99)
    assert stats.error_rate.value == pytest.approx(0.02)
    assert (stats.error_rate.low, stats.error_rate.high) == (expected.lower, expected.upper)
    exact = float(np.quantile(np.concatenate([a, b]), 0.95))
    assert stats.ttft_p95.n == 500
    assert abs(stats.ttft_p95.value - exact) <= exact * histogram.RELATIVE_ERROR
    assert stats.ttft_p95.low <= exact <= stats.ttft_p95.high
    assert "gateways gw-a, gw-b access logs" in stats.ttft_p95.source
    # Neither gateway is registered (deleted since): what their TTFT measured is not known.
    assert "gateway no longer registered" in stats.ttft_p95.source
    assert stats.tpot_p95.n == 80 and "vllm:time_per_output_token_seconds" in \
        stats.tpot_p95.source
    assert stats.sources == ["gw-a", "gw-b", "pool /metrics"]
    assert stats.rps == pytest.approx(500 / 20)
    assert stats.last_data_at is not None
    # All routes together.
    assert selectors.pool_stats(pool="pa", since=t0, until=t0 + timedelta(seconds=20)
                                ).requests == 1500


def test_edge_windows_count_whole_and_no_data_is_not_zero() -> None:
    t0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    _window(t0, requests=10)
    assert selectors.pool_stats(pool="pa", since=t0 + timedelta(seconds=9),
                                until=t0 + timedelta(seconds=11)).requests == 10
    assert selectors.pool_stats(pool="pa", since=t0 + timedelta(seconds=10),
                                until=t0 + timedelta(seconds=20)).requests == 0
    empty = selectors.pool_stats(pool="nothing", since=t0, until=t0 + timedelta(minutes=1))
    assert empty.requests == 0 and empty.last_data_at is None
    for figure in (empty.error_rate, empty.ttft_p95, empty.tpot_p95, empty.duration_p95):
        assert (figure.value, figure.low, figure.high, figure.n) == (None, None, None, 0)
    assert "no data" in empty.ttft_p95.source


def test_pool_series_steps() -> None:
    t0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    for i in range(6):
        _window(t0 + timedelta(seconds=10 * i), requests=10 + i, errors=i, streamed=1,
                ttft=_h([100.0]))
    series = selectors.pool_series(pool="pa", since=t0, until=t0 + timedelta(minutes=1))
    assert [p["requests"] for p in series] == [10, 11, 12, 13, 14, 15]
    assert series[1]["error_rate"] == pytest.approx(1 / 11)
    assert series[0]["ttft_p95"] == pytest.approx(histogram.value_of(histogram.bucket_of(100)))
    assert series[0]["tpot_p95"] is None
    minute = selectors.pool_series(pool="pa", since=t0, until=t0 + timedelta(minutes=1),
                                   resolution_s=60)
    assert len(minute) == 1 and minute[0]["requests"] == 75 and minute[0]["rps"] == 75 / 60


def test_live_summary_lists_every_pool(make_pool: Any) -> None:
    make_pool("pa")
    make_pool("pb")
    now = window_start(timezone.now().timestamp(), 10)
    _window(now, requests=4, errors=1)
    _window(now, source="pool", gateway="pb", route="", pool="pb", tpot=_h([20.0]))
    _window(now, pool="gone", requests=5)  # not a pool (deleted): not listed
    summary = selectors.live_summary(window_s=60)
    assert list(summary) == ["pa", "pb"]
    assert summary["pa"].requests == 4 and summary["pa"].error_rate.value == 0.25
    assert summary["pb"].requests == 0 and summary["pb"].tpot_p95.n == 1
    assert list(selectors.live_summary(pools=["pb"])) == ["pb"]


def test_live_summary_is_a_few_queries(make_pool: Any,
                                       django_assert_max_num_queries: Any) -> None:
    for i in range(20):
        make_pool(f"p{i}")
    now = window_start(timezone.now().timestamp(), 10)
    for i in range(20):
        _window(now, pool=f"p{i}", requests=i)
    # Pools, gateway windows, the pools' own (and Prometheus) windows, gateway kinds, and
    # the Prometheus telemetry sources' state.
    with django_assert_max_num_queries(5):
        assert len(selectors.live_summary()) == 20
    with django_assert_max_num_queries(3):
        selectors.pool_stats(pool="p3", since=now)


def test_the_ttft_source_says_what_each_gateway_kind_measured(make_pool: Any,
                                                              system: Any) -> None:
    """Envoy logs the first byte of the answer's body; HAProxy and nginx only the response
    headers, which a pool may send before its first token: the figure says which it is."""
    from fleetctl.traffic.models import Gateway

    make_pool("pa")
    Gateway.objects.create(name="gw-envoy", kind="envoy", admin_address="http://127.0.0.1:1")
    Gateway.objects.create(name="gw-nginx", kind="nginx", admin_address="/tmp/nginx")
    t0 = window_start(timezone.now().timestamp(), 10)
    _window(t0, gateway="gw-envoy", requests=10, streamed=10, ttft=_h([100] * 10))
    envoy_only = selectors.pool_stats(pool="pa", since=t0)
    assert envoy_only.ttft_p95.source == (
        "gateway gw-envoy access log (first body byte of streamed answers)")
    _window(t0, gateway="gw-nginx", requests=10, streamed=10, ttft=_h([20] * 10))
    both = selectors.pool_stats(pool="pa", since=t0)
    assert both.ttft_p95.source == (
        "gateway gw-envoy access log (first body byte of streamed answers); gateway gw-nginx "
        "access log (response headers of streamed answers ($upstream_header_time): a TTFT "
        "only when the pool sends its headers with its first token)")


def test_ingest_status() -> None:
    now = timezone.now()
    Cursor.objects.create(source_name="gw-a", path="/var/log/a.log", lines=10, malformed=1,
                          last_read_at=now - timedelta(seconds=3))
    Cursor.objects.create(source_name="pa", path="http://127.0.0.1:9/metrics",
                          last_error="refused")
    # Leases and heartbeats are no sources: gw-a's shard is held, the scrape's expired.
    Cursor.objects.create(source_name="_ingester", path="shard:log:gw-a",
                          updated_at=now + timedelta(seconds=5),
                          last_counters={"owner": "h:1:a", "until": "…"})
    Cursor.objects.create(source_name="_ingester", path="shard:scrape",
                          updated_at=now - timedelta(seconds=1),
                          last_counters={"owner": "h:2:b", "until": "…"})
    Cursor.objects.create(source_name="_ingester", path="alive:h:1:a",
                          updated_at=now + timedelta(seconds=5))
    rows = selectors.ingest_status(now)
    assert [(r["source"], r["kind"]) for r in rows] == [("gw-a", "gateway access log"),
                                                        ("pa", "pool /metrics")]
    assert rows[0]["lag_s"] == pytest.approx(3.0) and rows[0]["malformed"] == 1
    assert rows[1]["lag_s"] is None and rows[1]["last_error"] == "refused"
    assert (rows[0]["ingester"], rows[1]["ingester"]) == ("h:1:a", None)


def test_client_disconnects_are_shown_apart_from_the_error_rate_in_stats_and_series(
        ) -> None:
    t0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    window_add(source="gateway", source_name="gw-a", route="chat", pool="pa", resolution_s=10,
               start=t0, counts={"requests": 80, "errors": 2, "client_disconnects": 20})
    window_add(source="gateway", source_name="gw-b", route="chat", pool="pa", resolution_s=10,
               start=t0 + timedelta(seconds=10), counts={"requests": 20, "errors": 0,
                                                         "client_disconnects": 0})
    stats = selectors.pool_stats(pool="pa", since=t0, until=t0 + timedelta(seconds=20))
    assert (stats.requests, stats.errors, stats.client_disconnects) == (100, 2, 20)
    # The error rate is the pool's own: hang-ups are in neither its numerator nor its
    # denominator. Their share of everything logged is a figure of its own.
    assert (stats.error_rate.value, stats.error_rate.n) == (pytest.approx(0.02), 100)
    share = wilson_interval(20, 120, 0.99)
    assert stats.disconnect_rate.value == pytest.approx(20 / 120)
    assert (stats.disconnect_rate.low, stats.disconnect_rate.high, stats.disconnect_rate.n) \
        == (share.lower, share.upper, 120)
    assert "client disconnects apart" in stats.error_rate.source
    assert "abandoned" in stats.disconnect_rate.source
    assert stats.rps == pytest.approx(100 / 20)
    series = selectors.pool_series(pool="pa", since=t0, until=t0 + timedelta(seconds=20))
    assert [(p["requests"], p["client_disconnects"]) for p in series] == [(80, 20), (20, 0)]
    assert series[0]["error_rate"] == pytest.approx(2 / 80)
    # No data is no figure, not a zero share.
    empty = selectors.pool_stats(pool="pb", since=t0, until=t0 + timedelta(seconds=20))
    assert empty.client_disconnects == 0 and empty.disconnect_rate.value is None
