"""The pool page's latency chart is a pure function of probe rows: test it without a page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetctl.core.charts import figure_data
from fleetctl.fleet.charts import FAIL_COLOUR, probe_latency_figure
from fleetctl.fleet.models import HealthCheck

UNTIL = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def probe(minutes_ago: float, *, ok: bool = True, latency_ms: float | None = 40.0,
          error: str = "") -> HealthCheck:
    return HealthCheck(checked_at=UNTIL - timedelta(minutes=minutes_ago), ok=ok,
                       latency_ms=latency_ms, error=error)


def test_failed_probes_are_red_crosses_with_their_error_and_sit_on_zero_without_a_latency():
    checks = [probe(30), probe(20, ok=False, latency_ms=None, error="<html>502</html>"),
              probe(10)]
    ok_trace, failed_trace = probe_latency_figure(checks, until=UNTIL).data
    assert list(ok_trace.y) == [40.0, 40.0]
    assert failed_trace.marker.color == FAIL_COLOUR and failed_trace.marker.symbol == "x"
    assert list(failed_trace.y) == [0]
    assert "502" in failed_trace.text[0] and "<html>" not in failed_trace.text[0]


def test_the_x_axis_is_the_whole_window_even_when_probes_cover_part_of_it():
    figure = probe_latency_figure([probe(5)], until=UNTIL, hours=24)
    start, end = figure.layout.xaxis.range
    assert start == UNTIL - timedelta(hours=24)
    assert UNTIL < end <= UNTIL + timedelta(minutes=30)


def test_a_day_of_fast_probes_is_thinned_but_keeps_every_spike_and_every_failure():
    checks = [probe(i / 4) for i in range(24 * 60 * 4)]  # every 15 s for 24 h
    checks[1000] = probe(1000 / 4, latency_ms=900.0)
    checks[2000] = probe(2000 / 4, ok=False, latency_ms=None, error="timeout")
    ok_trace, failed_trace = probe_latency_figure(checks, until=UNTIL).data
    assert len(ok_trace.y) <= 1440
    assert max(ok_trace.y) == 900.0
    assert "slowest per 1 min" in ok_trace.name
    assert len(failed_trace.x) == 1


def test_the_figure_is_plain_json_data_for_the_page():
    data = figure_data(probe_latency_figure([probe(5)], until=UNTIL))
    assert set(data) >= {"data", "layout"}
    assert isinstance(data["data"][0]["x"][0], str)
