"""Fleet charts: pure functions from selector data to Plotly figures (no queries, no I/O).

Views embed the figure as JSON and `static/js/charts.js` draws it, so plotly.js is loaded once,
only on pages that have a chart.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import plotly.graph_objects as go

from fleetctl.fleet.models import HealthCheck

OK_COLOUR = "#2563eb"
FAIL_COLOUR = "#dc2626"
MAX_OK_POINTS = 1440  # one a minute over 24 h; a 15 s probe interval would give 5,760


def probe_latency_figure(
    checks: Sequence[HealthCheck], *, until: datetime, hours: int = 24
) -> go.Figure:
    """Probe latency over the window ending at `until`; failed probes as red crosses.

    A failed probe often has no latency (refused, timed out), so failures without one sit on
    the zero line: the point is that they happened and when, with the error on hover. Every
    failure is drawn; successful probes are thinned to the slowest per time bucket when there
    are too many to draw, so a latency spike never disappears into an average.
    """
    since = until - timedelta(hours=hours)
    ok_x, ok_y, bucket = slowest_per_bucket([c for c in checks if c.ok], since, until)
    failed = [c for c in checks if not c.ok]
    ok_name = f"ok probe (slowest per {bucket})" if bucket else "ok probe"
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        name=ok_name, x=ok_x, y=ok_y,
        mode="lines+markers", line={"color": OK_COLOUR, "width": 1.5},
        marker={"size": 4, "color": OK_COLOUR},
        hovertemplate="%{x|%H:%M:%S} UTC<br>%{y:.0f} ms<extra>ok</extra>",
    ))
    fig.add_trace(go.Scatter(
        name="failed probe", x=[c.checked_at for c in failed],
        y=[c.latency_ms if c.latency_ms is not None else 0 for c in failed],
        mode="markers", marker={"symbol": "x", "size": 9, "color": FAIL_COLOUR},
        cliponaxis=False,  # crosses on the zero line stay whole
        text=[_failure_text(c) for c in failed],
        hovertemplate="%{x|%H:%M:%S} UTC<br>%{text}<extra>failed</extra>",
    ))
    fig.update_layout(
        height=300, margin={"l": 56, "r": 16, "t": 36, "b": 40},
        title={"text": f"Probe latency, last {hours} h (UTC)", "font": {"size": 14}},
        yaxis={"title": {"text": "latency (ms)"}, "rangemode": "tozero"},
        # A little room past `until` so the newest probe's marker is not cut in half.
        xaxis={"title": {"text": ""}, "range": [since, until + (until - since) / 60]},
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.12},
        plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
        font={"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"},
    )
    fig.update_xaxes(gridcolor="#e5e7eb")
    fig.update_yaxes(gridcolor="#e5e7eb")
    return fig


def slowest_per_bucket(
    ok: list[HealthCheck], since: datetime, until: datetime, *, max_points: int = MAX_OK_POINTS
) -> tuple[list[datetime], list[float | None], str]:
    """(times, latencies, bucket label); the label is empty when nothing was thinned."""
    if len(ok) <= max_points:
        return [c.checked_at for c in ok], [c.latency_ms for c in ok], ""
    width = (until - since) / max_points
    slowest: dict[int, HealthCheck] = {}
    for check in ok:
        # Clamp: a probe exactly at `until` (or a hair outside the window) joins the edge bin.
        index = min(max(int((check.checked_at - since) / width), 0), max_points - 1)
        kept = slowest.get(index)
        if kept is None or (check.latency_ms or 0) > (kept.latency_ms or 0):
            slowest[index] = check
    kept_checks = [slowest[index] for index in sorted(slowest)]
    label = f"{width.total_seconds() / 60:g} min"
    return (
        [c.checked_at for c in kept_checks], [c.latency_ms for c in kept_checks], label,
    )


def _failure_text(check: HealthCheck) -> str:
    status = f"HTTP {check.status_code}: " if check.status_code else ""
    # Plotly renders a few HTML tags in hover text; an error body must not become markup.
    error = (check.error or "no error text")[:120].replace("<", "‹").replace(">", "›")
    return f"{status}{error}"
