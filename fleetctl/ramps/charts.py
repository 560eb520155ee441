"""Ramp charts: pure functions from a ramp's timeline and its pools' telemetry series to
Plotly figures (no queries, no I/O). Views embed them with `core.charts.figure_data` and
`static/js/charts.js` draws them.

Messages in hover text are HTML-escaped here: Plotly reads a few tags in text (<br>, <b>),
and an event message is free text a person typed (a reason) or a gateway's error.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fleetctl.core.charts import POOL_PALETTE
from fleetctl.traffic.charts import layout

CANDIDATE_COLOUR = POOL_PALETTE[0]
PRIMARY_COLOUR = POOL_PALETTE[7]
SLO_COLOUR = "#dc2626"

# How each decision is marked on the timeline: (symbol, colour).
MARKERS: dict[str, tuple[str, str]] = {
    "start": ("circle-open", "#111827"),
    "pass": ("circle", "#16a34a"),
    "warn": ("triangle-up", "#d97706"),
    "fail": ("x", SLO_COLOUR),
    "rollback": ("x-thin-open", SLO_COLOUR),
    "abort": ("x-thin-open", SLO_COLOUR),
    "pause": ("square-open", "#6b7280"),
    "resume": ("triangle-right-open", "#2563eb"),
    "skip": ("triangle-right", "#7c3aed"),
    "manual-change": ("diamond", "#d97706"),
    "complete": ("star", "#16a34a"),
    "error": ("x", "#7f1d1d"),
    "wait": ("circle-open", "#9ca3af"),
}
# The kinds that bring the candidate's weight back to 0 %.
TO_ZERO = ("rollback", "abort")


def weight_points(*, start: datetime, start_percent: float, events: Sequence[Mapping[str, Any]],
                  until: datetime) -> list[tuple[datetime, float]]:
    """The candidate's weight over the ramp as (time, percent) corners of a step line: its
    share when the ramp started, each STEP's percent from its time, 0 % from a rollback or
    an abort, and the last value held until `until`."""
    points = [(start, start_percent)]
    for event in events:
        if event["kind"] == "step" and event.get("percent") is not None:
            points.append((event["at"], float(event["percent"])))
        elif event["kind"] in TO_ZERO:
            points.append((event["at"], 0.0))
    if until > points[-1][0]:
        points.append((until, points[-1][1]))
    return points


def _percent_at(points: Sequence[tuple[datetime, float]], at: datetime) -> float:
    value = points[0][1]
    for when, percent in points:
        if when > at:
            break
        value = percent
    return value


def timeline_figure(*, points: Sequence[tuple[datetime, float]],
                    events: Sequence[Mapping[str, Any]], pool: str,
                    planned: Sequence[float]) -> go.Figure:
    """The candidate's weight as a step line over time, every decision a marker on it (hover:
    what and why), and the planned steps as faint horizontal guides."""
    fig = go.Figure(go.Scatter(
        x=[p[0] for p in points], y=[p[1] for p in points], mode="lines",
        line={"shape": "hv", "color": CANDIDATE_COLOUR, "width": 2.5},
        name=f"{pool} weight", hovertemplate="%{x|%H:%M:%S} UTC: %{y:g} %<extra></extra>"))
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for event in events:
        if event["kind"] in MARKERS and event["kind"] != "step":
            by_kind.setdefault(event["kind"], []).append(event)
    for kind, marked in by_kind.items():
        symbol, colour = MARKERS[kind]
        fig.add_trace(go.Scatter(
            x=[e["at"] for e in marked], y=[_percent_at(points, e["at"]) for e in marked],
            mode="markers", name=kind,
            marker={"symbol": symbol, "color": colour, "size": 11,
                    "line": {"width": 2, "color": colour}},
            customdata=[html.escape(str(e.get("message", "")))[:300] for e in marked],
            hovertemplate=f"{kind} · %{{x|%H:%M:%S}} UTC<br>%{{customdata}}<extra></extra>"))
    for percent in planned:
        fig.add_hline(y=percent, line={"color": "#d1d5db", "dash": "dot", "width": 1})
    top = max([*planned, *(p[1] for p in points), 1.0])
    layout(fig, title=f"{pool}: weight on the route (UTC)", height=300,
            legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.18})
    fig.update_yaxes(range=[0, top * 1.12], ticksuffix=" %", rangemode="tozero")
    return fig


# (series key, panel title, threshold key, scale for the axis)
METRICS = (
    ("ttft_p95", "TTFT p95, ms", "ttft", 1.0),
    ("tpot_p95", "TPOT p95, ms", "tpot", 1.0),
    ("error_rate", "Error rate, %", "error_rate", 100.0),
)


def _series_time(row: Mapping[str, Any]) -> Any:
    return row.get("start", row.get("at"))


def pools_figure(*, candidate: str, primary: str,
                 series: Mapping[str, Sequence[Mapping[str, Any]]],
                 thresholds: Mapping[str, float | None],
                 steps_at: Sequence[tuple[datetime, float]] = ()) -> go.Figure:
    """TTFT p95, TPOT p95 and error rate over the ramp, the candidate against the primary,
    each with its SLO as a dashed red line, and a faint vertical line at every step. A window
    with no data is a gap, never a zero."""
    fig = make_subplots(rows=len(METRICS), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[title for _, title, _, _ in METRICS])
    for pool, role, colour in ((candidate, "candidate", CANDIDATE_COLOUR),
                               (primary, "primary", PRIMARY_COLOUR)):
        rows = series.get(pool) or []
        times = [_series_time(row) for row in rows]
        for index, (key, title, _, scale) in enumerate(METRICS, start=1):
            values = [None if row.get(key) is None else float(row[key]) * scale
                      for row in rows]
            fig.add_trace(go.Scatter(
                x=times, y=values, mode="lines+markers", connectgaps=False,
                name=f"{pool} ({role})", legendgroup=pool, showlegend=index == 1,
                line={"color": colour, "width": 2 if role == "candidate" else 1.5,
                      "dash": "solid" if role == "candidate" else "dot"},
                marker={"size": 4, "color": colour},
                hovertemplate=f"{pool}<br>%{{x|%H:%M:%S}} UTC<br>%{{y:.2f}}"
                              f" {title.split(', ')[-1]}<extra></extra>"), row=index, col=1)
    for index, (_, _, threshold_key, scale) in enumerate(METRICS, start=1):
        threshold = thresholds.get(threshold_key)
        if threshold is not None:
            fig.add_hline(y=float(threshold) * scale, row=index, col=1,
                          line={"color": SLO_COLOUR, "dash": "dash", "width": 1.5},
                          annotation_text="SLO", annotation_position="top left",
                          annotation_font={"color": SLO_COLOUR, "size": 10})
    for at, _ in steps_at:
        fig.add_vline(x=at, line={"color": "#e5e7eb", "width": 1})
    layout(fig, title="Candidate against primary over the ramp (UTC)", height=620,
            legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.08})
    fig.update_yaxes(rangemode="tozero")
    fig.update_annotations(font={"size": 12})
    return fig


def recent_figure(*, pool: str, rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """A pool's last half hour: TTFT p95 and TPOT p95 (ms) on the left axis, requests per
    second on the right."""
    times = [_series_time(row) for row in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for key, name, colour in (("ttft_p95", "TTFT p95", CANDIDATE_COLOUR),
                              ("tpot_p95", "TPOT p95", POOL_PALETTE[2])):
        fig.add_trace(go.Scatter(
            x=times, y=[row.get(key) for row in rows], mode="lines+markers", name=name,
            connectgaps=False, line={"color": colour, "width": 1.5}, marker={"size": 3},
            hovertemplate=f"{name} %{{y:.0f}} ms at %{{x|%H:%M:%S}}<extra></extra>"),
            secondary_y=False)
    fig.add_trace(go.Scatter(
        x=times, y=[row.get("rps") for row in rows], mode="lines", name="requests / s",
        line={"color": PRIMARY_COLOUR, "width": 1, "dash": "dot"},
        hovertemplate="%{y:.2f} requests/s at %{x|%H:%M:%S}<extra></extra>"),
        secondary_y=True)
    layout(fig, title=f"{pool}, last 30 min (UTC)", height=300,
            legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.2})
    fig.update_yaxes(title_text="ms", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="req/s", rangemode="tozero", secondary_y=True, showgrid=False)
    return fig
