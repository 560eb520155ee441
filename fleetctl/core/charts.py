"""What every chart shares: the pool palette, the font, and the hand-over of a Plotly figure
to the page. Each app's `charts.py` builds its figures from selector data (pure functions, no
queries); views embed them with `figure_data` and `static/js/charts.js` draws them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go

# Colour-blind-safe (Okabe–Ito, then Tableau) and distinct from the red used for failures.
POOL_PALETTE = (
    "#2563eb", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#8c564b", "#0072b2", "#7f7f7f",
    "#bcbd22", "#17becf",
)
FONT = {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"}


def pool_colours(pools: Iterable[str]) -> dict[str, str]:
    """One colour per pool, by sorted name, so the same pools get the same colours on a page
    whatever order they are met in."""
    return {pool: POOL_PALETTE[i % len(POOL_PALETTE)] for i, pool in enumerate(sorted(set(pools)))}


def figure_data(fig: go.Figure) -> dict[str, Any]:
    """The figure as plain JSON data for `json_script` (Plotly's encoder handles datetimes)."""
    data: dict[str, Any] = json.loads(fig.to_json())
    return data
