"""A job's throughput over time for its page: requests/s, output tokens/s and errors per
bucket of `BatchResult.finished_at`, and the Plotly figure drawn from them.

The query is bounded whatever the job's size: one aggregate over the job's results (the
(job, finished_at) index) with one conditional COUNT/SUM per bucket, and at most
MAX_BUCKETS buckets: the bucket width is the smallest "round" width that covers the job's
span in that many. Portable (PostgreSQL and SQLite): no date_bin, no epoch extraction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import plotly.graph_objects as go
from django.db.models import Count, Q, Sum
from django.utils import timezone

from fleetctl.batch.models import BatchJob, BatchResult
from fleetctl.core.charts import FONT, POOL_PALETTE

MAX_BUCKETS = 60
# Bucket widths a person reads easily, in seconds.
WIDTHS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
            43200, 86400)
REQUESTS_COLOUR = POOL_PALETTE[0]
TOKENS_COLOUR = POOL_PALETTE[1]
ERRORS_COLOUR = "#dc2626"


@dataclass(frozen=True)
class Bucket:
    start: datetime
    seconds: float  # the span the bucket covers (the last one may be cut at "until")
    requests: int
    errors: int
    output_tokens: int

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


def bucket_width(span_s: float, max_buckets: int = MAX_BUCKETS) -> int:
    """The smallest round width (seconds) that covers `span_s` in at most `max_buckets`."""
    for width in WIDTHS_S:
        if width * max_buckets >= span_s:
            return width
    return int(-(-span_s // max_buckets))


def throughput_buckets(job: BatchJob, *, now: datetime | None = None,
                       max_buckets: int = MAX_BUCKETS) -> list[Bucket]:
    """The job's results counted per bucket from its start (first claim) to its end (or
    now). Empty before the first result. One query."""
    start = job.started_at
    if start is None:
        return []
    until = job.finished_at or now or timezone.now()
    span = max(1.0, (until - start).total_seconds())
    width = bucket_width(span, max_buckets)
    count = min(max_buckets, int(-(-span // width)))
    edges = [start + timedelta(seconds=width * i) for i in range(count + 1)]
    results = BatchResult.objects.filter(job=job)
    aggregates: dict[str, Any] = {}
    for i in range(count):
        # The last bucket also takes anything written up to now (a result committed after
        # finished_at was read, or on the second of the end).
        window = Q(finished_at__gte=edges[i])
        if i < count - 1:
            window &= Q(finished_at__lt=edges[i + 1])
        aggregates[f"n{i}"] = Count("id", filter=window)
        aggregates[f"e{i}"] = Count("id", filter=window & ~Q(status_code__gte=200,
                                                              status_code__lt=300))
        aggregates[f"t{i}"] = Sum("output_tokens", filter=window)
    row = results.filter(finished_at__gte=start).aggregate(**aggregates)
    buckets = []
    for i in range(count):
        seconds = (min(edges[i + 1], max(until, edges[i])) - edges[i]).total_seconds()
        buckets.append(Bucket(start=edges[i], seconds=max(seconds, 0.0),
                              requests=row[f"n{i}"] or 0, errors=row[f"e{i}"] or 0,
                              output_tokens=row[f"t{i}"] or 0))
    return buckets


def job_marks(job: BatchJob) -> list[tuple[datetime, str]]:
    """The moments drawn across the chart: the drill firing and the resume after it."""
    marks = []
    if job.drill_fired_at is not None:
        marks.append((job.drill_fired_at, f"drill fired ({job.drill})"))
    if job.drill_resumed_at is not None:
        marks.append((job.drill_resumed_at, "resumed"))
    return marks


def throughput_figure(buckets: list[Bucket],
                      marks: list[tuple[datetime, str]] | None = None) -> go.Figure:
    """Requests/s (left axis) and output tokens/s (right axis) per bucket, errors/s as red
    bars: a stall (the drill's kill, a paused job) shows as a gap at zero, not a line
    drawn across it. `marks` (time, label) are drawn as dashed vertical lines."""
    x = [b.start for b in buckets]
    fig = go.Figure()
    for at, label in marks or []:
        fig.add_shape(type="line", x0=at, x1=at, y0=0, y1=1, yref="paper",
                      line={"color": ERRORS_COLOUR, "dash": "dash", "width": 1})
        fig.add_annotation(x=at, y=1, yref="paper", text=label, showarrow=False,
                           xanchor="left", yanchor="bottom", font={"size": 11})
    fig.add_trace(go.Bar(x=x, y=[round(b.errors / b.seconds, 3) if b.seconds else 0
                                 for b in buckets],
                         name="errors/s", marker={"color": ERRORS_COLOUR}, opacity=0.6,
                         hovertemplate="%{y:.2f} errors/s<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=[round(b.requests_per_s, 3) for b in buckets],
                             name="requests/s", mode="lines+markers",
                             line={"color": REQUESTS_COLOUR, "shape": "hv"},
                             hovertemplate="%{y:.2f} requests/s<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=[round(b.output_tokens_per_s, 1) for b in buckets],
                             name="output tokens/s", mode="lines", yaxis="y2",
                             line={"color": TOKENS_COLOUR, "shape": "hv", "dash": "dot"},
                             hovertemplate="%{y:.0f} output tokens/s<extra></extra>"))
    fig.update_layout(
        font=FONT, height=300, margin={"l": 50, "r": 60, "t": 20, "b": 40},
        legend={"orientation": "h", "y": -0.25}, hovermode="x unified", bargap=0.1,
        yaxis={"title": "requests/s", "rangemode": "tozero"},
        yaxis2={"title": "output tokens/s", "overlaying": "y", "side": "right",
                "rangemode": "tozero", "showgrid": False},
        xaxis={"title": "UTC"})
    return fig
