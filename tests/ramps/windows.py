"""Telemetry for the ramp tests, written as the ingester writes it: 10 s Window rows of what a
gateway saw per (route, pool), histograms from fleetctl.telemetry.histogram."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from fleetctl.telemetry import histogram
from fleetctl.telemetry.models import Window

RESOLUTION_S = 10


def boundary(moment: datetime) -> datetime:
    """The first window boundary at or after `moment`: a step set there is judged on its
    windows from the first (the guard skips a window that began before its step)."""
    epoch = moment.timestamp()
    aligned = epoch - epoch % RESOLUTION_S
    if aligned < epoch:
        aligned += RESOLUTION_S
    return datetime.fromtimestamp(aligned, tz=moment.tzinfo)


def window(*, pool: str, start: datetime, ttft: Sequence[float], route: str = "llama",
           errors: int = 0, updated_at: datetime | None = None, gateway: str = "gw-1") -> Window:
    """One gateway window: every request streamed, its first byte after `ttft` ms."""
    h: dict[str, int] = {}
    for ms in ttft:
        histogram.add(h, float(ms))
    row, _ = Window.objects.get_or_create(
        source=Window.Source.GATEWAY, source_name=gateway, route=route, pool=pool,
        resolution_s=RESOLUTION_S, start=start)
    # Added to what the window holds, as the ingester's flushes add.
    row.requests += len(ttft)
    row.errors += errors
    row.streamed += len(ttft)
    row.ttft = histogram.merge(row.ttft, h)
    row.duration = histogram.merge(row.duration, h)
    row.updated_at = updated_at or start + timedelta(seconds=RESOLUTION_S)
    row.save()
    return row


def traffic(*, since: datetime, until: datetime, per_window: dict[str, Sequence[float]],
            route: str = "llama") -> None:
    """Windows from `since` to `until` (aligned down to 10 s), the same samples in each."""
    epoch = since.timestamp() // RESOLUTION_S * RESOLUTION_S
    start = datetime.fromtimestamp(epoch, tz=since.tzinfo)
    while start < until:
        for pool, samples in per_window.items():
            window(pool=pool, start=start, ttft=samples, route=route,
                   updated_at=min(start + timedelta(seconds=RESOLUTION_S), until))
        start += timedelta(seconds=RESOLUTION_S)
