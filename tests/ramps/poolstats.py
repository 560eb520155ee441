"""PoolStats built from samples, as telemetry.selectors.pool_stats builds them from windows:
the same histograms (fleetctl.telemetry.histogram), the same 99 % bounds (order statistics
for quantiles, Wilson for the error rate). For the guard's unit tests, which need no
database."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from fleetctl.inference.confidence import wilson_interval
from fleetctl.telemetry import histogram
from fleetctl.telemetry.selectors import Figure, PoolStats

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def figure(samples: Sequence[float], q: float, source: str = "test") -> Figure:
    h: dict[str, int] = {}
    for ms in samples:
        histogram.add(h, float(ms))
    n = histogram.count(h)
    if not n:
        return Figure(None, None, None, 0, source)
    bounds = histogram.quantile_interval(h, q, 0.99)
    assert bounds is not None
    return Figure(histogram.quantile(h, q), bounds[0], bounds[1], n, source)


def rate(errors: int, requests: int) -> Figure:
    if not requests:
        return Figure(None, None, None, 0, "test")
    interval = wilson_interval(errors, requests, 0.99)
    return Figure(errors / requests, interval.lower, interval.upper, requests, "test")


def stats(pool: str, *, ttft: Sequence[float] = (), tpot: Sequence[float] = (),
          requests: int | None = None, errors: int = 0, window_s: float = 30.0,
          last_data_at: datetime | None = NOW, route: str = "llama",
          disconnects: int = 0, duration: Sequence[float] | None = None,
          fell_over: int = 0) -> PoolStats:
    """A pool's figures over the `window_s` seconds before NOW; every request streamed unless
    `requests` says there were more. `disconnects`: requests the clients abandoned besides
    (in no other figure, as telemetry counts them). `duration`: whole-request latencies
    (default: the TTFTs, as if every answer ended at its first byte)."""
    requests = len(ttft) if requests is None else requests
    return PoolStats(
        pool=pool, route=route, since=NOW - timedelta(seconds=window_s), until=NOW,
        requests=requests, errors=errors, retries=0, streamed=len(ttft),
        rps=requests / window_s, error_rate=rate(errors + fell_over, requests + fell_over),
        ttft_p50=figure(ttft, 0.5), ttft_p95=figure(ttft, 0.95), ttft_p99=figure(ttft, 0.99),
        tpot_p95=figure(tpot, 0.95),
        duration_p95=figure(ttft if duration is None else duration, 0.95),
        sources=["test"],
        last_data_at=last_data_at if requests or disconnects or fell_over else None,
        client_disconnects=disconnects,
        disconnect_rate=rate(disconnects, requests + disconnects), fell_over=fell_over)
