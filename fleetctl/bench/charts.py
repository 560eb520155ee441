"""Benchmark charts: pure functions from level points (`selectors.chart_points`) to Plotly
figures — throughput, TTFT p95, TPOT p95 and cost per 1M output tokens against concurrency,
or, for a trace-timing run (`timing="trace"`), against the trace speed factor (1 = the
trace's own arrival times).

One trace per pool, in the pool's colour, so pools sit side by side on every chart. Levels
that passed or failed the SLO are joined by a line; levels that did not count (too few
samples, or the client was the bottleneck) are drawn as hollow markers beside it, never on
the line, so a reader cannot mistake them for measurements of the server.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from fleetctl.core.charts import FONT, POOL_PALETTE, pool_colours

# Verdict → marker: filled for counted levels, hollow for the ones that did not count.
SYMBOLS = {"pass": "circle", "fail": "x", "insufficient": "circle-open",
           "invalid": "diamond-open"}
COUNTED = ("pass", "fail")
SLO_COLOUR = "#dc2626"

Points = dict[str, list[dict[str, Any]]]
AXES = {"concurrency": ("concurrency", "concurrency (streams in flight)"),
        "trace": ("trace speed", "trace speed (× the trace's own arrival rate)")}


def _x(point: dict[str, Any]) -> float:
    return point.get("x", point["concurrency"])  # type: ignore[no-any-return]


def _tick(value: float, timing: str) -> str:
    return f"{value:g}×" if timing == "trace" else f"{value:g}"


def _layout(fig: go.Figure, *, title: str, y_title: str, concurrencies: list[float],
            timing: str = "concurrency") -> None:
    ticks = sorted(set(concurrencies))
    fig.update_layout(
        height=320, margin={"l": 64, "r": 16, "t": 40, "b": 44},
        title={"text": title, "font": {"size": 14}}, font=FONT,
        plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.14},
        xaxis={"title": {"text": AXES[timing][1]}, "type": "log",
               "tickvals": ticks, "ticktext": [_tick(t, timing) for t in ticks]},
        yaxis={"title": {"text": y_title}, "rangemode": "tozero"},
    )
    fig.update_xaxes(gridcolor="#e5e7eb")
    fig.update_yaxes(gridcolor="#e5e7eb")


def _hover(point: dict[str, Any], value: str) -> str:
    note = str(point.get("note") or "")[:140].replace("<", "‹").replace(">", "›")
    where = (f"trace speed {point['speed']:g}×" if point.get("speed") is not None
             else f"concurrency {point['concurrency']}")
    return f"{value} at {where}<br>{point['verdict']}: {note}"


def _metric_figure(points: Points, *, key: str, title: str, y_title: str, unit: str,
                   slo: float | None = None, fmt: str = "{:,.1f}",
                   timing: str = "concurrency",
                   colours: dict[str, str] | None = None) -> go.Figure:
    colours = colours or pool_colours(points)
    fig = go.Figure()
    concurrencies: list[float] = []
    for pool in sorted(points):
        colour = colours.get(pool, POOL_PALETTE[0])
        rows = sorted((p for p in points[pool] if p.get(key) is not None),
                      key=lambda p: (_x(p), p["attempt"]))
        concurrencies += [_x(p) for p in rows]
        counted = [p for p in rows if p["verdict"] in COUNTED]
        other = [p for p in rows if p["verdict"] not in COUNTED]
        fig.add_trace(go.Scatter(
            name=pool, legendgroup=pool, x=[_x(p) for p in counted],
            y=[p[key] for p in counted], mode="lines+markers",
            line={"color": colour, "width": 2},
            marker={"size": 9, "color": colour,
                    "symbol": [SYMBOLS[p["verdict"]] for p in counted]},
            text=[_hover(p, f"{fmt.format(p[key])} {unit}") for p in counted],
            hovertemplate=f"{pool}<br>%{{text}}<extra></extra>",
        ))
        if other:
            fig.add_trace(go.Scatter(
                name=f"{pool}: not counted", legendgroup=pool,
                x=[_x(p) for p in other], y=[p[key] for p in other],
                mode="markers",
                marker={"size": 11, "color": colour, "line": {"width": 2, "color": colour},
                        "symbol": [SYMBOLS.get(p["verdict"], "circle-open") for p in other]},
                text=[_hover(p, f"{fmt.format(p[key])} {unit}") for p in other],
                hovertemplate=f"{pool}<br>%{{text}}<extra></extra>",
            ))
    if slo is not None:
        fig.add_hline(y=slo, line={"color": SLO_COLOUR, "dash": "dash", "width": 1.5},
                      annotation_text=f"SLO {slo:g} {unit}", annotation_position="top left",
                      annotation_font={"color": SLO_COLOUR, "size": 11})
    _layout(fig, title=f"{title} vs {AXES[timing][0]}", y_title=y_title,
            concurrencies=concurrencies or [1], timing=timing)
    return fig


def throughput_figure(points: Points, *, timing: str = "concurrency") -> go.Figure:
    return _metric_figure(points, key="output_tokens_per_s", title="Output tokens/s",
                          y_title="output tokens/s", unit="tok/s", timing=timing)


def ttft_figure(points: Points, *, slo_ms: float, timing: str = "concurrency") -> go.Figure:
    return _metric_figure(points, key="ttft_p95_ms", title="TTFT p95",
                          y_title="TTFT p95 (ms)", unit="ms", slo=slo_ms, timing=timing)


def tpot_figure(points: Points, *, slo_ms: float, timing: str = "concurrency") -> go.Figure:
    return _metric_figure(points, key="tpot_p95_ms", title="TPOT p95",
                          y_title="TPOT p95 (ms)", unit="ms", slo=slo_ms, fmt="{:,.2f}",
                          timing=timing)


def by_currency(points: Points) -> dict[str, Points]:
    """The points split by the currency each level's cost is in: costs in two currencies
    never share an axis."""
    out: dict[str, Points] = {}
    for pool, rows in points.items():
        for point in rows:
            out.setdefault(point["currency"], {}).setdefault(pool, []).append(point)
    return dict(sorted(out.items()))


def cost_figure(points: Points, *, timing: str = "concurrency",
                colours: dict[str, str] | None = None) -> go.Figure:
    """Cost per 1M output tokens of pools whose costs are in one currency."""
    currencies = sorted({p["currency"] for rows in points.values() for p in rows})
    if len(currencies) > 1:
        raise ValueError(f"costs in {', '.join(currencies)} cannot share an axis; draw one "
                         f"figure per currency (by_currency)")
    unit = currencies[0] if currencies else ""
    return _metric_figure(points, key="cost_per_1m",
                          title=f"Cost per 1M output tokens ({unit})" if unit else
                          "Cost per 1M output tokens",
                          y_title=f"{unit} per 1M output tokens", unit=f"{unit}/1M",
                          fmt="{:,.4f}", timing=timing, colours=colours)


def cost_figures(points: Points, *, timing: str = "concurrency"
                 ) -> list[tuple[str, str, go.Figure]]:
    """One cost chart per currency (each pool in its own colour on every chart); a run whose
    pools all cost in one currency has one, `cost-chart`."""
    x = AXES[timing][0]
    groups = by_currency(points) or {"": points}
    colours = pool_colours(points)
    single = len(groups) == 1
    return [("cost-chart" if single else f"cost-chart-{currency.lower()}",
             f"Cost per 1M output tokens against {x}, per pool"
             + (f", in {currency} (pools costed in {currency} only)" if not single else ""),
             cost_figure(group, timing=timing, colours=colours))
            for currency, group in groups.items()]


def run_figures(points: Points, *, slo_ttft_ms: float, slo_tpot_ms: float,
                timing: str = "concurrency") -> list[tuple[str, str, go.Figure]]:
    """(element id, accessible label, figure) for each chart of a run page; the x axis is
    the concurrency, or the trace speed for a trace-timing run."""
    x = AXES[timing][0]
    return [
        ("throughput-chart", f"Output tokens per second against {x}, per pool",
         throughput_figure(points, timing=timing)),
        ("ttft-chart", f"TTFT p95 against {x} per pool; SLO {slo_ttft_ms:g} ms",
         ttft_figure(points, slo_ms=slo_ttft_ms, timing=timing)),
        ("tpot-chart", f"TPOT p95 against {x} per pool; SLO {slo_tpot_ms:g} ms",
         tpot_figure(points, slo_ms=slo_tpot_ms, timing=timing)),
        *cost_figures(points, timing=timing),
    ]


# ---- load shape: when each stream of a level started ------------------------------------------

STRIP_WIDTH = 600
STRIP_PAD = 12


def load_strip(shape: dict[str, Any]) -> dict[str, Any] | None:
    """Geometry of a level's start-offset strip (an inline SVG on the run page): one tick per
    stream at its first send, coloured by endpoint, on an axis from 0 to the window's start,
    with the ramp's end and the window's start marked. None for a level without streams
    (trace timing, or stored before streams were recorded)."""
    streams = list(shape.get("streams") or [])
    if not streams:
        return None
    starts = [float(s["start_s"]) for s in streams]
    window = shape.get("window_start_s")
    ramp = float(shape.get("ramp_s") or 0.0)
    span = max([*starts, ramp, float(window or 0.0), 1e-3])
    inner = STRIP_WIDTH - 2 * STRIP_PAD

    def x(t: float) -> float:
        return round(STRIP_PAD + inner * t / span, 1)

    ticks = [{"x": x(float(s["start_s"])), "stream": s["stream"], "start_s": s["start_s"],
              "endpoint": s.get("endpoint", 0),
              "colour": POOL_PALETTE[int(s.get("endpoint", 0)) % len(POOL_PALETTE)]}
             for s in streams]
    return {
        "width": STRIP_WIDTH, "ticks": ticks, "span_s": span,
        "first_s": min(starts), "last_s": max(starts),
        "ramp_s": ramp, "ramp_x": x(ramp) if ramp > 0 else None,
        "window_start_s": window, "window_x": x(float(window)) if window is not None else None,
        "end_x": STRIP_WIDTH - STRIP_PAD,
    }
