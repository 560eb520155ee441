"""Live cost per pool (and a route's share of it): what the pool's hours cost against the
output tokens it actually served, beside the benchmark's figure, with the gap explained.

- **Tokens**: the pool's own `vllm:generation_tokens_total`, delta per scrape (scrape.py;
  Window.output_tokens). The gateways cannot count them: Envoy does not parse a streamed
  body, and an answer's `usage` is only in its last SSE chunk, so access logs carry none.
- **Hours**: the time that counter covered (Window.metered_ms: from each scrape to the
  next), so tokens and hours are the same interval; a pool the ingester did not scrape for
  a while has neither for that while.
- **Cost** = node_hourly_rate × hours, in the pool's currency; **cost per 1M output tokens**
  = fleet.costs.cost_per_1m(rate, tokens ÷ seconds): the benchmark's formula, so the two
  compare like with like.
- **Utilisation** = mean running requests (`vllm:num_requests_running`, every endpoint
  summed, one sample per scrape round) ÷ the pool's SLO capacity in streams (the most
  concurrent streams at which its latest valid benchmark held the SLO:
  traffic.capacity.pool_capacities). The benchmark ran at that concurrency, so a pool below
  it pays for idle hours and costs more per token.
- **A route's share**: the gateways' requests of that route to the pool over all the
  gateways' requests to it, in the same period; the pool's tokens and cost are split by it
  (a request share, not a token share: gateways cannot see tokens).

- **Cost per successful request** = the period's cost ÷ the requests the pool answered
  without error (the gateways' access logs: requests − errors). Errors are what the ramp
  guard counts against the pool: 5xx, no answer, cut off by the pool, and requests the
  split sent it that another pool of the tier answered (`fell_over`); the attempts Envoy
  retried are spend (the pool's hours) and never successes. A route's: its share of the
  cost ÷ its own successes.

A missing rate, no token counter or no tokens give "not measured: <reason>", never 0; so do
no successful request or no request logged (`per_success_not_measured`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from fleetctl.telemetry.models import Window

TOKENS_SOURCE = "pool /metrics (vllm:generation_tokens_total, delta per scrape)"
GATEWAY_CANNOT = ("the gateways' access logs carry no token counts (a streamed answer's "
                  "usage is in its body, which Envoy does not parse)")
PERIODS = ("day", "month")
_FIELDS = ("pool", "route", "source", "start", "resolution_s", "requests", "errors",
           "retries", "fell_over", "output_tokens", "metered_ms", "running_sum",
           "running_samples")
REQUESTS_SOURCE = ("the gateways' access logs (errors: 5xx, no answer, cut off by the pool, "
                   "or failed over to another pool of the tier; client disconnects apart)")


@dataclass
class LiveCost:
    pool: str
    since: datetime
    until: datetime
    currency: str
    hourly_rate: str
    output_tokens: int | None = None
    hours: float | None = None  # metered: the time the token counter covered
    cost: str | None = None
    cost_per_1m: str | None = None
    output_tokens_per_s: float | None = None
    utilisation: float | None = None
    mean_running: float | None = None
    capacity_streams: float | None = None
    capacity_tokens_per_s: float | None = None
    utilisation_source: str = ""
    tokens_source: str = TOKENS_SOURCE
    not_measured: str = ""  # why cost_per_1m is None ("" when it is measured)
    route: str | None = None
    route_share: float | None = None  # the route's share of the pool's gateway requests
    benchmark_cost_per_1m: str | None = None
    benchmark_source: str = ""
    gap: str = ""  # live against the benchmark, in words
    routes: list[dict[str, Any]] = field(default_factory=list)
    # An interruptible pool's tax, in the cost (fleet/interruption.py): "incl. interruption
    # tax +6.2 % (…)"; the rate the cost used (= hourly_rate when not interruptible).
    interruption: str = ""
    effective_hourly_rate: str | None = None
    # Cost per successful request (the gateways' access logs; None with the reason).
    requests: int | None = None  # attempted: logged requests + those that fell over
    failed_requests: int | None = None  # 5xx, no answer, cut off by the pool, fell over
    retries: int | None = None  # upstream attempts beyond the first (Envoy's retries)
    successful_requests: int | None = None
    error_rate: float | None = None
    cost_per_success: str | None = None
    per_success_not_measured: str = ""
    requests_source: str = REQUESTS_SOURCE

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rows(pools: list[str], since: datetime, until: datetime,
          route: str | None = None) -> list[dict[str, Any]]:
    from fleetctl.telemetry.selectors import LONGEST_WINDOW, _overlapping

    # The gateways' and the pools' own windows: a Prometheus's (pool-wide, the same requests
    # again) are never part of the cost.
    rows = (Window.objects.filter(source__in=[Window.Source.POOL, Window.Source.GATEWAY],
                                  pool__in=pools, start__lt=until,
                                  start__gt=since - LONGEST_WINDOW)
            .order_by().values(*_FIELDS))
    return [row for row in _overlapping(rows, since, until)
            if row["source"] == Window.Source.POOL or route is None or row["route"] == route]


def _capacity(pool: Any) -> Any:
    """The pool's SLO capacity from its newest benchmark of any model it was measured on
    (one read however many models it serves)."""
    from fleetctl.traffic.capacity import pool_capacities

    return pool_capacities("", [pool])[pool.name]


def _money(value: Decimal) -> str:
    return str(value.quantize(Decimal("0.0001")))


def _measure(pool: Any, rows: list[dict[str, Any]], since: datetime, until: datetime,
             capacity: Any, route: str | None = None, tax: Any = None) -> LiveCost:
    live = _measure_cost(pool, rows, since, until, capacity, route, tax)
    if live.cost is None and live.successful_requests is not None:
        # Requests were logged but the cost is not measured: its reason is this one's too.
        live.per_success_not_measured = live.not_measured
    return live


def _measure_cost(pool: Any, rows: list[dict[str, Any]], since: datetime, until: datetime,
                  capacity: Any, route: str | None = None, tax: Any = None) -> LiveCost:
    from fleetctl.fleet.costs import cost_per_1m
    from fleetctl.fleet.interruption import effective_rate
    from fleetctl.fleet.models import money

    tax = tax or effective_rate(pool)  # no query for a pool that is not interruptible
    live = LiveCost(pool=pool.name, since=since, until=until, currency=pool.currency,
                    hourly_rate=money(tax.hourly_rate), route=route, interruption=tax.text)
    rate = tax.effective_rate if tax.effective_rate is not None else tax.hourly_rate
    live.effective_hourly_rate = money(rate) if tax.effective_rate is not None else None
    own = [row for row in rows if row["source"] == Window.Source.POOL]
    metered_ms = sum(row["metered_ms"] for row in own)
    tokens = sum(row["output_tokens"] for row in own)
    samples = sum(row["running_samples"] for row in own)
    if samples:
        live.mean_running = sum(row["running_sum"] for row in own) / samples
    if capacity.known and capacity.streams:
        live.capacity_streams, live.capacity_tokens_per_s = (capacity.streams,
                                                             capacity.tokens_per_s)
    if live.mean_running is not None and live.capacity_streams:
        live.utilisation = live.mean_running / live.capacity_streams
        live.utilisation_source = (
            f"mean running requests (vllm:num_requests_running, {samples} scrape rounds) "
            f"÷ {live.capacity_streams:g} SLO streams ({capacity.source})")
    else:
        live.utilisation_source = (
            "not measured: " + ("no vllm:num_requests_running seen from every endpoint"
                                if live.mean_running is None else
                                f"no SLO capacity: {capacity.why_none or capacity.source}"))
    if route is not None:
        gateway = [row for row in rows if row["source"] == Window.Source.GATEWAY]
        total = sum(row["requests"] for row in gateway)
        mine = sum(row["requests"] for row in gateway if row["route"] == route)
        live.route_share = mine / total if total else None
    _count_requests(live, rows, route)
    if not own:
        live.not_measured = (f"not measured: no token counter seen in this period (the "
                             f"pool's /metrics was not scraped — is the ingester running? — "
                             f"or has no vllm:generation_tokens_total); {GATEWAY_CANNOT}")
        return live
    if not metered_ms:
        live.not_measured = (f"not measured: the pool's /metrics has no "
                             f"vllm:generation_tokens_total (or only one scrape of it so "
                             f"far); {GATEWAY_CANNOT}")
        return live
    share = 1.0 if route is None else live.route_share
    if share is None:
        live.not_measured = (f"not measured: the gateways logged no request to this pool "
                             f"in this period, so route {route} has no share of it")
        return live
    seconds = metered_ms / 1000
    live.hours = seconds / 3600 * share
    live.output_tokens = round(tokens * share)
    if rate <= 0:
        live.not_measured = ("not measured: the pool's hourly rate is 0 — set its "
                             "node_hourly_rate (Fleet → the pool → Edit) to price it")
        return live
    if tax.not_measured:
        live.not_measured = tax.not_measured
        return live
    spent = rate * Decimal(str(seconds)) / Decimal(3600) * Decimal(str(share))
    live.cost = _money(spent)
    _per_success(live, spent)
    if not tokens:
        live.not_measured = (f"not measured: no output tokens served in this period; the "
                             f"pool still cost {live.cost} {pool.currency} (idle)")
        return live
    live.output_tokens_per_s = tokens / seconds
    live.cost_per_1m = _money(cost_per_1m(rate, live.output_tokens_per_s))
    _explain(pool, live, capacity, tax.apply(pool.cost_per_1m_output_tokens))
    return live


def _count_requests(live: LiveCost, rows: list[dict[str, Any]], route: str | None) -> None:
    """The gateways' requests to the pool (of `route`) as the ramp guard counts them: a
    request the split sent the pool that another pool answered (fell_over) is an attempt
    the pool failed."""
    gateway = [row for row in rows if row["source"] == Window.Source.GATEWAY
               and (route is None or row["route"] == route)]
    if not gateway:
        live.per_success_not_measured = (
            "not measured: the gateways logged no request to this pool"
            + (f" on route {route}" if route else "") + " in this period (are its routes "
            "behind a gateway whose access log the ingester follows?)")
        return
    logged = sum(row["requests"] for row in gateway)
    fell_over = sum(row["fell_over"] for row in gateway)
    errors = sum(row["errors"] for row in gateway)
    live.requests, live.failed_requests = logged + fell_over, errors + fell_over
    live.retries = sum(row["retries"] for row in gateway)
    live.successful_requests = max(0, logged - errors)
    live.error_rate = live.failed_requests / live.requests if live.requests else None


def _per_success(live: LiveCost, spent: Decimal) -> None:
    """Cost per successful request, once the cost is known (`spent`, before rounding)."""
    from fleetctl.fleet.costs import cost_per_success

    if live.successful_requests is None or live.cost is None:
        return
    if not live.successful_requests:
        live.per_success_not_measured = (
            f"not measured: no request succeeded in this period ({live.requests} attempted, "
            f"{live.failed_requests} failed); the pool still cost {live.cost} {live.currency}")
        return
    live.cost_per_success = str(cost_per_success(spent, live.successful_requests))
    live.per_success_not_measured = ""


def _explain(pool: Any, live: LiveCost, capacity: Any, bench: Decimal | None) -> None:
    """Live against the pool's benchmark cost per 1M (with the same interruption tax), with
    what makes the gap."""
    if bench is None:
        live.gap = "no benchmark cost yet: run a benchmark of the pool to compare"
        return
    live.benchmark_cost_per_1m = _money(Decimal(bench))
    live.benchmark_source = pool.cost_source or "the pool's latest passing benchmark"
    bench_currency = pool.cost_currency or pool.currency
    if pool.cost_stale_reason or bench_currency != live.currency:
        live.gap = (f"not compared: the benchmark cost is stale "
                    f"({pool.cost_stale_reason or 'other currency'})")
        return
    ratio = float(Decimal(live.cost_per_1m or 0) / Decimal(bench))
    head = (f"live {Decimal(live.cost_per_1m or 0):.2f} vs benchmark {Decimal(bench):.2f} "
            f"{live.currency} per 1M ({live.benchmark_source}), {ratio:.2f}×")
    why = []
    if live.utilisation is not None:
        why.append(f"utilisation {100 * live.utilisation:.0f} % (mean "
                   f"{live.mean_running:.1f} of {live.capacity_streams:g} SLO streams "
                   f"running; the benchmark ran at its SLO concurrency)")
    if capacity.known and live.output_tokens_per_s is not None:
        why.append(f"the pool served {live.output_tokens_per_s:,.0f} output tokens/s, "
                   f"{100 * live.output_tokens_per_s / capacity.tokens_per_s:.0f} % of the "
                   f"{capacity.tokens_per_s:,.0f} its benchmark gave at the SLO")
    if not why:
        why.append("no SLO capacity to explain it: " + (capacity.why_none or "no benchmark"))
    live.gap = f"{head}: {'; '.join(why)}"


def live_cost(*, pool: str, since: datetime, until: datetime,
              route: str | None = None, breakdown: bool = True, tax: Any = None) -> LiveCost:
    """Live cost of `pool` in [since, until) (windows overlapping it read whole), or of
    `route`'s share of it, with a per-route breakdown when no route is asked (and
    `breakdown`: the pool page leaves it to the API, as it costs queries per route)."""
    from fleetctl.fleet.models import Pool

    row = Pool.objects.prefetch_related("models").get(name=pool)
    capacity = _capacity(row)
    rows = _rows([pool], since, until)
    tax = tax or _tax(row)  # the page that has it already passes it
    live = _measure(row, rows, since, until, capacity, route=route, tax=tax)
    if route is None and breakdown:
        live.routes = _route_shares(row, rows, since, until, capacity, tax)
    return live


def _tax(pool: Any) -> Any:
    """The pool's interruption tax, read once for all its figures (fleet/interruption.py)."""
    from fleetctl.fleet.interruption import effective_rate

    return effective_rate(pool)


def _route_shares(pool: Any, rows: list[dict[str, Any]], since: datetime, until: datetime,
                  capacity: Any, tax: Any = None) -> list[dict[str, Any]]:
    routes = sorted({row["route"] for row in rows if row["source"] == Window.Source.GATEWAY})
    out = []
    for route in routes:
        part = _measure(pool, rows, since, until, capacity, route=route, tax=tax)
        out.append({"route": route, "share": part.route_share,
                    "output_tokens": part.output_tokens, "cost": part.cost,
                    "not_measured": part.not_measured, "requests": part.requests,
                    "failed_requests": part.failed_requests, "retries": part.retries,
                    "successful_requests": part.successful_requests,
                    "cost_per_success": part.cost_per_success,
                    "per_success_not_measured": part.per_success_not_measured})
    return out


def _buckets(since: datetime, until: datetime, period: str) -> list[tuple[datetime, datetime]]:
    """UTC days or calendar months covering [since, until), each clipped to it."""
    at = since.astimezone(UTC)
    start = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        start = start.replace(day=1)
    out = []
    while start < until:
        if period == "day":
            end = start + timedelta(days=1)
        else:
            end = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
        out.append((max(start, since), min(end, until)))
        start = end
    return out


def live_cost_rollup(*, pool: str, since: datetime, until: datetime, period: str,
                     route: str | None = None, tax: Any = None) -> list[LiveCost]:
    """Live cost per UTC day or calendar month in [since, until) (windows are kept 30 days:
    a month's rollup covers what is left of it). A window belongs to the bucket it starts in."""
    from fleetctl.fleet.models import Pool

    if period not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)}")
    row = Pool.objects.prefetch_related("models").get(name=pool)
    capacity = _capacity(row)
    rows = _rows([pool], since, until)
    tax = tax or _tax(row)  # the page that has it already passes it
    out = []
    for start, end in _buckets(since, until, period):
        mine = [r for r in rows if start <= max(r["start"], since) < end]
        out.append(_measure(row, mine, start, end, capacity, route=route, tax=tax))
    return out


OVERVIEW_WINDOW_S = 3600


def live_costs(pools: list[Any], *, window_s: int,
               capacities: bool = True) -> dict[str, LiveCost]:
    """Every pool given (Pool rows) over the last `window_s` seconds, in one windows query;
    with `capacities`, each scraped pool's SLO capacity is looked up too (queries per pool:
    the fleet overview goes without, and shows mean running requests instead)."""
    from django.utils import timezone

    from fleetctl.fleet.interruption import effective_rates
    from fleetctl.traffic.capacity import PoolCapacity

    if not pools:
        return {}
    until = timezone.now()
    since = until - timedelta(seconds=window_s)
    rows = _rows([pool.name for pool in pools], since, until)
    by_pool: dict[str, list[dict[str, Any]]] = {pool.name: [] for pool in pools}
    for row in rows:
        by_pool[row["pool"]].append(row)
    taxes = effective_rates(pools)  # one drill read for every interruptible pool
    out = {}
    for pool in pools:
        mine = by_pool[pool.name]
        scraped = any(row["source"] == Window.Source.POOL for row in mine)
        capacity = (_capacity(pool) if scraped and capacities else PoolCapacity(
            pool=pool.name, why_none="not looked up on the overview: see the pool's page"))
        out[pool.name] = _measure(pool, mine, since, until, capacity, tax=taxes[pool.name])
    return out


def overview_costs(pools: Any) -> dict[str, dict[str, str]]:
    """The fleet overview's live cost column ("fleet.pool_cost"): per pool, the text of the
    cell, the gap beside the benchmark in a few words, and the whole story as a title. One
    query however many pools (no capacity lookup: the pool page has utilisation)."""
    out = {}
    for name, live in live_costs(list(pools), window_s=OVERVIEW_WINDOW_S,
                                 capacities=False).items():
        running = (f"{live.mean_running:.1f} running" if live.mean_running is not None
                   else "")
        if live.cost_per_1m is None:
            out[name] = {"text": "", "note": running, "title": live.not_measured}
            continue
        note = running
        if live.benchmark_cost_per_1m is not None and not live.gap.startswith("not"):
            ratio = Decimal(live.cost_per_1m) / Decimal(live.benchmark_cost_per_1m)
            note = f"{ratio:.2f}× benchmark" + (f" · {running}" if running else "")
        if live.interruption:
            note = "incl. interruption tax" + (f" · {note}" if note else "")
        out[name] = {"text": f"{Decimal(live.cost_per_1m):.2f} {live.currency}", "note": note,
                     "title": f"last hour: {live.output_tokens:,} output tokens in "
                              f"{live.hours or 0:.2f} h ({live.tokens_source}). {live.gap}."
                              + (f" Cost {live.interruption}." if live.interruption else "")}
    return out
