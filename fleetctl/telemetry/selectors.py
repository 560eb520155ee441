"""Reading telemetry: per-pool figures with their confidence bounds and where they come from.

Windows are merged exactly (counts add, histograms share their buckets). A window is read
whole when it overlaps the asked interval at all: with 10 s windows a 30 s question reads up
to 40 s of data, and after downsampling (a 60 s or 600 s window) more. Figures say how many
samples they stand on (`n`) and which source measured them (`source`); missing data is never
zero: no windows means requests 0 and Figures whose value is None.

Requests a client abandoned (`client_disconnects`) are shown apart and are in none of the
other figures: `requests`, the error rate's numerator and denominator, `rps` and the latency
percentiles are the pool's own (ingest.py says which hang-ups still give a TTFT).
`disconnect_rate` is their share of everything logged, for the guard to compare pools by.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from fleetctl.telemetry import histogram
from fleetctl.telemetry.models import (
    PROMETHEUS_CURSOR_PREFIX,
    Cursor,
    Window,
    prometheus_cursor_path,
)

LONGEST_WINDOW = timedelta(seconds=600)
_FIELDS = ("source", "source_name", "route", "pool", "resolution_s", "start", "requests",
           "errors", "client_disconnects", "retries", "fallbacks", "fell_over", "streamed",
           "ttft", "duration", "tpot", "updated_at")
TPOT_SOURCE = "pool /metrics (vllm:time_per_output_token_seconds)"


@dataclass(frozen=True)
class Figure:
    value: float | None  # the point estimate (ms, or a rate 0..1)
    low: float | None  # lower confidence bound
    high: float | None  # upper confidence bound
    n: int  # samples behind it
    source: str  # where it was measured, in plain words

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Reported:
    """What one pool-wide source outside the gateways reports of a pool: a Prometheus
    marked as a telemetry source (Window source "prometheus",
    fleetctl/prometheus/telemetry.py). Shown beside the gateways' figures, labelled by
    source; never judged by the ramp guard (it covers every route and the same requests the
    gateways logged)."""

    source: str  # "prometheus"
    source_name: str  # the metric source's name
    label: str  # "from Prometheus <name>"
    requests: int  # vllm:e2e_request_latency_seconds' count in the windows
    ttft_p95: Figure
    tpot_p95: Figure
    duration_p95: Figure
    last_data_at: datetime | None = None
    # The source's last error for this pool ("" when its last read answered): a source that
    # is down shows why its figures are dashes.
    error: str = ""
    last_read_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PoolStats:
    pool: str
    route: str | None
    since: datetime
    until: datetime
    requests: int
    errors: int
    retries: int
    streamed: int
    rps: float
    error_rate: Figure  # Wilson interval
    ttft_p50: Figure
    ttft_p95: Figure  # from gateway windows (route-scoped when route given)
    ttft_p99: Figure
    tpot_p95: Figure  # from the pool's own /metrics windows (pool-wide, route ignored)
    duration_p95: Figure
    sources: list[str] = field(default_factory=list)
    last_data_at: datetime | None = None
    # Requests the clients abandoned (not in `requests`), and their share of all the requests
    # logged (disconnects / (requests + disconnects), Wilson interval).
    client_disconnects: int = 0
    disconnect_rate: Figure = field(default_factory=lambda: Figure(None, None, None, 0, ""))
    # A context tier's per-request fallback (Window.fallbacks, Window.fell_over).
    fallbacks: int = 0
    fell_over: int = 0
    # Beside the gateways' figures: each Prometheus telemetry source's (Reported), pool-wide;
    # empty when none is configured (or when the caller did not ask: the guard).
    reported: list[Reported] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _overlapping(rows: Iterable[dict[str, Any]], since: datetime,
                 until: datetime) -> list[dict[str, Any]]:
    return [row for row in rows
            if row["start"] < until
            and row["start"] + timedelta(seconds=row["resolution_s"]) > since]


def _windows(*, source: str | tuple[str, ...], since: datetime, until: datetime,
             pools: list[str] | None, route: str | None = None) -> list[dict[str, Any]]:
    """One query: the windows of `source` (or of each source of a tuple) overlapping
    [since, until)."""
    rows = Window.objects.filter(start__lt=until, start__gt=since - LONGEST_WINDOW)
    rows = rows.filter(source__in=source) if isinstance(source, tuple) else \
        rows.filter(source=source)
    if pools is not None:
        rows = rows.filter(pool__in=pools)
    if route is not None:
        rows = rows.filter(route=route)
    return _overlapping(rows.order_by().values(*_FIELDS), since, until)


def _quantile_figure(h: dict[str, int], q: float, confidence: float, source: str) -> Figure:
    n = histogram.count(h)
    if n == 0:
        return Figure(None, None, None, 0, source)
    bounds = histogram.quantile_interval(h, q, confidence)
    low, high = bounds if bounds else (None, None)
    return Figure(histogram.quantile(h, q), low, high, n, source)


def _label(gateways: list[str]) -> str:
    if not gateways:
        return "gateway access logs (no data)"
    if len(gateways) == 1:
        return f"gateway {gateways[0]} access log"
    return f"gateways {', '.join(gateways)} access logs"


def _kinds(rows: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Gateway name -> kind for the gateways behind `rows` (one query; none when no rows)."""
    from fleetctl.traffic.models import Gateway

    names = {row["source_name"] for row in rows}
    if not names:
        return {}
    return dict(Gateway.objects.filter(name__in=names).values_list("name", "kind"))


def _ttft_source(label: str, gateways: list[str], kinds: dict[str, str]) -> str:
    """What the TTFT figure measured: Envoy's first body byte, HAProxy's and nginx's response
    headers (registry.GatewayKind.ttft_measures) — said per gateway when they differ."""
    from fleetctl.traffic.gateways import registry

    def measures(gateway: str) -> str:
        kind = registry.find(kinds.get(gateway, ""))
        return (kind.ttft_measures if kind is not None and kind.ttft_measures
                else "time to first byte of streamed answers; gateway no longer registered")

    meanings = {gateway: measures(gateway) for gateway in gateways}
    if len(set(meanings.values())) <= 1:
        return f"{label} ({next(iter(meanings.values()), measures(''))})"
    return "; ".join(f"gateway {gateway} access log ({meaning})"
                     for gateway, meaning in sorted(meanings.items()))


def _stats(*, pool: str, route: str | None, since: datetime, until: datetime,
           gateway_rows: list[dict[str, Any]], pool_rows: list[dict[str, Any]],
           confidence: float, kinds: dict[str, str]) -> PoolStats:
    requests = sum(row["requests"] for row in gateway_rows)
    errors = sum(row["errors"] for row in gateway_rows)
    # Requests the split gave this pool that it failed before their first byte, answered by
    # another pool of the tier (a context tier's fallback): the client got its answer, but the
    # pool failed them, so its error rate counts them (a guard must not see a dead pool as
    # one with no traffic).
    fell_over = sum(row["fell_over"] for row in gateway_rows)
    disconnects = sum(row["client_disconnects"] for row in gateway_rows)
    gateways = sorted({row["source_name"] for row in gateway_rows})
    label = _label(gateways)
    ttft = histogram.merge_all(row["ttft"] for row in gateway_rows)
    duration = histogram.merge_all(row["duration"] for row in gateway_rows)
    tpot = histogram.merge_all(row["tpot"] for row in pool_rows)
    error_rate = _rate(errors + fell_over, requests + fell_over, confidence,
                       f"{label} (5xx, no answer or cut off by the pool, or failed before "
                       f"the first byte and answered by another pool; client disconnects "
                       f"apart)")
    disconnect_rate = _rate(disconnects, requests + disconnects, confidence,
                            f"{label} (requests the client abandoned)")
    ttft_source = _ttft_source(label, gateways, kinds)
    seconds = max((until - since).total_seconds(), 1e-9)
    updated = [row["updated_at"] for row in (*gateway_rows, *pool_rows)]
    return PoolStats(
        pool=pool, route=route, since=since, until=until, requests=requests, errors=errors,
        retries=sum(row["retries"] for row in gateway_rows),
        streamed=sum(row["streamed"] for row in gateway_rows),
        rps=requests / seconds, error_rate=error_rate,
        ttft_p50=_quantile_figure(ttft, 0.50, confidence, ttft_source),
        ttft_p95=_quantile_figure(ttft, 0.95, confidence, ttft_source),
        ttft_p99=_quantile_figure(ttft, 0.99, confidence, ttft_source),
        tpot_p95=_quantile_figure(tpot, 0.95, confidence, TPOT_SOURCE),
        duration_p95=_quantile_figure(duration, 0.95, confidence,
                                      f"{label} (whole request)"),
        sources=[*gateways, *(["pool /metrics"] if pool_rows else [])],
        last_data_at=max(updated) if updated else None,
        client_disconnects=disconnects, disconnect_rate=disconnect_rate,
        fallbacks=sum(row["fallbacks"] for row in gateway_rows),
        fell_over=fell_over,
    )


def prometheus_label(name: str) -> str:
    return f"from Prometheus {name}"


def _prometheus_state(pools: list[str] | None) -> dict[tuple[str, str], tuple[str, Any]]:
    """(metric source, pool) -> (last error, last read) of the Prometheus telemetry sources'
    cursors (one query; a source's cursors go when it stops being one)."""
    cursors = Cursor.objects.filter(path__startswith=PROMETHEUS_CURSOR_PREFIX)
    if pools is not None:
        cursors = cursors.filter(path__in=[prometheus_cursor_path(p) for p in pools])
    return {(c["source_name"], c["path"][len(PROMETHEUS_CURSOR_PREFIX):]):
            (c["last_error"], c["last_read_at"])
            for c in cursors.values("source_name", "path", "last_error", "last_read_at")}


def _reported(pool: str, rows: list[dict[str, Any]],
              state: dict[tuple[str, str], tuple[str, Any]],
              confidence: float) -> list[Reported]:
    """One Reported per Prometheus source that reads the pool (has a cursor for it)."""
    by_source: dict[str, list[dict[str, Any]]] = {
        name: [] for name, of in state if of == pool}
    for row in rows:
        by_source[row["source_name"]].append(row)
    out = []
    for name in sorted(by_source):
        mine = by_source[name]
        label = prometheus_label(name)
        error, read_at = state.get((name, pool), ("", None))

        def figure(key: str, what: str, mine: list[dict[str, Any]] = mine,
                   label: str = label) -> Figure:
            return _quantile_figure(histogram.merge_all(r[key] for r in mine), 0.95,
                                    confidence, f"{label} ({what}, pool-wide: every route)")

        updated = [r["updated_at"] for r in mine]
        out.append(Reported(
            source=Window.Source.PROMETHEUS, source_name=name, label=label,
            requests=sum(r["requests"] for r in mine),
            ttft_p95=figure("ttft", "vllm:time_to_first_token_seconds"),
            tpot_p95=figure("tpot", "vllm:time_per_output_token_seconds"),
            duration_p95=figure("duration", "vllm:e2e_request_latency_seconds"),
            last_data_at=max(updated) if updated else None, error=error,
            last_read_at=read_at))
    return out


def _rate(count: int, total: int, confidence: float, source: str) -> Figure:
    """count / total with its Wilson interval; no value without a total."""
    from fleetctl.inference.confidence import wilson_interval

    if not total:
        return Figure(None, None, None, 0, source)
    interval = wilson_interval(count, total, confidence)
    return Figure(interval.estimate, interval.lower, interval.upper, total, source)


def pool_stats(*, pool: str, route: str | None = None, since: datetime,
               until: datetime | None = None, confidence: float = 0.99,
               reported: bool = False) -> PoolStats:
    """What every gateway saw of `pool` (on `route`, or all its routes) in [since, until),
    plus the pool's own TPOT, in two queries (three when a gateway saw it: their kinds name
    what the TTFT measured).

    Windows overlapping the interval's edges are included whole (a window is the finest
    grain there is), so the figures may cover up to one window more on each side; `rps`
    divides by the asked interval.

    With `reported`, also each Prometheus telemetry source's figures (PoolStats.reported;
    three queries more). The guard never asks: it judges the gateways' windows only."""
    until = until or timezone.now()
    gateway_rows = _windows(source=Window.Source.GATEWAY, since=since, until=until,
                            pools=[pool], route=route)
    pool_rows = _windows(source=Window.Source.POOL, since=since, until=until, pools=[pool])
    stats = _stats(pool=pool, route=route, since=since, until=until,
                   gateway_rows=gateway_rows, pool_rows=pool_rows, confidence=confidence,
                   kinds=_kinds(gateway_rows))
    if not reported:
        return stats
    return replace(stats, reported=reported_of([pool], since=since, until=until,
                                               confidence=confidence)[pool])


def _resolution(since: datetime, until: datetime) -> int:
    span = (until - since).total_seconds()
    for resolution in (10, 60, 600):
        if span / resolution <= 360:
            return resolution
    return 3600


def pool_series(*, pool: str, route: str | None = None, since: datetime,
                until: datetime | None = None, resolution_s: int | None = None,
                confidence: float = 0.99) -> list[dict[str, Any]]:
    """Per time step of `resolution_s` (by default the finest giving at most 360 points):
    start, requests, errors, error_rate, client_disconnects, ttft_p50/p95/p99, tpot_p95, rps.
    Steps without data are left out (not zero)."""
    from fleetctl.telemetry.services import window_start

    until = until or timezone.now()
    step = resolution_s or _resolution(since, until)
    gateway_rows = _windows(source=Window.Source.GATEWAY, since=since, until=until,
                            pools=[pool], route=route)
    pool_rows = _windows(source=Window.Source.POOL, since=since, until=until, pools=[pool])
    kinds = _kinds(gateway_rows)
    steps: dict[datetime, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for rows, side in ((gateway_rows, 0), (pool_rows, 1)):
        for row in rows:
            at = window_start(row["start"].timestamp(), step)
            steps.setdefault(at, ([], []))[side].append(row)
    out = []
    for at in sorted(steps):
        g_rows, p_rows = steps[at]
        stats = _stats(pool=pool, route=route, since=at, until=at + timedelta(seconds=step),
                       gateway_rows=g_rows, pool_rows=p_rows, confidence=confidence,
                       kinds=kinds)
        out.append({
            "start": at, "requests": stats.requests, "errors": stats.errors,
            "error_rate": stats.error_rate.value,
            "client_disconnects": stats.client_disconnects, "ttft_p50": stats.ttft_p50.value,
            "ttft_p95": stats.ttft_p95.value, "ttft_p99": stats.ttft_p99.value,
            "tpot_p95": stats.tpot_p95.value, "rps": stats.rps,
        })
    return out


def live_summary(*, pools: list[str] | None = None, window_s: int = 60,
                 confidence: float = 0.99, route: str | None = None) -> dict[str, PoolStats]:
    """The last `window_s` seconds of every pool (or those named), all routes together or
    one `route` (the gateways' figures; a pool's own TPOT is pool-wide), with each
    Prometheus telemetry source's figures beside them (`reported`): one query for the pools,
    one for the gateways' windows, one for the pools' own and the Prometheus ones, one for
    the gateways' kinds, one for the Prometheus sources' state — however many pools."""
    from fleetctl.fleet.models import Pool

    until = timezone.now()
    since = until - timedelta(seconds=window_s)
    names = list(Pool.objects.order_by("name").values_list("name", flat=True)
                 if pools is None else Pool.objects.filter(name__in=pools)
                 .order_by("name").values_list("name", flat=True))
    by_pool: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
        name: ([], []) for name in names}
    prometheus_rows = []
    for row in _windows(source=Window.Source.GATEWAY, since=since, until=until, pools=pools,
                        route=route):
        if row["pool"] in by_pool:
            by_pool[row["pool"]][0].append(row)
    for row in _windows(source=(Window.Source.POOL, Window.Source.PROMETHEUS), since=since,
                        until=until, pools=pools):
        if row["source"] == Window.Source.PROMETHEUS:
            prometheus_rows.append(row)
        elif row["pool"] in by_pool:
            by_pool[row["pool"]][1].append(row)
    kinds = _kinds(row for g_rows, _ in by_pool.values() for row in g_rows)
    # Each Prometheus telemetry source's figures beside them (pool-wide, never judged).
    reported = reported_of(names, since=since, until=until, confidence=confidence,
                           rows=prometheus_rows)
    return {name: replace(_stats(pool=name, route=route, since=since, until=until,
                                 gateway_rows=g_rows, pool_rows=p_rows, confidence=confidence,
                                 kinds=kinds), reported=reported[name])
            for name, (g_rows, p_rows) in by_pool.items()}


def reported_of(pools: list[str], *, since: datetime, until: datetime,
                confidence: float = 0.99, rows: list[dict[str, Any]] | None = None
                ) -> dict[str, list[Reported]]:
    """Pool -> what each Prometheus telemetry source reading it reports of it in [since,
    until) (Reported, labelled "from Prometheus <name>"); empty lists when no source reads
    it (a source's cursors go when it stops being one, and with them its figures). One query
    for the sources' state, one for their windows unless `rows` has them already or no
    source reads any of the pools."""
    state = _prometheus_state(pools)
    if not state:
        return {pool: [] for pool in pools}
    if rows is None:
        rows = _windows(source=Window.Source.PROMETHEUS, since=since, until=until,
                        pools=pools)
    by_pool: dict[str, list[dict[str, Any]]] = {pool: [] for pool in pools}
    for row in rows:
        if row["pool"] in by_pool and (row["source_name"], row["pool"]) in state:
            by_pool[row["pool"]].append(row)
    return {pool: _reported(pool, by_pool[pool], state, confidence) for pool in pools}


def ingest_status(now: datetime | None = None) -> list[dict[str, Any]]:
    """Per cursor: which source (a gateway's log, a pool's /metrics, a Prometheus's view of
    one pool: path "prometheus:<pool>"), how far it got, how long ago an ingester last read
    it (`lag_s`; None when it never has) and which ingester holds its shard now
    (`ingester`: "host:pid:random"; None when none does). The pools' /metrics and the
    Prometheus sources are read by the scrape shard."""
    from fleetctl.telemetry.ingest import LEASE_SOURCE, SCRAPE_SHARD, SHARD_PREFIX, log_shard

    now = now or timezone.now()
    # The ingesters' leases and heartbeats are Cursor rows too (ingest.py), but no source.
    holders = {row.path.removeprefix(SHARD_PREFIX): (row.last_counters or {}).get("owner")
               or None for row in Cursor.objects.filter(
                   source_name=LEASE_SOURCE, path__startswith=SHARD_PREFIX, updated_at__gte=now)}
    out = []
    for cursor in Cursor.objects.exclude(source_name=LEASE_SOURCE).order_by("source_name",
                                                                             "path"):
        is_metrics = cursor.path.startswith(("http://", "https://"))
        is_prometheus = cursor.path.startswith(PROMETHEUS_CURSOR_PREFIX)
        out.append({
            "source": cursor.source_name,
            "kind": ("Prometheus" if is_prometheus else "pool /metrics" if is_metrics
                     else "gateway access log"),
            "path": cursor.path,
            "lines": cursor.lines,  # lines read (a log) or scrapes answered (/metrics)
            "malformed": cursor.malformed,
            "offset": cursor.offset,
            "rotations": cursor.rotations,
            "truncations": cursor.truncations,
            "last_read_at": cursor.last_read_at,
            "lag_s": (now - cursor.last_read_at).total_seconds()
            if cursor.last_read_at else None,
            "last_error": cursor.last_error,
            "ingester": holders.get(SCRAPE_SHARD if is_metrics or is_prometheus
                                    else log_shard(cursor.source_name)),
        })
    return out


TIER_LIVE_MINUTES = 15
_TIER_FIELDS = ("start", "resolution_s", "pool", "tiers")


def route_tier_live(route: str, *, minutes: float = TIER_LIVE_MINUTES,
                    now: datetime | None = None) -> dict[str, Any]:
    """What the gateways' logs say each context tier of `route` carried lately: per tier
    ("0", "1", ... and "unknown": the prompts the gateway could not size), the requests its
    entry routed and each pool's share of them (0..1), over the windows overlapping the last
    `minutes` (every gateway summed). Tiers that routed nothing are absent; a route without
    tiers, or a gateway kind that does not log them, gives {"tiers": {}}. Client disconnects
    count too: the question is where the gateway sent requests, not how they ended."""
    until = now or timezone.now()
    since = until - timedelta(minutes=minutes)
    rows = Window.objects.filter(source=Window.Source.GATEWAY, route=route,
                                 start__lt=until, start__gt=since - LONGEST_WINDOW)
    counts: dict[str, dict[str, int]] = {}
    for row in _overlapping(rows.order_by().values(*_TIER_FIELDS), since, until):
        for tier, n in (row["tiers"] or {}).items():
            pools = counts.setdefault(str(tier), {})
            pools[row["pool"]] = pools.get(row["pool"], 0) + int(n)
    tiers: dict[str, Any] = {}
    for tier in sorted(counts, key=lambda t: (not t.isdigit(), int(t) if t.isdigit() else 0)):
        total = sum(counts[tier].values())
        tiers[tier] = {"requests": total, "pools": [
            {"pool": pool, "requests": n, "share": n / total if total else 0.0,
             "percent": round(100 * n / total, 1) if total else 0.0}
            for pool, n in sorted(counts[tier].items(), key=lambda kv: (-kv[1], kv[0]))]}
    return {"since": since, "until": until, "minutes": minutes, "tiers": tiers}
