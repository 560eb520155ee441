"""Eval run charts: pure functions from a finished run's statistics (EvalRun.stats, as
stats.run_statistics returns them) to Plotly figures, so the run page says at a glance how
each pool scored and whether the candidate's drop against the primary is within the margin.

Scores and differences are drawn in percent / points, as the plan's quality margin is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from fleetctl.core.charts import FONT, POOL_PALETTE

CANDIDATE_COLOUR = POOL_PALETTE[0]
PRIMARY_COLOUR = POOL_PALETTE[7]
OTHER_COLOURS = POOL_PALETTE[1:7]
MARGIN_COLOUR = "#dc2626"


def _pct(value: Any) -> float | None:
    return None if value is None else round(float(value) * 100, 3)


def _colour(role: str, index: int) -> str:
    if role == "candidate":
        return CANDIDATE_COLOUR
    if role == "primary":
        return PRIMARY_COLOUR
    return OTHER_COLOURS[index % len(OTHER_COLOURS)]


def scores_figure(pools: Mapping[str, Mapping[str, Any]],
                  roles: Sequence[tuple[str, str]]) -> go.Figure:
    """One bar per pool (in `roles` order: (pool name, role)) at its score, with the
    confidence interval as an error bar. Pools without a score yet are left out."""
    names, scores, up, down, colours, hover = [], [], [], [], [], []
    for index, (name, role) in enumerate(roles):
        row = pools.get(name) or {}
        score = _pct(row.get("score"))
        if score is None:
            continue
        lower, upper = _pct(row.get("lower")), _pct(row.get("upper"))
        names.append(f"{name} ({role})")
        scores.append(score)
        up.append(max(0.0, (upper if upper is not None else score) - score))
        down.append(max(0.0, score - (lower if lower is not None else score)))
        colours.append(_colour(role, index))
        hover.append(f"n {row.get('n', 0):,} · [{lower if lower is not None else '—'}, "
                     f"{upper if upper is not None else '—'}] · {row.get('method', '')}")
    fig = go.Figure(go.Bar(
        x=scores, y=names, orientation="h", marker={"color": colours},
        error_x={"type": "data", "symmetric": False, "array": up, "arrayminus": down,
                 "color": "#111827", "thickness": 1.5, "width": 6},
        text=[f"{s:.1f} %" for s in scores], textposition="inside",
        insidetextanchor="start", customdata=hover,
        hovertemplate="%{y}: %{x:.2f} %<br>%{customdata}<extra></extra>", name="score"))
    fig.update_layout(
        height=120 + 48 * max(1, len(names)), margin={"l": 16, "r": 16, "t": 24, "b": 48},
        font=FONT, plot_bgcolor="#ffffff", paper_bgcolor="#ffffff", showlegend=False,
        bargap=0.35)
    fig.update_xaxes(title_text="score, % of items (bars: confidence interval)",
                     range=[0, 100], gridcolor="#e5e7eb")
    fig.update_yaxes(autorange="reversed", automargin=True)
    return fig


def difference_figure(paired: Mapping[str, Any] | None, *, margin: float,
                      tags: Mapping[str, Mapping[str, Any]] | None = None,
                      most_tags: int = 20) -> go.Figure:
    """Candidate minus primary in points with its interval, the run's row on top and then
    (at most `most_tags` of) the tags' rows, worst first (red: beyond the margin); the margin
is a dashed red line
    at −margin and zero a grey one. A row passes while its interval's lower end is right of
    the red line."""
    # (label, paired, beyond the margin): the run's row is red when it fails, a tag's when
    # its own interval is wholly beyond the margin ("regressed"; tags get no verdict).
    rows: list[tuple[str, Mapping[str, Any], bool]] = []
    if paired and paired.get("estimate") is not None:
        rows.append(("all items", paired, paired.get("verdict") == "fail"))
    tag_rows = [(f"tag {tag}", (info or {}).get("paired") or {},
                 bool((info or {}).get("regressed"))) for tag, info in (tags or {}).items()]
    tag_rows = [row for row in tag_rows if row[1].get("estimate") is not None]

    def worst_first(row: tuple[str, Mapping[str, Any], bool]) -> tuple[float, str]:
        upper = row[1].get("upper")
        return (float(upper if upper is not None else row[1]["estimate"]), row[0])

    tag_rows.sort(key=worst_first)
    rows.extend(tag_rows[:most_tags])
    labels = [label for label, _, _ in rows]
    est = [_pct(p.get("estimate")) or 0.0 for _, p, _ in rows]
    lower = [_pct(p.get("lower")) for _, p, _ in rows]
    upper = [_pct(p.get("upper")) for _, p, _ in rows]
    colours = [MARGIN_COLOUR if beyond else CANDIDATE_COLOUR for _, _, beyond in rows]
    fig = go.Figure(go.Scatter(
        x=est, y=labels, mode="markers", marker={"color": colours, "size": 10},
        error_x={"type": "data", "symmetric": False,
                 "array": [max(0.0, (u if u is not None else e) - e)
                           for e, u in zip(est, upper, strict=True)],
                 "arrayminus": [max(0.0, e - (lo if lo is not None else e))
                                for e, lo in zip(est, lower, strict=True)],
                 "color": "#111827", "thickness": 1.5, "width": 6},
        customdata=[[lo, u, p.get("n", 0), "beyond the margin" if beyond else ""]
                    for (_, p, beyond), lo, u in zip(rows, lower, upper, strict=True)],
        hovertemplate=("%{y}: %{x:+.2f} points [%{customdata[0]:.2f}, %{customdata[1]:.2f}]"
                       "<br>n %{customdata[2]} %{customdata[3]}<extra></extra>"),
        name="candidate − primary"))
    fig.add_vline(x=-margin * 100, line={"color": MARGIN_COLOUR, "dash": "dash", "width": 1.5},
                  annotation_text=f"−margin {margin * 100:g} points",
                  annotation_position="top left",
                  annotation_font={"color": MARGIN_COLOUR, "size": 11})
    fig.add_vline(x=0, line={"color": "#9ca3af", "width": 1})
    fig.update_layout(
        height=140 + 36 * max(1, len(rows)), margin={"l": 16, "r": 16, "t": 36, "b": 48},
        font=FONT, plot_bgcolor="#ffffff", paper_bgcolor="#ffffff", showlegend=False)
    fig.update_xaxes(title_text="candidate − primary, points (paired, with its interval)",
                     gridcolor="#e5e7eb", zeroline=False)
    fig.update_yaxes(autorange="reversed", automargin=True)
    return fig
