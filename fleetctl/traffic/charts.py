"""Traffic charts: pure functions from selector data to Plotly figures (no queries, no I/O).

Views embed the figure as JSON (`fleetctl.core.charts.figure_data`) and `static/js/charts.js`
draws it. Each pool keeps one colour on a page, in the split bar, the split chart and the
rate charts alike, so a reader matches them by colour as well as by name.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fleetctl.core.charts import FONT, POOL_PALETTE


def layout(fig: go.Figure, *, title: str, height: int, **extra: Any) -> None:
    """A traffic chart's frame (the ramp charts share it: one look for a route's weights)."""
    fig.update_layout(
        height=height, margin={"l": 56, "r": 16, "t": 40, "b": 36},
        title={"text": title, "font": {"size": 14}},
        plot_bgcolor="#ffffff", paper_bgcolor="#ffffff", font=FONT, **extra,
    )
    fig.update_xaxes(gridcolor="#e5e7eb")
    fig.update_yaxes(gridcolor="#e5e7eb")


def split_figure(percentages: dict[str, float], *, colours: dict[str, str],
                 revision: int) -> go.Figure:
    """The current split as one horizontal bar per pool. Bars rather than a pie: 99.9 % next
    to 0.1 % must still show the 0.1 %, so each bar carries its number as text too."""
    pools = sorted(percentages, key=lambda pool: (-percentages[pool], pool))
    fig = go.Figure(go.Bar(
        orientation="h", y=pools, x=[percentages[p] for p in pools],
        marker={"color": [colours.get(p, POOL_PALETTE[0]) for p in pools]},
        text=[f"{percentages[p]:g} %" for p in pools], textposition="outside",
        cliponaxis=False, hovertemplate="%{y}: %{x:.2f} %<extra></extra>",
    ))
    layout(fig, title=f"Current split (revision {revision})",
            height=90 + 36 * max(len(pools), 1), showlegend=False)
    # Headroom past 100 so the "100 %" label outside the bar is not cut off.
    fig.update_xaxes(range=[0, 112], ticksuffix=" %", tickvals=[0, 25, 50, 75, 100])
    fig.update_yaxes(autorange="reversed", automargin=True)
    return fig


RATE_PANELS = (
    ("rps", "Requests / s"),
    ("eps", "Errors / s"),
    ("active", "In flight"),
)


def pool_rates_figure(rates: dict[str, list[dict[str, Any]]], *,
                      colours: dict[str, str]) -> go.Figure:
    """Request rate, error rate and in-flight per pool over time: one trace per pool in each
    panel (never only the sum), the pool's colour the same in all three."""
    fig = make_subplots(rows=len(RATE_PANELS), cols=1, shared_xaxes=True,
                        vertical_spacing=0.09, subplot_titles=[t for _, t in RATE_PANELS])
    for pool, points in sorted(rates.items()):
        times = [point["at"] for point in points]
        colour = colours.get(pool, POOL_PALETTE[0])
        for row, (key, title) in enumerate(RATE_PANELS, start=1):
            fig.add_trace(go.Scatter(
                name=pool, legendgroup=pool, showlegend=row == 1, x=times,
                y=[point[key] for point in points], mode="lines+markers",
                line={"color": colour, "width": 1.5}, marker={"size": 4, "color": colour},
                hovertemplate=f"{pool}<br>%{{x|%H:%M:%S}} UTC<br>%{{y:.2f}} {title.lower()}"
                              "<extra></extra>",
            ), row=row, col=1)
    layout(fig, title="Per pool, last 15 min (UTC)", height=460,
            legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.1})
    fig.update_yaxes(rangemode="tozero")
    # The panel titles are annotations; keep them small and left-aligned like axis labels.
    fig.update_annotations(font={"size": 12}, x=0, xanchor="left")
    return fig
