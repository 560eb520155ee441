"""Shadow run chart: a pure function from the run's judgements (ShadowJudgement rows, oldest
first) to one Plotly figure, so the run page can say at a glance whether the candidate's
divergence stays within the noise floor plus the plan's margin, and since when.

Two panels share the time axis. The top one draws the two rates the judge compared: the
signal (primary vs candidate) and the noise floor (primary vs secondary, the same pool asked
twice). The bottom one draws what the gate reads: their difference with its confidence band,
and the margin as a dashed red line; the metric passes while the band's upper edge stays
below the margin. Rates are in percent (points), as the plan's quality margin is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fleetctl.core.charts import FONT, POOL_PALETTE

SIGNAL_COLOUR = POOL_PALETTE[0]  # the candidate
NOISE_COLOUR = POOL_PALETTE[7]  # grey: the primary against itself
BAND_FILL = "rgba(37, 99, 235, 0.18)"
MARGIN_COLOUR = "#dc2626"
HEADLINE = "divergence"


# A day of judgements every 15 s is 5,760 points: more than a chart 1,000 pixels wide can
# show, and megabytes of JSON re-sent with every refresh. The page draws at most this many.
MOST_POINTS = 360


def thin(ids: Sequence[int], most: int = MOST_POINTS) -> list[int]:
    """At most `most` of `ids` (oldest first), evenly spread, always with the first and the
    last: the newest judgement is the one the verdict reads."""
    if len(ids) <= most:
        return list(ids)
    step = (len(ids) - 1) / (most - 1)
    return [ids[i] for i in sorted({round(k * step) for k in range(most)})]


def _pct(value: Any) -> float | None:
    return None if value is None else round(float(value) * 100, 3)


def divergence_figure(judgements: Sequence[Any], *, margin: float,
                      metric: str = HEADLINE) -> go.Figure:
    """`judgements`: objects with `at`, `pairs` and `metrics` (metric -> {"noise_rate",
    "signal_rate", "estimate", "lower", "upper", "n", "verdict"}), oldest first. Judgements
    without the metric are skipped, so a run that has not compared a pair yet draws empty
    axes with the margin, not a misleading zero."""
    rows: list[tuple[Any, int, dict[str, Any]]] = [
        (j.at, j.pairs, (j.metrics or {})[metric]) for j in judgements
        if (j.metrics or {}).get(metric)]
    x = [at for at, _, _ in rows]
    hover = [f"{m.get('n', pairs)} pairs · {m.get('verdict', '')}" for _, pairs, m in rows]

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        row_heights=[0.5, 0.5],
                        subplot_titles=("Rate: candidate vs noise floor",
                                        "Difference with its confidence band"))
    _add_rates(fig, x, rows, hover)
    _add_difference(fig, x, rows, hover, margin)
    fig.update_layout(
        height=480, margin={"l": 64, "r": 16, "t": 56, "b": 64}, font=FONT,
        plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
        legend={"orientation": "h", "x": 0, "y": -0.1, "yanchor": "top"},
        hovermode="x unified",
    )
    fig.update_yaxes(title_text="% of pairs", rangemode="tozero", gridcolor="#e5e7eb",
                     row=1, col=1)
    fig.update_yaxes(title_text="points", gridcolor="#e5e7eb", zeroline=False, row=2, col=1)
    fig.update_xaxes(gridcolor="#e5e7eb")
    return fig


def _add_rates(fig: go.Figure, x: list[Any], rows: Sequence[tuple[Any, int, dict[str, Any]]],
               hover: list[str]) -> None:
    """The top panel: the signal and the noise floor the judge compared."""
    fig.add_trace(go.Scatter(
        name="signal (primary vs candidate)", x=x,
        y=[_pct(m.get("signal_rate")) for _, _, m in rows], mode="lines+markers",
        line={"color": SIGNAL_COLOUR, "width": 2}, marker={"size": 6}, text=hover,
        hovertemplate="signal %{y:.2f} %<br>%{text}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(
        name="noise floor (primary vs secondary)", x=x,
        y=[_pct(m.get("noise_rate")) for _, _, m in rows], mode="lines+markers",
        line={"color": NOISE_COLOUR, "width": 2, "dash": "dot"}, marker={"size": 6},
        text=hover, hovertemplate="noise %{y:.2f} %<br>%{text}<extra></extra>"), row=1, col=1)


def _add_difference(fig: go.Figure, x: list[Any],
                    rows: Sequence[tuple[Any, int, dict[str, Any]]], hover: list[str],
                    margin: float) -> None:
    """The bottom panel: what the gate reads, the difference with its band, and the margin."""
    # The band: the upper edge, then the lower edge filled up to it.
    fig.add_trace(go.Scatter(
        name="confidence band", legendgroup="band", x=x,
        y=[_pct(m.get("upper")) for _, _, m in rows], mode="lines",
        line={"width": 0, "color": BAND_FILL}, hoverinfo="skip", showlegend=False),
        row=2, col=1)
    fig.add_trace(go.Scatter(
        name="confidence band", legendgroup="band", x=x,
        y=[_pct(m.get("lower")) for _, _, m in rows], mode="lines", fill="tonexty",
        fillcolor=BAND_FILL, line={"width": 0, "color": BAND_FILL}, hoverinfo="skip"),
        row=2, col=1)
    fig.add_trace(go.Scatter(
        name="difference (signal − noise)", x=x,
        y=[_pct(m.get("estimate")) for _, _, m in rows], mode="lines+markers",
        line={"color": SIGNAL_COLOUR, "width": 2}, marker={"size": 6},
        customdata=[[_pct(m.get("lower")), _pct(m.get("upper"))] for _, _, m in rows],
        text=hover,
        hovertemplate=("difference %{y:.2f} points [%{customdata[0]:.2f}, "
                       "%{customdata[1]:.2f}]<br>%{text}<extra></extra>")), row=2, col=1)
    fig.add_hline(y=margin * 100, row=2, col=1,  # type: ignore[arg-type]
                  line={"color": MARGIN_COLOUR, "dash": "dash", "width": 1.5},
                  annotation_text=f"margin {margin * 100:g} points",
                  annotation_position="top left",
                  annotation_font={"color": MARGIN_COLOUR, "size": 11})
    fig.add_hline(y=0, row=2, col=1,  # type: ignore[arg-type]
                  line={"color": "#9ca3af", "width": 1})
