"""The shadow feature's live state in Redis: which route has a running run (and its spend
caps), the run's counters, its token spend today, and the admission check (rate, tokens,
behind) that the collector and the replay task both apply.

Redis, not the database, because the collector reads it on the mirror path at thousands of
requests per second and must never wait on PostgreSQL (it never connects to it), and because a
stop must reach every collector within a second: `unpublish_run` deletes one hash field and
each collector re-reads the hash every second (the kill switch).

Keys (docs/shadow.md, "The collector"):

- `fleetctl:shadow:routes` — hash, field = route name, value = JSON {"run", "max_rps",
  "max_tokens_per_day"}: the running run of each mirrored route.
- `fleetctl:shadow:run:<id>:counters` — hash of COUNTER_FIELDS (HINCRBY).
- `fleetctl:shadow:unmatched` — hash, field = route name (or "-" when the mirrored request
  named none): mirrored requests for which no run was running.
- `fleetctl:shadow:run:<id>:tokens:<YYYYMMDD>` — the run's tokens on that UTC day, all three
  sides; expires after two days.
- `fleetctl:shadow:run:<id>:rate` — the run's request-rate state (GCRA: the theoretical
  arrival time of the next request, µs), shared by every collector and the replay task, so
  `max_rps` is a cap on the run, not on each process.
- `fleetctl:shadow:mirror-auth` — hash, field = route name, value = the gateways that carry
  the route and digests of the mirror tokens each may present (written by traffic,
  fleetctl/traffic/mirror_auth.py); re-read with the routes hash. A copy without a valid
  token is refused and counted `refused_unauthenticated`.

Sync functions use `redis` (web, workers, replay); the `a…` twins use `redis.asyncio` for the
collector's event loop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
import redis.asyncio as aredis
from django.conf import settings

from fleetctl.traffic import mirror_auth

ROUTES_KEY = "fleetctl:shadow:routes"
UNMATCHED_KEY = "fleetctl:shadow:unmatched"
# The Celery queue `shadow.pair` and `shadow.replay` go to (fleetctl/celery.py ROUTES). Kombu's
# Redis transport keeps a queue's messages in a list named after it.
SHADOW_QUEUE = "shadow"
# Unmatched requests that named no route (the gateway always sets the header; a stray POST
# does not).
NO_ROUTE = "-"
TOKENS_TTL_S = 2 * 24 * 3600

COUNTER_FIELDS = (
    "received",           # mirrored requests for the run's route (or replayed requests)
    "refused_unauthenticated",  # POSTed for the route without a valid mirror token of one
                                # of its gateways (forged): refused 403, never `received`
    "sampled",            # admitted and enqueued as a shadow.pair task
    "dropped_rate",       # over the run's max_rps
    "dropped_tokens",     # today's tokens reached max_tokens_per_day
    "dropped_behind",     # the collector's queue full or the shadow queue ≥ SHADOW_MAX_QUEUED
    "dropped_malformed",  # not JSON, not an object, or no "model"
    "dropped_too_large",  # body over SHADOW_MAX_BODY_BYTES
    "dropped_stopped",    # the worker found the run no longer running
    "dropped_residency",  # the worker found a pool outside the route's pin (run stopped)
    "pairs",              # pairs stored
    "pair_errors",        # pairs whose triple could not be completed
    "tokens",             # tokens spent, all three sides, since the run started
)
# admit()'s answers, each the suffix of a counter: "rate" → dropped_rate.
DROP_REASONS = ("rate", "tokens", "behind")


@dataclass(frozen=True)
class RunConfig:
    """What a collector needs to know about a route's running run."""

    run: int
    max_rps: float
    max_tokens_per_day: int

    def to_json(self) -> str:
        return json.dumps({"run": self.run, "max_rps": self.max_rps,
                           "max_tokens_per_day": self.max_tokens_per_day})

    @classmethod
    def from_json(cls, raw: str | bytes) -> RunConfig | None:
        """None for a value that is not a run's configuration: a collector skips it (fails
        closed for that route) rather than crashing on somebody's hand-edited hash."""
        try:
            data = json.loads(raw)
            config = cls(run=int(data["run"]), max_rps=float(data["max_rps"]),
                         max_tokens_per_day=int(data["max_tokens_per_day"]))
        except (ValueError, TypeError, KeyError):
            return None
        return config if config.max_rps > 0 else None


def config_of(run_id: int, cfg: RunConfig | Mapping[str, Any] | Any) -> RunConfig:
    """A RunConfig from one, from a mapping with max_rps and max_tokens_per_day (the routes
    hash's value), or from anything with those attributes (a ShadowRun)."""
    if isinstance(cfg, RunConfig):
        return cfg
    if isinstance(cfg, Mapping):
        return RunConfig(run_id, float(cfg["max_rps"]), int(cfg["max_tokens_per_day"]))
    return RunConfig(run_id, float(cfg.max_rps), int(cfg.max_tokens_per_day))


def counters_key(run_id: int) -> str:
    return f"fleetctl:shadow:run:{int(run_id)}:counters"


def rate_key(run_id: int) -> str:
    return f"fleetctl:shadow:run:{int(run_id)}:rate"


def tokens_key(run_id: int, day: datetime | None = None) -> str:
    day = day or datetime.now(UTC)
    return f"fleetctl:shadow:run:{int(run_id)}:tokens:{day:%Y%m%d}"


def _check_fields(fields: Mapping[str, int]) -> None:
    unknown = set(fields) - set(COUNTER_FIELDS)
    if unknown:
        raise ValueError(f"unknown shadow counter(s) {sorted(unknown)}; "
                         f"known: {', '.join(COUNTER_FIELDS)}")


def _ints(raw: Mapping[Any, Any]) -> dict[str, int]:
    return {(k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()}


# --- the rate cap: GCRA, the same arithmetic locally and in Redis -----------------------------

def rate_interval_us(max_rps: float) -> int:
    return max(1, round(1_000_000 / max_rps))


def rate_tolerance_us(max_rps: float) -> int:
    """Burst: up to max(1, max_rps) requests back to back, then one every 1/max_rps s."""
    return round(rate_interval_us(max_rps) * (max(1.0, max_rps) - 1))


class LocalRate:
    """GCRA on this process's clock: the collector's first check, so the excess of a busy
    route is refused without a Redis round trip; what passes is checked again against the
    run-wide state in Redis (RATE_SCRIPT)."""

    __slots__ = ("interval_us", "tat_us", "tolerance_us")

    def __init__(self, max_rps: float) -> None:
        self.interval_us = rate_interval_us(max_rps)
        self.tolerance_us = rate_tolerance_us(max_rps)
        self.tat_us = 0

    def allow(self, now_us: int | None = None) -> bool:
        now = time.monotonic_ns() // 1000 if now_us is None else now_us
        tat = max(self.tat_us, now)
        if tat - now > self.tolerance_us:
            return False
        self.tat_us = tat + self.interval_us
        return True


# Server time, so several collectors and the replay task share one clock. Values are
# formatted with %.0f: Lua's tostring would print 16-digit microsecond times in exponent
# notation and lose their last digits.
RATE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tat < now then tat = now end
if tat - now > tonumber(ARGV[2]) then return 0 end
local nxt = tat + tonumber(ARGV[1])
redis.call('SET', KEYS[1], string.format('%.0f', nxt), 'PX',
           math.floor((nxt - now) / 1000) + 1000)
return 1
"""


def _rate_args(max_rps: float) -> list[int]:
    return [rate_interval_us(max_rps), rate_tolerance_us(max_rps)]


def over_caps(cfg: RunConfig, *, tokens_today: int, queued: int, max_queued: int) -> str:
    """The cap a request would break before the rate is consulted: "tokens", "behind" or ""."""
    if tokens_today >= cfg.max_tokens_per_day:
        return "tokens"
    if queued >= max_queued:
        return "behind"
    return ""


# --- sync: web, workers, the replay task -------------------------------------------------------

_clients: dict[str, redis.Redis] = {}


def client() -> redis.Redis:
    """One client (connection pool) per Redis URL for the process; the URL is read from the
    settings at each call, so tests that override REDIS_URL get their own."""
    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    return _clients[url]


def publish_run(run_id: int, route: str, *, max_rps: float, max_tokens_per_day: int) -> None:
    """Tell every collector that mirrored requests for `route` belong to this run (within a
    second). Publishing again with other caps adjusts them."""
    if not max_rps > 0:
        raise ValueError("max_rps must be more than 0")
    config = RunConfig(int(run_id), float(max_rps), int(max_tokens_per_day))
    client().hset(ROUTES_KEY, route, config.to_json())


def unpublish_run(route: str) -> None:
    """The kill switch: within a second every collector counts the route's mirrored requests
    as unmatched and enqueues nothing more for it."""
    client().hdel(ROUTES_KEY, route)


def published() -> dict[str, RunConfig]:
    """Route name → its running run's configuration, as the collectors see it."""
    return _parse_routes(client().hgetall(ROUTES_KEY))


def _parse_routes(raw: Mapping[Any, Any]) -> dict[str, RunConfig]:
    routes = {}
    for name, value in raw.items():
        if (config := RunConfig.from_json(value)) is not None:
            routes[name.decode() if isinstance(name, bytes) else str(name)] = config
    return routes


def count(run_id: int, **fields: int) -> None:
    """Add to the run's counters (one pipelined round trip)."""
    _check_fields(fields)
    if not fields:
        return
    key = counters_key(run_id)
    with client().pipeline(transaction=False) as pipe:
        for field, n in fields.items():
            pipe.hincrby(key, field, int(n))
        pipe.execute()


def counters(run_id: int) -> dict[str, int]:
    """Every counter of the run, 0 for those never incremented."""
    found = _ints(client().hgetall(counters_key(run_id)))
    return {field: found.get(field, 0) for field in COUNTER_FIELDS}


def count_unmatched(route: str | None, n: int = 1) -> None:
    client().hincrby(UNMATCHED_KEY, route or NO_ROUTE, int(n))


def unmatched() -> dict[str, int]:
    """Route name ("-" for none) → mirrored requests that arrived while it had no run."""
    return _ints(client().hgetall(UNMATCHED_KEY))


def add_tokens(run_id: int, n: int) -> int:
    """Add the real usage of one pair (all three sides) to today's total, which the spend cap
    reads; returns the total. The run's `tokens` counter is separate: count(run_id, tokens=n)."""
    key = tokens_key(run_id)
    with client().pipeline(transaction=False) as pipe:
        pipe.incrby(key, int(n))
        pipe.expire(key, TOKENS_TTL_S)
        total, _ = pipe.execute()
    return int(total)


def tokens_today(run_id: int) -> int:
    return int(client().get(tokens_key(run_id)) or 0)


def shadow_queue_length() -> int:
    """Messages waiting in the Celery `shadow` queue (default priority)."""
    return int(client().llen(SHADOW_QUEUE))


def admit(run_id: int, cfg: RunConfig | Mapping[str, Any] | Any) -> str:
    """May the run send one more sample now? "" when admitted (and the rate cap's budget is
    spent on it), else the reason: "tokens", "behind" or "rate". The caller counts it."""
    config = config_of(run_id, cfg)
    r = client()
    with r.pipeline(transaction=False) as pipe:
        pipe.get(tokens_key(run_id))
        pipe.llen(SHADOW_QUEUE)
        spent, queued = pipe.execute()
    reason = over_caps(config, tokens_today=int(spent or 0), queued=int(queued),
                       max_queued=settings.SHADOW_MAX_QUEUED)
    if reason:
        return reason
    allowed = r.eval(RATE_SCRIPT, 1, rate_key(run_id), *_rate_args(config.max_rps))
    return "" if allowed else "rate"


# --- async twins: the collector -----------------------------------------------------------------

def aclient(url: str | None = None) -> aredis.Redis:
    """A new asyncio client; the collector keeps one for its life."""
    return aredis.Redis.from_url(url or settings.REDIS_URL, socket_timeout=2,
                                 socket_connect_timeout=2)


async def apublished(r: aredis.Redis) -> dict[str, RunConfig]:
    return _parse_routes(await r.hgetall(ROUTES_KEY))


async def amirror_auth(r: aredis.Redis) -> mirror_auth.AcceptedTokens:
    """Route name -> the gateways that may mirror it and the tokens each may present."""
    return mirror_auth.parse(await r.hgetall(mirror_auth.MIRROR_AUTH_KEY))


async def asnapshot(r: aredis.Redis, run_ids: Iterable[int]) -> tuple[
        dict[str, RunConfig], dict[int, int], int]:
    """One round trip for what the collector caches: the routes hash, today's tokens of the
    given runs, and the shadow queue's length."""
    ids = list(run_ids)
    async with r.pipeline(transaction=False) as pipe:
        pipe.hgetall(ROUTES_KEY)
        pipe.llen(SHADOW_QUEUE)
        for run_id in ids:
            pipe.get(tokens_key(run_id))
        raw = await pipe.execute()
    tokens = {run_id: int(value or 0) for run_id, value in zip(ids, raw[2:], strict=True)}
    return _parse_routes(raw[0]), tokens, int(raw[1])


async def acount_many(r: aredis.Redis, runs: Mapping[int, Mapping[str, int]],
                      unmatched_by_route: Mapping[str, int]) -> None:
    """Flush batched counter increments in one round trip."""
    async with r.pipeline(transaction=False) as pipe:
        for run_id, fields in runs.items():
            _check_fields(fields)
            for field, n in fields.items():
                if n:
                    pipe.hincrby(counters_key(run_id), field, int(n))
        for route, n in unmatched_by_route.items():
            if n:
                pipe.hincrby(UNMATCHED_KEY, route or NO_ROUTE, int(n))
        await pipe.execute()


async def arate(r: aredis.Redis, run_id: int, max_rps: float) -> bool:
    """Spend one request of the run's rate budget (shared by every process), if there is one."""
    return bool(await r.eval(RATE_SCRIPT, 1, rate_key(run_id), *_rate_args(max_rps)))


async def aadmit(r: aredis.Redis, run_id: int, cfg: RunConfig | Mapping[str, Any] | Any) -> str:
    """admit() on the event loop, reading everything fresh (the collector itself uses its
    cached snapshot and calls `arate` only)."""
    config = config_of(run_id, cfg)
    async with r.pipeline(transaction=False) as pipe:
        pipe.get(tokens_key(run_id))
        pipe.llen(SHADOW_QUEUE)
        spent, queued = await pipe.execute()
    reason = over_caps(config, tokens_today=int(spent or 0), queued=int(queued),
                       max_queued=settings.SHADOW_MAX_QUEUED)
    if reason:
        return reason
    return "" if await arate(r, run_id, config.max_rps) else "rate"
