"""What the fleet and traffic pages show of live telemetry and ramps: the overview's live
figures per pool, the pool page's live block (figures, its last half hour, the routes it
carries, its plans), and the route page's live per-pool table and Ramps panel.

Template tags of the ramps templates that those pages render as panels, and the overview's
figure provider (both registered in fleetctl/ramps/apps.py; fleetctl/core/panels.py), so the
pages show them without naming telemetry or ramps, which sit above fleet and traffic
(tests/test_layers.py). Missing data is a dash, never a zero, and
each figure says where it came from in its title (the tooltip).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django import template
from django.db.models import Q
from django.utils import timezone

from fleetctl.core.charts import figure_data
from fleetctl.ramps import charts, selectors
from fleetctl.ramps.models import ACTIVE_STATES
from fleetctl.telemetry import selectors as telemetry
from fleetctl.traffic import selectors as traffic
from migrations_plan.models import Plan

register = template.Library()

LIVE_WINDOW_S = 60
RECENT_MINUTES = 30
DASH = "—"


def _value(figure: Any) -> float | None:
    if figure is None:
        return None
    value = figure.get("value") if isinstance(figure, dict) else getattr(figure, "value", figure)
    return None if value is None else float(value)


def _ms(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:,.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _rate(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:.2f} %"


@register.filter
def figure_ms(figure: Any) -> str:
    """A latency Figure (or its dict, or a bare number) as "812 ms"; "—" when unknown."""
    return _ms(_value(figure))


@register.filter
def figure_rate(figure: Any) -> str:
    """A rate 0..1 (Figure, dict or number) as "0.42 %"; "—" when unknown."""
    return _rate(_value(figure))


@register.filter
def figure_interval(figure: Any, unit: str = "ms") -> str:
    """The Figure's confidence interval as "[780 ms, 850 ms]"; "" when it has none."""
    get = figure.get if isinstance(figure, dict) else lambda k: getattr(figure, k, None)
    low, high = get("low"), get("high")
    if low is None and high is None:
        return ""
    fmt = _rate if unit == "rate" else _ms
    return (f"[{fmt(None if low is None else float(low))}, "
            f"{fmt(None if high is None else float(high))}]")


@register.filter
def ramp_seconds(ms: Any) -> str:
    return DASH if ms is None else f"{float(ms) / 1000:.2f} s"


@dataclass(frozen=True)
class LiveRow:
    """One pool's last minute as a page shows it: text per figure and where it came from."""

    requests: int
    ttft_p95: str
    ttft_source: str
    tpot_p95: str
    tpot_source: str
    error_rate: str
    error_source: str
    rps: str
    sources: str
    has_data: bool
    # Requests the clients abandoned: a count beside the error rate, never part of it.
    client_disconnects: str = DASH
    disconnect_source: str = "no data in the window"
    any_disconnects: bool = False
    # Beside them: each Prometheus telemetry source's figures (telemetry.Reported), pool-wide.
    reported: tuple[ReportedRow, ...] = ()

    @classmethod
    def of(cls, stats: Any) -> LiveRow:
        requests = int(getattr(stats, "requests", 0) or 0)
        sources = ", ".join(getattr(stats, "sources", None) or []) or "no data in the window"
        return cls(
            requests=requests,
            ttft_p95=figure_ms(stats.ttft_p95), ttft_source=stats.ttft_p95.source or sources,
            tpot_p95=figure_ms(stats.tpot_p95), tpot_source=stats.tpot_p95.source or sources,
            error_rate=figure_rate(stats.error_rate),
            error_source=stats.error_rate.source or sources,
            rps=f"{stats.rps:.2f}/s" if requests and stats.rps is not None else DASH,
            sources=sources, has_data=bool(requests),
            client_disconnects=_disconnects(stats),
            any_disconnects=bool(getattr(stats, "client_disconnects", 0)),
            disconnect_source=getattr(stats.disconnect_rate, "source", "") or sources,
            reported=tuple(ReportedRow.of(r) for r in getattr(stats, "reported", None) or ()))


@dataclass(frozen=True)
class ReportedRow:
    """One Prometheus telemetry source's view of a pool, as a page shows it."""

    name: str
    label: str  # "from Prometheus <name>"
    ttft_p95: str
    ttft_source: str
    tpot_p95: str
    tpot_source: str
    e2e_p95: str
    e2e_source: str
    requests: int
    error: str

    @classmethod
    def of(cls, reported: Any) -> ReportedRow:
        def get(key: str) -> Any:
            return reported.get(key) if isinstance(reported, dict) else getattr(reported, key)

        def source(key: str) -> str:
            figure = get(key)
            return str(figure.get("source") if isinstance(figure, dict) else figure.source)

        return cls(name=str(get("source_name")), label=str(get("label")),
                   ttft_p95=figure_ms(get("ttft_p95")), ttft_source=source("ttft_p95"),
                   tpot_p95=figure_ms(get("tpot_p95")), tpot_source=source("tpot_p95"),
                   e2e_p95=figure_ms(get("duration_p95")), e2e_source=source("duration_p95"),
                   requests=int(get("requests") or 0), error=str(get("error") or ""))


def _disconnects(stats: Any) -> str:
    """"3 (1.20 %)": the requests the clients abandoned and their share; "—" without data."""
    count = int(getattr(stats, "client_disconnects", 0) or 0)
    if not count and not getattr(stats, "requests", 0):
        return DASH
    share = _value(getattr(stats, "disconnect_rate", None))
    return f"{count:,}" + (f" ({_rate(share)})" if count and share is not None else "")


EMPTY = LiveRow(requests=0, ttft_p95=DASH, ttft_source="no data in the window", tpot_p95=DASH,
                tpot_source="no data in the window", error_rate=DASH,
                error_source="no data in the window", rps=DASH,
                sources="no data in the window", has_data=False)


def live_pools(pools: Any) -> dict[str, LiveRow]:
    """The overview's live figures ("fleet.pool_live"): one live_summary for every pool on
    the page, a row for each (dashes where the window has no data)."""
    names = [pool.name for pool in pools]
    if not names:
        return {}
    summary = telemetry.live_summary(pools=names, window_s=LIVE_WINDOW_S)
    return {name: LiveRow.of(summary[name]) if name in summary else EMPTY for name in names}


def _carried(pool: Any) -> list[dict[str, Any]]:
    """The routes whose current split gives the pool weight, with that weight."""
    routes = list(traffic.route_list())
    current = traffic.revisions_current(routes=routes)
    rows = []
    for route in routes:
        share = current[route.pk].percentages().get(pool.name) if route.pk in current else None
        if share:
            rows.append({"route": route, "share": share,
                         "primary": route.primary_pool_id == pool.pk})
    return rows


@register.simple_tag
def pool_live(pool: Any) -> dict[str, Any]:
    """The pool page's live block: the last minute (every route), its last half hour as a
    chart, the routes it carries with their weights, and the plans it is in."""
    now = timezone.now()
    stats = telemetry.live_summary(pools=[pool.name], window_s=LIVE_WINDOW_S).get(pool.name)
    rows = telemetry.pool_series(pool=pool.name, since=now - timedelta(minutes=RECENT_MINUTES),
                                 until=now)
    has_series = any(row.get("requests") or row.get("tpot_p95") is not None for row in rows)
    # One query with OR, not a UNION: Plan's default ordering makes each side of a union an
    # ordered subquery, which SQLite (the demo's database) refuses in a compound statement.
    plans = list(Plan.objects.filter(Q(candidate_pool=pool) | Q(primary_pool=pool))
                 .order_by("name"))
    return {
        "row": LiveRow.of(stats) if stats is not None else EMPTY,
        "figure": figure_data(charts.recent_figure(pool=pool.name, rows=rows))
        if has_series else None,
        "carried": _carried(pool), "plans": plans,
        "ramps": list(selectors.ramp_list().filter(pool=pool, state__in=ACTIVE_STATES)
                      .select_related("route")),
    }


@register.simple_tag
def route_live(route: Any, split: Any) -> list[dict[str, Any]]:
    """The route page's live table: each pool with weight, its last minute on this route."""
    names = [pool for pool, _, _ in split]
    summary = (telemetry.live_summary(pools=names, window_s=LIVE_WINDOW_S, route=route.name)
               if names else {})
    return [{"pool": pool, "share": share, "colour": colour,
             "live": LiveRow.of(summary[pool]) if pool in summary else EMPTY}
            for pool, share, colour in split]


@register.simple_tag(takes_context=True)
def ramp_panel(context: Any, route: Any) -> dict[str, Any]:
    """The route page's Ramps panel: the active ramp, or the start form (for the ramp role),
    and the route's latest ramps."""
    from fleetctl.ramps.views import start_form  # the form's prefill lives with the view

    active = selectors.ramp_active_for(route)
    can = context.get("can") or {}
    return {
        "active": active,
        "form": start_form(route) if active is None and can.get("ramp") else None,
        "recent": list(selectors.ramp_list().filter(route=route).select_related("pool")[:5]),
        "watches": selectors.watches_with_verdicts(route, limit=5),
    }
